"""A lane's tokens, wrapped at token boundaries into cached lines.

A click on a token posts ``TokenView.Selected``: the screen decides what a selection
does (the panel follows it), the view only knows where its tokens are."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, replace

from rich.cells import cell_len, chop_cells
from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.geometry import Region, Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from specdiff.safe_text import terminal_text, visible
from specdiff.tui.view_state import LaneState
from specdiff.tui.widgets.base import LineDrawn
from specdiff.tui.widgets.styles import TokenMarks, TokenStyles

LINE_CHUNK = 8
"""A token view's scrollable height grows by this many lines at a time."""
TAB = "    "
"""A tab in a token, as the pane shows it: a tab sent to the terminal would move the
cursor past cells the layout does not know of."""


class TokenView(LineDrawn, ScrollView, can_focus=False):
    """A lane's tokens, wrapped at token boundaries into cached lines.

    Layout (which token sits on which line) depends only on the text and the width;
    looks (fork, cursor, near-tie heat, diff) are applied when a line is drawn. So while
    a run streams only new tokens are laid out, and moving the cursor or finding the
    fork redraws the visible lines without laying anything out again.
    """

    @dataclass
    class Selected(Message):
        """A token was clicked: the screen moves the cursor there."""

        lane_id: str
        index: int

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
        self.waiting: tuple[LaneState, TokenMarks] | None = None
        """What was asked to be shown while the view had no width."""
        self.following = False
        """Last scrolled to the end: a resize (the panel growing at the fork) keeps the
        end in view instead of the rows above it."""
        self.kept_token: int | None = None
        """The token last scrolled to, kept in view the same way."""

    def set_tokens(self, state: LaneState, marks: TokenMarks) -> None:
        if not self.scrollable_content_region.width:
            # not laid out yet, or hidden (the aligned view stands in for the panes): a
            # guessed width would stay once the view is shown again, so the tokens wait
            # for the view's own width (on_resize lays them out)
            self.waiting = (state, marks)
            return
        self.waiting = None
        width = max(8, self.scrollable_content_region.width)
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
        self.following, self.kept_token = True, None
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
        cached = self.strips.get(line)
        if cached is not None:
            strip = cached
        else:
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

    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)  # padding excluded; None outside the text
        if offset is None:
            return
        index = self.token_at(offset.x, offset.y)
        if index is not None:
            self.post_message(self.Selected(self.lane_id, index))

    def scroll_to_token(self, index: int) -> None:
        self.following, self.kept_token = False, index
        if 0 <= index < len(self.token_lines):
            y = max(0, self.token_lines[index] - self.size.height // 3)
            if y > self.max_scroll_y:
                # lines laid out just now: the scrollable height grows on the next
                # refresh, and a scroll past today's end would stop short of the token
                self.call_after_refresh(self.scroll_to, y=y, animate=False)
            else:
                self.scroll_to(y=y, animate=False)

    def on_resize(self) -> None:
        # a new width lays the lines out again, at once: no update may come (a finished
        # run, a replay at its end)
        self.width_used = -1
        shown = self.waiting or ((self.state, self.marks) if self.marks is not None else None)
        if shown is not None:
            self.set_tokens(*shown)
        if self.following:
            self.follow_end()
        elif self.kept_token is not None:
            self.scroll_to_token(self.kept_token)
