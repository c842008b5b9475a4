"""The footer: Textual's, with only the keys that fit whole, on a second row where one
row cannot hold them all (an 80-column screen after a fork).

Textual's footer cuts a key mid-word past the width, and a stray letter of it shows
beside the palette key. Its key widgets are not public API, so they are recognised by
what they show (a key and a description), not by their class.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.cells import cell_len
from textual.app import ComposeResult
from textual.containers import HorizontalGroup
from textual.widget import Widget
from textual.widgets import Footer

MAX_ROWS = 2
"""Rows the footer may take: a second holds what the first cannot; a third would take
a row of text from the lanes of an 80x24 screen for keys that help lists anyway."""


def key_cells(key_display: str, description: str, compact: bool) -> int:
    """The cells a footer key takes: its key, its description and the spacing the
    footer's style puts around them (a margin when compact, padding when not)."""
    return cell_len(key_display) + cell_len(description) + (2 if compact else 3)


def shown_key(widget: Widget) -> tuple[str, str] | None:
    """(key, description) of a footer key widget; None for anything else the footer holds."""
    key_display, description = (
        getattr(widget, "key_display", None),
        getattr(widget, "description", None),
    )
    if isinstance(key_display, str) and isinstance(description, str):
        return key_display, description
    return None


def footer_rows(cells: Sequence[int], first_room: int, room: int) -> list[list[int]]:
    """Which keys (by position) go on each row: as many as fit `first_room` on the first
    (which the palette key shares), the next that fit `room` on a second; keys that fit
    neither are left out. The keys keep their order; a row holds whole keys only."""
    rows: list[list[int]] = []
    start = 0
    for limit in (first_room, room)[:MAX_ROWS]:
        row, used = [], 0
        for position in range(start, len(cells)):
            if used + cells[position] > limit:
                break
            row.append(position)
            used += cells[position]
        rows.append(row)
        start = row[-1] + 1 if row else start
        if start >= len(cells):
            break
    return [row for row in rows if row] or [[]]


class FooterRow(HorizontalGroup):
    """One row of the footer's keys."""

    DEFAULT_CSS = "FooterRow { width: 1fr; height: 1; }"


class FittedFooter(Footer):
    """Textual's footer with only the keys that fit whole, in the bindings' order (help
    and quit come first, on the bottom row); the keys one row cannot hold go on a row
    above it."""

    DEFAULT_CSS = "FittedFooter { layout: vertical; }"

    def compose(self) -> ComposeResult:
        widgets = list(super().compose())
        palette = [widget for widget in widgets if widget.has_class("-command-palette")]
        keys = [
            (widget, shown)
            for widget in widgets
            if widget not in palette and (shown := shown_key(widget)) is not None
        ]
        width = self.size.width or self.app.size.width
        beside = sum(
            key_cells(*shown, self.compact) + 1
            for widget in palette
            if (shown := shown_key(widget)) is not None
        )
        cells = [key_cells(*shown, self.compact) for _, shown in keys]
        rows = footer_rows(cells, width - beside, width)
        self.styles.height = len(rows)
        # the first keys (help, quit) on the bottom row, beside the palette key
        for number, row in reversed(list(enumerate(rows))):
            with FooterRow():
                yield from (keys[position][0] for position in row)
                if number == 0:
                    yield from palette
