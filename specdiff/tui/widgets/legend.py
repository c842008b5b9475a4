"""The legend: every colour and mark of the panes, named in its own look, in one line
under the panel and in full on the help screen."""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text

from specdiff.tui.widgets.base import ThemeAware
from specdiff.tui.widgets.margin_strip import strip_cell_style
from specdiff.tui.widgets.styles import (
    FORECAST,
    FORECAST_SHOWN,
    FORK,
    ONLY_A,
    ONLY_B,
    SHADE_LEVELS,
    SHARED,
    SHARED_AFTER,
    Look,
    Palette,
    TokenMarks,
    look_style,
)


@dataclass(frozen=True)
class LegendEntry:
    """One colour or mark, as the legend line and the help screen name it."""

    short: str
    long: str
    meaning: str
    look: Look


LEGEND = (
    LegendEntry("fork", "fork", "the first token the lanes differ at, in both panes", Look(FORK)),
    LegendEntry("a only", "only in a", "after the fork: text lane b does not have", Look(ONLY_A)),
    LegendEntry("b only", "only in b", "after the fork: text lane a does not have", Look(ONLY_B)),
    LegendEntry(
        "shared", "shared after", "after the fork: text both lanes have", Look(SHARED_AFTER)
    ),
    LegendEntry(
        "tie",
        "near tie",
        "shaded: margin below the near-tie threshold; stronger shade, smaller margin",
        Look(SHARED, SHADE_LEVELS - 1),
    ),
    LegendEntry(
        "draft",
        "draft",
        "underlined: from an accepted draft (where nothing else marks the token)",
        Look(SHARED, drafted=True),
    ),
    LegendEntry(
        "cursor",
        "cursor",
        "the selected token, in a box of its own colour (on the fork: underlined)",
        Look(SHARED, cursor=True),
    ),
)
FORECAST_LEGEND = LegendEntry(
    "forecast",
    "forecast",
    "faint fork colour, italic: ahead of the other lane, a step the forecast ranks among "
    f"the {FORECAST_SHOWN} likeliest first forks (from this lane's margins)",
    Look(FORECAST),
)
"""Named in the legend line only while a lane ahead shows forecast marks: the line has
room for the strip's marks at 80 columns only without it."""
LEGEND_ROWS = tuple((entry.long, entry.meaning) for entry in (*LEGEND, FORECAST_LEGEND)) + (
    (
        "margin strip",
        "under each pane, one bar per step (binned when they outnumber the columns): "
        "taller is more confident; near ties in their own colour below the threshold "
        "band; the fork and the cursor marked; dimmed after the fork",
    ),
)
"""The legend as (mark, meaning) rows, for the help screen."""


def _legend_entry(palette: Palette, entry: LegendEntry, label: str) -> Text:
    name = getattr(entry, label)
    if entry.look.shade is None:
        return Text(name, look_style(palette, entry.look))
    # a near tie's name in every strength of its shade, the closest call first: the
    # strength reads as shade, as it does in the panes
    text = Text()
    for number, character in enumerate(name):
        level = SHADE_LEVELS - 1 - round(number * (SHADE_LEVELS - 1) / max(1, len(name) - 1))
        text.append(character, look_style(palette, Look(SHARED, level)))
    return text


def _strip_legend(palette: Palette) -> Text:
    """The margin strip's marks, each drawn as the strip draws it: a near tie's bar
    over the threshold band, the fork's cell, a bar after the fork (dimmed)."""
    marks = TokenMarks(palette, threshold=1.0, fork_index=0, cursor=None)
    no_fork = TokenMarks(palette, threshold=1.0, fork_index=None, cursor=None)
    text = Text()
    text.append("strip ", "dim")
    for character, style, name in (
        ("▃", strip_cell_style(no_fork, 0, 0, True, True), "tie "),
        ("█", strip_cell_style(marks, 0, 0, False, False), "fork "),
        ("▆", strip_cell_style(marks, 1, 1, False, False), "after"),
    ):
        text.append(character, style)
        text.append(name)
    return text


def legend_text(palette: Palette, width: int, forecast: bool = False) -> Text:
    """The legend in one line of `width` cells: each mark named in its own look (the
    forecast's while one is shown), with long names where they fit with the margin
    strip's marks, else short ones, the strip's marks where they fit too, else cut.

    The names depend on the width alone, so they do not change while a run streams and a
    forecast comes and goes: a forecast named takes the strip's room where both do not
    fit."""
    strip = Text()
    strip.append("  │ ", "dim")
    strip.append_text(_strip_legend(palette))
    fits = [
        label
        for with_strip in (True, False)
        for label in ("long", "short")
        if _names(palette, LEGEND, label).cell_len + (strip.cell_len if with_strip else 0) <= width
    ]
    label = fits[0] if fits else "short"
    text = _names(palette, (*LEGEND, FORECAST_LEGEND) if forecast else LEGEND, label)
    if text.cell_len + strip.cell_len <= width:
        text.append_text(strip)
    text.no_wrap, text.overflow = True, "ellipsis"
    text.truncate(width, overflow="ellipsis")
    return text


def _names(palette: Palette, entries: tuple[LegendEntry, ...], label: str) -> Text:
    """The entries named in `label`'s form, each in its own look."""
    return Text("  ").join(_legend_entry(palette, entry, label) for entry in entries)


class Legend(ThemeAware):
    """One line under the panel: every colour and mark of the panes."""

    DEFAULT_CSS = "Legend { height: 1; padding: 0 1; }"

    forecast = False
    """Whether a pane shows forecast marks, so the line names them."""

    def show_forecast(self, shown: bool) -> None:
        if shown != self.forecast:
            self.forecast = shown
            self.refresh()

    def render(self) -> Text:
        return legend_text(self.palette, self.content_size.width or 80, self.forecast)
