"""Messages the worker threads post to the compare screen: a live run's steps and how
it ended, and a replayed session's steps as its file is read. Widgets' own messages
are nested in the widget that posts them (``Controls.RunRequested``,
``TokenView.Selected``). They are the screen's alone: none bubbles on to the app."""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message

from specdiff.engine.base import Live
from specdiff.results import PairResult
from specdiff.steps import TokenStep


@dataclass
class StepsArrived(Message, bubble=False):
    """New steps from the running lanes, with each lane's live numbers."""

    steps: list[TokenStep]
    live: Live
    """Each lane's numbers so far (tokens/s of its own decode time, drafts)."""


@dataclass
class RunStarted(Message, bubble=False):
    """The lanes are loaded and generating."""

    prompt_tokens: int


@dataclass
class RunFinished(Message, bubble=False):
    """The run ended: complete, stopped, or with a lane error inside the result."""

    result: PairResult


@dataclass
class RunFailed(Message, bubble=False):
    """The run could not start or broke down (model load, bad prompt, ...)."""

    error: str
    lane: str | None = None
    """The lane the engine says failed (its model, settings or server), None when the
    failure is the pair's (a prompt, vocabularies that differ, a crash)."""


@dataclass
class SessionLoaded(Message, bubble=False):
    """More steps of a session being replayed were read from its file."""

    steps: list[TokenStep]
    done: bool


@dataclass
class SessionLoadFailed(Message, bubble=False):
    """The rest of a replayed session's file is unreadable (one line naming file, line)."""

    error: str
