"""What the front end and the worker process say to each other: one record per kind of
message, frozen, so both sides read the same fields where a tagged tuple would be read
by position. Each record crosses the socket pickled; a step's record is sent once per
step, so the records hold their fields in slots.

Also the worker's small "due step" file, the other thing both sides read: which lane's
step the decode loop is computing, so that a native crash can be placed.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specdiff.engine.base import Live
from specdiff.errors import SpecdiffError
from specdiff.lanes import LaneId, Pair
from specdiff.steps import TokenStep

if TYPE_CHECKING:  # annotations only: the records hold these, never build them
    from specdiff.results import PairResult

CANCEL_SIGNAL = signal.SIGUSR1
"""Sent by the front end to stop a run: a signal, so the decode loop sees it at once."""

# -- the front end's requests ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OpenPair:
    """Load both lanes of `pair`; answered by Ready (or by the failure)."""

    pair: Pair


@dataclass(frozen=True, slots=True)
class CallFunction:
    """Call `function(*args, cancel=EVENT, **events)` instead of loading a pair; answered
    by Ready, then EventFired as the function hands things over, then Answer."""

    function: Callable[..., Any]
    args: tuple[Any, ...]
    events: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class StreamRun:
    """Run the pair on a prompt: StepMade per step, then RunFinished."""

    cancelled: bool
    """Whether a cancel is already asked for: a signal sent before this request was
    read must not be lost, nor one left from the last run count."""
    prompt: str
    max_tokens: int
    stop: list[str]
    near_tie: float
    teacher_forced: bool
    control: bool


@dataclass(frozen=True, slots=True)
class Tokenize:
    """Lane a's token ids of `prompt`; answered by Answer."""

    prompt: str


@dataclass(frozen=True, slots=True)
class Check:
    """Refuse a prompt that cannot run; answered by Answer (None) or the failure."""

    tokens: list[int]
    max_tokens: int


@dataclass(frozen=True, slots=True)
class AskExecuted:
    """What each lane runs on; answered by Answer."""


@dataclass(frozen=True, slots=True)
class Close:
    """End the worker, which is idle."""


Request = OpenPair | CallFunction | StreamRun | Tokenize | Check | AskExecuted | Close

# -- the worker's replies -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Progressed:
    """A line of progress while loading or preparing."""

    text: str


@dataclass(frozen=True, slots=True)
class Ready:
    """The lanes are loaded (or the function is about to run)."""

    build: dict[str, str]
    executed: dict[str, dict[str, Any]] = field(default_factory=dict)
    """PairRun.executed(): each lane's table, as a session header holds it."""


@dataclass(frozen=True, slots=True)
class Answer:
    """What a request asked for."""

    value: Any


@dataclass(frozen=True, slots=True)
class StepMade:
    """One lane's next step, with both lanes' live numbers after it."""

    step: TokenStep
    live: Live


@dataclass(frozen=True, slots=True)
class RunFinished:
    """The run's result, once every step was sent."""

    result: PairResult


@dataclass(frozen=True, slots=True)
class EventFired:
    """A called function handed `payload` to its event `name`."""

    name: str
    payload: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Raised:
    """Bad input, or a lane's failure, to show as it is."""

    error: SpecdiffError


@dataclass(frozen=True, slots=True)
class Bug:
    """Any other Python error in the worker, with its traceback."""

    traceback: str


Reply = Progressed | Ready | Answer | StepMade | RunFinished | EventFired | Raised | Bug

# -- the due step ---------------------------------------------------------------------


class DueStep:
    """Which lane's step the decode loop is computing, written to a small file before
    each step, so the front end can name where a native crash struck: steps are handed
    over in pairs, so what arrived does not say which lane died."""

    def __init__(self, path: str) -> None:
        self.descriptor = os.open(path, os.O_WRONLY)

    def mark(self, lane: LaneId, index: int) -> None:
        os.pwrite(self.descriptor, f"{lane}{index:010d}".encode(), 0)

    @staticmethod
    def read(path: Path) -> tuple[LaneId, int] | None:
        try:
            text = path.read_bytes().decode("ascii")
        except (OSError, UnicodeDecodeError):
            return None
        lane = _LANE_IDS.get(text[:1])
        if len(text) != 11 or lane is None or not text[1:].isdigit():
            return None
        return lane, int(text[1:])


_LANE_IDS: dict[str, LaneId] = {"a": "a", "b": "b"}
