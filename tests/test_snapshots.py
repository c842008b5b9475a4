"""Pictures of the screen, from recorded sessions so they are stable (no model involved).

At 80x24 and 200x50, from the bundled demo session in sessions/: lanes streaming mid-run
(before the fork, the lane ahead showing its forecast), the fork panel, the aligned view
and the panes after it, a replay at its end, help and the command palette. At 80x24 and
120x40 in every bundled theme: the fork, a theme switch, the panel past the fork.
Update them after an intended change with: python3 -m pytest tests/test_snapshots.py
--snapshot-update, and look at the pictures before committing.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.pilot import Pilot

from specdiff.engine.base import LiveStats
from specdiff.lanes import presets
from specdiff.sessions.store import load_session
from specdiff.tui import live
from specdiff.tui.app import SpecdiffApp, make_app
from specdiff.tui.messages import StepsArrived
from specdiff.tui.themes import load_themes
from tests.conftest import wait_for
from tests.test_tui import fork_in_view
from tests.tui_driver import drive

SESSION = Path(__file__).parent / "data" / "ubatch-roman-empire.jsonl"
DEMO = Path(__file__).resolve().parent.parent / "sessions"
DEMO_SESSION = DEMO / "20261129T095647Z-spec-vs-plain-cd1458d9.jsonl"
THEMES = Path(__file__).resolve().parent.parent / "themes"
SIZES = {"80x24": (80, 24), "120x40": (120, 40)}
SMALL_AND_LARGE = {"80x24": (80, 24), "200x50": (200, 50)}


@pytest.fixture(autouse=True)
def from_the_checkout(monkeypatch: pytest.MonkeyPatch) -> None:
    """The status line names the session by its path from the current folder, so the
    pictures read the same wherever the checkout lies."""
    monkeypatch.chdir(DEMO.parent)


def demo_app(speed: float | None = None) -> SpecdiffApp:
    """The bundled demo session (spec-vs-plain, forks at token 46): shown at once, or
    replayed at `speed`."""
    session = load_session(DEMO_SESSION)
    return make_app(
        presets(),
        session.pair.name,
        session.prompt,
        session.header.max_tokens,
        session=session,
        theme_dirs=[THEMES],
        replay_speed=speed,
    )


def live_app() -> SpecdiffApp:
    """The demo session's pair and prompt, no run started: the steps come from the test."""
    session = load_session(DEMO_SESSION)
    return make_app(
        presets(),
        session.pair.name,
        session.prompt,
        session.header.max_tokens,
        autostart=False,
        theme_dirs=[THEMES],
    )


def session_app(theme: str | None = None, speed: float | None = None) -> SpecdiffApp:
    """The demo session in the app: at once, or replayed at `speed`."""
    session = load_session(SESSION)
    return make_app(
        presets(),
        "ubatch",
        session.prompt,
        60,
        session=session,
        theme_name=theme,
        theme_dirs=[THEMES],
        replay_speed=speed,
    )


@pytest.mark.parametrize("size", sorted(SIZES))
@pytest.mark.parametrize("theme", sorted(load_themes([THEMES]).themes))
def test_at_the_fork(snap_compare, theme: str, size: str) -> None:
    assert snap_compare(session_app(theme), press=["d"], terminal_size=SIZES[size])


@pytest.mark.parametrize(
    ("start", "size"), [("specdiff-light", "120x40"), ("specdiff-dark", "80x24")]
)
def test_theme_switch_restyles_the_panes(snap_compare, start: str, size: str) -> None:
    # light -> dark and dark -> high-contrast: the themes cycle in name order
    assert snap_compare(session_app(start), press=["d", "t"], terminal_size=SIZES[size])


def test_panel_past_the_fork(snap_compare) -> None:
    assert snap_compare(session_app(), press=["d", "n"], terminal_size=SIZES["120x40"])


def test_bundled_themes_all_load() -> None:
    found = load_themes([THEMES])
    assert found.problems == []
    assert {"specdiff-dark", "specdiff-light", "specdiff-high-contrast"} <= set(found.themes)


# -- the states a newcomer meets, at 80x24 and 200x50, from the bundled demo session --


@pytest.mark.parametrize("size", sorted(SMALL_AND_LARGE))
def test_streaming_mid_run_lane_a_ahead_before_the_fork(
    snap_compare, monkeypatch: pytest.MonkeyPatch, size: str
) -> None:
    """Lane a 40 tokens in, lane b 30: streamed as the generation thread posts them (each
    batch drawn), no fork yet, the lane ahead marking where the forecast expects one."""
    monkeypatch.setattr(live, "FRAME_CPU_SHARE", 1.0)
    monkeypatch.setattr(live, "PANEL_SECONDS", 0.0)
    steps = load_session(DEMO_SESSION).steps
    speeds = {"a": LiveStats(65.0, 12, 9), "b": LiveStats(52.3)}

    async def stream(pilot: Pilot) -> None:
        screen = drive(pilot.app)  # type: ignore[arg-type]
        screen.set_running(True)
        for end in (10, 20, 30, 40):
            batch = [*steps["a"][end - 10 : end], *steps["b"][end - 10 : min(end, 30)]]
            screen.post(StepsArrived(batch, speeds))
            await pilot.pause()
        screen.say("generating: 7-token prompt, up to 200 tokens per lane")

    app = live_app()
    assert snap_compare(app, run_before=stream, terminal_size=SMALL_AND_LARGE[size])


@pytest.mark.parametrize("size", sorted(SMALL_AND_LARGE))
def test_fork_panel_at_the_fork(snap_compare, size: str) -> None:
    assert snap_compare(demo_app(), press=["d"], terminal_size=SMALL_AND_LARGE[size])


@pytest.mark.parametrize("size", sorted(SMALL_AND_LARGE))
def test_aligned_view_of_the_branches(snap_compare, size: str) -> None:
    assert snap_compare(demo_app(), press=["d", "a"], terminal_size=SMALL_AND_LARGE[size])


@pytest.mark.parametrize("size", sorted(SMALL_AND_LARGE))
def test_panes_back_from_the_aligned_view(snap_compare, size: str) -> None:
    """The panes as they were before `a`: each laid out at its own width again."""
    press = ["d", "a", "escape"]
    assert snap_compare(demo_app(), press=press, terminal_size=SMALL_AND_LARGE[size])


@pytest.mark.parametrize("size", sorted(SMALL_AND_LARGE))
def test_replay_at_its_end(snap_compare, size: str) -> None:
    async def to_the_end(pilot: Pilot) -> None:
        app = pilot.app
        await wait_for(pilot, lambda: drive(app).replayed, 60)
        await wait_for(pilot, lambda: fork_in_view(app), 20, "the fork in both panes")
        await pilot.pause()

    app = demo_app(speed=1000.0)
    assert snap_compare(app, run_before=to_the_end, terminal_size=SMALL_AND_LARGE[size])


@pytest.mark.parametrize("size", sorted(SMALL_AND_LARGE))
def test_help_first_page(snap_compare, size: str) -> None:
    press = ["question_mark"]
    assert snap_compare(demo_app(), press=press, terminal_size=SMALL_AND_LARGE[size])


@pytest.mark.parametrize("size", sorted(SMALL_AND_LARGE))
def test_command_palette_lists_specdiffs_commands(snap_compare, size: str) -> None:
    async def open_palette(pilot: Pilot) -> None:
        app = pilot.app
        await pilot.press("ctrl+p")
        await wait_for(pilot, lambda: type(app.screen).__name__ == "CommandPalette", 10)
        for field in app.screen.query("Input"):
            field.cursor_blink = False  # type: ignore[attr-defined]
        # the palette marks itself ready once every command is listed
        await wait_for(pilot, lambda: app.screen.has_class("-ready"), 10, "the commands listed")
        await pilot.pause()

    app = demo_app()
    assert snap_compare(app, run_before=open_palette, terminal_size=SMALL_AND_LARGE[size])


@pytest.mark.parametrize("size", sorted(SMALL_AND_LARGE))
def test_the_fork_autopsy_in_the_panel(snap_compare, size: str) -> None:
    """w over a replay whose autopsy was saved beside its session: shown without a model."""
    assert snap_compare(session_app(), press=["w"], terminal_size=SMALL_AND_LARGE[size])
