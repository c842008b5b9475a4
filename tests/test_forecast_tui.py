"""The fork forecast in the TUI: the lane ahead marks the steps the forecast ranks likeliest
to fork, until the other lane reaches them; legible in every theme, named in the legend."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console
from textual.color import Color

from specdiff.forecast import POOLED_MODEL
from specdiff.lanes import presets
from specdiff.sessions.store import load_session
from specdiff.steps import Candidate, TokenStep
from specdiff.tui.app import SpecdiffApp, make_app
from specdiff.tui.themes import contrast, load_themes
from specdiff.tui.widgets import (
    FORECAST,
    FORECAST_SHOWN,
    LEGEND_ROWS,
    SHADE_LEVELS,
    Legend,
    Look,
    Palette,
    TokenMarks,
    legend_text,
    look_style,
    pending_forecast,
    shade,
)
from tests.conftest import wait_for
from tests.test_snapshots import SESSION, THEMES
from tests.tui_driver import drive

THEME_SET = load_themes([THEMES]).themes
WCAG_TEXT = 4.5


def steps_of(margins: list[float], lane: str = "a") -> list[TokenStep]:
    return [
        TokenStep(lane, i, 1, b"x", (Candidate(1, 5.0), Candidate(2, 5.0 - m)), False, 1, 0.0)
        for i, m in enumerate(margins)
    ]


@pytest.mark.parametrize("name", sorted(THEME_SET))
def test_a_forecast_step_reads_in_every_theme_and_is_no_other_mark(name: str) -> None:
    palette = Palette.from_theme(THEME_SET[name])
    assert contrast(palette.forecast_text, palette.forecast) >= WCAG_TEXT
    others = {palette.fork, palette.cursor, palette.background}
    others |= {shade(palette, level) for level in range(SHADE_LEVELS)}
    assert all(Color.parse(palette.forecast).hex != Color.parse(other).hex for other in others)


@pytest.mark.parametrize("other_length", [0, 3, 9, 10, 12])
@pytest.mark.parametrize("forked", [False, True])
def test_only_the_lane_ahead_marks_steps_the_other_has_not_reached(
    other_length: int, forked: bool
) -> None:
    steps = steps_of([0.05, 2.0, 0.3, 0.01, 5.0, 0.2, 0.1, 0.4, 0.02, 3.0])
    marked = pending_forecast(steps, other_length, forked, POOLED_MODEL)
    if forked or other_length >= len(steps):
        assert marked == frozenset()
    else:
        assert marked and all(other_length <= index < len(steps) for index in marked)
        assert len(marked) <= FORECAST_SHOWN


@pytest.mark.parametrize("fork_index", [None, 2])
@pytest.mark.parametrize("cursor", [None, 3])
def test_the_fork_and_the_cursor_outrank_a_forecast_mark(
    fork_index: int | None, cursor: int | None
) -> None:
    palette = Palette.from_variables({})
    steps = steps_of([0.01] * 6)
    marks = TokenMarks(palette, 0.5, fork_index, cursor, forecast=frozenset({2, 3, 4}))
    looks = {index: marks.look("a", index, steps[index]) for index in range(6)}
    assert looks[4].role == (FORECAST if fork_index is None else "shared after")
    assert looks[3].cursor == (cursor == 3)
    assert looks[2].role == ("fork" if fork_index == 2 else FORECAST)
    assert looks[0].role != FORECAST


@pytest.mark.parametrize("width", [78, 118, 200])
def test_the_legend_names_the_forecast_while_one_is_shown(width: int) -> None:
    palette = Palette.from_variables({})
    shown = legend_text(palette, width, forecast=True)
    assert shown.cell_len <= width
    start = shown.plain.index("forecast")
    assert shown.get_style_at_offset(Console(), start) == look_style(palette, Look(FORECAST))
    assert "forecast" not in legend_text(palette, width).plain
    assert any(name == "forecast" for name, _ in LEGEND_ROWS)


def lane_b_behind(tmp_path: Path, reached: int) -> Path:
    """The demo session with lane b cut after `reached` steps, as a replay shows a lane
    still on its way: lane a ahead, no fork yet."""
    lines = SESSION.read_text().splitlines()
    kept = [lines[0]]
    for line in lines[1:-1]:
        record = json.loads(line)
        if record["lane"] == "a" or record["index"] < reached:
            kept.append(line)
    path = tmp_path / "behind.jsonl"
    path.write_text("\n".join(kept) + "\n")
    return path


def app_of(path: Path, theme: str) -> SpecdiffApp:
    session = load_session(path)
    return make_app(
        presets(),
        "ubatch",
        session.prompt,
        60,
        session=session,
        theme_name=theme,
        theme_dirs=[THEMES],
    )


@pytest.mark.parametrize("theme", ["specdiff-dark", "specdiff-light"])
@pytest.mark.parametrize("reached", [0, 5])
async def test_the_lane_ahead_shows_the_forecast_before_the_other_arrives(
    tmp_path: Path, theme: str, reached: int
) -> None:
    app = app_of(lane_b_behind(tmp_path, reached), theme)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: len(drive(app).lanes["a"].steps) == 60)
        await pilot.pause()
        marks = drive(app).marks("a")
        steps = drive(app).lanes["a"].steps
        assert drive(app).fork is None
        assert 0 < len(marks.forecast) <= FORECAST_SHOWN
        assert min(marks.forecast) >= reached
        # the recording forked at token 11, a margin of 0.008: the likeliest first fork
        assert 11 in marks.forecast
        assert drive(app).marks("b").forecast == frozenset()
        assert all(marks.look("a", i, steps[i]).role == FORECAST for i in marks.forecast)
        forecast_colour = Color.parse(drive(app).palette().forecast).rich_color
        drawn = app.query_one("#lane-a").query_one("TokenView")
        backgrounds = {
            segment.style.bgcolor
            for y in range(drawn.size.height)
            for segment in drawn.render_line(y)
            if segment.style is not None
        }
        assert forecast_colour in backgrounds
        assert "forecast" in app.query_one(Legend).render().plain
