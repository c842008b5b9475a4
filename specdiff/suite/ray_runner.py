"""A suite's units on a Ray cluster (--ray): each actor holds one pair's worker, loaded
once, and runs one unit (a prompt under the pair) at a time; this process writes every
session file, the ledger and the report as the units' results arrive.

`RayRunners` takes the place of `Runners` in SuiteRun: one slot per actor, each slot a
`RayPairRunner` that offers PairWorker's interface. A unit's steps come back with its
result, in the order they were produced, and are written then: a unit whose actor (or
node) dies has written nothing, and runs again from the start on a fresh actor, so the
ledger holds each unit once. A stop (a second Ctrl+C) reaches the unit in flight, whose
steps so far are written to a partial file that --resume runs again, as in-process."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Any

from specdiff.cluster import import_ray
from specdiff.cluster.actors import PairHolder, Unit, actor_name, remote_class
from specdiff.compare import DEFAULT_NEAR_TIE
from specdiff.errors import SpecdiffError
from specdiff.lanes import LaneId, Pair, default_threads
from specdiff.results import LaneOutcome, PairResult, RunRequest
from specdiff.steps import TokenStep

MAX_ACTOR_LOSSES = 3
"""How often one unit runs again after its actor (or node) died under it."""
WAIT_SECONDS = 0.1
"""How often a unit in flight is checked for a stop."""
STOP_SECONDS = 10.0
"""How long a stopped unit's actor may take to hand back its steps so far."""


class RayRunners:
    """The suite's runners as Ray actors: `slots` of them per pair, each loading it."""

    def __init__(
        self,
        actors: int,
        cpus_per_actor: int,
        cancel: threading.Event,
        say: Callable[[str], None],
    ) -> None:
        self.slots = actors
        self.cpus = cpus_per_actor
        self.cancel = cancel
        self.say = say
        """Where an actor's death is told (every slot's, not only the one that says
        what loads)."""
        self._opened: list[RayPairRunner] = []

    def new(self, pair: Pair, progress: Callable[[str], None]) -> RayPairRunner:
        runner = RayPairRunner(pair, progress, self.cancel, self.cpus, self.say)
        self._opened.append(runner)
        return runner

    def release(self) -> None:
        for runner in self._opened:
            runner.close()
        self._opened.clear()


@functools.lru_cache(maxsize=8)
def _actor_class(cpus: int) -> Any:
    return remote_class(PairHolder, cpus)


class RayPairRunner:
    """PairWorker's interface, the pair loaded in a Ray actor."""

    def __init__(
        self,
        pair: Pair,
        progress: Callable[[str], None],
        cancel: threading.Event,
        cpus: int,
        say: Callable[[str], None],
    ) -> None:
        self.pair = pair
        self.progress = progress
        self.say = say
        self.cancel = cancel
        self.cpus = cpus
        self.alive = True
        self._tokens: list[int] = []
        self._executed: dict[str, dict[str, Any]] = {}
        self.build: dict[str, str] = {}
        self.actor: Any = None
        self._prompt: str | None = None
        """The prompt last tokenized: a fresh actor tokenizes it again, so that its
        lanes check their own ids of it."""
        self._loud = True
        try:
            self._call(lambda: None)  # the first actor, saying what it loads
        except BaseException:
            self.close()  # a pair that will not load leaves no actor behind
            raise

    def _call(self, call: Callable[[], Any]) -> Any:
        """`call()` (which uses `self.actor`) on a live actor: one started with the pair
        loaded where there is none, and again after its actor (or node) died, up to
        MAX_ACTOR_LOSSES times; WorkerCrashed after that."""
        ray = import_ray()
        for lost in range(MAX_ACTOR_LOSSES + 1):
            try:
                if self.actor is None:
                    self._start()
                return call()
            except ray.exceptions.RayActorError as error:
                self.actor = None  # dead: a fresh one takes its place
                why = str(error).splitlines()[0][:200]
                if lost == MAX_ACTOR_LOSSES:
                    from specdiff.engine.worker import WorkerCrashed

                    raise WorkerCrashed(f"its Ray actor died {lost + 1} times: {why}") from None
                self.say(f"a Ray actor died under a unit ({why}); running it again on another")
        raise AssertionError("unreachable: the loop returns or raises")

    def _start(self) -> None:
        """A fresh actor with the pair loaded (the first one tells what it loads)."""
        self.actor = (
            _actor_class(self.cpus)
            .options(name=actor_name("pair"))
            .remote(self.cpus, default_threads())
        )
        opened = self._get(self.actor.open.remote(self.pair))
        if self._loud:
            self._loud = False
            for line in opened.said:
                self.progress(line)
        self.build, self._executed = opened.build, opened.executed
        if self._prompt is not None:
            self._tokens, self._executed = self._get(self.actor.tokenize.remote(self._prompt))

    def _get(self, ref: Any) -> Any:
        """The call's value; its SpecdiffError raised as itself, not as Ray's wrapper."""
        ray = import_ray()
        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as error:
            if isinstance(error.cause, SpecdiffError):
                raise error.cause from None
            raise

    def tokenize(self, prompt: str) -> list[int]:
        self._prompt = prompt
        self._tokens, self._executed = self._call(
            lambda: self._get(self.actor.tokenize.remote(prompt))
        )
        return self._tokens

    def check(self, tokens: Sequence[int], max_tokens: int) -> None:
        self._call(lambda: self._get(self.actor.check.remote(list(tokens), max_tokens)))

    def executed(self) -> dict[str, dict[str, Any]]:
        return self._executed

    def run(
        self,
        prompt: str,
        max_tokens: int,
        stop: Sequence[str] = (),
        near_tie: float = DEFAULT_NEAR_TIE,
        on_step: Callable[[TokenStep], None] | None = None,
        teacher_forced: bool = False,
        control: bool = False,
    ) -> PairResult:
        """The unit's result; its steps handed to `on_step` once it has arrived, in the
        order the actor's worker produced them. Runs again on a fresh actor when its
        actor dies under it: nothing of the lost run was handed over."""
        request = (prompt, max_tokens, list(stop), near_tie, teacher_forced, control)
        unit: Unit = self._call(lambda: self._unit(request))
        self.alive = unit.alive
        if on_step is not None:
            _replay(unit, on_step)
        return unit.result

    def _unit(self, request: tuple[Any, ...]) -> Unit:
        """Send the unit and wait for it, passing a stop on; a stopped actor that does not
        answer in STOP_SECONDS is ended, and the unit counts as cancelled."""
        ray = import_ray()
        ref = self.actor.run.remote(*request)
        while not ray.wait([ref], timeout=WAIT_SECONDS)[0]:
            if self.cancel.is_set():
                self.actor.stop.remote()
                if not ray.wait([ref], timeout=STOP_SECONDS)[0]:
                    self.close()
                    return Unit(self._cancelled(request), "", False)
                break
        unit: Unit = self._get(ref)
        return unit

    def _cancelled(self, request: tuple[Any, ...]) -> PairResult:
        """A unit stopped before any step came back: nothing to write, --resume runs it."""
        prompt, max_tokens, stop, near_tie, teacher_forced, _ = request
        started = datetime.now(timezone.utc).isoformat(timespec="seconds")
        asked = RunRequest(
            prompt, self._tokens, max_tokens, stop, near_tie, teacher_forced, started
        )
        outcomes: dict[LaneId, LaneOutcome] = {
            "a": LaneOutcome("a", self.pair.a),
            "b": LaneOutcome("b", self.pair.b),
        }
        return PairResult.assemble(self.pair, asked, outcomes, self.build, cancelled=True)

    def close(self) -> None:
        """End the actor (and the worker process it holds)."""
        if self.actor is None:
            return
        ray = import_ray()
        ray.kill(self.actor)
        self.actor = None


def _replay(unit: Unit, on_step: Callable[[TokenStep], None]) -> None:
    """Hand over the unit's steps in the order they were produced."""
    steps = {"a": iter(unit.result.a.steps), "b": iter(unit.result.b.steps)}
    for lane_id in unit.order:
        on_step(next(steps[lane_id]))
