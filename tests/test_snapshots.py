"""Pictures of the screen, from a fixed session so they are stable (no model involved).

Update them after an intended change with: python3 -m pytest tests/test_snapshots.py
--snapshot-update, and look at the SVGs before committing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from specdiff.lanes import presets
from specdiff.sessions.store import load_session
from specdiff.tui.app import make_app
from specdiff.tui.themes import load_themes

SESSION = Path(__file__).parent / "data" / "ubatch-roman-empire.jsonl"
THEMES = Path(__file__).resolve().parent.parent / "themes"


def session_app(theme: str | None = None):
    session = load_session(SESSION)
    return make_app(
        presets(),
        "ubatch",
        session.prompt,
        60,
        session=session,
        theme_name=theme,
        theme_dirs=[THEMES],
    )


def test_main_screen_at_the_fork(snap_compare) -> None:
    assert snap_compare(session_app(), press=["d"], terminal_size=(120, 36))


def test_divergence_panel_on_a_near_tie(snap_compare) -> None:
    assert snap_compare(session_app(), press=["d", "n"], terminal_size=(120, 36))


def test_help_screen(snap_compare) -> None:
    assert snap_compare(session_app(), press=["question_mark"], terminal_size=(100, 30))


def test_small_terminal(snap_compare) -> None:
    assert snap_compare(session_app(), press=["d"], terminal_size=(80, 24))


@pytest.mark.parametrize("theme", sorted(load_themes([THEMES]).themes))
def test_each_bundled_theme(snap_compare, theme: str) -> None:
    assert snap_compare(session_app(theme), press=["d"], terminal_size=(100, 30))


def test_bundled_themes_all_load() -> None:
    found = load_themes([THEMES])
    assert found.problems == []
    assert {"specdiff-dark", "specdiff-light", "specdiff-high-contrast"} <= set(found.themes)
