"""What a Ray actor holds: one pair's worker (`PairWorker`), loaded once, running one
unit at a time; or a repeat's slice of runs in a worker process.

The classes here are plain: `remote_class` makes the actor class when Ray is there, so
this module imports without it. The actor's lanes run as many llama.cpp threads as the
actor has CPUs, unless a lane set its own: two actors on one machine then share its
cores instead of each taking all of them.

A native crash in llama.cpp ends the actor's worker process, not the actor: the unit's
result says so (as in-process), and the driver opens a fresh actor for the next unit."""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from specdiff.lanes import Lane, Pair
from specdiff.results import PairResult
from specdiff.steps import TokenStep


@dataclass(frozen=True)
class Opened:
    """A pair loaded in an actor: what its lanes run on, and the lines loading said."""

    build: dict[str, str]
    executed: dict[str, dict[str, Any]]
    said: tuple[str, ...]


@dataclass(frozen=True)
class Unit:
    """One prompt run under the pair: its result, the order its steps came in (a lane
    id per step), and whether the actor's worker is still alive after it."""

    result: PairResult
    order: str
    alive: bool


def pinned(lane: Lane, cpus: int, default: int) -> Lane:
    """The lane with the actor's CPUs as its threads, where it had the driver's default
    (`default`); threads a lane set itself are kept."""
    if lane.threads != default:
        return lane
    batch = lane.threads_batch if lane.threads_batch not in (0, default) else 0
    return replace(lane, threads=cpus, threads_batch=batch)


class PairHolder:
    """One pair's worker in an actor, one unit at a time."""

    def __init__(self, cpus: int, default_threads: int) -> None:
        self.cpus = cpus
        self.default_threads = default_threads
        self.cancel = threading.Event()
        self.worker: Any = None  # a PairWorker, once `open` has loaded the pair

    def open(self, pair: Pair) -> Opened:
        # deferred: the engine loads in the actor only
        from specdiff.engine.worker import PairWorker

        said: list[str] = []
        pair = replace(
            pair,
            a=pinned(pair.a, self.cpus, self.default_threads),
            b=pinned(pair.b, self.cpus, self.default_threads),
        )
        self.worker = PairWorker(pair, said.append, self.cancel)
        return Opened(self.worker.build, self.worker.executed(), tuple(said))

    def tokenize(self, prompt: str) -> tuple[list[int], dict[str, dict[str, Any]]]:
        tokens = self.worker.tokenize(prompt)
        return tokens, self.worker.executed()

    def check(self, tokens: Sequence[int], max_tokens: int) -> None:
        self.worker.check(tokens, max_tokens)

    def run(
        self,
        prompt: str,
        max_tokens: int,
        stop: Sequence[str],
        near_tie: float,
        teacher_forced: bool,
        control: bool,
    ) -> Unit:
        self.cancel.clear()
        order: list[str] = []

        def arrived(step: TokenStep) -> None:
            order.append(step.lane)

        result = self.worker.run(
            prompt, max_tokens, stop, near_tie, arrived, teacher_forced=teacher_forced,
            control=control,
        )  # fmt: skip
        return Unit(result, "".join(order), bool(self.worker.alive))

    def stop(self) -> None:
        """Stop the unit in flight where it is (its result says it was cancelled)."""
        self.cancel.set()

    def pid(self) -> int:
        return os.getpid()

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()
            self.worker = None


ACTOR_PREFIX = "specdiff-"
"""Every actor's name starts so (`ray list actors` shows whose they are)."""


def actor_name(kind: str) -> str:
    """A name no other actor has: ACTOR_PREFIX, what it runs, and a random part."""
    return f"{ACTOR_PREFIX}{kind}-{uuid.uuid4().hex[:12]}"


def remote_class(holder: type[Any], cpus: int) -> Any:
    """`holder` as a Ray actor class taking `cpus` CPUs; two calls at once, so that a
    stop reaches the unit in flight (units themselves still run one at a time)."""
    from specdiff.cluster import import_ray

    ray = import_ray()
    return ray.remote(num_cpus=cpus, max_concurrency=2)(holder)
