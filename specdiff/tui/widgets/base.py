"""What several widgets share: a style read once per repaint, and a repaint when the
theme changes."""

from __future__ import annotations

from rich.style import Style
from textual.geometry import Region
from textual.strip import Strip
from textual.theme import Theme
from textual.widget import Widget

from specdiff.tui.widgets.styles import Palette


class LineDrawn:
    """For a widget drawn line by line on its own style, worked out once per repaint:
    Textual's `rich_style` walks every ancestor's styles on each call, which for a
    streaming pane's every line was most of the cost of drawing it. A plain mixin, put
    first: Textual takes a widget's default CSS from its first widget base alone."""

    _repaint_style: Style | None = None
    rich_style: Style  # the widget's own, from the class this is mixed into

    def render_lines(self, crop: Region) -> list[Strip]:
        self._repaint_style = self.rich_style
        try:
            return super().render_lines(crop)  # type: ignore[misc,no-any-return]
        finally:
            self._repaint_style = None

    @property
    def line_style(self) -> Style:
        """The widget's style, for a line drawn now."""
        return self._repaint_style if self._repaint_style is not None else self.rich_style


class ThemeAware(Widget):
    """A widget drawn in theme colours that repaints once a new theme is applied."""

    def on_mount(self) -> None:
        self.app.theme_changed_signal.subscribe(self, self.theme_changed)

    def theme_changed(self, _theme: Theme) -> None:
        self.refresh()

    @property
    def palette(self) -> Palette:
        return Palette.from_theme(self.app.current_theme)
