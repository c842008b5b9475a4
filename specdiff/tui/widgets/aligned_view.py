"""The aligned view: the shared prefix folded to its last tokens, the two branches from
the fork on stacked, in the panes' colours."""

from __future__ import annotations

from collections.abc import Mapping

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.widgets import Static

from specdiff.safe_text import on_one_line, terminal_text
from specdiff.tui.view_state import LaneState
from specdiff.tui.widgets.styles import TokenMarks, TokenStyles
from specdiff.tui.widgets.token_view import TAB

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
    # the shared context on one row (a newline as ␤), so lane a's branch starts on the
    # third row even in a short view: it is what the view is for
    _append_tokens(text, a, marks["a"], styles, range(start, shared_end), one_line=fork is not None)
    if fork is None:
        longer = a if len(a.steps) >= len(b.steps) else b
        _append_tokens(
            text, longer, marks[longer.lane_id], styles, range(shared_end, len(longer.steps))
        )
        text.append(f"\n\nno fork yet: the lanes agree over {shared_end} tokens", "dim")
        return text, None
    branches = [text, Text()]
    for state, branch in zip((a, b), branches):
        gap = "\n" if branch.plain else ""  # lane b's part begins its own view
        branch.append(f"{gap}{state.lane_id} ▸ ", "bold")
        _append_tokens(branch, state, marks[state.lane_id], styles, range(fork, len(state.steps)))
    return branches[0], branches[1]


def _append_tokens(
    text: Text,
    state: LaneState,
    marks: TokenMarks,
    styles: TokenStyles,
    indices: range,
    one_line: bool = False,
) -> None:
    for index in indices:
        raw = state.texts[index] or "\u2205"
        piece = on_one_line(raw) if one_line else terminal_text(raw, tab=TAB)
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
    BINDINGS = [Binding("escape", "screen.toggle_aligned", "back", show=False)]

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.top = Static(classes="aligned-text")
        """The folded prefix and lane a's branch."""
        self.branch_b = Static(classes="aligned-branch-b")

    def compose(self) -> ComposeResult:
        with VerticalScroll(classes="aligned-a", can_focus=False):
            yield self.top
        with VerticalScroll(classes="aligned-b", can_focus=False):
            yield self.branch_b

    def show(self, lanes: Mapping[str, LaneState], marks: Mapping[str, TokenMarks]) -> None:
        top, branch_b = aligned_parts(lanes, marks)
        self.top.update(top)
        self.branch_b.update(branch_b or "")
