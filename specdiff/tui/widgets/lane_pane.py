"""One lane's pane: a title naming what differs, live stats, the tokens, the margin strip."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical

from specdiff.tui.view_state import LaneState
from specdiff.tui.widgets.line import Line
from specdiff.tui.widgets.margin_strip import MarginStrip
from specdiff.tui.widgets.styles import TokenMarks
from specdiff.tui.widgets.token_view import TokenView


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
