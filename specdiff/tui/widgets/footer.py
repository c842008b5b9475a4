"""The footer: Textual's, with only the keys that fit whole.

Textual's footer cuts a key mid-word past the width, and a stray letter of it shows
beside the palette key. Its key widgets are not public API, so they are recognised by
what they show (a key and a description), not by their class.
"""

from __future__ import annotations

from rich.cells import cell_len
from textual.app import ComposeResult
from textual.widget import Widget
from textual.widgets import Footer


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


class FittedFooter(Footer):
    """Textual's footer with only the keys that fit whole, in the bindings' order (help
    and quit come first)."""

    def compose(self) -> ComposeResult:
        widgets = list(super().compose())
        palette = [widget for widget in widgets if widget.has_class("-command-palette")]
        room = (self.size.width or self.app.size.width) - sum(
            key_cells(*shown, self.compact) + 1
            for widget in palette
            if (shown := shown_key(widget)) is not None
        )
        for widget in widgets:
            shown = shown_key(widget)
            if shown is not None and widget not in palette:
                room -= key_cells(*shown, self.compact)
                if room < 0:
                    continue
            yield widget
