"""Pictures of the screen, from a fixed session so they are stable (no model involved).

At 80x24 and 120x40, in every bundled theme: the fork with its panel and legend, a theme
switch after the lanes are drawn, the aligned view, help, and the panel past the fork.
Update them after an intended change with: python3 -m pytest tests/test_snapshots.py
--snapshot-update, and look at the SVGs before committing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from specdiff.lanes import presets
from specdiff.sessions.store import load_session
from specdiff.tui.app import SpecdiffApp, make_app
from specdiff.tui.themes import load_themes

SESSION = Path(__file__).parent / "data" / "ubatch-roman-empire.jsonl"
THEMES = Path(__file__).resolve().parent.parent / "themes"
SIZES = {"80x24": (80, 24), "120x40": (120, 40)}


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


@pytest.mark.parametrize("size", sorted(SIZES))
def test_aligned_view(snap_compare, size: str) -> None:
    assert snap_compare(session_app(), press=["d", "a"], terminal_size=SIZES[size])


@pytest.mark.parametrize("size", sorted(SIZES))
def test_help_screen(snap_compare, size: str) -> None:
    assert snap_compare(session_app(), press=["question_mark"], terminal_size=SIZES[size])


def test_panel_past_the_fork(snap_compare) -> None:
    assert snap_compare(session_app(), press=["d", "n"], terminal_size=SIZES["120x40"])


def test_bundled_themes_all_load() -> None:
    found = load_themes([THEMES])
    assert found.problems == []
    assert {"specdiff-dark", "specdiff-light", "specdiff-high-contrast"} <= set(found.themes)
