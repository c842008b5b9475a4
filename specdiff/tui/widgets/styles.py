"""The one colour hierarchy every widget draws with: a theme's palette, near-tie
shading, a token's look (fork, one lane only, shared, cursor, draft, forecast) and the
Rich style each look gets. Tokens, the margin strip, the legend and the aligned view all
take their colours from here, so the legend always shows what the panes show."""

from __future__ import annotations

from dataclasses import dataclass

from rich.style import Style
from textual.color import Color
from textual.theme import Theme

from specdiff.steps import TokenStep
from specdiff.tui.themes import APP_VARIABLES, readable_on, theme_variables

# how many steps get the forecast look: a rule of the view, named here with the look
from specdiff.tui.view_state import FORECAST_SHOWN as FORECAST_SHOWN


@dataclass(frozen=True)
class Palette:
    """Colours the renderers need, read from a theme. Text colours that sit on a
    coloured background (the fork, the cursor) are picked for contrast."""

    background: str
    shared: str
    muted: str
    """Text both lanes share after the fork: greyed, as it no longer explains the fork."""
    fork: str
    fork_text: str
    heat_strong: str
    heat_weak: str
    insert: str
    delete: str
    cursor: str
    cursor_text: str
    bar: str
    """Margin strip bars above the near-tie threshold."""
    tie_bar: str
    """Margin strip bars below it."""
    forecast: str = "#5a2a3a"
    """A forecast step's background: the fork's colour, faint, as a fork not yet seen."""
    forecast_text: str = "#ffffff"

    @classmethod
    def from_variables(cls, variables: dict[str, str]) -> Palette:
        colours = {**APP_VARIABLES, **variables}
        background = colours.get("background", "#000000")
        fork, cursor = colours["fork"], colours["cursor"]
        shared = colours["shared"]
        faint_fork = Color.parse(fork).blend(Color.parse(background), FORECAST_FAINTNESS).hex
        return cls(
            background=background,
            shared=shared,
            muted=colours["shared-after-fork"],
            fork=fork,
            fork_text=readable_on(fork, background, shared),
            heat_strong=colours["near-tie-strong"],
            heat_weak=colours["near-tie-weak"],
            insert=colours["diff-insert"],
            delete=colours["diff-delete"],
            cursor=cursor,
            cursor_text=readable_on(cursor, shared, background),
            bar=colours.get("secondary", "#af87ff"),
            tie_bar=colours.get("warning", "#ffd75f"),
            forecast=faint_fork,
            forecast_text=readable_on(faint_fork, shared, background),
        )

    @classmethod
    def from_theme(cls, theme: Theme) -> Palette:
        """The palette of a theme (computed once per theme object)."""
        cached = _THEME_PALETTES.get(id(theme))
        if cached is None or cached[0] is not theme:
            cached = (theme, cls.from_variables(theme_variables(theme)))
            _THEME_PALETTES[id(theme)] = cached
        return cached[1]


_THEME_PALETTES: dict[int, tuple[Theme, Palette]] = {}

SHADE_LEVELS = 8
"""Near-tie shading comes in this many strengths: enough to read, few enough to cache."""


def shade_level(margin: float, threshold: float) -> int | None:
    """How strongly a near tie is shaded, 0 (margin just below the threshold) to
    SHADE_LEVELS - 1 (margin 0); None for a step that is not a near tie."""
    if not margin < threshold:
        return None
    closeness = 1.0 - margin / threshold if threshold > 0 else 1.0
    return max(0, min(SHADE_LEVELS - 1, int(closeness * SHADE_LEVELS)))


def shade(palette: Palette, level: int) -> str:
    """The background of a near tie: one hue, stronger for a smaller margin, so the
    strength reads as shade in every theme (high-contrast included)."""
    weak, strong = Color.parse(palette.heat_weak), Color.parse(palette.heat_strong)
    return weak.blend(strong, level / (SHADE_LEVELS - 1)).hex


FORK, ONLY_A, ONLY_B, SHARED_AFTER, SHARED = "fork", "a only", "b only", "shared after", "shared"
"""A token's role, which picks its colour; one role per token, never stacked."""
FORECAST = "forecast"
"""A step the other lane has not reached yet that the fork forecast ranks among the likeliest
first forks."""
FORECAST_FAINTNESS = 0.5
"""How far a forecast step's background blends from the fork's colour to the pane's:
kin to the fork, and never mistaken for it."""


@dataclass(frozen=True)
class Look:
    """Everything that decides how one token is drawn."""

    role: str
    shade: int | None = None
    """Near-tie strength; only before the fork, where it explains what comes."""
    cursor: bool = False
    drafted: bool = False
    """Underlined: only where nothing else marks the token."""


def look_style(palette: Palette, look: Look) -> Style:
    """The one colour hierarchy: the fork strongest, then the text only one lane has,
    then near-tie shading before the fork; the cursor is a box of its own colour, and
    on the fork an underline, so it never hides the fork."""
    colour = {
        FORK: palette.fork_text,
        ONLY_A: palette.delete,
        ONLY_B: palette.insert,
        SHARED_AFTER: palette.muted,
    }.get(look.role, palette.shared)
    background = None if look.shade is None else shade(palette, look.shade)
    if look.role == FORK:
        return Style(
            color=colour,
            bgcolor=palette.fork,
            bold=True,
            underline=look.cursor,
            overline=look.cursor,
        )
    if look.cursor:
        return Style(color=palette.cursor_text, bgcolor=palette.cursor, bold=True)
    if look.role == FORECAST:
        return Style(color=palette.forecast_text, bgcolor=palette.forecast, italic=True)
    return Style(color=colour, bgcolor=background, underline=look.drafted)


@dataclass(frozen=True)
class TokenMarks:
    """What decides a token's look besides the step itself."""

    palette: Palette
    threshold: float
    fork_index: int | None
    cursor: int | None
    changed_after_fork: frozenset[int] = frozenset()
    forecast: frozenset[int] = frozenset()
    """Forecast steps not yet reached by the other lane (`pending_forecast`)."""

    def look(self, lane_id: str, index: int, step: TokenStep) -> Look:
        cursor = index == self.cursor
        fork = self.fork_index
        if index == fork:
            return Look(FORK, cursor=cursor)
        if fork is not None and index > fork:
            if index in self.changed_after_fork:
                return Look(ONLY_A if lane_id == "a" else ONLY_B, cursor=cursor)
            # greyed text is marked already: no draft underline on top of it
            return Look(SHARED_AFTER, cursor=cursor)
        if index in self.forecast:
            return Look(FORECAST, cursor=cursor)
        level = shade_level(step.margin, self.threshold)
        return Look(SHARED, level, cursor, step.drafted and level is None and not cursor)


class TokenStyles:
    """Rich styles for token looks; few distinct looks, so each is built once."""

    def __init__(self) -> None:
        self._cache: dict[tuple[Palette, Look], Style] = {}

    def style(self, lane_id: str, index: int, step: TokenStep, marks: TokenMarks) -> Style:
        key = (marks.palette, marks.look(lane_id, index, step))
        cached = self._cache.get(key)
        if cached is None:
            # the colour blend runs once per look, not once per drawn token
            cached = self._cache[key] = look_style(*key)
        return cached
