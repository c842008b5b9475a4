"""One lane's pane: a title naming what differs, live stats, the tokens, the margin strip."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.reactive import reactive

from specdiff.tui.view_state import LaneState
from specdiff.tui.widgets.line import Line
from specdiff.tui.widgets.margin_strip import MarginStrip
from specdiff.tui.widgets.styles import TokenMarks
from specdiff.tui.widgets.token_view import TokenView


class LanePane(Vertical):
    """One lane: a header with what differs and live stats, the tokens, the margin
    strip."""

    current: reactive[bool] = reactive(False)
    """The current lane's pane (the one `l` switches): titled so."""
    lit: reactive[bool] = reactive(False)
    """Framed in the accent colour: the current lane, while the panes have focus."""

    def __init__(self, lane_id: str) -> None:
        super().__init__(id=f"lane-{lane_id}", classes="lane")
        self.lane_id = lane_id
        self.title_line = Line(classes="lane-title")
        self.stats_line = Line(classes="lane-stats")
        self.tokens = TokenView(lane_id, classes="lane-body")
        self.strip = MarginStrip(classes="margins")
        self.border_title = f"lane {lane_id.upper()}"

    def compose(self) -> ComposeResult:
        yield self.title_line
        yield self.stats_line
        yield self.tokens
        yield self.strip

    def watch_current(self, current: bool) -> None:
        self.set_class(current, "current")
        self.border_title = f"lane {self.lane_id.upper()}" + (" · current" if current else "")

    def watch_lit(self, lit: bool) -> None:
        self.set_class(lit, "focused")

    def set_title(self, title: str) -> None:
        self.title_line.set(title)

    def set_stats(self, stats: str) -> None:
        self.stats_line.set(stats)

    def show_tokens(
        self, state: LaneState, marks: TokenMarks, follow: bool, strip: bool = True
    ) -> None:
        self.tokens.set_tokens(state, marks)
        if strip:
            self.strip.show(state.steps, marks)
        if follow:
            self.tokens.follow_end()

    def scroll_to_token(self, index: int) -> None:
        self.tokens.scroll_to_token(index)
