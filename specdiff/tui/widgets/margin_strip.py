"""The margin strip under each pane: one bar per step (binned when the steps outnumber
the columns), near ties in their own colour, the fork and the cursor marked."""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

from rich.segment import Segment
from rich.style import Style
from textual.color import Color
from textual.strip import Strip

from specdiff.compare import MARGIN_DISPLAY_CAP as MARGIN_CAP
from specdiff.steps import TokenStep
from specdiff.tui.widgets.base import LineDrawn, ThemeAware
from specdiff.tui.widgets.styles import FORK, SHARED, SHARED_AFTER, Palette, TokenMarks, shade


def strip_columns(margins: Sequence[float], width: int) -> list[tuple[int, int, float]]:
    """(first step, last step, smallest margin) per cell: one step a cell up to the
    width, beyond it bins of neighbouring steps, each showing its closest call."""
    count = len(margins)
    if count <= width:
        return [(index, index, margin) for index, margin in enumerate(margins)]
    columns = []
    for column in range(width):
        first, end = column * count // width, (column + 1) * count // width
        columns.append((first, end - 1, min(margins[first:end])))
    return columns


def strip_height(margin: float, threshold: float, rows: int) -> int:
    """A bar's height in eighths of a cell, 1 to 8 * rows. The near-tie threshold sits
    at half the height: below it the scale is linear in the margin, above it
    logarithmic up to MARGIN_CAP, so near ties are not squashed into the axis."""
    cap = MARGIN_CAP
    if threshold <= 0 or threshold >= cap:
        fraction = min(margin, cap) / cap
    elif margin < threshold:
        fraction = 0.5 * margin / threshold
    else:
        fraction = 0.5 + 0.5 * math.log(min(margin, cap) / threshold) / math.log(cap / threshold)
    return max(1, min(8 * rows, math.ceil(fraction * 8 * rows)))


BAR_CHARACTERS = " ▁▂▃▄▅▆▇█"


class MarginStrip(LineDrawn, ThemeAware):
    """Every step's margin under a pane: bars below the near-tie threshold in their own
    colour (in two rows, over a band that ends at the threshold), the fork marked, the
    steps after it dimmed, the cursor marked, nothing before the first token."""

    DEFAULT_CSS = "MarginStrip { height: 2; }"

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.steps: Sequence[TokenStep] = ()
        self.marks: TokenMarks | None = None
        self.shown: tuple[int, TokenMarks | None] = (0, None)
        self.margins: list[float] = []
        """The steps' margins, extended as steps arrive: a long session's are not read
        again on every repaint."""
        self.columns: tuple[tuple[int, int], list[tuple[int, int, float]]] = ((0, 0), [])
        self.cells: tuple[tuple[object, ...], list[tuple[int, tuple[str, bool]]]] = ((), [])

    def show(self, steps: Sequence[TokenStep], marks: TokenMarks) -> None:
        if steps is not self.steps or len(self.margins) > len(steps):
            self.margins = []  # another run, or a replay stepping back
        self.steps = steps
        self.margins.extend(step.margin for step in steps[len(self.margins) :])
        self.marks = marks
        if self.shown != (len(steps), marks):
            self.shown = (len(steps), marks)
            self.refresh()

    def strip_columns(self, width: int) -> list[tuple[int, int, float]]:
        key = (len(self.margins), width)
        if self.columns[0] != key:
            self.columns = (key, strip_columns(self.margins, width))
        return self.columns[1]

    def strip_cells(
        self, marks: TokenMarks, width: int, rows: int
    ) -> list[tuple[int, tuple[str, bool]]]:
        """Each cell's bar height (in eighths) and look (its kind, and whether it is a
        near tie), worked out once for all of the strip's rows."""
        key = (len(self.margins), width, rows, marks)
        if self.cells[0] != key:
            threshold = marks.threshold
            self.cells = (
                key,
                [
                    (
                        strip_height(margin, threshold, rows),
                        (strip_cell_kind(marks, first, last), margin < threshold),
                    )
                    for first, last, margin in self.strip_columns(width)
                ],
            )
        return self.cells[1]

    def render_line(self, y: int) -> Strip:
        width, rows = self.size.width, self.size.height
        base = self.line_style
        if self.marks is None or not self.margins or width <= 0:
            return Strip.blank(width, base)
        marks = self.marks
        floor = 8 * (rows - 1 - y)
        # in two rows or more the bottom row is the band below the threshold
        band = rows > 1 and y == rows - 1 and marks.threshold > 0
        segments = []
        styles: dict[tuple[str, bool], Style] = {}  # the few kinds of cell on this line
        for height, look in self.strip_cells(marks, width, rows):
            character = BAR_CHARACTERS[max(0, min(8, height - floor))]
            style = styles.get(look)
            if style is None:
                style = styles[look] = base + strip_kind_style(marks.palette, *look, band)
            segments.append(Segment(character, style))
        # neighbouring cells mostly share a style: fewer segments for the screen to draw
        return Strip(segments).simplify().crop_extend(0, width, base)


def strip_cell_style(marks: TokenMarks, first: int, last: int, near_tie: bool, band: bool) -> Style:
    """One cell of the margin strip; `first`..`last` are the steps it stands for, and
    `band` marks a cell below the near-tie threshold's level."""
    return strip_kind_style(marks.palette, strip_cell_kind(marks, first, last), near_tie, band)


def strip_cell_kind(marks: TokenMarks, first: int, last: int) -> str:
    """What a margin strip cell for steps `first`..`last` marks: the fork, the cursor,
    a step after the fork or one before it."""
    if marks.fork_index is not None and first <= marks.fork_index <= last:
        return FORK
    if marks.cursor is not None and first <= marks.cursor <= last:
        return "cursor"
    if marks.fork_index is not None and first > marks.fork_index:
        return SHARED_AFTER
    return SHARED


@lru_cache(maxsize=256)
def strip_kind_style(palette: Palette, kind: str, near_tie: bool, band: bool) -> Style:
    """A margin strip cell's style by what it marks: a strip has a few kinds of cell and
    a streaming lane redraws every one of them each time, so each style is built once."""
    background = Color.parse(palette.background)
    if kind == FORK:
        tint = Color.parse(palette.fork).blend(background, 0.6).hex
        return Style(color=palette.fork, bgcolor=tint)
    if kind == "cursor":
        return Style(color=palette.cursor_text, bgcolor=palette.cursor)
    colour = palette.tie_bar if near_tie else palette.bar
    if kind == SHARED_AFTER:
        # after the fork the lanes' contexts differ: their margins compare nothing
        colour = Color.parse(colour).blend(background, 0.6).hex
    return Style(color=colour, bgcolor=shade(palette, 0) if band else None)
