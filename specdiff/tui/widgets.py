"""Widgets that render records: a lane pane, its tokens, the divergence panel."""

from __future__ import annotations

import codecs
import textwrap
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from rich.cells import cell_len
from rich.console import Group, RenderableType
from rich.segment import Segment
from rich.style import Style
from rich.table import Table
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.color import Color
from textual.containers import Vertical
from textual.filter import LineFilter
from textual.geometry import Region, Size
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.widget import Widget
from textual.widgets import Sparkline

from specdiff.compare import (
    AMBIGUOUS,
    DEFAULT_NEAR_TIE,
    LARGE_MARGIN_SPLIT,
    NEAR_TIE,
    Fork,
    PickView,
    fork_verdict,
)
from specdiff.compare import MARGIN_DISPLAY_CAP as MARGIN_CAP
from specdiff.safe_text import terminal_text, visible, without_controls
from specdiff.steps import TokenStep

LINE_CHUNK = 8
"""A token view's scrollable height grows by this many lines at a time."""
TAB = "    "
"""A tab in a token, as the pane shows it: a tab sent to the terminal would move the
cursor past cells the layout does not know of."""


@dataclass
class LaneState:
    """What the app knows of one lane: its steps and their decoded text so far."""

    lane_id: str
    steps: list[TokenStep] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    speed: float = 0.0
    """Tokens/s over the lane's own decode time (the runner's clock, not the wall's)."""
    drafted: int = 0
    accepted: int = 0
    error: str | None = None
    decoder: codecs.IncrementalDecoder = field(
        default_factory=lambda: codecs.getincrementaldecoder("utf-8")("replace")
    )

    def extend(self, steps: Iterable[TokenStep]) -> None:
        # A token may hold part of a UTF-8 character: the character shows on the token
        # that completes it.
        for step in steps:
            self.steps.append(step)
            self.texts.append(self.decoder.decode(step.piece))

    def truncate(self, length: int) -> None:
        """Keep the first `length` steps (a replay stepping back)."""
        del self.steps[length:], self.texts[length:]
        # The decoder may hold the first bytes of a character split over tokens:
        # rebuild its state from the steps that remain.
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        for step in self.steps:
            self.decoder.decode(step.piece)


@dataclass(frozen=True)
class Palette:
    """Colours the token renderer needs, read from the current theme's variables."""

    shared: str
    fork: str
    heat_strong: str
    heat_weak: str
    drafted: str
    insert: str
    delete: str
    background: str

    @classmethod
    def from_variables(cls, variables: dict[str, str]) -> Palette:
        return cls(
            shared=variables.get("shared", "#d0d0d0"),
            fork=variables.get("fork", "#ff3d7f"),
            heat_strong=variables.get("near-tie-strong", "#a23b1c"),
            heat_weak=variables.get("near-tie-weak", "#4a3a12"),
            drafted=variables.get("drafted", "#5fd7af"),
            insert=variables.get("diff-insert", "#87d787"),
            delete=variables.get("diff-delete", "#ff8787"),
            background=variables.get("background", "#000000"),
        )


def heat(palette: Palette, margin: float, threshold: float) -> str:
    """Background for a near tie: the smaller the margin, the stronger the colour."""
    factor = max(0.0, min(1.0, margin / threshold)) if threshold > 0 else 1.0
    strong, weak = Color.parse(palette.heat_strong), Color.parse(palette.heat_weak)
    return strong.blend(weak, factor).hex


@dataclass(frozen=True)
class TokenMarks:
    """What decides a token's look besides the step itself."""

    palette: Palette
    threshold: float
    fork_index: int | None
    cursor: int | None
    changed_after_fork: frozenset[int] = frozenset()


class TokenStyles:
    """Rich styles for token looks; few distinct looks, so each is built once."""

    def __init__(self) -> None:
        self._cache: dict[tuple[object, ...], Style] = {}

    def style(self, lane_id: str, index: int, step: TokenStep, marks: TokenMarks) -> Style:
        palette = marks.palette
        colour = palette.shared
        dim = False
        if marks.fork_index is not None and index > marks.fork_index:
            if index in marks.changed_after_fork:
                colour = palette.delete if lane_id == "a" else palette.insert
            else:
                dim = True
        level = None
        if step.margin < marks.threshold:
            # heat in 8 steps: enough to read, few enough to cache
            level = min(7, int(8 * step.margin / marks.threshold)) if marks.threshold else 7
        key = (
            palette,
            marks.threshold,
            colour,
            level,
            dim,
            step.drafted,
            index == marks.fork_index,
            index == marks.cursor,
        )
        cached = self._cache.get(key)
        if cached is None:
            # the colour blend runs once per look, not once per drawn token
            background = (
                None
                if level is None
                else heat(palette, (level + 0.5) / 8 * marks.threshold, marks.threshold)
            )
            cached = Style(color=colour, bgcolor=background, dim=dim, underline=step.drafted)
            if index == marks.fork_index:
                cached += Style(bgcolor=palette.fork, color=palette.background, bold=True)
            if index == marks.cursor:
                cached += Style(reverse=True)
            self._cache[key] = cached
        return cached


class TokenView(ScrollView, can_focus=False):
    """A lane's tokens, wrapped at token boundaries into cached lines.

    Layout (which token sits on which line) depends only on the text and the width;
    looks (fork, cursor, near-tie heat, diff) are applied when a line is drawn. So while
    a run streams only new tokens are laid out, and moving the cursor or finding the
    fork redraws the visible lines without laying anything out again.
    """

    def __init__(self, lane_id: str, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.lane_id = lane_id
        self.styles_cache = TokenStyles()
        self.state = LaneState(lane_id)
        self.marks: TokenMarks | None = None
        self.lines: list[list[tuple[int, str]]] = [[]]
        self.line_widths: list[int] = [0]
        self.token_lines: list[int] = []
        self.width_used = 0
        self.strips: dict[int, Strip] = {}
        self.trailer: str | None = None
        self.trailer_lines: list[str] = []
        """The trailer wrapped to the view's width: a crash message is longer than a pane."""

    def set_tokens(self, state: LaneState, marks: TokenMarks) -> None:
        width = max(8, self.scrollable_content_region.width or self.size.width or 40)
        redraw_all = False
        if (
            state is not self.state
            or width != self.width_used
            or len(self.token_lines) > len(state.steps)
        ):
            self.state = state
            self.lines, self.line_widths, self.token_lines = [[]], [0], []
            self.strips.clear()
            self.width_used = width
            redraw_all = True
        if marks != self.marks:
            self.marks = marks
            self.strips.clear()
            redraw_all = True
        trailer = f"[lane error] {visible(state.error)}" if state.error else None
        if trailer != self.trailer or redraw_all:
            self.trailer = trailer
            self.trailer_lines = textwrap.wrap(trailer, max(width, 8)) if trailer else []
            redraw_all = True
        first_dirty = len(self.lines) - 1
        for index in range(len(self.token_lines), len(state.steps)):
            self.token_lines.append(len(self.lines) - 1)
            self._place(index, state.texts[index] or "\u2205", width)
        for line in range(first_dirty, len(self.lines)):
            self.strips.pop(line, None)
        # Past one screenful the virtual height grows in steps of LINE_CHUNK lines: each
        # change costs a new layout of the whole screen, which a streaming lane would
        # otherwise ask for on almost every update.
        height = self.text_height
        if height > self.size.height:
            height = -(-height // LINE_CHUNK) * LINE_CHUNK
        size = Size(width, height)
        if size != self.virtual_size or redraw_all:
            self.virtual_size = size
            self.refresh()
            return
        # only the lines that changed, where they are on screen
        top = max(first_dirty - self.scroll_offset.y, 0)
        bottom = min(len(self.lines) - self.scroll_offset.y, self.size.height)
        if bottom > top:
            self.refresh(Region(0, top, self.size.width, bottom - top))

    @property
    def text_height(self) -> int:
        return len(self.lines) + (1 + len(self.trailer_lines) if self.trailer else 0)

    def follow_end(self) -> None:
        """Scroll so the last line of text sits at the bottom of the view."""
        self.scroll_to(y=max(0, self.text_height - self.size.height), animate=False)

    def _place(self, index: int, text: str, width: int) -> None:
        # A newline token still breaks the line; every other control character (an
        # escape sequence in a shared session or a server's stream) shows as its
        # escape, laid out at the width it takes.
        parts = terminal_text(text, tab=TAB).split("\n")
        for number, part in enumerate(parts):
            if number:
                self.lines.append([])
                self.line_widths.append(0)
            while part:
                room = width - self.line_widths[-1]
                size = cell_len(part)
                if size > room and self.line_widths[-1] and size <= width:
                    self.lines.append([])
                    self.line_widths.append(0)
                    room = width
                piece = part
                if cell_len(piece) > room:
                    piece = part[:room]
                part = part[len(piece) :]
                self.lines[-1].append((index, piece))
                self.line_widths[-1] += cell_len(piece)
                if part:
                    self.lines.append([])
                    self.line_widths.append(0)

    def render_line(self, y: int) -> Strip:
        line = y + self.scroll_offset.y
        width = self.scrollable_content_region.width
        base = self.rich_style
        if line >= len(self.lines) or self.marks is None:
            row = line - len(self.lines) - 1
            if 0 <= row < len(self.trailer_lines):
                text = self.trailer_lines[row]
                strip = Strip([Segment(text, base + Style(color="red", bold=True))])
                return strip.crop_extend(0, width, base)
            return Strip.blank(width, base)
        strip = self.strips.get(line)
        if strip is None:
            steps, marks, styles = self.state.steps, self.marks, self.styles_cache
            strip = Strip(
                [
                    Segment(piece, base + styles.style(self.lane_id, index, steps[index], marks))
                    for index, piece in self.lines[line]
                ]
            )
            self.strips[line] = strip
        return strip.crop_extend(self.scroll_offset.x, self.scroll_offset.x + width, base)

    def token_at(self, x: int, y: int) -> int | None:
        line = y + self.scroll_offset.y
        if not 0 <= line < len(self.lines):
            return None
        column = 0
        for index, piece in self.lines[line]:
            column += cell_len(piece)
            if x < column:
                return index
        return None

    async def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)  # padding excluded; None outside the text
        if offset is None:
            return
        index = self.token_at(offset.x, offset.y)
        if index is not None:
            await self.app.run_action(f"select_token('{self.lane_id}', {index})")

    def scroll_to_token(self, index: int) -> None:
        if 0 <= index < len(self.token_lines):
            line = self.token_lines[index]
            self.scroll_to(y=max(0, line - self.size.height // 3), animate=False)

    def on_resize(self) -> None:
        # a new width lays the lines out again on the next update
        self.width_used = -1


class WithoutControls(LineFilter):
    """Drops control characters from every drawn line: a last guard behind the widgets,
    which show them as escapes. Removing one keeps the layout, as it takes no cell."""

    def apply(self, segments: list[Segment], background: Color) -> list[Segment]:
        kept = []
        for segment in segments:
            text = without_controls(segment.text)
            # a control segment is Rich's own cursor movement, not text
            if text != segment.text and not segment.control:
                segment = Segment(text, segment.style)
            kept.append(segment)
        return kept


class Line(Widget):
    """One line of text that changes often: a repaint, never a new layout (which
    Static.update would ask for, and which costs a full reflow of the screen)."""

    DEFAULT_CSS = "Line { height: 1; }"

    def __init__(self, text: str = "", **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._text = Text(text, no_wrap=True, overflow="ellipsis")

    def set(self, text: str | Text) -> None:
        value = text if isinstance(text, Text) else Text(visible(text))
        value.no_wrap, value.overflow = True, "ellipsis"
        if value != self._text:
            self._text = value
            self.refresh()

    @property
    def plain(self) -> str:
        return self._text.plain

    def render(self) -> Text:
        return self._text


class Panel(Widget):
    """The divergence panel: fixed height, so a new selection repaints without a new
    layout of the screen."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._content: RenderableType = Text("")

    def set(self, content: RenderableType) -> None:
        self._content = content
        self.refresh()

    def render(self) -> RenderableType:
        return self._content


class LanePane(Vertical):
    """One lane: a header with what differs and live stats, the tokens, a margin
    sparkline."""

    def __init__(self, lane_id: str) -> None:
        super().__init__(id=f"lane-{lane_id}", classes="lane")
        self.lane_id = lane_id

    def compose(self) -> ComposeResult:
        yield Line(classes="lane-title")
        yield Line(classes="lane-stats")
        yield TokenView(self.lane_id, classes="lane-body")
        yield Sparkline([], classes="margins")

    def set_title(self, title: str) -> None:
        self.query_one(".lane-title", Line).set(title)

    def set_stats(self, stats: str) -> None:
        self.query_one(".lane-stats", Line).set(stats)

    def show_tokens(self, state: LaneState, marks: TokenMarks, follow: bool) -> None:
        view = self.query_one(TokenView)
        view.set_tokens(state, marks)
        if follow:
            view.follow_end()

    def set_margins(self, margins: Sequence[float]) -> None:
        self.query_one(".margins", Sparkline).data = [min(m, MARGIN_CAP) for m in margins] or [0]

    def scroll_to_token(self, index: int) -> None:
        self.query_one(TokenView).scroll_to_token(index)


def _candidate_rows(step: TokenStep | None) -> list[tuple[str, str, str]]:
    if step is None:
        return []
    rows = []
    for candidate in step.top:
        probability = step.probability(candidate.logit)
        rows.append(
            (
                repr(candidate.piece.decode("utf-8", "replace")),
                f"{candidate.logit:.3f}",
                "" if probability is None else f"{probability:.3f}",
            )
        )
    return rows


CLASS_BADGES = {
    NEAR_TIE: ("near tie", "black on green"),
    AMBIGUOUS: ("ambiguous", "black on yellow"),
    LARGE_MARGIN_SPLIT: ("SPLIT", "bold white on red"),
}
"""The fork class badge: a split is not a rounding effect, so it stands out."""


def _class_badge(a: TokenStep | None, b: TokenStep | None, near_tie: float) -> tuple[str, str]:
    if a is None or b is None:
        return ("", "")
    label, style = CLASS_BADGES[fork_verdict(a, b, near_tie=near_tie).kind]
    return (f" {label} ", style)


def render_panel(
    index: int | None,
    a: TokenStep | None,
    b: TokenStep | None,
    fork: Fork | None,
    similarity: float | None,
    generated: int,
    near_tie: float = DEFAULT_NEAR_TIE,
) -> Group | Text:
    """The divergence panel: the fork (or the selected step) with both lanes' top-k."""
    if index is None:
        return Text("no token selected: d jumps to the fork, n/p to near ties", style="dim")
    lines = []
    if fork is not None and index == fork.index:

        def view(pick: PickView) -> str:
            if pick.logit is None:
                return "outside top-k"
            return f"{pick.logit:.3f} (#{pick.rank})"

        lines.append(
            Text.assemble(
                ("FORK", "bold reverse"),
                f" at token {fork.index} of {generated} ",
                _class_badge(a, b, near_tie),
                "  ",
                ("a ", "bold"),
                repr(fork.piece_a.decode("utf-8", "replace")),
                "  vs  ",
                ("b ", "bold"),
                repr(fork.piece_b.decode("utf-8", "replace")),
            )
        )
        lines.append(
            Text(
                f"margin a {fork.a.margin:.3f} · b {fork.b.margin:.3f}   "
                f"b's pick in a: {view(fork.a.other)} · a's pick in b: {view(fork.b.other)}"
                + (f"   after the fork {similarity:.0%} similar" if similarity is not None else "")
            )
        )
    else:
        margins = " · ".join(
            f"{lane} margin {step.margin:.3f}" for lane, step in (("a", a), ("b", b)) if step
        )
        lines.append(Text(f"token {index}   {margins}"))
    table = Table(box=None, pad_edge=False, expand=False, show_edge=False)
    for header in ("a token", "logit", "p", "", "b token", "logit", "p"):
        table.add_column(header, no_wrap=True, overflow="ellipsis", max_width=18)
    rows_a, rows_b = _candidate_rows(a), _candidate_rows(b)
    for row in range(max(len(rows_a), len(rows_b))):
        left = rows_a[row] if row < len(rows_a) else ("", "", "")
        right = rows_b[row] if row < len(rows_b) else ("", "", "")
        table.add_row(*left, "│", *right)
    return Group(*lines, table)
