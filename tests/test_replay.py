"""Replaying a session at its recorded pace: the playback clock and the TUI's keys."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from specdiff.cli import main
from specdiff.lanes import presets
from specdiff.sessions.playback import (
    MAX_GAP_SECONDS,
    Playback,
    PlaybackError,
    check_speed,
    offsets_of,
)
from specdiff.sessions.store import load_session
from specdiff.tui.app import make_app
from specdiff.tui.paths import shown_path
from tests.conftest import wait_for
from tests.tui_driver import drive

SESSION = Path(__file__).parent / "data" / "ubatch-roman-empire.jsonl"


def recorded():
    return load_session(SESSION).recorded_steps()


def test_recorded_order_is_the_file_order() -> None:
    lines = [json.loads(line) for line in SESSION.read_text(encoding="utf-8").splitlines()]
    in_file = [(r["lane"], r["index"]) for r in lines if r["type"] == "step"]
    assert [(s.lane, s.index) for s in recorded()] == in_file


def test_offsets_follow_the_timestamps_and_cap_long_gaps() -> None:
    steps = recorded()[:4]
    steps[2] = replace(steps[2], timestamp=steps[1].timestamp + 600.0)
    steps[3] = replace(steps[3], timestamp=steps[2].timestamp + 0.25)
    offsets = offsets_of(steps)
    assert offsets[0] == 0.0
    assert offsets[1] == pytest.approx(steps[1].timestamp - steps[0].timestamp)
    assert offsets[2] == pytest.approx(offsets[1] + MAX_GAP_SECONDS)
    assert offsets[3] == pytest.approx(offsets[2] + 0.25)
    assert offsets == sorted(offsets)


def test_advance_plays_at_the_recorded_pace_times_the_speed() -> None:
    steps = recorded()
    playback = Playback(steps, speed=2.0)
    half = playback.duration / 2
    due = playback.advance(half / 2)  # wall time: half the session at 2x
    assert due == steps[: len(due)]
    assert all(offset <= half for offset in playback.offsets[: len(due)])
    assert playback.offsets[len(due)] > half
    rest = playback.advance(playback.duration)
    assert due + rest == steps and playback.finished
    assert playback.advance(1.0) == []


def test_a_paused_playback_does_not_move_and_steps_one_at_a_time() -> None:
    steps = recorded()
    playback = Playback(steps)
    playback.paused = True
    assert playback.advance(100.0) == []
    assert playback.forward() == steps[0]
    assert playback.forward() == steps[1]
    assert playback.back() == steps[1]
    assert playback.position == 1
    assert playback.back() == steps[0]
    assert playback.back() is None
    playback.paused = False
    assert playback.advance(0.0) == [steps[0]]  # the first step is due at once


def test_through_shows_both_lanes_up_to_an_index() -> None:
    steps = recorded()
    playback = Playback(steps)
    due = playback.through(11)
    assert {(s.lane, s.index) for s in due} >= {("a", 11), ("b", 11)}
    assert max(s.index for s in due) <= 12
    assert due == steps[: len(due)]


@pytest.mark.parametrize("speed", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_speeds_are_refused(speed: float) -> None:
    with pytest.raises(PlaybackError, match="--speed"):
        check_speed(speed)


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--speed", "0"], "--speed: must be a finite number of at least 0.01"),
        (["--speed", "1e-320"], "--speed: must be a finite number of at least 0.01"),
        (["--speed", "fast"], "--speed: must be a finite number of at least 0.01"),
        (["--speed", "2", "--instant"], "not allowed with"),
    ],
)
def test_replay_command_refuses_bad_pace_options(capsys, arguments, message) -> None:
    assert main(["replay", str(SESSION), *arguments]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def replay_app(speed: float | None):
    session = load_session(SESSION)
    return make_app(presets(), "ubatch", session.prompt, 60, session=session, replay_speed=speed)


def shown(app) -> int:
    return len(drive(app).lanes["a"].steps) + len(drive(app).lanes["b"].steps)


def fewest_shown(app) -> int:
    return min(len(drive(app).lanes["a"].steps), len(drive(app).lanes["b"].steps))


async def test_replay_streams_at_the_recorded_pace_and_ends_with_the_fork() -> None:
    app = replay_app(1.0)
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.pause()
        # The session lasts about 2 s: the first frame shows only its beginning.
        assert shown(app) < 120
        drive(app).playback.speed = 1000.0
        await wait_for(pilot, lambda: drive(app).playback.finished, 20, "the replay's end")
        assert shown(app) == 120
        expected = load_session(SESSION).comparison().fork
        assert drive(app).fork is not None and drive(app).fork.index == expected.index
        status = app.query_one("#status").plain
        assert status.startswith(f"REPLAY {shown_path(SESSION)} · replayed: ")
        assert " 120/120 steps " in status


async def test_space_pauses_and_arrows_step_token_by_token() -> None:
    app = replay_app(0.01)  # slow enough that nothing but the first steps play
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.press("space")
        assert drive(app).playback.paused
        before = shown(app)
        await pilot.pause(0.2)  # time passes, as it is the point: a paused replay stays put
        assert shown(app) == before
        await pilot.press("right", "right", "right")
        assert shown(app) == before + 3
        last = drive(app).playback.steps[drive(app).playback.position - 1]
        assert (drive(app).cursor_lane, drive(app).cursor) == (last.lane, last.index)
        await pilot.press("left")
        assert shown(app) == before + 2
        assert "paused" in app.query_one("#status").plain
        await pilot.press("space")
        assert not drive(app).playback.paused


async def test_d_plays_up_to_the_fork_and_stops_there() -> None:
    app = replay_app(0.01)
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.press("d")
        assert drive(app).playback.paused
        assert drive(app).fork is not None and drive(app).fork.index == 11
        assert drive(app).cursor == 11
        assert len(drive(app).lanes["a"].steps) >= 12 and len(drive(app).lanes["b"].steps) >= 12
        # stepping back over the fork forgets it; stepping forward finds it again
        while drive(app).fork is not None:
            await pilot.press("left")
        assert min(len(drive(app).lanes["a"].steps), len(drive(app).lanes["b"].steps)) == 11
        await pilot.press("right", "right")
        assert drive(app).fork is not None and drive(app).fork.index == 11


async def test_space_at_the_end_plays_again_from_the_start() -> None:
    app = replay_app(1000.0)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: drive(app).playback.finished, 20, "the replay's end")
        drive(app).playback.speed = 0.01
        await pilot.press("space")
        assert not drive(app).playback.finished and shown(app) < 120 and drive(app).fork is None


async def test_stepping_back_keeps_split_characters_whole() -> None:
    app = replay_app(0.01)
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.press("space")
        for _ in range(40):
            await pilot.press("right")
        for _ in range(20):
            await pilot.press("left")
        for lane_id, state in drive(app).lanes.items():
            whole = b"".join(step.piece for step in state.steps).decode("utf-8", "replace")
            pending = state.decoder.decode(b"", final=True)
            assert "".join(state.texts) + pending == whole, lane_id


def big_session(path: Path, steps: int, bad_line: int | None = None) -> Path:
    """The recorded session's steps repeated and re-indexed (as the load benchmark does)."""
    records = [json.loads(line) for line in SESSION.read_text(encoding="utf-8").splitlines()]
    header, body = records[0], [r for r in records if r["type"] == "step"]
    lines = [json.dumps(header)]
    for number in range(steps):
        record = dict(body[number % len(body)])
        record["lane"] = "a" if number % 2 == 0 else "b"
        record["index"] = number // 2
        lines.append(json.dumps(record))
    if bad_line is not None:
        lines[bad_line - 1] = json.dumps(dict(body[0], index=-4))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def streamed_app(path: Path, speed: float | None):
    from specdiff.cli.replay import REPLAY_FIRST_STEPS, open_for_replay

    session, stream = open_for_replay(path)
    assert len(session.steps["a"]) + len(session.steps["b"]) == REPLAY_FIRST_STEPS
    app = make_app(
        presets(),
        "ubatch",
        session.prompt,
        60,
        session=session,
        replay_speed=speed,
        session_stream=stream,
    )
    return app, stream


@pytest.mark.parametrize("speed", [None, 1000.0])
async def test_a_long_session_opens_after_its_first_steps_and_reads_the_rest(tmp_path, speed):
    path = big_session(tmp_path / "big.jsonl", 6000)
    whole = load_session(path)
    app, stream = streamed_app(path, speed)

    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: stream.done and shown(app) == 6000)
        await wait_for(pilot, lambda: not drive(app).loading, 20, "the reading to end")
        await pilot.pause()
        assert drive(app).load_error is None
        for lane_id in ("a", "b"):
            assert drive(app).lanes[lane_id].steps == whole.steps[lane_id]
        fork = drive(app).fork
        assert fork is not None and fork.index == whole.comparison().fork.index
        assert "reading" not in app.query_one("#status").plain


async def test_a_bad_line_past_the_first_steps_is_reported_in_the_replay(tmp_path: Path) -> None:
    path = big_session(tmp_path / "bad.jsonl", 3000, bad_line=2500)
    app, stream = streamed_app(path, 1000.0)

    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: drive(app).load_error is not None)
        await wait_for(pilot, lambda: drive(app).playback.finished)
        assert f"{path}:2500:" in drive(app).load_error and "index" in drive(app).load_error
        assert shown(app) == 2498  # every good step before it still plays
        assert "unreadable past this point" in app.query_one("#status").plain


def test_a_bad_line_among_the_first_steps_stops_replay_before_it_opens(tmp_path, capsys):
    path = big_session(tmp_path / "bad.jsonl", 600, bad_line=100)
    assert main(["replay", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert f"{path}:100:" in err and "index" in err and len(err.splitlines()) == 1


async def test_a_pause_shows_the_stats_and_strips_of_every_step_shown(monkeypatch) -> None:
    from specdiff.tui import live
    from specdiff.tui.widgets import Line, MarginStrip

    # the details (stats lines, margin strips) wait for a period no test reaches
    monkeypatch.setattr(live, "PANEL_SECONDS", 3600.0)
    app = replay_app(0.3)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: fewest_shown(app) > 1, 20, "two steps in each lane")
        await pilot.press("space")
        assert drive(app).playback.paused
        for lane_id in ("a", "b"):
            steps = len(drive(app).lanes[lane_id].steps)
            assert steps > 1
            stats = app.query_one(f"#lane-{lane_id} .lane-stats", Line).plain
            assert stats.startswith(f"{steps} tokens"), (lane_id, stats)
            strip = app.query_one(f"#lane-{lane_id} MarginStrip", MarginStrip)
            assert strip.shown[0] == steps
