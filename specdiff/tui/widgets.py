"""Widgets that render records: a lane pane, its tokens and margin strip, the
divergence panel, the legend and the aligned view.

One colour hierarchy (look_style) draws tokens, the legend and the aligned view, so
the legend always shows what the panes show."""

from __future__ import annotations

import codecs
import math
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache

from rich.cells import cell_len, chop_cells
from rich.console import Group, RenderableType
from rich.segment import Segment, SegmentLines
from rich.style import Style
from rich.table import Table
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.color import Color
from textual.containers import Vertical, VerticalScroll
from textual.filter import LineFilter
from textual.geometry import Region, Size
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.theme import Theme
from textual.widget import Widget
from textual.widgets import Footer, Static
from textual.widgets._footer import FooterKey

from specdiff.compare import (
    AMBIGUOUS,
    DEFAULT_NEAR_TIE,
    LARGE_MARGIN_SPLIT,
    NEAR_TIE,
    UNSCORED,
    Fork,
    PickView,
    counted,
    fork_sentence,
    fork_verdict,
    near_ties,
    quoted_piece,
)
from specdiff.compare import MARGIN_DISPLAY_CAP as MARGIN_CAP
from specdiff.forecast import FlipModel, forecast
from specdiff.lanes import Pair, differences
from specdiff.safe_text import terminal_text, visible, without_controls
from specdiff.steps import TokenStep
from specdiff.tui.themes import APP_VARIABLES, readable_on, theme_variables

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
    """Colours the renderers need, read from a theme. Text colours that sit on a
    coloured background (the fork, the cursor) are picked for contrast."""

    background: str
    shared: str
    muted: str
    """Text both lanes share after the fork: greyed, as it no longer explains the fork."""
    fork: str
    fork_text: str
    heat_strong: str
    heat_weak: str
    insert: str
    delete: str
    cursor: str
    cursor_text: str
    bar: str
    """Margin strip bars above the near-tie threshold."""
    tie_bar: str
    """Margin strip bars below it."""
    forecast: str = "#5a2a3a"
    """A forecast step's background: the fork's colour, faint, as a fork not yet seen."""
    forecast_text: str = "#ffffff"

    @classmethod
    def from_variables(cls, variables: dict[str, str]) -> Palette:
        colours = {**APP_VARIABLES, **variables}
        background = colours.get("background", "#000000")
        fork, cursor = colours["fork"], colours["cursor"]
        shared = colours["shared"]
        faint_fork = Color.parse(fork).blend(Color.parse(background), FORECAST_FAINTNESS).hex
        return cls(
            background=background,
            shared=shared,
            muted=colours["shared-after-fork"],
            fork=fork,
            fork_text=readable_on(fork, background, shared),
            heat_strong=colours["near-tie-strong"],
            heat_weak=colours["near-tie-weak"],
            insert=colours["diff-insert"],
            delete=colours["diff-delete"],
            cursor=cursor,
            cursor_text=readable_on(cursor, shared, background),
            bar=colours.get("secondary", "#af87ff"),
            tie_bar=colours.get("warning", "#ffd75f"),
            forecast=faint_fork,
            forecast_text=readable_on(faint_fork, shared, background),
        )

    @classmethod
    def from_theme(cls, theme: Theme) -> Palette:
        """The palette of a theme (computed once per theme object)."""
        cached = _THEME_PALETTES.get(id(theme))
        if cached is None or cached[0] is not theme:
            cached = (theme, cls.from_variables(theme_variables(theme)))
            _THEME_PALETTES[id(theme)] = cached
        return cached[1]


_THEME_PALETTES: dict[int, tuple[Theme, Palette]] = {}

SHADE_LEVELS = 8
"""Near-tie shading comes in this many strengths: enough to read, few enough to cache."""


def shade_level(margin: float, threshold: float) -> int | None:
    """How strongly a near tie is shaded, 0 (margin just below the threshold) to
    SHADE_LEVELS - 1 (margin 0); None for a step that is not a near tie."""
    if not margin < threshold:
        return None
    closeness = 1.0 - margin / threshold if threshold > 0 else 1.0
    return max(0, min(SHADE_LEVELS - 1, int(closeness * SHADE_LEVELS)))


def shade(palette: Palette, level: int) -> str:
    """The background of a near tie: one hue, stronger for a smaller margin, so the
    strength reads as shade in every theme (high-contrast included)."""
    weak, strong = Color.parse(palette.heat_weak), Color.parse(palette.heat_strong)
    return weak.blend(strong, level / (SHADE_LEVELS - 1)).hex


FORK, ONLY_A, ONLY_B, SHARED_AFTER, SHARED = "fork", "a only", "b only", "shared after", "shared"
FORECAST = "forecast"
"""A step the other lane has not reached yet that the fork forecast ranks among the likeliest
first forks."""
FORECAST_FAINTNESS = 0.5
"""How far a forecast step's background blends from the fork's colour to the pane's:
kin to the fork, and never mistaken for it."""
FORECAST_SHOWN = 5
"""How many forecast steps the lane ahead marks."""
"""A token's role, which picks its colour; one role per token, never stacked."""


@dataclass(frozen=True)
class Look:
    """Everything that decides how one token is drawn."""

    role: str
    shade: int | None = None
    """Near-tie strength; only before the fork, where it explains what comes."""
    cursor: bool = False
    drafted: bool = False
    """Underlined: only where nothing else marks the token."""


def look_style(palette: Palette, look: Look) -> Style:
    """The one colour hierarchy: the fork strongest, then the text only one lane has,
    then near-tie shading before the fork; the cursor is a box of its own colour, and
    on the fork an underline, so it never hides the fork."""
    colour = {
        FORK: palette.fork_text,
        ONLY_A: palette.delete,
        ONLY_B: palette.insert,
        SHARED_AFTER: palette.muted,
    }.get(look.role, palette.shared)
    background = None if look.shade is None else shade(palette, look.shade)
    if look.role == FORK:
        return Style(
            color=colour,
            bgcolor=palette.fork,
            bold=True,
            underline=look.cursor,
            overline=look.cursor,
        )
    if look.cursor:
        return Style(color=palette.cursor_text, bgcolor=palette.cursor, bold=True)
    if look.role == FORECAST:
        return Style(color=palette.forecast_text, bgcolor=palette.forecast, italic=True)
    return Style(color=colour, bgcolor=background, underline=look.drafted)


@dataclass(frozen=True)
class TokenMarks:
    """What decides a token's look besides the step itself."""

    palette: Palette
    threshold: float
    fork_index: int | None
    cursor: int | None
    changed_after_fork: frozenset[int] = frozenset()
    forecast: frozenset[int] = frozenset()
    """Forecast steps not yet reached by the other lane (`pending_forecast`)."""

    def look(self, lane_id: str, index: int, step: TokenStep) -> Look:
        cursor = index == self.cursor
        fork = self.fork_index
        if index == fork:
            return Look(FORK, cursor=cursor)
        if fork is not None and index > fork:
            if index in self.changed_after_fork:
                return Look(ONLY_A if lane_id == "a" else ONLY_B, cursor=cursor)
            # greyed text is marked already: no draft underline on top of it
            return Look(SHARED_AFTER, cursor=cursor)
        if index in self.forecast:
            return Look(FORECAST, cursor=cursor)
        level = shade_level(step.margin, self.threshold)
        return Look(SHARED, level, cursor, step.drafted and level is None and not cursor)


def pending_forecast(
    steps: Sequence[TokenStep], other_length: int, forked: bool, model: FlipModel
) -> frozenset[int]:
    """The steps of a lane ahead that the forecast ranks likeliest to be the first fork,
    among those the other lane has not reached: the lanes agree so far, so the first fork
    lies there or nowhere. Nothing once the lanes have forked, or for the lane behind."""
    if forked or len(steps) <= other_length:
        return frozenset()
    return frozenset(forecast(steps, FORECAST_SHOWN, model, start=other_length).indices)


class TokenStyles:
    """Rich styles for token looks; few distinct looks, so each is built once."""

    def __init__(self) -> None:
        self._cache: dict[tuple[Palette, Look], Style] = {}

    def style(self, lane_id: str, index: int, step: TokenStep, marks: TokenMarks) -> Style:
        key = (marks.palette, marks.look(lane_id, index, step))
        cached = self._cache.get(key)
        if cached is None:
            # the colour blend runs once per look, not once per drawn token
            cached = self._cache[key] = look_style(*key)
        return cached


class LineDrawn:
    """For a widget drawn line by line on its own style, worked out once per repaint:
    Textual's `rich_style` walks every ancestor's styles on each call, which for a
    streaming pane's every line was most of the cost of drawing it. A plain mixin, put
    first: Textual takes a widget's default CSS from its first widget base alone."""

    _repaint_style: Style | None = None
    rich_style: Style  # the widget's own, from the class this is mixed into

    def render_lines(self, crop: Region) -> list[Strip]:
        self._repaint_style = self.rich_style
        try:
            return super().render_lines(crop)  # type: ignore[misc]
        finally:
            self._repaint_style = None

    @property
    def line_style(self) -> Style:
        """The widget's style, for a line drawn now."""
        return self._repaint_style if self._repaint_style is not None else self.rich_style


class TokenView(LineDrawn, ScrollView, can_focus=False):
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
        self.strips_base = Style()
        """The pane's style the cached lines were drawn on."""
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
        restyled = self.restyle(marks)
        redraw_all = redraw_all or restyled is None
        trailer = f"[lane error] {visible(state.error)}" if state.error else None
        if trailer != self.trailer or redraw_all:
            self.trailer = trailer
            self.trailer_lines = textwrap.wrap(trailer, max(width, 8)) if trailer else []
            redraw_all = True
        first_dirty = len(self.lines) - 1
        for index in range(len(self.token_lines), len(state.steps)):
            self.token_lines.append(len(self.lines) - 1)
            self._place(index, state.texts[index] or "\u2205", width)
        dirty = set(range(first_dirty, len(self.lines))) | (restyled or set())
        for line in dirty:
            self.strips.pop(line, None)
        # Past one screenful the virtual height grows in steps of LINE_CHUNK lines: each
        # change redraws the whole view and its scrollbar, which a streaming lane would
        # otherwise ask for on almost every update.
        height = self.text_height
        if height > self.size.height:
            height = -(-height // LINE_CHUNK) * LINE_CHUNK
        size = Size(width, height)
        if size != self.virtual_size or redraw_all:
            self.grow_to(size)
            self.refresh()
            return
        # only the lines that changed, where they are on screen
        rows = sorted(line - self.scroll_offset.y for line in dirty)
        shown = [Region(0, row, self.size.width, 1) for row in rows if 0 <= row < self.size.height]
        if shown:
            self.refresh(*shown)

    def restyle(self, marks: TokenMarks) -> set[int] | None:
        """Take new marks; the lines whose looks they change, or None when they may
        change every line. While a lane streams its forecast marks and the diff after
        the fork move with every batch, and a new look for all its lines would redraw
        the whole view each time."""
        old, self.marks = self.marks, marks
        if old == marks:
            return set()
        if (
            old is None
            or replace(
                old,
                cursor=marks.cursor,
                changed_after_fork=marks.changed_after_fork,
                forecast=marks.forecast,
            )
            != marks
        ):
            self.strips.clear()
            return None
        tokens = (old.changed_after_fork ^ marks.changed_after_fork) | (
            old.forecast ^ marks.forecast
        )
        tokens |= {index for index in (old.cursor, marks.cursor) if index is not None}
        placed = (index for index in tokens if index < len(self.token_lines))
        return {line for index in placed for line in self.token_span(index)}

    def token_span(self, index: int) -> range:
        """The lines a placed token may take: from the line it was placed at to the one
        the next token was (a token that does not fit there starts a new line)."""
        following = index + 1
        last = (
            self.token_lines[following]
            if following < len(self.token_lines)
            else len(self.lines) - 1
        )
        return range(self.token_lines[index], last + 1)

    def grow_to(self, size: Size) -> None:
        """Take a new scrollable size without a layout of the whole screen: the screen
        never reads a scroll view's virtual size, so only its scrollbars need it (and
        they ask for a layout themselves the one time they appear or go)."""
        if size != self.virtual_size:
            self.set_reactive(TokenView.virtual_size, size)
            self._scroll_update(size)

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
                # cut by cells, not characters: a wide character takes two
                piece = part if size <= room else chop_cells(part, room)[0] if room > 0 else ""
                if cell_len(piece) > room:  # a wide character with one cell left
                    piece = ""
                part = part[len(piece) :]
                if piece:
                    self.lines[-1].append((index, piece))
                self.line_widths[-1] += cell_len(piece)
                if part:
                    self.lines.append([])
                    self.line_widths.append(0)

    def render_line(self, y: int) -> Strip:
        line = y + self.scroll_offset.y
        width = self.scrollable_content_region.width
        base = self.line_style
        if line >= len(self.lines) or self.marks is None:
            row = line - len(self.lines) - 1
            if 0 <= row < len(self.trailer_lines):
                text = self.trailer_lines[row]
                strip = Strip([Segment(text, base + Style(color="red", bold=True))])
                return strip.crop_extend(0, width, base)
            return Strip.blank(width, base)
        if base != self.strips_base:
            # a new theme changes the pane's own colours, which every cached line holds
            self.strips.clear()
            self.strips_base = base
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


def footer_key_width(key: FooterKey, compact: bool) -> int:
    """The cells a footer key takes: its key, its description and the spacing the
    footer's style puts around them (a margin when compact, padding when not)."""
    return cell_len(key.key_display) + cell_len(key.description) + (2 if compact else 3)


class FittedFooter(Footer):
    """Textual's footer with only the keys that fit whole, in the bindings' order (help
    and quit come first): past the width Textual's cuts a key mid-word and a stray
    letter of it shows beside the palette key."""

    def compose(self) -> ComposeResult:
        widgets = list(super().compose())
        keys = [widget for widget in widgets if isinstance(widget, FooterKey)]
        palette = [key for key in keys if key.has_class("-command-palette")]
        room = (self.size.width or self.app.size.width) - sum(
            footer_key_width(key, self.compact) + 1 for key in palette
        )
        for widget in widgets:
            if isinstance(widget, FooterKey) and widget not in palette:
                room -= footer_key_width(widget, self.compact)
                if room < 0:
                    continue
            yield widget


class ThemeAware(Widget):
    """A widget drawn in theme colours that repaints once a new theme is applied."""

    def on_mount(self) -> None:
        self.app.theme_changed_signal.subscribe(self, self.theme_changed)

    def theme_changed(self, _theme: Theme) -> None:
        self.refresh()

    @property
    def palette(self) -> Palette:
        return Palette.from_theme(self.app.current_theme)


@dataclass(frozen=True)
class PanelView:
    """What the divergence panel shows: the selected step (or the fork) of both lanes."""

    index: int | None
    a: TokenStep | None
    b: TokenStep | None
    fork: Fork | None
    similarity: float | None
    generated: int
    """The tokens each lane has so far (the longer lane's count)."""
    near_tie: float = DEFAULT_NEAR_TIE
    near_ties_before: tuple[tuple[int, float], ...] = ()
    """(index, margin) of lane a's near ties before the fork (or so far, without one)."""
    differences: tuple[str, ...] = ()
    """What the lanes differ in, one "key a / b" each."""


class Panel(ThemeAware):
    """The divergence panel: fixed height, so a new selection repaints without a new
    layout of the screen; laid out for its own size when drawn."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.view: PanelView | None = None
        self.body: tuple[tuple[object, ...], SegmentLines | None] = ((), None)
        """The candidates as drawn, with what they were drawn from: while lanes stream
        the panel is redrawn for its token count, and the table is most of its cost."""

    def show(self, view: PanelView) -> None:
        if view != self.view:
            self.view = view
            self.refresh()

    def theme_changed(self, theme: Theme) -> None:
        self.body = ((), None)
        super().theme_changed(theme)

    def render(self) -> RenderableType:
        if self.view is None:
            return Text("")
        width, height = self.content_size.width or 120, self.content_size.height or 12
        lines = panel_lines(self.view, width, height, self.palette)
        key = body_key(self.view, width, height - len(lines))
        if key != self.body[0]:
            body = panel_body(self.view, width, height - len(lines))
            console = self.app.console
            options = self.app.console_options.update(highlight=False, width=width)
            drawn = console.render_lines(body, options, pad=False) if body is not None else None
            self.body = (key, SegmentLines(drawn, new_lines=True) if drawn else None)
        return Group(*lines, *([self.body[1]] if self.body[1] is not None else []))


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


@dataclass(frozen=True)
class LegendEntry:
    """One colour or mark, as the legend line and the help screen name it."""

    short: str
    long: str
    meaning: str
    look: Look


LEGEND = (
    LegendEntry("fork", "fork", "the first token the lanes differ at, in both panes", Look(FORK)),
    LegendEntry("a only", "only in a", "after the fork: text lane b does not have", Look(ONLY_A)),
    LegendEntry("b only", "only in b", "after the fork: text lane a does not have", Look(ONLY_B)),
    LegendEntry(
        "shared", "shared after", "after the fork: text both lanes have", Look(SHARED_AFTER)
    ),
    LegendEntry(
        "tie",
        "near tie",
        "shaded: margin below the near-tie threshold; stronger shade, smaller margin",
        Look(SHARED, SHADE_LEVELS - 1),
    ),
    LegendEntry(
        "draft",
        "draft",
        "underlined: from an accepted draft (where nothing else marks the token)",
        Look(SHARED, drafted=True),
    ),
    LegendEntry(
        "cursor",
        "cursor",
        "the selected token, in a box of its own colour (on the fork: underlined)",
        Look(SHARED, cursor=True),
    ),
)
FORECAST_LEGEND = LegendEntry(
    "forecast",
    "forecast",
    "faint fork colour, italic: ahead of the other lane, a step the forecast ranks among "
    f"the {FORECAST_SHOWN} likeliest first forks (from this lane's margins)",
    Look(FORECAST),
)
"""Named in the legend line only while a lane ahead shows forecast marks: the line has
room for the strip's marks at 80 columns only without it."""
LEGEND_ROWS = tuple((entry.long, entry.meaning) for entry in (*LEGEND, FORECAST_LEGEND)) + (
    (
        "margin strip",
        "under each pane, one bar per step (binned when they outnumber the columns): "
        "taller is more confident; near ties in their own colour below the threshold "
        "band; the fork and the cursor marked; dimmed after the fork",
    ),
)
"""The legend as (mark, meaning) rows, for the help screen."""


def _legend_entry(palette: Palette, entry: LegendEntry, label: str) -> Text:
    name = getattr(entry, label)
    if entry.look.shade is None:
        return Text(name, look_style(palette, entry.look))
    # a near tie's name in every strength of its shade, the closest call first: the
    # strength reads as shade, as it does in the panes
    text = Text()
    for number, character in enumerate(name):
        level = SHADE_LEVELS - 1 - round(number * (SHADE_LEVELS - 1) / max(1, len(name) - 1))
        text.append(character, look_style(palette, Look(SHARED, level)))
    return text


def _strip_legend(palette: Palette) -> Text:
    """The margin strip's marks, each drawn as the strip draws it: a near tie's bar
    over the threshold band, the fork's cell, a bar after the fork (dimmed)."""
    marks = TokenMarks(palette, threshold=1.0, fork_index=0, cursor=None)
    no_fork = TokenMarks(palette, threshold=1.0, fork_index=None, cursor=None)
    text = Text()
    text.append("strip ", "dim")
    for character, style, name in (
        ("▃", strip_cell_style(no_fork, 0, 0, True, True), "tie "),
        ("█", strip_cell_style(marks, 0, 0, False, False), "fork "),
        ("▆", strip_cell_style(marks, 1, 1, False, False), "after"),
    ):
        text.append(character, style)
        text.append(name)
    return text


def legend_text(palette: Palette, width: int, forecast: bool = False) -> Text:
    """The legend in one line of `width` cells: each mark named in its own look (the
    forecast's while one is shown), with long names where they fit, else short ones, with
    the margin strip's marks where they fit too, else cut."""
    strip = _strip_legend(palette)
    entries = (*LEGEND, FORECAST_LEGEND) if forecast else LEGEND
    for label, with_strip in (("long", True), ("short", True), ("long", False), ("short", False)):
        text = Text(no_wrap=True, overflow="ellipsis")
        for number, entry in enumerate(entries):
            if number:
                text.append("  ")
            text.append_text(_legend_entry(palette, entry, label))
        if with_strip:
            text.append("  │ ", "dim")
            text.append_text(strip)
        if text.cell_len <= width:
            return text
    text.truncate(width, overflow="ellipsis")
    return text


class Legend(ThemeAware):
    """One line under the panel: every colour and mark of the panes."""

    DEFAULT_CSS = "Legend { height: 1; padding: 0 1; }"

    forecast = False
    """Whether a pane shows forecast marks, so the line names them."""

    def show_forecast(self, shown: bool) -> None:
        if shown != self.forecast:
            self.forecast = shown
            self.refresh()

    def render(self) -> Text:
        return legend_text(self.palette, self.content_size.width or 80, self.forecast)


class LanePane(Vertical):
    """One lane: a header with what differs and live stats, the tokens, the margin
    strip."""

    def __init__(self, lane_id: str) -> None:
        super().__init__(id=f"lane-{lane_id}", classes="lane")
        self.lane_id = lane_id

    def compose(self) -> ComposeResult:
        yield Line(classes="lane-title")
        yield Line(classes="lane-stats")
        yield TokenView(self.lane_id, classes="lane-body")
        yield MarginStrip(classes="margins")

    def set_title(self, title: str) -> None:
        self.query_one(".lane-title", Line).set(title)

    def set_stats(self, stats: str) -> None:
        self.query_one(".lane-stats", Line).set(stats)

    def show_tokens(
        self, state: LaneState, marks: TokenMarks, follow: bool, strip: bool = True
    ) -> None:
        view = self.query_one(TokenView)
        view.set_tokens(state, marks)
        if strip:
            self.query_one(MarginStrip).show(state.steps, marks)
        if follow:
            view.follow_end()

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
                quoted_piece(candidate.piece),
                f"{candidate.logit:.3f}",
                "" if probability is None else f"{probability:.3f}",
            )
        )
    return rows


CLASS_BADGES = {
    NEAR_TIE: "near tie",
    AMBIGUOUS: "ambiguous",
    LARGE_MARGIN_SPLIT: "SPLIT",
    UNSCORED: "unscored",
}
"""The fork class badge: a split is not a rounding effect, so it stands out."""


def _class_badge(
    a: TokenStep | None, b: TokenStep | None, near_tie: float, palette: Palette | None
) -> tuple[str, Style]:
    if a is None or b is None:
        return ("", Style())
    kind = fork_verdict(a, b, near_tie=near_tie).kind
    colours = {
        NEAR_TIE: "#5fd787",
        AMBIGUOUS: "#ffd75f",
        LARGE_MARGIN_SPLIT: "#d70000",
        UNSCORED: "#808080",
    }
    if palette is not None:
        colours = {
            NEAR_TIE: palette.insert,
            AMBIGUOUS: palette.tie_bar,
            LARGE_MARGIN_SPLIT: palette.fork,
            UNSCORED: palette.muted,
        }
    background = colours[kind]
    return (
        f" {CLASS_BADGES[kind]} ",
        Style(color=readable_on(background), bgcolor=background, bold=True),
    )


def render_panel(
    index: int | None,
    a: TokenStep | None,
    b: TokenStep | None,
    fork: Fork | None,
    similarity: float | None,
    generated: int,
    near_tie: float = DEFAULT_NEAR_TIE,
) -> Group:
    """The divergence panel at 120x12 cells, as a renderable (for reports and tests)."""
    view = PanelView(index, a, b, fork, similarity, generated, near_tie)
    return panel_renderable(view, 120, 12, None)


WHY_WRAP_HEIGHT = 6
"""From this panel height (an 80x24 screen's) the fork's verdict may take two lines."""
SIDE_NOTES_WIDTH = 100
"""From this width the panel puts what the lanes differ in and the near ties before
the fork beside the candidates."""


def panel_renderable(view: PanelView, width: int, height: int, palette: Palette | None) -> Group:
    """The panel laid out for `width` x `height` cells, the most important lines first
    (the fork and why; then the margins; then as many candidates as fit)."""
    lines = panel_lines(view, width, height, palette)
    body = panel_body(view, width, height - len(lines))
    return Group(*lines, *([body] if body is not None else []))


def panel_lines(view: PanelView, width: int, height: int, palette: Palette | None) -> list[Text]:
    """The panel's lines above its candidates: the fork, why, the margins."""
    # a tall panel gives the verdict a second line; a short one keeps the candidates
    return _panel_lines(view, palette, width if height >= WHY_WRAP_HEIGHT else None)


def panel_body(view: PanelView, width: int, rows: int) -> RenderableType | None:
    """The candidates in `rows` lines, with the side notes beside them where the width
    allows; None without a selected step or room."""
    if view.index is None:
        return None
    table = _candidate_table(view.a, view.b, rows - 1) if rows > 1 else None
    notes = _side_notes(view, max(0, rows)) if width >= SIDE_NOTES_WIDTH else None
    if table is not None and notes is not None:
        grid = Table.grid(expand=True, padding=(0, 0, 0, 3))
        grid.add_column(no_wrap=True)
        grid.add_column(ratio=1, overflow="ellipsis")
        grid.add_row(table, notes)
        return grid
    return table


def body_key(view: PanelView, width: int, rows: int) -> tuple[object, ...]:
    """What the panel's body is drawn from: the token count and the similarity after the
    fork, which change with every streamed batch, are not in it."""
    return (
        view.index is None,
        view.a,
        view.b,
        view.differences,
        view.fork is not None,
        view.near_ties_before,
        width,
        rows,
    )


def _one_line(*parts: str | tuple[str, str | Style]) -> Text:
    text = Text.assemble(*parts)
    text.no_wrap, text.overflow = True, "ellipsis"
    return text


def _panel_lines(view: PanelView, palette: Palette | None, why_width: int | None) -> list[Text]:
    fork, a, b = view.fork, view.a, view.b
    if view.index is None:
        keys = "d jumps to the fork, " if fork is not None else ""
        return [_one_line((f"no token selected: {keys}n/p near ties, ←/→ token by token", "dim"))]
    no_normalizer = any(step is not None and step.logsumexp is None for step in (a, b))
    p_note = " · p: no normalizer recorded" if no_normalizer else ""
    p_note += "".join(  # a drafted step's numbers: "rescored by llama-server /completion"
        f" · {lane} {visible(step.source)}"
        for lane, step in (("a", a), ("b", b))
        if step and step.source
    )
    if fork is not None and view.index == fork.index and a is not None and b is not None:
        return _fork_lines(view, (fork, a, b), palette, p_note, why_width)
    # each lane's own pick at this step: away from the fork the reader still sees
    # what each lane chose before reading the numbers
    picks = " · ".join(
        f"{lane} {quoted_piece(step.piece)}" for lane, step in (("a", a), ("b", b)) if step
    )
    margins = " · ".join(f"{lane} {step.margin:.3f}" for lane, step in (("a", a), ("b", b)) if step)
    lines = [_one_line(("token", "bold"), f" {view.index}: {picks}   margins {margins}{p_note}")]
    if fork is not None and view.index > fork.index:
        warning = palette.tie_bar if palette is not None else "yellow"
        lines.append(
            _one_line(
                (
                    f"after the fork (token {fork.index}): the lanes are compared by index, "
                    "though their contexts differ",
                    Style(color=warning, italic=True),
                )
            )
        )
    return lines


def _fork_lines(
    view: PanelView,
    at_fork: tuple[Fork, TokenStep, TokenStep],
    palette: Palette | None,
    p_note: str,
    why_width: int | None,
) -> list[Text]:
    """The fork's header, its verdict (on two lines when `why_width` is given and it
    needs them) and its margins."""
    fork, a, b = at_fork

    def pick(view_of: PickView) -> str:
        return "outside top-k" if view_of.logit is None else f"#{view_of.rank} {view_of.logit:.3f}"

    verdict = fork_verdict(a, b, near_tie=view.near_tie)
    similar = (
        f" · after the fork {view.similarity:.0%} similar" if view.similarity is not None else ""
    )
    why = f"why: {fork_sentence(fork, verdict, ('a', 'b'))}"
    why_lines = textwrap.wrap(why, why_width)[:2] if why_width else [why]
    if len(why_lines) == 2:
        why_lines[1] = why[len(why_lines[0]) :].strip()
    return [
        _one_line(
            ("FORK", "bold reverse"),
            # the fork's index beside the tokens shown, never "N of M": an index next to
            # a count reads as off by one
            f" at token {fork.index} · {counted(view.generated, 'token')} shown ",
            _class_badge(a, b, view.near_tie, palette),
            " ",
            ("a ", "bold"),
            quoted_piece(fork.piece_a),
            " vs ",
            ("b ", "bold"),
            quoted_piece(fork.piece_b),
        ),
        *(
            _one_line(("why:", "bold") if not n else "", line[4:] if not n else line)
            for n, line in enumerate(why_lines)
        ),
        _one_line(
            f"margins a {fork.a.margin:.3f} · b {fork.b.margin:.3f} · "
            f"b's pick in a {pick(fork.a.other)} · a's in b {pick(fork.b.other)}"
            f"{similar}{p_note}"
        ),
    ]


def _candidate_table(a: TokenStep | None, b: TokenStep | None, rows: int) -> Table:
    table = Table(box=None, pad_edge=False, expand=False, show_edge=False)
    for header in ("a token", "logit", "p", "", "b token", "logit", "p"):
        table.add_column(header, no_wrap=True, overflow="ellipsis", max_width=18)
    rows_a, rows_b = _candidate_rows(a), _candidate_rows(b)
    for row in range(min(rows, max(len(rows_a), len(rows_b)))):
        left = rows_a[row] if row < len(rows_a) else ("", "", "")
        right = rows_b[row] if row < len(rows_b) else ("", "", "")
        table.add_row(*left, "│", *right)
    return table


def _side_notes(view: PanelView, rows: int) -> Text:
    """What the lanes differ in, then lane a's near ties before the fork."""
    lines: list[Text] = []
    if view.differences:
        lines.append(_one_line(("lanes differ in ", "bold"), " · ".join(view.differences)))
    where = "before the fork" if view.fork is not None else "so far"
    ties = view.near_ties_before
    lines.append(_one_line((f"near ties {where} (a): ", "bold"), str(len(ties))))
    for index, margin in ties[: max(0, rows - len(lines))]:
        lines.append(_one_line(f"  token {index}  margin {margin:.3f}"))
    return Text("\n").join(lines)


def lane_differences(pair: Pair) -> tuple[str, ...]:
    """The pair's differing keys, "key a / b" each, as the panel lists them."""
    return tuple(
        visible(f"{key} {pair.a.shown(key)} / {pair.b.shown(key)}")
        for key in differences(pair.a, pair.b)
    )


def near_ties_before(
    steps: Sequence[TokenStep], threshold: float, fork: Fork | None
) -> tuple[tuple[int, float], ...]:
    """(index, margin) of a lane's near ties before the fork (all of them without one)."""
    end = fork.index if fork is not None else len(steps)
    return tuple((index, steps[index].margin) for index in near_ties(steps[:end], threshold))


ALIGNED_CONTEXT = 8
"""Shared tokens the aligned view keeps before the fork, for context."""


def aligned_text(
    lanes: Mapping[str, LaneState], marks: Mapping[str, TokenMarks], context: int = ALIGNED_CONTEXT
) -> Text:
    """The shared prefix collapsed to its last few tokens, then each lane's branch from
    the fork on, a above b, in the panes' colours."""
    top, branch_b = aligned_parts(lanes, marks, context)
    return top if branch_b is None else Text("\n\n").join((top, branch_b))


def aligned_parts(
    lanes: Mapping[str, LaneState], marks: Mapping[str, TokenMarks], context: int = ALIGNED_CONTEXT
) -> tuple[Text, Text | None]:
    """The aligned view in two parts: the collapsed prefix with lane a's branch, and
    lane b's branch (None before a fork), so each can have its own share of the
    height."""
    a, b = lanes["a"], lanes["b"]
    fork = marks["a"].fork_index
    shared_end = fork if fork is not None else min(len(a.steps), len(b.steps))
    start = max(0, shared_end - context)
    text = Text()
    text.append("aligned view (a or escape: back to the panes)", "dim")
    if start:
        text.append(f"  … {start} shared token{'s' if start != 1 else ''} …", "dim italic")
    text.append("\n")
    styles = TokenStyles()
    _append_tokens(text, a, marks["a"], styles, range(start, shared_end))
    if fork is None:
        longer = a if len(a.steps) >= len(b.steps) else b
        _append_tokens(
            text, longer, marks[longer.lane_id], styles, range(shared_end, len(longer.steps))
        )
        text.append(f"\n\nno fork yet: the lanes agree over {shared_end} tokens", "dim")
        return text, None
    branches = [text, Text()]
    for state, branch in zip((a, b), branches):
        gap = "\n\n" if branch.plain else ""  # lane b's part begins its own view
        branch.append(f"{gap}{state.lane_id} ▸ ", "bold")
        _append_tokens(branch, state, marks[state.lane_id], styles, range(fork, len(state.steps)))
    return branches[0], branches[1]


def _append_tokens(
    text: Text, state: LaneState, marks: TokenMarks, styles: TokenStyles, indices: range
) -> None:
    for index in indices:
        piece = terminal_text(state.texts[index] or "\u2205", tab=TAB)
        text.append(piece, styles.style(state.lane_id, index, state.steps[index], marks))


class AlignedView(Vertical, can_focus=True):
    """The aligned view: the shared prefix collapsed, the two branches stacked. Lane a's
    part takes at most half the height, so lane b's branch is on screen too; each part
    scrolls on its own."""

    DEFAULT_CSS = """
    AlignedView { display: none; height: 1fr; padding: 0 1; }
    AlignedView > VerticalScroll { height: auto; max-height: 50%; scrollbar-size-vertical: 1; }
    AlignedView > VerticalScroll.aligned-b { height: 1fr; max-height: 100%; }
    AlignedView Static { width: 100%; height: auto; }
    """
    BINDINGS = [Binding("escape", "app.toggle_aligned", "back", show=False)]

    def compose(self) -> ComposeResult:
        with VerticalScroll(classes="aligned-a", can_focus=False):
            yield Static(classes="aligned-text")
        with VerticalScroll(classes="aligned-b", can_focus=False):
            yield Static(classes="aligned-branch-b")

    def show(self, lanes: Mapping[str, LaneState], marks: Mapping[str, TokenMarks]) -> None:
        top, branch_b = aligned_parts(lanes, marks)
        self.query_one(".aligned-text", Static).update(top)
        self.query_one(".aligned-branch-b", Static).update(branch_b or "")
