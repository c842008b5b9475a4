"""What flows between the compare screen and its controllers, as plain typed records.

Two kinds, one way each:

- *reports* come up from worker threads (a live run's steps and how it ended, a
  replayed session's steps as its file is read): a controller receives them on the UI
  thread, changes the model (`view_state.CompareView`) and returns what changed;
- *changes* go from a controller to the screen, which draws them (`FrameDue`,
  `StatusChanged`, ...). A controller never draws, and the screen never decides.

No Textual import: the controllers that speak these are tested without an app. The
screen carries a report across threads inside one Textual message of its own.
Widgets' own messages are nested in the widget that posts them
(``Controls.RunRequested``, ``TokenView.Selected``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from specdiff.autopsy import Autopsy
from specdiff.engine.base import Live
from specdiff.results import PairResult
from specdiff.sessions.store import Session
from specdiff.steps import TokenStep

# -- reports, from worker threads


@dataclass
class StepsArrived:
    """New steps from the running lanes, with each lane's live numbers."""

    steps: list[TokenStep]
    live: Live
    """Each lane's numbers so far (tokens/s of its own decode time, drafts)."""


@dataclass
class RunStarted:
    """The lanes are loaded and generating."""

    prompt_tokens: int


@dataclass
class RunFinished:
    """The run ended: complete, stopped, or with a lane error inside the result."""

    result: PairResult


@dataclass
class RunFailed:
    """The run could not start or broke down (model load, bad prompt, ...)."""

    error: str
    lane: str | None = None
    """The lane the engine says failed (its model, settings or server), None when the
    failure is the pair's (a prompt, vocabularies that differ, a crash)."""


@dataclass
class SessionLoaded:
    """More steps of a session being replayed were read from its file."""

    steps: list[TokenStep]
    done: bool


@dataclass
class SessionLoadFailed:
    """The rest of a replayed session's file is unreadable (one line naming file, line)."""

    error: str


@dataclass
class MachineCompared:
    """The replayed session was recorded on a CPU unlike this machine's (`line` says
    how)."""

    session: Session
    line: str


# -- changes, from a controller to the screen


@dataclass(frozen=True)
class FrameDue:
    """Draw the lanes' tokens; with `details`, also their stats lines, margin strips,
    legend, aligned view and panel."""

    follow: bool
    """The panes scroll to the newest token."""
    details: bool = True


@dataclass(frozen=True)
class StatusChanged:
    """The status line says `text` from now on."""

    text: str


@dataclass(frozen=True)
class Noted:
    """A routine note, said before the status line's text until it next changes."""

    text: str


@dataclass(frozen=True)
class Alerted:
    """A toast: errors, and what must stay in view a while (another CPU)."""

    text: str
    severity: Literal["information", "warning", "error"] = "error"
    timeout: float | None = 8.0
    """Seconds in view; None: the app's default."""


@dataclass(frozen=True)
class ForkFound:
    """The fork was just found: `d` is offered, both panes bring it into view."""

    announce: bool


@dataclass(frozen=True)
class CursorMoved:
    """The cursor is on `index` of `lane_id` (None: no cursor); the pane of that lane,
    or both with `scroll_both`, scrolls to it."""

    lane_id: str
    index: int | None
    scroll_both: bool = False


@dataclass(frozen=True)
class PairShown:
    """Another pair (or session) is on screen: the panes' titles name it."""


@dataclass(frozen=True)
class ReplayShown:
    """A replay is shown (or no longer is): what would discard it is locked."""

    replaying: bool


@dataclass(frozen=True)
class KeysChanged:
    """What the keys do changed (space pauses or resumes, `d` is offered): the footer
    asks again."""


@dataclass(frozen=True)
class RunningChanged:
    """The lanes started or stopped generating."""

    running: bool


@dataclass(frozen=True)
class RunAgain:
    """The run stopped by `r` mid-run has ended: start the next one."""


@dataclass(frozen=True)
class AutopsyProgress:
    """The autopsy being made moved on: the panel's bar and its latest line."""

    title: str
    line: str
    done: int
    total: int


@dataclass(frozen=True)
class AutopsyShown:
    """A finished (or saved) autopsy takes the panel's place."""

    title: str
    autopsy: Autopsy


@dataclass(frozen=True)
class AutopsyClosed:
    """The autopsy panel gives the divergence panel its place back."""


Change = (
    FrameDue
    | StatusChanged
    | Noted
    | Alerted
    | ForkFound
    | CursorMoved
    | PairShown
    | ReplayShown
    | KeysChanged
    | RunningChanged
    | RunAgain
    | AutopsyProgress
    | AutopsyShown
    | AutopsyClosed
)
Changes = list[Change]
"""What one controller call changed, in the order the screen applies it."""
