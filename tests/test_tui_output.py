"""What the app writes, driven by Textual's pilot: a run is saved once whichever of `s`
and `e` comes first, screenshots go to their own folder, and the status line names each
file whole at 80 columns. The finished run is a recorded one handed to the screen as a
live run's end (no model needed)."""

from __future__ import annotations

from pathlib import Path

from specdiff.lanes import presets
from specdiff.results import LaneOutcome, PairResult
from specdiff.sessions.store import load_session
from specdiff.tui.app import SpecdiffApp, make_app
from specdiff.tui.messages import RunFinished
from tests.conftest import wait_for
from tests.tui_driver import drive

DEMO = sorted((Path(__file__).parent.parent / "sessions").glob("*.jsonl"))[0]


def recorded_result(path: Path = DEMO) -> PairResult:
    session = load_session(path)
    header = session.header
    return PairResult(
        pair=session.pair,
        prompt=session.prompt,
        prompt_tokens=list(header.prompt_token_ids),
        max_tokens=header.max_tokens,
        a=LaneOutcome("a", session.pair.a, list(session.steps["a"]), stop_reason="length"),
        b=LaneOutcome("b", session.pair.b, list(session.steps["b"]), stop_reason="length"),
        comparison=session.comparison(),
        build=dict(header.build),
        started=header.created,
    )


def finished_app(folder: Path) -> SpecdiffApp:
    result = recorded_result()
    pairs = presets() | {result.pair.name: result.pair}
    return make_app(
        pairs, result.pair.name, result.prompt, 200, autostart=False, sessions_dir=folder
    )


def status(app: SpecdiffApp) -> str:
    return str(app.query_one("#status").plain)


async def test_e_then_s_saves_the_run_once_and_names_the_file(tmp_path: Path) -> None:
    folder = tmp_path / "a-rather-long-folder-name-for-the-sessions" / "of-this-machine"
    app = finished_app(folder)
    async with app.run_test(size=(80, 24)) as pilot:
        drive(app).post(RunFinished(recorded_result()))
        await wait_for(pilot, lambda: drive(app).result is not None, 10)
        await pilot.press("e")
        await pilot.pause()
        (saved,) = folder.glob("*.jsonl")
        (report,) = folder.glob("*.html")
        said = status(app)
        assert said.endswith(f"{report.name} + .jsonl") and len(said) <= 80
        assert saved.stem == report.stem
        await pilot.press("s")
        await pilot.pause()
        assert list(folder.glob("*.jsonl")) == [saved]
        assert saved.name in status(app) and "already saved" in status(app)
        assert len(status(app)) <= 80


async def test_s_twice_writes_one_file(tmp_path: Path) -> None:
    app = finished_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        drive(app).post(RunFinished(recorded_result()))
        await wait_for(pilot, lambda: drive(app).result is not None, 10)
        await pilot.press("s")
        await pilot.pause()
        (saved,) = tmp_path.glob("*.jsonl")
        assert status(app).startswith("saved: ") and saved.name in status(app)
        await pilot.press("s")
        await pilot.pause()
        assert list(tmp_path.glob("*.jsonl")) == [saved]


async def test_a_screenshot_goes_to_its_own_folder_and_is_named(tmp_path: Path) -> None:
    sessions = tmp_path / "sessions"
    app = finished_app(sessions)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        app.deliver_screenshot()
        await wait_for(pilot, lambda: list(tmp_path.rglob("*.svg")), 10)
        (shot,) = tmp_path.rglob("*.svg")
        assert shot.parent == tmp_path / "screenshots"
        assert not sessions.exists() or not list(sessions.glob("*.svg"))
        assert status(app).startswith("screenshot saved: ") and shot.name in status(app)


def shaded(app: SpecdiffApp, lane_id: str) -> set[int]:
    """The token indices a lane's pane draws with a near-tie shade."""
    from specdiff.tui.widgets import TokenView

    view = app.query_one(f"#lane-{lane_id} TokenView", TokenView)
    return {
        index
        for index, step in enumerate(drive(app).lanes[lane_id].steps)
        if view.marks.look(lane_id, index, step).shade is not None
    }


async def test_n_visits_exactly_the_tokens_shaded_as_near_ties() -> None:
    """From the start, n goes through every shaded token of the current lane and no
    other, in both lanes; the demo sessions have near ties after their fork too."""
    session = load_session(DEMO)
    app = make_app(
        presets() | {session.pair.name: session.pair},
        session.pair.name,
        session.prompt,
        session.header.max_tokens,
        session=session,
    )
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert drive(app).fork is not None
        after_fork = [
            i
            for i, s in enumerate(drive(app).lanes["a"].steps)
            if i > drive(app).fork.index and s.margin < 0.5
        ]
        assert after_fork, "the demo has near ties after its fork (what n used to visit)"
        for lane_id in ("a", "b"):
            if drive(app).cursor_lane != lane_id:
                await pilot.press("l")
            drive(app).view.cursor = None
            visited: list[int] = []
            for _ in range(200):
                before = drive(app).cursor
                await pilot.press("n")
                if drive(app).cursor == before:
                    break
                visited.append(drive(app).cursor)
            assert visited and set(visited) == shaded(app, lane_id), lane_id
            assert "near ties end there" in status(app)


async def test_a_status_line_too_long_for_the_screen_is_cut_not_wrapped() -> None:
    """A line that ends in a long word (a path) shows its start, then "…": never the
    first row of the line wrapped, which drops the whole word."""
    app = finished_app(Path("unused"))
    async with app.run_test(size=(80, 24)) as pilot:
        words = "report written: " + "x" * 70 + ".html"
        drive(app).say(words)
        await pilot.pause()
        shown = "".join(segment.text for segment in app.query_one("#status").render_line(0))
        assert shown.startswith("report written: xxxx") and shown.rstrip().endswith("…")
