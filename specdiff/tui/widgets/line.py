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
        return self._text
