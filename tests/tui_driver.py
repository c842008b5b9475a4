"""The compare screen as the tests read and drive it: its model (`CompareView`) and its
controllers' state, typed, and the few things a test does besides pressing keys (show
a session, post what a worker thread would post). One place that knows where each
fact lives, so a test says `drive(app).fork` instead of reaching into the screen."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from specdiff.compare import Fork
from specdiff.lanes import Pair
from specdiff.results import PairResult
from specdiff.sessions.playback import Playback
from specdiff.sessions.store import Session, load_session
from specdiff.tui.app import SpecdiffApp, make_app
from specdiff.tui.controls import RunSettings
from specdiff.tui.messages import (
    RunFailed,
    RunFinished,
    RunStarted,
    SessionLoaded,
    SessionLoadFailed,
    StatusChanged,
    StepsArrived,
)
from specdiff.tui.replay import Replay
from specdiff.tui.screen import CompareScreen, WorkerReport
from specdiff.tui.view_state import CompareView, LaneState
from specdiff.tui.widgets.styles import Palette, TokenMarks

LiveReport = RunStarted | StepsArrived | RunFinished | RunFailed
ReplayReport = SessionLoaded | SessionLoadFailed


class Driver:
    """One app's compare screen, for a test."""

    def __init__(self, app: SpecdiffApp) -> None:
        self.app = app
        self.screen: CompareScreen = app.compare

    # -- the model

    @property
    def view(self) -> CompareView:
        return self.screen.view

    @property
    def lanes(self) -> dict[str, LaneState]:
        return self.view.lanes

    @property
    def fork(self) -> Fork | None:
        return self.view.fork

    @property
    def cursor(self) -> int | None:
        return self.view.cursor

    @property
    def cursor_lane(self) -> str:
        return self.view.cursor_lane

    @property
    def result(self) -> PairResult | None:
        return self.view.result

    @property
    def running(self) -> bool:
        return self.view.running

    @property
    def session(self) -> Session | None:
        return self.view.session

    @property
    def near_tie(self) -> float:
        return self.view.near_tie

    def stats_line(self, lane_id: str, width: int | None = None) -> str:
        return self.view.stats_line(lane_id, width)

    # -- the controllers

    @property
    def replay(self) -> Replay:
        return self.screen.replay

    @property
    def playback(self) -> Playback | None:
        return self.screen.replay.playback

    @property
    def replayed(self) -> bool:
        """A replay played to its end (of what has been read)."""
        playback = self.screen.replay.playback
        return playback is not None and playback.finished

    @property
    def played_out(self) -> bool:
        """No replay plays, or it has played to its end."""
        playback = self.screen.replay.playback
        return playback is None or playback.finished

    @property
    def loading(self) -> bool:
        return self.screen.replay.loading

    @property
    def load_error(self) -> str | None:
        return self.screen.replay.load_error

    @property
    def autopsy_running(self) -> bool:
        """An autopsy is being made."""
        return self.screen.explainer.running is not None

    @property
    def worker_pid(self) -> int | None:
        return self.screen.streaming.live.worker_pid

    # -- the controls and what is drawn

    @property
    def pairs(self) -> Mapping[str, Pair]:
        return self.screen.controls.pairs

    @property
    def prompt_mode(self) -> str:
        return self.screen.controls.prompt_mode

    def resolve_pair(self) -> RunSettings:
        return self.screen.controls.resolve_pair()

    def marks(self, lane_id: str) -> TokenMarks:
        return self.screen.drawing.marks(lane_id)

    def palette(self) -> Palette:
        return Palette.from_theme(self.app.current_theme)

    @property
    def status(self) -> str:
        """The status line's text, all of it (not what fits)."""
        return self.screen.status_line.plain

    def record_statuses(self) -> list[str]:
        """From now on, every status the screen says, in order."""
        said: list[str] = []
        line = self.screen.status_line
        say = line.say
        line.say = lambda text: (said.append(text), say(text))[1]  # type: ignore[method-assign]
        return said

    # -- what a test does besides pressing keys

    def show_session(self, session: Session) -> None:
        self.screen.apply(self.screen.replay.show_session(session))

    def say(self, text: str) -> None:
        """The status line says `text`, as a controller would have it."""
        self.screen.apply([StatusChanged(text)])

    def post(self, report: LiveReport | ReplayReport) -> None:
        """Post `report` as the live run's (or the replay's) worker thread would."""
        if isinstance(report, (SessionLoaded, SessionLoadFailed)):
            self.screen.host.post(self.screen.replay.receive, report)
        else:
            self.screen.host.post(self.screen.streaming.receive, report)

    def set_running(self, running: bool) -> None:
        """The lanes are generating (or not), as a live run's start says."""
        self.screen.apply(self.screen.streaming.set_running(running))

    def run(self) -> None:
        self.screen.action_run()

    def move(self, delta: int) -> None:
        self.screen.action_move(delta)

    def panes(self) -> None:
        self.screen.action_panes()

    def toggle_prompt_mode(self) -> None:
        self.screen.action_toggle_prompt_mode()


def drive(app: SpecdiffApp) -> Driver:
    """The compare screen of `app`, for a test."""
    return Driver(app)


def reports(messages: Iterable[object]) -> list[object]:
    """What the worker threads reported, among the messages an app's hook saw."""
    return [message.report for message in messages if isinstance(message, WorkerReport)]


def session_app(path: Path) -> SpecdiffApp:
    """The app replaying the session at `path`, its pair the only one offered."""
    session = load_session(path)
    return make_app(
        {session.pair.name: session.pair},
        session.pair.name,
        session.prompt,
        session.header.max_tokens,
        session=session,
    )


def rendered_lines(app: SpecdiffApp) -> list[str]:
    """The screen's rows as text, as the terminal shows them."""
    strips = app.screen._compositor.render_strips()
    return ["".join(segment.text for segment in strip) for strip in strips]
