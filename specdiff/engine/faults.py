"""Fault injection: ``SPECDIFF_FAULT=LANE:STEP:KIND`` makes the lane's decode die at that
step (KIND segv, abort or ill: that signal) or fail (KIND error), so every crash path is
testable on any CPU. Read only in a child that runs llama.cpp: the worker, and the
probe that decides whether a build's kernels can be trusted; both import it from here
rather than from each other.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable
from dataclasses import dataclass

from specdiff.engine.base import EngineError
from specdiff.lanes import LaneId
from specdiff.steps import TokenStep

FAULT_ENV = "SPECDIFF_FAULT"
_LANE_IDS: dict[str, LaneId] = {"a": "a", "b": "b"}


@dataclass(frozen=True)
class Fault:
    """Where SPECDIFF_FAULT asks the worker to die, and how."""

    lane: LaneId
    step: int
    kind: str

    KINDS = {"segv": signal.SIGSEGV, "abort": signal.SIGABRT, "ill": signal.SIGILL}

    @classmethod
    def from_env(cls) -> Fault | None:
        value = os.environ.get(FAULT_ENV, "")
        parts = value.split(":")
        if len(parts) != 3 or not parts[1].isdigit():
            return None
        lane = _LANE_IDS.get(parts[0])
        if lane is None or parts[2] not in cls.KINDS and parts[2] != "error":
            return None
        return cls(lane, int(parts[1]), parts[2])

    def fire_at(self, step: TokenStep) -> None:
        """For a function's events: die as the step is handed over."""
        self.fire_before(step.lane, step.index)

    def fire_before(self, lane: LaneId, index: int) -> None:
        """Die (or fail, KIND error) at the lane's step, before it leaves the decode loop:
        where a native crash in a kernel would strike."""
        if lane != self.lane or index != self.step:
            return
        if self.kind == "error":
            raise EngineError(f"llama_decode failed (injected at step {self.step})")
        signal.signal(self.KINDS[self.kind], signal.SIG_DFL)
        os.kill(os.getpid(), self.KINDS[self.kind])


def fault_point(steps: Iterable[TokenStep]) -> None:
    """Where a function run by `call_in_worker` hands over less than its steps (counts
    only), the steps it finished pass here, so an injected fault still strikes there."""
    fault = Fault.from_env()
    if fault is not None:
        for step in steps:
            fault.fire_at(step)
