"""What the compare screen opens with, as one record: the pairs offered, the run the
controls start out holding, a session to show and how to play it. The command line and
the tests build it once (`app.make_app`); the app, the screen and the controls read it.
No Textual import."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from specdiff.compare import DEFAULT_NEAR_TIE
from specdiff.lanes import Pair
from specdiff.sessions.store import Session, SessionStream


@dataclass(frozen=True)
class CompareOptions:
    """The compare screen's starting point."""

    pairs: Mapping[str, Pair]
    """The pairs the picker offers."""
    pair_name: str
    prompt: str
    max_tokens: int
    near_tie: float = DEFAULT_NEAR_TIE
    autostart: bool = True
    """Run the pair on the prompt once the screen is up."""
    session: Session | None = None
    """A recorded run to show: at once when `replay_speed` is None, else played at the
    recorded pace times `replay_speed`."""
    sessions_dir: str | Path | None = None
    replay_speed: float | None = None
    session_stream: SessionStream | None = None
    """The rest of the session's file, read while the replay plays."""
    refused_pairs: Mapping[str, str] = field(default_factory=dict)
    """Pairs shown but never run, each with the reason (a shared session's server lanes,
    which the user has not allowed)."""
    pause_at_fork: bool = False
    """A played replay pauses once both lanes show the fork's token."""
    overrides: Mapping[str, str] = field(default_factory=dict)
    """Each lane's overrides from the command line, as "key=value" words, shown (and
    applied again, to the same effect) in its overrides field."""
    control: bool = False
    """Lane a runs again, cold, after each run."""
    compare_machine: bool = False
    """Say when a replayed session was recorded on another CPU (`specdiff replay`)."""
    runs_refused: str | None = None
    """Why no run starts here (`specdiff proxy --tui`, whose proxy runs the pair): r is
    not offered, and a run asked for otherwise says this instead."""

    @property
    def pair(self) -> Pair:
        return self.pairs[self.pair_name]
