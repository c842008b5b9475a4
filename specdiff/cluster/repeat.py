"""`specdiff repeat --ray`: a repeat's runs shared out among Ray actors.

Run r of a repeat decodes the prompt beside the companions its number gives it (r mod
(K + 1) of them) and nothing else, so the runs are independent: actor i takes runs i,
i + A, i + 2A, ... of A actors, loads the lane once for them, and runs them in a worker
process of its own (a native crash ends that worker, not the actor). The driver puts the
runs back in their numbers' order, so the summary reads as an in-process repeat's. An
actor that dies has its share run again on a fresh one."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

from specdiff.cluster import import_ray
from specdiff.cluster.actors import actor_name, pinned, remote_class
from specdiff.lanes import Lane, default_threads
from specdiff.repeat import RunDone, repeat_numbers
from specdiff.repeat_summary import BatchedRun, RepeatResult, RepeatSummary, summary

MAX_ACTOR_LOSSES = 3
"""How often one actor's share of the runs is sent again after its actor died."""
WAIT_SECONDS = 0.1


class RepeatHolder:
    """An actor's share of a repeat: the lane loaded once in a worker process for it."""

    def __init__(self, cpus: int, default: int) -> None:
        self.cpus = cpus
        self.default = default
        self.cancel = threading.Event()

    def runs(
        self, lane: Lane, prompt: str, numbers: Sequence[int], width: int, max_tokens: int
    ) -> RepeatResult:
        # deferred: the engine loads in the actor only
        from specdiff.engine.worker import call_in_worker

        lane = pinned(lane, self.cpus, self.default)
        share = (lane, prompt, list(numbers), width, max_tokens)
        return call_in_worker(repeat_numbers, share, cancel=self.cancel, doing="repeating")

    def stop(self) -> None:
        self.cancel.set()

    def pid(self) -> int:
        return os.getpid()


class _Shares:
    """The actors in flight and the runs that came back, by number."""

    def __init__(self, cpus: int, on_run: RunDone | None) -> None:
        self.actor_class = remote_class(RepeatHolder, cpus)
        self.cpus = cpus
        self.on_run = on_run
        self.flying: dict[Any, tuple[Any, list[int], int]] = {}
        self.done: dict[int, tuple[BatchedRun, list[str]]] = {}

    def send(self, request: tuple[Any, ...], numbers: list[int], losses: int = 0) -> None:
        named = self.actor_class.options(name=actor_name("repeat"))
        actor = named.remote(self.cpus, default_threads())
        lane, prompt, width, max_tokens = request
        self.flying[actor.runs.remote(lane, prompt, numbers, width, max_tokens)] = (
            actor, numbers, losses,
        )  # fmt: skip

    def arrived(self, ref: Any, request: tuple[Any, ...], say: Callable[[str], None]) -> None:
        """Keep a share's runs; send it again when its actor died."""
        ray = import_ray()
        actor, numbers, losses = self.flying.pop(ref)
        try:
            result: RepeatResult = ray.get(ref)
        except ray.exceptions.RayActorError as error:
            why = str(error).splitlines()[0][:200]
            if losses >= MAX_ACTOR_LOSSES:
                from specdiff.engine.worker import WorkerCrashed

                raise WorkerCrashed(f"a Ray actor died {losses + 1} times: {why}") from None
            say(f"a Ray actor died under {len(numbers)} runs ({why}); running them again")
            self.send(request, numbers, losses + 1)
            return
        except ray.exceptions.RayTaskError as error:
            raise error.cause from None
        finally:
            ray.kill(actor)
        for number, run, ids in zip(numbers, result.runs, result.companion_ids):
            self.done[number] = (run, ids)
            if self.on_run is not None:
                self.on_run(number, len(run.steps), run.companions)

    def stop(self) -> None:
        for actor, _, _ in self.flying.values():
            actor.stop.remote()

    def end(self) -> None:
        ray = import_ray()
        for actor, _, _ in self.flying.values():
            ray.kill(actor)
        self.flying.clear()


def repeat_on_cluster(
    lane: Lane,
    prompt: str,
    runs: int,
    width: int,
    max_tokens: int,
    actors: int,
    cpus: int,
    on_run: RunDone | None,
    cancel: threading.Event,
    say: Callable[[str], None],
) -> RepeatSummary:
    """`run_repeat`'s summary for an in-process repeat, its runs shared among `actors`."""
    ray = import_ray()
    shares = _Shares(cpus, on_run)
    request = (lane, prompt, width, max_tokens)
    stopping = False
    try:
        for first in range(min(actors, runs)):
            shares.send(request, list(range(first, runs, actors)))
        while shares.flying:
            if cancel.is_set() and not stopping:
                stopping = True
                shares.stop()  # each share hands back the runs it finished
            ready, _ = ray.wait(list(shares.flying), num_returns=1, timeout=WAIT_SECONDS)
            for ref in ready:
                shares.arrived(ref, request, say)
    finally:
        shares.end()
    kept: list[tuple[BatchedRun, list[str]]] = []
    while len(kept) in shares.done:
        kept.append(shares.done[len(kept)])
    result = RepeatResult(
        lane, prompt, max_tokens, width, [run for run, _ in kept], [ids for _, ids in kept]
    )
    result.cancelled = len(kept) < runs
    return summary(result)
