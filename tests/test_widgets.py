"""The pane widgets' rules, checked without a model: the colour hierarchy, contrast in
every bundled theme, the margin strip's columns and scale, the legend's fit, the panel's
lines, a theme switch in the middle of a replay and the aligned view."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
from rich.console import Console
from textual.color import Color

from specdiff.compare import fork_at, fork_verdict
from specdiff.fork_words import fork_explanation, quoted_piece
from specdiff.steps import Candidate, TokenStep
from specdiff.tui.app import SpecdiffApp
from specdiff.tui.themes import contrast, load_themes
from specdiff.tui.widgets import (
    FORK,
    LEGEND,
    ONLY_A,
    ONLY_B,
    SHADE_LEVELS,
    SHARED,
    SHARED_AFTER,
    AlignedView,
    Look,
    MarginStrip,
    Palette,
    PanelView,
    TokenMarks,
    TokenView,
    legend_text,
    look_style,
    panel_renderable,
    shade,
    shade_level,
    strip_cell_style,
    strip_columns,
    strip_height,
)
from tests.conftest import wait_for
from tests.test_snapshots import demo_app, session_app
from tests.tui_driver import drive, rendered_lines

THEMES_DIR = Path(__file__).resolve().parent.parent / "themes"
THEMES = load_themes([THEMES_DIR]).themes
THEME_NAMES = sorted(THEMES)
WCAG_TEXT = 4.5



LANE_NAMES = ("lane a", "lane b")

def palette_of(name: str) -> Palette:
    return Palette.from_theme(THEMES[name])


def step(lane: str, index: int, logits: dict[int, float], drafted: bool = False) -> TokenStep:
    ranked = sorted(logits.items(), key=lambda item: -item[1])
    top = tuple(Candidate(token, logit, f" t{token}".encode()) for token, logit in ranked)
    return TokenStep(
        lane=lane,
        index=index,
        token_id=ranked[0][0],
        piece=top[0].piece,
        top=top,
        drafted=drafted,
        verify_width=1,
        timestamp=0.0,
    )


# -- colours -------------------------------------------------------------------------
def text_pairs(palette: Palette) -> list[tuple[str, str, str]]:
    """(what, text colour, background) for every text colour the panes draw."""
    pairs = [
        ("shared text", palette.shared, palette.background),
        ("shared after the fork", palette.muted, palette.background),
        ("only in a", palette.delete, palette.background),
        ("only in b", palette.insert, palette.background),
        ("fork", palette.fork_text, palette.fork),
        ("cursor", palette.cursor_text, palette.cursor),
    ]
    pairs += [
        (f"near tie shade {level}", palette.shared, shade(palette, level))
        for level in range(SHADE_LEVELS)
    ]
    return pairs


@pytest.mark.parametrize("theme", THEME_NAMES)
def test_every_text_colour_reads_on_its_background(theme: str) -> None:
    low = [
        f"{what}: {fg} on {bg} is {contrast(fg, bg):.2f}"
        for what, fg, bg in text_pairs(palette_of(theme))
        if contrast(fg, bg) < WCAG_TEXT
    ]
    assert low == []


@pytest.mark.parametrize(
    ("foreground", "background", "expected"),
    [("#000000", "#ffffff", 21.0), ("#ffffff", "#ffffff", 1.0), ("#777777", "#ffffff", 4.48)],
)
def test_contrast_is_the_wcag_ratio(foreground: str, background: str, expected: float) -> None:
    assert contrast(foreground, background) == pytest.approx(expected, abs=0.01)
    assert contrast(background, foreground) == pytest.approx(expected, abs=0.01)


@pytest.mark.parametrize("theme", THEME_NAMES)
def test_near_tie_shade_grows_as_the_margin_shrinks(theme: str) -> None:
    palette = palette_of(theme)
    threshold = 0.5
    margins = [threshold * k / 40 for k in range(40, -1, -1)]  # just below 0.5 down to 0
    levels = [shade_level(margin, threshold) for margin in margins[1:]]
    assert shade_level(threshold, threshold) is None
    assert levels == sorted(levels) and levels[0] == 0 and levels[-1] == SHADE_LEVELS - 1
    # one hue, more of it: the distance from the pane's background grows with the level
    background = Color.parse(palette.background)
    distances = []
    for level in range(SHADE_LEVELS):
        colour = Color.parse(shade(palette, level))
        distances.append(sum(abs(x - y) for x, y in zip(colour.rgb, background.rgb)))
    assert distances == sorted(distances) and distances[0] < distances[-1]


def marks_for(palette: Palette, fork: int | None, cursor: int | None = None) -> TokenMarks:
    return TokenMarks(palette, 0.5, fork, cursor, frozenset({12, 13}))


@pytest.mark.parametrize("theme", THEME_NAMES)
@pytest.mark.parametrize("lane", ["a", "b"])
def test_one_mark_per_token(theme: str, lane: str) -> None:
    palette = palette_of(theme)
    near_tie = step(lane, 0, {1: 5.0, 2: 4.9}, drafted=True)
    clear = step(lane, 0, {1: 9.0, 2: 1.0}, drafted=True)
    marks = marks_for(palette, fork=10)
    # before the fork: shade, and the draft underline only where there is no shade
    assert marks.look(lane, 3, near_tie) == Look(SHARED, shade_level(0.1, 0.5))
    assert marks.look(lane, 3, clear) == Look(SHARED, drafted=True)
    # the fork, the text one lane alone has, and shared text after it: never shaded
    assert marks.look(lane, 10, near_tie) == Look(FORK)
    only = ONLY_A if lane == "a" else ONLY_B
    assert marks.look(lane, 12, near_tie) == Look(only)
    # greyed shared text after the fork is marked already: no draft underline on it
    assert marks.look(lane, 14, near_tie) == Look(SHARED_AFTER)
    for index in (10, 12, 14):
        style = look_style(palette, marks.look(lane, index, clear))
        assert not style.underline, index
    styles = {
        role: look_style(palette, Look(role)) for role in (FORK, ONLY_A, ONLY_B, SHARED_AFTER)
    }
    assert len({(s.color, s.bgcolor) for s in styles.values()}) == len(styles)
    assert styles[ONLY_A].color == Color.parse(palette.delete).rich_color
    assert styles[ONLY_B].color == Color.parse(palette.insert).rich_color


@pytest.mark.parametrize("theme", THEME_NAMES)
@pytest.mark.parametrize("index", [3, 10, 12, 14])
def test_the_cursor_never_hides_the_fork(theme: str, index: int) -> None:
    palette = palette_of(theme)
    token = step("a", index, {1: 5.0, 2: 4.9})
    style = look_style(palette, marks_for(palette, fork=10, cursor=index).look("a", index, token))
    assert not style.reverse
    if index == 10:
        assert style.bgcolor == Color.parse(palette.fork).rich_color
        assert style.underline
    else:
        assert style.bgcolor == Color.parse(palette.cursor).rich_color


# -- margin strip ----------------------------------------------------------------------
@pytest.mark.parametrize("steps", [0, 1, 13, 79, 80, 81, 200, 1000, 4097])
@pytest.mark.parametrize("width", [1, 40, 80, 200])
def test_strip_has_one_cell_per_step_up_to_its_width(steps: int, width: int) -> None:
    margins = [((index * 7919) % 97) / 10 for index in range(steps)]
    columns = strip_columns(margins, width)
    assert len(columns) == min(steps, width)
    covered = [index for first, last, _ in columns for index in range(first, last + 1)]
    assert covered == list(range(steps))  # every step in one cell, in order
    for first, last, smallest in columns:
        assert smallest == min(margins[first : last + 1])  # a bin shows its closest call


@pytest.mark.parametrize("rows", [1, 2, 3])
@pytest.mark.parametrize("threshold", [0.0, 0.25, 0.5, 2.0, 10.0])
def test_strip_scale_puts_the_threshold_at_half_height(rows: int, threshold: float) -> None:
    margins = [0.0, 0.01, 0.1, 0.24, 0.49, 0.5, 1.0, 3.9, 4.0, 50.0, math.inf]
    heights = [strip_height(margin, threshold, rows) for margin in margins]
    assert heights == sorted(heights)
    assert all(1 <= height <= 8 * rows for height in heights)
    assert strip_height(math.inf, threshold, rows) == 8 * rows
    if 0 < threshold < 4:
        below = [h for m, h in zip(margins, heights) if m < threshold]
        above = [h for m, h in zip(margins, heights) if m >= threshold]
        assert max(below) <= 4 * rows <= min(above)


# -- legend ----------------------------------------------------------------------------
@pytest.mark.parametrize("theme", THEME_NAMES)
@pytest.mark.parametrize("width", [20, 40, 60, 79, 80, 120, 200])
def test_legend_fits_its_width(theme: str, width: int) -> None:
    text = legend_text(palette_of(theme), width)
    assert text.cell_len <= width
    if width >= 80:  # every mark named at 80 columns, in the look it names
        for entry in LEGEND:
            label = entry.long if entry.long in text.plain else entry.short
            start = text.plain.index(label)
            assert text.get_style_at_offset(Console(), start) == look_style(
                palette_of(theme), entry.look
            )


@pytest.mark.parametrize("theme", THEME_NAMES)
@pytest.mark.parametrize("width", [78, 118])
def test_the_legend_names_the_strip_marks_and_the_shade_strength(theme: str, width: int) -> None:
    """At 80 and 120 columns: the strip's near tie over its band, the fork's cell and a
    dimmed cell after it, each in the strip's own style; a near tie's shade goes from
    strongest to weakest across its name."""
    palette = palette_of(theme)
    text = legend_text(palette, width)
    console = Console()
    fork_marks = marks_for(palette, fork=0)
    expected = {
        "▃tie": strip_cell_style(marks_for(palette, fork=None), 0, 0, True, True),
        "█fork": strip_cell_style(fork_marks, 0, 0, False, False),
        "▆after": strip_cell_style(fork_marks, 1, 1, False, False),
    }
    for label, style in expected.items():
        assert text.get_style_at_offset(console, text.plain.index(label)) == style, label
    tie = next(entry for entry in LEGEND if entry.look.shade is not None)
    label = tie.long if tie.long in text.plain else tie.short
    start = text.plain.index(label)
    shades = [
        text.get_style_at_offset(console, start + offset).bgcolor.triplet.hex
        for offset in (0, len(label) - 1)
    ]
    assert shades == [shade(palette, SHADE_LEVELS - 1).lower(), shade(palette, 0).lower()]


# -- panel -----------------------------------------------------------------------------
def forked_steps() -> tuple[list[TokenStep], list[TokenStep]]:
    a = [step("a", 0, {1: 5.0, 2: 3.0}), step("a", 1, {4: 5.0, 5: 4.9, 6: 1.0})]
    b = [step("b", 0, {1: 5.0, 2: 3.0}), step("b", 1, {5: 5.0, 4: 4.95, 6: 1.0})]
    a += [step("a", index, {7: 5.0, 8: 1.0}) for index in range(2, 6)]
    b += [step("b", index, {7: 5.0, 8: 1.0}) for index in range(2, 6)]
    return a, b


def panel_text(view: PanelView, width: int, height: int) -> list[str]:
    console = Console(width=width, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(panel_renderable(view, width, height, palette_of("specdiff-dark")))
    return console.export_text().splitlines()


@pytest.mark.parametrize(("width", "height"), [(78, 6), (118, 11), (198, 20)])
def test_the_fork_panel_names_both_picks_and_says_why(width: int, height: int) -> None:
    a, b = forked_steps()
    fork = fork_at(a, b)
    assert fork is not None
    view = PanelView(1, a[1], b[1], fork, 0.5, len(a), 0.5, ((1, 0.1),), ("n_ubatch 512 / 2",))
    lines = panel_text(view, width, height)
    assert len(lines) <= height and all(len(line) <= width for line in lines)
    # the fork's index beside the count of tokens shown: never "1 of 6", which reads
    # as a 1-based position
    assert lines[0].startswith(f"FORK at token 1 · {len(a)} tokens shown  near tie  a ' t4'")
    # plain words first: the picks' probabilities, not only their logits
    explanation = fork_explanation(fork, fork_verdict(a[1], b[1], near_tie=0.5), LANE_NAMES)
    assert "times as likely" in explanation.plain  # odds: these steps hold no p
    why = f"why: {explanation.plain}"
    assert lines[1].startswith("why: lane a held ' t4' only 1.11 times as likely as ' t5'")
    margins_at = next(n for n, line in enumerate(lines) if line.startswith("margins a"))
    # the verdict whole, on one line or two, no character dropped or repeated at the wrap
    assert " ".join(line.strip() for line in lines[1:margins_at]) == why
    assert any("a token" in line for line in lines)  # at least the candidates' header
    assert ("lanes differ in n_ubatch 512 / 2" in "\n".join(lines)) == (width >= 100)


@pytest.mark.parametrize("index", [0, 2, 5])
@pytest.mark.parametrize("width", [78, 118])
def test_away_from_the_fork_the_panel_names_each_lanes_pick(index: int, width: int) -> None:
    a, b = forked_steps()
    view = PanelView(index, a[index], b[index], fork_at(a, b), None, len(a))
    header = panel_text(view, width, 6)[0]
    picks = f"a {quoted_piece(a[index].piece)} · b {quoted_piece(b[index].piece)}"
    assert header.startswith(f"token {index}: {picks}   margins a ")


@pytest.mark.parametrize("has_fork", [True, False])
def test_no_selection_mentions_the_fork_only_when_there_is_one(has_fork: bool) -> None:
    a, b = forked_steps()
    fork = fork_at(a, b) if has_fork else None
    lines = panel_text(PanelView(None, None, None, fork, None, len(a)), 80, 6)
    assert ("d jumps to the fork" in lines[0]) == has_fork


@pytest.mark.parametrize("index", [0, 1, 2, 5])
def test_past_the_fork_the_panel_warns_that_contexts_differ(index: int) -> None:
    a, b = forked_steps()
    view = PanelView(index, a[index], b[index], fork_at(a, b), None, len(a))
    text = "\n".join(panel_text(view, 120, 12))
    assert ("compared by index" in text) == (index > 1)



@pytest.mark.parametrize("normalized", [True, False])
def test_the_p_column_is_shown_only_with_a_probability_and_its_absence_is_explained(
    normalized: bool,
) -> None:
    """These steps carry no normalizer (logsumexp) unless given one: without it no p
    column stands empty, a line says why in plain words."""
    a, b = forked_steps()
    if normalized:
        a = [dataclasses.replace(s, logsumexp=6.0) for s in a]
        b = [dataclasses.replace(s, logsumexp=6.0) for s in b]
    view = PanelView(3, a[3], b[3], fork_at(a, b), None, len(a))
    lines = panel_text(view, 120, 12)
    table_header = next(line for line in lines if line.startswith("a token"))
    assert (" p " in f"{table_header} ") == normalized
    explained = any("no p (probability) here" in line for line in lines)
    assert explained != normalized
    if normalized:  # exp(5 - 6): the candidate's probability, to three places
        assert "0.368" in "\n".join(lines)


# -- in the app ------------------------------------------------------------------------
def drawn_colours(app: SpecdiffApp) -> set[str]:
    colours = set()
    for lane_id in ("a", "b"):
        view = app.query_one(f"#lane-{lane_id} TokenView", TokenView)
        for y in range(view.size.height):
            for segment in view.render_line(y):
                style = segment.style
                for colour in (style.color, style.bgcolor) if style else ():
                    if colour is not None and colour.triplet is not None:
                        colours.add(colour.triplet.hex)
    return colours


def palette_colours(palette: Palette) -> set[str]:
    named = [palette.background, palette.shared, palette.muted, palette.fork, palette.fork_text]
    named += [palette.insert, palette.delete, palette.cursor, palette.cursor_text]
    named += [shade(palette, level) for level in range(SHADE_LEVELS)]
    return {Color.parse(colour).hex.lower() for colour in named}


@pytest.mark.parametrize(
    ("start", "after"),
    [("specdiff-light", "specdiff-dark"), ("specdiff-dark", "specdiff-high-contrast")],
)
async def test_a_theme_switch_mid_replay_restyles_every_drawn_token(start: str, after: str) -> None:
    app = session_app(start, speed=4.0)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: drawn_colours(app), 20, "tokens drawn in both panes")
        while app.theme != after:
            await pilot.press("t")
        await wait_for(pilot, lambda: drawn_in(app, after, start), 10, f"the tokens in {after}")
        assert_drawn_in(app, after, start)
        # lines drawn after the switch but before the new theme's CSS applies (a repaint
        # can fall in between) are drawn again once it does
        app.theme = start
        drawn_colours(app)
        await wait_for(pilot, lambda: drawn_in(app, start, after), 10, f"the tokens in {start}")
        assert_drawn_in(app, start, after)


def drawn_in(app: SpecdiffApp, theme: str, old: str) -> bool:
    """Tokens are drawn, all in `theme`'s colours, none in `old`'s alone."""
    drawn = drawn_colours(app)
    new, before = palette_colours(palette_of(theme)), palette_colours(palette_of(old))
    return bool(drawn) and drawn <= new and not drawn & (before - new)


def assert_drawn_in(app: SpecdiffApp, theme: str, old: str) -> None:
    drawn = drawn_colours(app)
    assert drawn and drawn <= palette_colours(palette_of(theme))
    assert not drawn & (palette_colours(palette_of(old)) - palette_colours(palette_of(theme)))


@pytest.mark.parametrize("size", [(80, 24), (100, 30)])
async def test_aligned_view_collapses_the_prefix_and_stacks_the_branches(size) -> None:
    app = session_app("specdiff-dark", speed=None)
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        assert drive(app).fork is not None
        await pilot.press("a")
        await pilot.pause()
        aligned = app.query_one("#aligned", AlignedView)
        assert aligned.display and not app.query_one("#lanes").display
        top = aligned.query_one(".aligned-text")
        branch_b = aligned.query_one(".aligned-branch-b")
        assert f"… {drive(app).fork.index - 8} shared tokens …" in str(top.render())
        assert "\na ▸ " in str(top.render()) and str(branch_b.render()).startswith("b ▸ ")
        # lane a's branch takes at most half the view: b's begins on screen below it
        assert aligned.region.contains_point(branch_b.region.offset)
        assert branch_b.region.y > top.parent.region.y
        await pilot.press("escape")
        assert not aligned.display and app.query_one("#lanes").display
        await pilot.press("a", "a")
        assert not aligned.display


async def test_both_branches_start_on_screen_when_the_shared_context_has_line_breaks() -> None:
    """The demo session's last shared tokens hold two newlines ('.␤␤The Roman Empire was
    a vast'): on one row, so at 80x24 under the fork panel lane a's branch still starts
    in its half of the view, above lane b's."""
    app = demo_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        await pilot.press("d", "a")
        await pilot.pause()
        shown = [line.strip() for line in rendered_lines(app)]
        assert any(line.startswith(".␤␤The Roman Empire was a vast") for line in shown), shown
        a_row = next(row for row, line in enumerate(shown) if line.startswith("a ▸ "))
        b_row = next(row for row, line in enumerate(shown) if line.startswith("b ▸ "))
        assert a_row < b_row


@pytest.mark.parametrize("lengths", [(5, 10, 3, 7), (0, 4, 4, 1), (12, 0, 6, 12)])
def test_strip_margins_follow_growing_cut_and_replaced_steps(lengths: tuple[int, ...]) -> None:
    palette = palette_of("specdiff-dark")
    recorded = [step("a", index, {1: 5.0, 2: 5.0 - index / 10}) for index in range(12)]
    strip = MarginStrip()
    steps: list[TokenStep] = []
    for number, length in enumerate(lengths):
        if number == 2:
            steps = list(steps)  # another run: a new list of steps
        del steps[length:]  # a replay stepping back cuts the list in place
        steps.extend(recorded[len(steps) : length])
        strip.show(steps, marks_for(palette, fork=None))
        assert strip.margins == [s.margin for s in steps]
        assert strip.strip_columns(4) == strip_columns(strip.margins, 4)


WRAPPED_PIECES = [
    [" is", " a", " fascinating", " one", ".", " It", " was"],
    ["...", ".", " ..", "\n", "a" * 30, ". ", "\t", "x"],
    ["漢字", "かな", " wide", "字" * 9, "\x1b[31m", " end"],
]


@pytest.mark.parametrize("width", [8, 9, 13, 37])
@pytest.mark.parametrize("pieces", WRAPPED_PIECES)
def test_the_token_wrapper_never_drops_or_repeats_a_character(width: int, pieces) -> None:
    """Whatever a line starts with (a '.' or a wide character), the lines read back
    every token's text once, in order, and none is wider than the view."""
    from rich.cells import cell_len

    from specdiff.safe_text import terminal_text
    from specdiff.tui.widgets import TAB

    view = TokenView("a")
    for index, piece in enumerate(pieces):
        view.token_lines.append(len(view.lines) - 1)
        view._place(index, piece, width)
    for index in range(len(pieces)):
        shown = "".join(text for line in view.lines for i, text in line if i == index)
        assert shown == terminal_text(pieces[index], tab=TAB).replace("\n", "")
    assert all(sum(cell_len(text) for _, text in line) <= width for line in view.lines)


@pytest.mark.parametrize("width", [8, 9, 13, 37])
@pytest.mark.parametrize("pieces", WRAPPED_PIECES)
def test_every_line_a_token_takes_is_in_its_span(width: int, pieces) -> None:
    """A restyled token redraws its span: a token that did not fit where it was placed,
    or one wrapped over several lines, lies within it all the same."""
    view = TokenView("a")
    for index, piece in enumerate(pieces):
        view.token_lines.append(len(view.lines) - 1)
        view._place(index, piece, width)
    for index in range(len(pieces)):
        taken = {number for number, line in enumerate(view.lines) for i, _ in line if i == index}
        assert taken <= set(view.token_span(index))


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
@pytest.mark.parametrize("keys", [["d", "right"], ["d", "n"], ["left"]])
async def test_a_moving_cursor_leaves_every_line_as_a_fresh_drawing_has_it(size, keys) -> None:
    """Only the lines whose tokens change look are drawn again as the cursor moves: each
    kept line must match the line drawn from nothing."""
    app = session_app("specdiff-dark")
    async with app.run_test(size=size) as pilot:
        await pilot.press(*keys[:-1])
        for _ in range(10):
            await pilot.press(keys[-1])
            await pilot.pause()
            for lane_id in ("a", "b"):
                view = app.query_one(f"#lane-{lane_id} TokenView", TokenView)
                kept = [view.render_line(y) for y in range(view.size.height)]
                view.strips.clear()
                assert [view.render_line(y) for y in range(view.size.height)] == kept


@pytest.mark.parametrize("width", [60, 78, 98, 118, 160, 200])
def test_the_legends_words_stay_when_a_forecast_comes_and_goes(width: int) -> None:
    """Mid-run a lane ahead shows forecast marks, then the other lane catches up: the
    legend names them meanwhile, and every other mark keeps the name it had."""
    palette = Palette.from_variables({})
    without = legend_text(palette, width).plain.split("  │")[0].removesuffix("…")
    with_forecast = legend_text(palette, width, forecast=True).plain
    assert with_forecast.startswith(f"{without}  forecast"), (without, with_forecast)
