"""One line of text that changes often (the status line, a lane's title and stats)."""

from __future__ import annotations

from rich.text import Text
from textual.widget import Widget

from specdiff.safe_text import visible


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
        # Cut here, at the width: handed a longer line, Textual wraps it at a space and
        # shows the first row only, so a line ending in a long word (a file's path)
        # lost that whole word instead of its last few characters.
        width = self.size.width
        if width and self._text.cell_len > width:
            cut = self._text.copy()
            cut.truncate(width, overflow="ellipsis")
            return cut
        return self._text


class StatusLine(Line):
    """The screen's status line: what the screen says now, and routine notes (theme,
    fork found, nothing further) said first, before it, until it next changes; toasts
    are for errors, as they sit over the panes."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__("", **kwargs)
        self.said = ""
        """The status without the note shown before it."""

    def say(self, text: str) -> None:
        self.said = text
        self.set(text)

    def note(self, text: str) -> None:
        self.set(f"{text} · {self.said}" if self.said else text)

    def drop_note(self) -> None:
        """The status without the note before it: a note about where the cursor was
        (no near tie after it) is stale once it moves."""
        self.set(self.said)
