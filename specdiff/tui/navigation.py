"""Where the compare screen's keys take the cursor: `d` to the fork, `n` and `p` to the
current lane's near ties, `l` to the other lane, ←/→ a token, a click to its token.

Each move changes the model (`view_state.CompareView`) and returns what changed (the
cursor moved, or a note saying why it did not); the screen draws it. No Textual import.
"""

from __future__ import annotations

from specdiff.tui.messages import Changes, CursorMoved, Noted
from specdiff.tui.view_state import CompareView

FORK, NEXT_TIE, PREVIOUS_TIE, OTHER_LANE = "fork", "next_tie", "previous_tie", "other_lane"
"""Where `go` takes the cursor, as the screen's `go(...)` bindings name it."""
PLACES = (FORK, NEXT_TIE, PREVIOUS_TIE, OTHER_LANE)


def move_cursor(
    view: CompareView, lane_id: str, index: int | None, scroll_both: bool = False
) -> Changes:
    """Put the cursor on `index` of `lane_id` (both panes scroll to it with
    `scroll_both`)."""
    view.select(lane_id, index)
    return [CursorMoved(lane_id, index, scroll_both)]


def go(view: CompareView, where: str) -> Changes:
    """The cursor to the fork, the next or previous near tie, or the other lane."""
    if where == FORK:
        if view.fork is None:
            return [Noted("no fork: the lanes agree so far")]
        return move_cursor(view, view.cursor_lane, view.fork.index, scroll_both=True)
    if where == OTHER_LANE:
        return move_cursor(view, *view.switched())
    index = view.next_tie() if where == NEXT_TIE else view.previous_tie()
    if index is None:
        return [Noted(view.no_tie_note("after" if where == NEXT_TIE else "before"))]
    return move_cursor(view, view.cursor_lane, index)


def step(view: CompareView, delta: int) -> Changes:
    """←/→: the cursor `delta` tokens along the current lane (nothing while it is
    empty)."""
    index = view.moved(delta)
    return [] if index is None else move_cursor(view, view.cursor_lane, index)


def select(view: CompareView, lane_id: str, index: int) -> Changes:
    """A click on lane `lane_id`'s token `index` (ignored where the lane has none)."""
    return move_cursor(view, lane_id, index) if view.holds(lane_id, index) else []
