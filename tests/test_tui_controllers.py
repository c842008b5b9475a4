"""The compare screen's controllers without a screen: a live run's streaming, a replay's
playback, the fork autopsy, the files written, the keys that move the cursor and the `r`
that asks before closing a replay. Each changes the model and returns what changed;
here a fake host stands in for the screen's threads and timers, and no app is built."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from specdiff.autopsy import AutopsyStage
from specdiff.engine.base import LiveStats
from specdiff.lanes import Lane, Pair, presets
from specdiff.results import LaneOutcome, PairResult
from specdiff.sessions.store import Session, load_session
from specdiff.tui import navigation
from specdiff.tui.explain import AutopsyProgressed, ForkExplainer
from specdiff.tui.host import IsCancelled
from specdiff.tui.live import LiveRun, Streaming
from specdiff.tui.messages import (
    Alerted,
    AutopsyProgress,
    Changes,
    CursorMoved,
    ForkFound,
    FrameDue,
    KeysChanged,
    Noted,
    PairShown,
    ReplayShown,
    RunAgain,
    RunFailed,
    RunFinished,
    RunningChanged,
    RunStarted,
    StatusChanged,
    StepsArrived,
)
from specdiff.tui.output import OutputFiles
from specdiff.tui.replay import CONFIRM_SECONDS, REPLAY_TICK, Replay, RunConfirmation
from specdiff.tui.view_state import CompareView

SESSION = Path(__file__).parent / "data" / "ubatch-roman-empire.jsonl"
CONTROLLERS = (
    "view_state",
    "messages",
    "host",
    "options",
    "live",
    "replay",
    "explain",
    "output",
    "navigation",
)


class Timer:
    """A timer the fake host set: fired by the test."""

    def __init__(self, seconds: float, callback: Callable[[], Changes]) -> None:
        self.seconds, self.callback, self.stopped = seconds, callback, False

    def stop(self) -> None:
        self.stopped = True


class FakeHost:
    """The screen as a controller sees it: work and timers are recorded, not run."""

    columns = 120

    def __init__(self) -> None:
        self.threads: list[tuple[str, Callable[[IsCancelled], None]]] = []
        self.timers: list[Timer] = []
        self.posted: list[tuple[Callable[[object], Changes], object]] = []
        self.cancelled: list[str] = []

    def post(self, receiver: Callable[[object], Changes], report: object) -> None:
        self.posted.append((receiver, report))

    def run_in_thread(
        self, work: Callable[[IsCancelled], None], group: str, exclusive: bool = True
    ) -> None:
        self.threads.append((group, work))

    def cancel_group(self, group: str) -> None:
        self.cancelled.append(group)

    def later(self, seconds: float, callback: Callable[[], Changes]) -> Timer:
        self.timers.append(Timer(seconds, callback))
        return self.timers[-1]

    every = later

    def after_refresh(self, callback: Callable[[], None]) -> None:
        callback()


def kinds(changes: Changes) -> list[type]:
    return [type(change) for change in changes]


def session() -> Session:
    return load_session(SESSION)


def result_of(recorded: Session) -> PairResult:
    header = recorded.header
    return PairResult(
        pair=recorded.pair,
        prompt=recorded.prompt,
        prompt_tokens=list(header.prompt_token_ids),
        max_tokens=header.max_tokens,
        a=LaneOutcome("a", recorded.pair.a, list(recorded.steps["a"]), stop_reason="length"),
        b=LaneOutcome("b", recorded.pair.b, list(recorded.steps["b"]), stop_reason="length"),
        comparison=recorded.comparison(),
        build=dict(header.build),
        started=header.created,
    )


def streaming() -> tuple[Streaming, CompareView, FakeHost]:
    view, host = CompareView(presets()["ubatch"]), FakeHost()
    return Streaming(view, LiveRun(view.near_tie, control=False), host), view, host


def test_the_controllers_import_no_textual() -> None:
    imports = "; ".join(f"import specdiff.tui.{name}" for name in CONTROLLERS)
    code = f"import sys; {imports}; print('textual' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_a_live_run_starts_in_a_thread_and_says_what_it_loads() -> None:
    controller, view, host = streaming()
    pair = presets()["ubatch"]
    changes = controller.start(pair, "Hello", 8)
    try:
        assert view.running and view.pair == pair and view.session is None
        assert kinds(changes) == [ReplayShown, PairShown, FrameDue, RunningChanged, StatusChanged]
        assert changes[2] == FrameDue(follow=True) and changes[-1] == StatusChanged(
            "loading ubatch…"
        )
        assert [group for group, _ in host.threads] == ["generation"]
        assert controller.stop() == [StatusChanged("stopping…")] and controller.live.cancel.is_set()
    finally:
        controller.set_running(False)  # gives back what the run set aside from collection


def test_steps_are_drawn_at_the_pacers_pace_and_held_back_ones_by_a_timer() -> None:
    controller, view, host = streaming()
    recorded = session()
    a, b = recorded.steps["a"], recorded.steps["b"]
    live = {"a": LiveStats(40.0), "b": LiveStats(30.0, 4, 3)}
    assert controller.receive(RunStarted(7))[0] == StatusChanged(
        "generating up to 0 tokens a lane · prompt 7 tokens"
    )
    first = controller.receive(StepsArrived([*a[:3], *b[:3]], live))
    assert first == [FrameDue(follow=True, details=True)]  # the first frame, and a panel
    assert view.lanes["b"].speed == 30.0 and view.lanes["b"].accepted == 3
    controller.pacer.frame_due = lambda: False  # type: ignore[method-assign]
    assert controller.receive(StepsArrived([a[3], b[3]], live)) == []
    assert len(view.lanes["a"].steps) == 4  # kept, drawn later
    (timer,) = host.timers
    view.running = True
    assert kinds(timer.callback()) == [FrameDue]


def test_a_frame_that_finds_the_fork_says_so_and_draws_the_details() -> None:
    controller, view, _host = streaming()
    recorded = session()
    fork = recorded.comparison().fork
    assert fork is not None
    steps = [*recorded.steps["a"][: fork.index + 1], *recorded.steps["b"][: fork.index + 1]]
    changes = controller.receive(StepsArrived(steps, {}))
    assert changes == [ForkFound(True), FrameDue(follow=False, details=True)]
    assert view.fork is not None and view.cursor == fork.index


def test_a_finished_run_compares_the_lanes_and_a_restart_runs_again() -> None:
    controller, view, _host = streaming()
    recorded = session()
    view.add([*recorded.steps["a"], *recorded.steps["b"]])  # as they streamed
    controller.live.restart = True
    changes = controller.receive(RunFinished(result_of(recorded)))
    assert kinds(changes) == [RunningChanged, ForkFound, FrameDue, StatusChanged, RunAgain]
    assert view.result is not None and view.fork is not None and not view.running
    status = changes[3]
    assert isinstance(status, StatusChanged) and status.text.startswith("d jumps to the fork")
    assert not controller.live.restart


def test_a_failed_lane_stops_the_other_and_is_named_once() -> None:
    controller, view, _host = streaming()
    changes = controller.receive(RunFailed("no such model file", "b"))
    assert Alerted("lane b: no such model file", "error", 10) in changes
    assert view.stopped_by == "b" and view.lanes["b"].error == "no such model file"
    assert view.lanes["a"].error is None and changes[-1] == FrameDue(follow=False)


def test_a_session_shown_at_once_is_compared_and_named_in_the_status() -> None:
    view, host = CompareView(presets()["ubatch"]), FakeHost()
    replay = Replay(view, host, Streaming(view, LiveRun(0.5, False), host).pacer, None, None, False)
    recorded = session()
    changes = replay.show_session(recorded)
    assert kinds(changes) == [PairShown, ReplayShown, ForkFound, FrameDue, StatusChanged]
    assert changes[2] == ForkFound(announce=False) and view.replaying
    status = changes[-1]
    assert isinstance(status, StatusChanged) and status.text.startswith("REPLAY ")
    assert view.pair == recorded.pair and view.fork is not None


def test_a_played_replay_ticks_pauses_and_steps_one_token() -> None:
    view, host = CompareView(presets()["ubatch"]), FakeHost()
    pacer = Streaming(view, LiveRun(0.5, False), host).pacer
    replay = Replay(view, host, pacer, 1.0, None, False)
    changes = replay.show_session(session())
    assert FrameDue(follow=True) in changes and KeysChanged() in changes
    (tick,) = host.timers
    assert tick.seconds == REPLAY_TICK
    paused = replay.toggle_pause()
    assert replay.playback is not None and replay.playback.paused
    assert isinstance(paused[-1], StatusChanged) and "paused" in paused[-1].text
    stepped = replay.step(1)
    assert CursorMoved("a", 0) in stepped or CursorMoved("b", 0) in stepped
    assert view.cursor == 0
    assert replay.stop() == [KeysChanged()] and tick.stopped


def test_r_over_a_replay_asks_once_and_another_key_disarms_it() -> None:
    view, host = CompareView(presets()["ubatch"]), FakeHost()
    replay = Replay(view, host, Streaming(view, LiveRun(0.5, False), host).pacer, None, None, False)
    replay.show_session(session())
    confirmation = RunConfirmation(replay, host)
    asked = confirmation.ask()
    assert asked is not None and "press r again" in str(asked)
    assert host.timers[-1].seconds == CONFIRM_SECONDS
    disarmed = confirmation.key_seen("d")
    assert kinds(disarmed) == [StatusChanged] and host.timers[-1].stopped
    assert confirmation.ask() is not None  # asks again
    assert confirmation.ask() is None  # the second r runs


def test_the_keys_move_the_cursor_or_say_why_not() -> None:
    view = CompareView(presets()["ubatch"])
    assert navigation.go(view, navigation.FORK) == [Noted("no fork: the lanes agree so far")]
    assert navigation.step(view, 1) == []
    recorded = session()
    view.add([*recorded.steps["a"], *recorded.steps["b"]])
    view.update_comparison()
    assert view.fork is not None
    fork = view.fork.index
    assert navigation.go(view, navigation.FORK) == [CursorMoved("a", fork, scroll_both=True)]
    assert navigation.go(view, navigation.OTHER_LANE) == [CursorMoved("b", fork)]
    assert navigation.step(view, -1) == [CursorMoved("b", fork - 1)]
    assert navigation.select(view, "a", 10_000) == []


def test_the_autopsy_says_why_it_cannot_start_without_a_finished_run() -> None:
    view, host = CompareView(presets()["ubatch"]), FakeHost()
    explainer = ForkExplainer(view, host)
    assert explainer.toggle() == [Noted("w explains a fork: run the pair first (r)")]
    view.running = True
    assert explainer.toggle() == [
        Noted("w explains a finished run: wait for it to end (x stops it)")
    ]
    assert explainer.escape() is None  # nothing to stop or close: the key goes on
    view.running = False
    server = Lane(backend="server", endpoint="http://127.0.0.1:1")
    view.pair = Pair("servers", server, server)
    view.result = result_of(session())
    (note,) = explainer.toggle()
    assert isinstance(note, Noted) and note.text.startswith("w explains in-process lanes only")
    assert host.threads == []


def test_nothing_is_saved_or_reported_mid_run_or_before_one(tmp_path: Path) -> None:
    view, output = CompareView(presets()["ubatch"]), OutputFiles(tmp_path)
    (said,) = output.save_shown(view, 80)
    assert said == Alerted("nothing to save yet: run a pair first", "warning", None)
    view.running = True
    (said,) = output.report_shown(view, 80)
    assert isinstance(said, Alerted) and "the run is still going" in said.text
    view.running = False
    view.result = result_of(session())
    (said,) = output.save_shown(view, 200)
    assert isinstance(said, StatusChanged) and said.text.startswith("saved: ")
    (again,) = output.save_shown(view, 200)
    assert isinstance(again, StatusChanged) and again.text.startswith("already saved: ")


def test_the_autopsys_progress_shows_the_engines_estimate_of_the_time_left() -> None:
    view, host = CompareView(presets()["ubatch"]), FakeHost()
    view.result = result_of(session())
    explainer = ForkExplainer(view, host)
    explainer.toggle()
    target = explainer.running
    assert target is not None and [group for group, _ in host.threads] == ["autopsy"]
    first, second = (
        explainer.receive(AutopsyProgressed(target, stage))
        for stage in (AutopsyStage("the pair as given", 1, 8), AutopsyStage("repack off", 3, 8, 40))
    )
    assert first[1] == StatusChanged("explaining the fork · w or escape stops")
    assert first[0] == AutopsyProgress(
        explainer.title(target, "explaining"), "run 1/8: the pair as given", 0, 9
    )
    assert second[1] == StatusChanged("explaining the fork · about 40 s left · w or escape stops")
    assert isinstance(second[0], AutopsyProgress) and second[0].done == 2
    assert second[0].line == "run 3/8: repack off · about 40 s left · fewer max tokens is faster"
    assert explainer.stop() == [StatusChanged("stopping the autopsy…")]
    # a stage that arrives while the autopsy stops moves the bar, not the status line
    late = explainer.receive(AutopsyProgressed(target, AutopsyStage("KV cache f32", 4, 8, 30)))
    assert kinds(late) == [AutopsyProgress]
