"""The last guard between the widgets and the terminal: whatever a widget forgot to
escape is dropped from the drawn line, never sent as a control code."""

from __future__ import annotations

from rich.segment import Segment
from textual.color import Color
from textual.filter import LineFilter

from specdiff.safe_text import without_controls


class WithoutControls(LineFilter):
    """Drops control characters from every drawn line: a last guard behind the widgets,
    which show them as escapes. Removing one keeps the layout, as it takes no cell."""

    def apply(self, segments: list[Segment], background: Color) -> list[Segment]:
        kept = []
        for segment in segments:
            text = without_controls(segment.text)
            # a control segment is Rich's own cursor movement, not text
            if text != segment.text and not segment.control:
                segment = Segment(text, segment.style)
            kept.append(segment)
        return kept
