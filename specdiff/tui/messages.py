"""Messages the generation worker posts to the app."""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message

from specdiff.results import PairResult
from specdiff.steps import TokenStep


@dataclass
class StepsArrived(Message):
    """New steps from the running lanes, with each lane's live numbers."""

    steps: list[TokenStep]
    live: dict[str, tuple[float, int, int]]
    """lane id -> (tokens/s of its own decode time, drafted, accepted)"""


@dataclass
class RunStarted(Message):
    """The lanes are loaded and generating."""

    prompt_tokens: int


@dataclass
class RunFinished(Message):
    """The run ended: complete, stopped, or with a lane error inside the result."""

    result: PairResult


@dataclass
class RunFailed(Message):
    """The run could not start or broke down (model load, bad prompt, ...)."""

    error: str
    lane: str | None = None
    """The lane that failed to load, None when the failure is the pair's (a prompt,
    vocabularies that differ, a crash)."""


@dataclass
class Status(Message):
    """A progress line from loading (model assembly, variants, ...)."""

    text: str


@dataclass
class SessionLoaded(Message):
    """More steps of a session being replayed were read from its file."""

    steps: list[TokenStep]
    done: bool


@dataclass
class SessionLoadFailed(Message):
    """The rest of a replayed session's file is unreadable (one line naming file, line)."""

    error: str
