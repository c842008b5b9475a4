"""The divergence panel widget: the fork (or the selected token) in both lanes."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.segment import SegmentLines
from rich.text import Text
from textual.geometry import Size
from textual.reactive import reactive
from textual.theme import Theme

from specdiff.tui.widgets.base import ThemeAware
from specdiff.tui.widgets.panel_text import (
    PanelView,
    body_key,
    panel_body,
    panel_lines,
    wanted_rows,
)

SHARES = (20, 30, 40, 50, 60, 70)
"""The most of the screen's height the panel may take, in percent, as + and - step it."""
FIRST_SHARE = 2
"""The share it starts with (40%, as the style sheet says: at 80x24 the panes keep five
lines of text)."""


class Panel(ThemeAware):
    """The divergence panel: as tall as what it shows needs, up to its share of the
    screen (the screen's `+`/`-` change the share), so the panes keep the rows it does
    not use. Its height changes only when what it shows needs other rows (a token
    selected, the fork found), not with each streamed batch; it is laid out for its own
    size when drawn."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.view: PanelView | None = None
        self.body: tuple[tuple[object, ...], SegmentLines | None] = ((), None)
        """The candidates as drawn, with what they were drawn from: while lanes stream
        the panel is redrawn for its token count, and the table is most of its cost."""

    def show(self, view: PanelView) -> None:
        if view != self.view:
            self.view = view
            rows = self.wanted_rows(self.content_size.width or self.app.size.width)
            self.refresh(layout=rows != self._rows)

    share: reactive[int] = reactive(FIRST_SHARE, init=False, repaint=False)
    """Which of SHARES the panel may take."""

    def validate_share(self, share: int) -> int:
        return max(0, min(len(SHARES) - 1, share))

    def watch_share(self, share: int) -> None:
        self.styles.max_height = f"{SHARES[share]}%"

    def change_share(self, step: int) -> int:
        """Step the share of the screen the panel may take; the share now, in percent."""
        self.share += step
        return SHARES[self.share]

    _rows = 0
    """The rows last asked for: the screen is laid out again only when they change."""

    def wanted_rows(self, width: int) -> int:
        return 1 if self.view is None else wanted_rows(self.view, width)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        self._rows = self.wanted_rows(width)
        return self._rows

    def theme_changed(self, theme: Theme) -> None:
        self.body = ((), None)
        super().theme_changed(theme)

    def render(self) -> RenderableType:
        if self.view is None:
            return Text("")
        width, height = self.content_size.width or 120, self.content_size.height or 12
        lines = panel_lines(self.view, width, height, self.palette)
        key = body_key(self.view, width, height - len(lines))
        if key != self.body[0]:
            body = panel_body(self.view, width, height - len(lines))
            console = self.app.console
            options = self.app.console_options.update(highlight=False, width=width)
            drawn = console.render_lines(body, options, pad=False) if body is not None else None
            self.body = (key, SegmentLines(drawn, new_lines=True) if drawn else None)
        return Group(*lines, *([self.body[1]] if self.body[1] is not None else []))
