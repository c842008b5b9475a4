"""Both lanes of a pair in a worker process: llama.cpp runs in a child, the front end
receives records.

specdiff drives llama.cpp into unusual corners (ubatch 1, KV types, drafts, other
people's GGUFs, CPUs whose kernels crash), and a native crash there (a SIGSEGV in a
kernel, a GGML_ASSERT abort) must end one run, not the program and its terminal. So
`PairWorker` offers PairRun's interface but runs PairRun in a child process (a fresh
interpreter, so the front-end process never loads llama.cpp, and no caller's main
module is imported again as multiprocessing's spawn would). Steps arrive one message
each, as they are produced, so when the child dies the front end holds every step it
produced and knows which lane died at which step.

A fault-injection switch read only in the worker makes every crash path testable on
any CPU: ``SPECDIFF_FAULT=LANE:STEP:KIND`` (e.g. ``b:5:segv``, ``a:0:abort``, ``b:3:ill``)
kills the worker by that signal just before it hands over that lane's step; KIND
``error`` instead makes that lane's decode fail there as llama.cpp refusing a call would
(the lane ends with the error, the other lane runs on).

The process and its socket are ``worker_process``'s, the messages ``worker_messages``'
records, and the child's side ``worker_child``.
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any, TypeVar, cast

from specdiff.compare import DEFAULT_NEAR_TIE
from specdiff.engine.base import Live, LiveStats, StreamsARun
from specdiff.engine.worker_messages import (
    CANCEL_SIGNAL,
    Answer,
    AskExecuted,
    CallFunction,
    Check,
    EventFired,
    OpenPair,
    Progressed,
    Ready,
    Request,
    RunFinished,
    StepMade,
    StreamRun,
    Tokenize,
)
from specdiff.engine.worker_process import (
    CLOSE_SECONDS,
    POLL_SECONDS,
    WorkerCrashed,
    WorkerFailed,
    WorkerProcess,
)
from specdiff.lanes import Lane, LaneId, Pair
from specdiff.results import LaneOutcome, PairResult, RunRequest
from specdiff.sessions.format import CRASHED
from specdiff.steps import TokenStep

__all__ = [
    "CANCEL_SIGNAL",
    "CLOSE_SECONDS",
    "POLL_SECONDS",
    "PairWorker",
    "WorkerCrashed",
    "WorkerFailed",
    "call_in_worker",
]

Progress = Callable[[str], None]
T = TypeVar("T")


def _quiet(_: str) -> None:
    return None


class PairWorker(StreamsARun):
    """PairRun's interface, with the lanes in a worker process.

    A crash while a run streams ends the run, not the caller: `stream` stops, and
    `result` holds every step that arrived, both lanes stopped as "crashed" and the
    crash in the lane that died. A crash at any other time raises WorkerCrashed. Once
    the worker has died the object is spent (`alive` is False); open a new one.
    """

    WHO = "the lanes' worker"
    repack_off = "--both repack=false"
    """The option that turns off the kernels most often behind a crash."""

    def __init__(
        self,
        pair: Pair,
        progress: Progress = _quiet,
        cancel: threading.Event | None = None,
        read_every: float = 0.0,
    ) -> None:
        self.pair = pair
        self.cancel = cancel or threading.Event()
        self.result: PairResult | None = None
        self._executed: dict[str, dict[str, Any]] = {}
        self._live: Live = {}
        self._received: dict[LaneId, list[TokenStep]] = {"a": [], "b": []}
        self._progress = progress
        # `read_every`: seconds a streaming reader waits before it drains what has
        # arrived, when nothing is waiting (0: woken by each step). A reader that draws
        # in batches anyway sets it: woken per step, its thread takes a core from the
        # decode threads some 200 times a second, and each time both of them wait at
        # the next barrier.
        self._worker = WorkerProcess(
            self.WHO,
            self.repack_off,
            self.cancel,
            "while loading or preparing the lanes",
            places_steps=True,
            read_every=read_every,
        )
        try:
            self._worker.send(OpenPair(pair))
            ready = self._worker.reply(progress, Ready)
        except BaseException:
            self.close()
            raise
        self._worker.build, self._executed = ready.build, ready.executed
        self._worker.busy = False

    @property
    def build(self) -> dict[str, str]:
        """llama.cpp's build and the system, as the worker loaded them."""
        return self._worker.build

    @property
    def process(self) -> subprocess.Popen[bytes]:
        """The worker's process."""
        return self._worker.process

    @property
    def alive(self) -> bool:
        return self._worker.alive

    # -- requests

    def tokenize(self, prompt: str) -> list[int]:
        tokens = cast(list[int], self._call(Tokenize(prompt)))
        # a chat lane's executed record now holds the prompt it formatted
        self._executed = cast(dict[str, dict[str, Any]], self._call(AskExecuted()))
        return tokens

    def check(self, tokens: Sequence[int], max_tokens: int) -> None:
        self._call(Check(list(tokens), max_tokens))

    def executed(self) -> dict[str, dict[str, Any]]:
        return self._executed

    def live(self) -> Live:
        """Per lane, while a run streams: its tokens/s so far, drafted and accepted."""
        return self._live

    def _call(self, request: Request) -> object:
        self._worker.send(request)
        return self._worker.reply(_quiet, Answer).value

    def stream(
        self,
        prompt: str,
        max_tokens: int,
        stop: Sequence[str] = (),
        near_tie: float = DEFAULT_NEAR_TIE,
        teacher_forced: bool = False,
        control: bool = False,
    ) -> Iterator[TokenStep]:
        """Yield both lanes' steps as the worker produces them; `self.result` holds the
        outcome once the iterator is exhausted, a crash included. `control` runs lane a
        again, cold, in the worker after the pair (PairRun.stream)."""
        self.result = None
        self._received = {"a": [], "b": []}
        self._live = {}
        # asked first, so that a result cut short by a crash still names its prompt
        tokens = self.tokenize(prompt)
        started = datetime.now(timezone.utc).isoformat(timespec="seconds")
        request = RunRequest(
            prompt, tokens, max_tokens, list(stop), near_tie, teacher_forced, started
        )
        worker = self._worker
        worker.begin_streaming()
        cancelled = self.cancel.is_set()
        worker.send(
            StreamRun(cancelled, prompt, max_tokens, list(stop), near_tie, teacher_forced, control)
        )
        worker.streaming = worker.busy = True
        try:
            yield from self._receive(request)
        finally:
            worker.streaming = False
            if worker.busy and worker.alive:
                # left mid-run: the worker is still streaming, and its steps would answer
                # the next request; it is spent
                worker.kill()

    def _receive(self, request: RunRequest) -> Iterator[TokenStep]:
        """The run's steps as they arrive, until its result or a crash."""
        while True:
            try:
                message = self._worker.next()
            except WorkerCrashed as crash:
                self.result = self._crashed_result(crash, request)
                return
            if isinstance(message, StepMade):
                step, self._live = message.step, message.live
                self._received[step.lane].append(step)
                yield step
            elif isinstance(message, RunFinished):
                self.result = message.result
                self._worker.busy = False
                return
            elif isinstance(message, Progressed):
                self._progress(message.text)
            else:
                self._worker.unexpected(message)

    def _crashed_result(self, crash: WorkerCrashed, request: RunRequest) -> PairResult:
        """What arrived before the crash, as a result: every step kept, both lanes
        stopped as crashed, the crash named in both lanes' errors."""
        outcomes: dict[LaneId, LaneOutcome] = {}
        lanes: tuple[tuple[LaneId, Lane], ...] = (("a", self.pair.a), ("b", self.pair.b))
        for lane_id, lane in lanes:
            live = self._live.get(lane_id, LiveStats(0.0))
            outcomes[lane_id] = LaneOutcome(
                lane_id,
                lane,
                steps=self._received[lane_id],
                stop_reason=CRASHED,
                error=str(crash),
                drafted=live.drafted,
                accepted=live.accepted,
                executed=self._executed.get(lane_id, {}),
                reported_tokens_per_second=live.tokens_per_second,
            )
        return PairResult.assemble(self.pair, request, outcomes, self.build)

    # -- life cycle

    def close(self) -> None:
        """End the worker: asked to close when idle, killed when busy (loading, running,
        or a run left unfinished), with whatever it started."""
        self._worker.close()

    def __enter__(self) -> PairWorker:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


# --- one function call in a worker process -------------------------------------------


def call_in_worker(
    function: Callable[..., T],
    args: Sequence[Any],
    events: Mapping[str, Callable[..., None]] | None = None,
    cancel: threading.Event | None = None,
    doing: str = "running",
    repack_off: str = "--lane repack=false",
) -> T:
    """`function(*args, cancel=EVENT, **events)` in a worker process, so llama.cpp runs
    there and not in the caller; its value comes back (it and its arguments pickle).

    Each of `events` is passed to the function as a keyword argument of that name, and
    the caller's callback receives what the function passes it. `cancel`, when set, sets
    the function's own cancel event. Its SpecdiffErrors are raised here; a crash raises
    WorkerCrashed naming what it was `doing` and `repack_off`, the option to try. A
    SPECDIFF_FAULT fires when an event hands over that lane's step.
    """
    handlers = dict(events or {})
    worker = WorkerProcess("the worker", repack_off, cancel or threading.Event(), f"while {doing}")
    try:
        worker.send(CallFunction(function, tuple(args), tuple(handlers)))
        worker.build = worker.reply(_quiet, Ready).build
        # a cancel is passed on while the call runs, as while a pair streams
        worker.streaming = True
        while True:
            message = worker.next()
            if isinstance(message, Answer):
                return cast(T, message.value)
            if isinstance(message, EventFired):
                handlers[message.name](*message.payload)
            else:
                worker.unexpected(message)
    finally:
        worker.close()
