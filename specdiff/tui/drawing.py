"""How the compare screen draws its model: each lane's tokens, stats line and margin
strip, the legend, the aligned view and the divergence panel, from what
`view_state.CompareView` holds. It reads the model and never changes it; the screen
calls it for the changes its controllers return (`messages.FrameDue`, `CursorMoved`,
`PairShown`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from specdiff.lanes import headline
from specdiff.tui.view_state import (
    LANE_IDS,
    CompareView,
    lane_differences,
    near_ties_before,
    other_lane,
)
from specdiff.tui.widgets.aligned_view import AlignedView
from specdiff.tui.widgets.lane_pane import LanePane
from specdiff.tui.widgets.legend import Legend
from specdiff.tui.widgets.panel import Panel
from specdiff.tui.widgets.panel_text import PanelView
from specdiff.tui.widgets.styles import Palette, TokenMarks


class CompareDrawing:
    """The screen's widgets that show the model, and how the model is drawn on them."""

    def __init__(self, view: CompareView, palette: Callable[[], Palette]) -> None:
        self.view = view
        self.palette = palette
        """The theme's colours now (they change with the theme)."""
        self.panes = {lane_id: LanePane(lane_id) for lane_id in LANE_IDS}
        self.aligned = AlignedView(id="aligned")
        self.panel = Panel(id="panel")
        self.legend = Legend(id="legend")

    def marks(self, lane_id: str) -> TokenMarks:
        """What decides the look of lane `lane_id`'s tokens besides the steps."""
        view = self.view
        return TokenMarks(
            palette=self.palette(),
            threshold=view.near_tie,
            fork_index=view.fork.index if view.fork is not None else None,
            cursor=view.cursor if lane_id == view.cursor_lane else None,
            changed_after_fork=frozenset(view.changed[lane_id]),
            forecast=view.forecast_marks(lane_id),
        )

    def set_titles(self) -> None:
        """Each pane names what its lane differs in; its stats line waits for numbers."""
        pair = self.view.pair
        for lane_id, pane in self.panes.items():
            lane, other = getattr(pair, lane_id), getattr(pair, other_lane(lane_id))
            pane.set_title(f"{lane_id.upper()} · {headline(lane, other)}")
            pane.set_stats("")

    def mark_current_lane(self, panes_focused: bool) -> None:
        """Border and title the current lane's pane (the one `l` switches), lit while
        the panes have focus."""
        for lane_id, pane in self.panes.items():
            pane.current = lane_id == self.view.cursor_lane
            pane.lit = pane.current and panes_focused

    def draw(self, follow: bool, details: bool = True) -> None:
        """Draw the lanes' tokens; with `details`, also what summarises them: each lane's
        stats line and margin strip, the legend, the aligned view and the panel. A
        streaming frame draws the details at most every PANEL_SECONDS: they sit above,
        below and beside the tokens, and a frame repaints everything between the parts
        that changed."""
        forecast_shown = False
        for lane_id, state in self.view.lanes.items():
            pane = self.panes[lane_id]
            marks = self.marks(lane_id)
            forecast_shown = forecast_shown or bool(marks.forecast)
            pane.show_tokens(state, marks, follow=follow, strip=details)
            if details and pane.content_size.width:
                # a pane without a width (hidden, or before the first layout) is given
                # its stats line once it has one
                pane.set_stats(self.view.stats_line(lane_id, pane.content_size.width - 2))
        if not details:
            return
        self.legend.show_forecast(forecast_shown)
        if self.aligned.display:
            lanes = self.view.lanes
            self.aligned.show(lanes, {lane_id: self.marks(lane_id) for lane_id in lanes})
        self.draw_panel()

    def draw_panel(self) -> None:
        view = self.view
        index = view.panel_index()
        a_steps, b_steps = view.lanes["a"].steps, view.lanes["b"].steps
        self.panel.show(
            PanelView(
                index,
                a_steps[index] if index is not None and index < len(a_steps) else None,
                b_steps[index] if index is not None and index < len(b_steps) else None,
                view.fork,
                view.similarity,
                view.generated(),
                view.near_tie,
                near_ties_before(a_steps, view.near_tie, view.fork),
                lane_differences(view.pair),
            )
        )

    def scroll_to(self, index: int, lane_ids: Iterable[str]) -> None:
        """Bring token `index` into view in the panes of `lane_ids` that have it."""
        for lane_id in lane_ids:
            if index < len(self.view.lanes[lane_id].steps):
                self.panes[lane_id].scroll_to_token(index)

    def scroll_to_fork(self) -> None:
        """Both panes keep the fork in view once laid out, unless they follow the end
        (another session may have replaced the one it was asked for)."""
        fork = self.view.fork
        if fork is None or self.view.follow:
            return
        for lane_id, pane in self.panes.items():
            shown = len(self.view.lanes[lane_id].steps)
            if shown:
                pane.scroll_to_token(min(fork.index, shown - 1))
