"""A replay as a presenter shows it, driven by Textual's pilot on the bundled sessions:
a build-up before the fork, REPLAY and the file named at 80 columns, both panes back
at the fork at the end, space named for what it does, x saying why it does nothing,
and a recording from another CPU said to be one."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.worker import Worker, WorkerState

from specdiff.compare import compare
from specdiff.lanes import presets
from specdiff.sessions.store import load_session
from specdiff.tui.app import SpecdiffApp, make_app
from specdiff.tui.machine import recorded_elsewhere
from specdiff.tui.messages import MachineCompared
from specdiff.tui.replay import BUILD_UP_SECONDS
from tests.conftest import wait_for
from tests.test_tui import fork_in_view, token_in_view
from tests.tui_driver import drive, reports

DEMOS = sorted((Path(__file__).parent.parent / "sessions").glob("*.jsonl"))
QUICK = next(path for path in DEMOS if "cache-vs-fresh" in path.name)
"""Its fork comes 0.44 recorded seconds in: without a build-up, a blink."""


def demo_app(path: Path, speed: float = 1.0, pause_at_fork: bool = True) -> SpecdiffApp:
    session = load_session(path)
    return make_app(
        presets() | {session.pair.name: session.pair},
        session.pair.name,
        session.prompt,
        session.header.max_tokens,
        session=session,
        replay_speed=speed,
        pause_at_fork=pause_at_fork,
    )


def status(app: SpecdiffApp) -> str:
    return str(app.query_one("#status").plain)


def space_label(app: SpecdiffApp) -> str:
    """What the footer says space does ("" while the footer is being composed again)."""
    # by the widget's type name: Textual's footer keys are not public API
    keys = [key for key in app.query("FooterKey") if key.key == "space"]
    return str(keys[0].description) if keys else ""


def machine_checked(messages: list[object]) -> bool:
    """The worker that compares the recording's CPU with this machine's has ended."""
    return any(
        isinstance(message, Worker.StateChanged)
        and message.worker.group == "machine"
        and message.state == WorkerState.SUCCESS
        for message in messages
    )


async def footer_says(pilot, app: SpecdiffApp, label: str) -> None:
    await wait_for(pilot, lambda: space_label(app) == label, 5)


async def test_pause_at_fork_builds_up_to_the_fork_then_plays_at_the_asked_pace() -> None:
    app = demo_app(QUICK)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: drive(app).playback is not None, 10, "the playback")
        playback, replay = drive(app).playback, drive(app).replay
        at_fork = replay.fork_offset()
        assert at_fork is not None and at_fork < BUILD_UP_SECONDS  # a quick recording
        # slowed so the fork comes BUILD_UP_SECONDS in: the tokens before it stream
        assert playback.speed == pytest.approx(at_fork / BUILD_UP_SECONDS)
        assert drive(app).fork is None and "building up to the fork" in status(app)
        await wait_for(pilot, lambda: playback.paused, 30)
        assert drive(app).fork is not None and playback.speed == 1.0
        assert "paused at the fork" in status(app)


async def test_the_status_line_says_replay_and_names_the_file_at_80_columns() -> None:
    app = demo_app(QUICK, speed=1000.0, pause_at_fork=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: drive(app).playback.finished, 20)
        await wait_for(pilot, lambda: status(app).startswith("REPLAY "), 5, "the REPLAY status")
        line = status(app)
        assert line.startswith("REPLAY ") and f"{QUICK.name} · " in line
        assert line.index(QUICK.name) + len(QUICK.name) < 80  # the name whole on screen


@pytest.mark.parametrize("path", DEMOS, ids=lambda path: path.name.split("-", 1)[1])
async def test_at_the_end_both_panes_show_the_fork_not_the_tail(path: Path) -> None:
    """Resumed after the pause at the fork, the panes follow the text to the end; once
    it is over they go back to the fork."""
    fork = compare(*load_session(path).steps.values()).fork
    assert fork is not None
    app = demo_app(path, speed=50.0)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: drive(app).playback.paused, 30)
        await pilot.press("space")
        await wait_for(pilot, lambda: drive(app).playback.finished, 30)
        await wait_for(pilot, lambda: fork_in_view(app), 20)  # once laid out
        assert drive(app).cursor == fork.index
        for lane_id in ("a", "b"):
            last = len(drive(app).lanes[lane_id].steps) - 1
            assert not token_in_view(app, lane_id, last), lane_id


async def test_space_is_named_for_what_it_does_and_x_says_why_it_does_nothing() -> None:
    app = demo_app(QUICK, speed=0.5)
    async with app.run_test(size=(120, 40)) as pilot:
        await footer_says(pilot, app, "pause")
        await pilot.press("space")
        assert drive(app).playback.paused
        await footer_says(pilot, app, "resume")
        drive(app).playback.speed = 1000.0
        await pilot.press("space")
        await wait_for(pilot, lambda: drive(app).playback.paused, 20)  # at the fork
        await pilot.press("space")
        await wait_for(pilot, lambda: drive(app).playback.finished, 20)
        await footer_says(pilot, app, "replay")
        assert "x" not in [key.key for key in app.query("FooterKey")]
        await pilot.press("x")
        assert status(app).startswith("x stops a live run; this is a recording")
        await pilot.press("space")  # plays it again
        playback = drive(app).playback
        await wait_for(
            pilot,
            lambda: not playback.finished or len(drive(app).lanes["a"].steps) < 200,
            5,
            "the replay to start again",
        )


def test_a_recording_from_another_cpu_says_so_and_one_from_here_does_not() -> None:
    """The rule `specdiff verify` uses, on a recording's build against another."""
    recorded = dict(load_session(QUICK).header.build)
    here = dict(recorded, cpu="Some Other CPU", system_info="CPU : AVX512 = 1 | AVX2 = 1 |")
    line = recorded_elsewhere(recorded, here)
    assert line is not None and line.startswith("recorded on another CPU")
    assert "Some Other CPU" in line and "may fork elsewhere" in line
    assert recorded_elsewhere(recorded, dict(recorded)) is None


async def test_the_replay_command_compares_the_recording_with_this_machine() -> None:
    """From the command line, the replay asks a worker process for this machine's
    llama.cpp build (no model) and says when the recording's CPU differs."""
    from specdiff.cli import build_parser
    from specdiff.cli.replay import open_for_replay, replay_app
    from specdiff.tui.machine import this_machine

    args = build_parser().parse_args(["replay", str(QUICK), "--instant"])
    session, stream = open_for_replay(args.session)
    here = this_machine()
    expected = recorded_elsewhere(dict(session.header.build), here)
    messages: list[object] = []
    try:
        app = replay_app(session, stream, args)
        async with app.run_test(size=(200, 50), message_hook=messages.append) as pilot:
            await wait_for(pilot, lambda: machine_checked(messages), 60, "the machine check")
            await pilot.pause()  # what the check posted before it ended is handled
            replay = drive(app).replay
            said = [report for report in reports(messages) if isinstance(report, MachineCompared)]
            if expected is None:  # recorded on a machine like this one: nothing to say
                assert said == [] and replay.elsewhere is None
            else:
                await wait_for(pilot, lambda: replay.elsewhere is not None, 10)
                assert [report.line for report in said] == [expected]
                assert replay.elsewhere == expected
                assert "recorded on another CPU" in status(app)
    finally:
        stream.close()
