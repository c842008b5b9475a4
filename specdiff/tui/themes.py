"""Themes are data: ``themes/*.toml`` files turned into ``textual.theme.Theme`` objects.

A theme file names Textual's base colours and specdiff's own variables (fork colour,
near-tie shading, shared text, cursor, diff colours). A file that does not parse or
names an unknown key or a bad colour is reported and skipped, never fatal. The text
colours a theme sets are checked for contrast (WCAG) by the tests, in every bundled theme.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from textual.color import Color, ColorParseError
from textual.theme import Theme

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

APP_VARIABLES = {
    "fork": "#ff3d7f",
    "near-tie-strong": "#8a3a1c",
    "near-tie-weak": "#3a2016",
    "shared": "#d0d0d0",
    "shared-after-fork": "#8a8f99",
    "cursor": "#2f4f7f",
    "drafted": "#5fd7af",
    "diff-insert": "#87d787",
    "diff-delete": "#ff8787",
}
"""specdiff's own theme variables and their defaults (the dark theme's). `drafted` is
still read from older theme files; accepted drafts are underlined in the text colour."""
BASE_COLOURS = (
    "primary",
    "secondary",
    "warning",
    "error",
    "success",
    "accent",
    "foreground",
    "background",
    "surface",
    "panel",
    "boost",
)
DEFAULT_THEME = "specdiff-dark"


def relative_luminance(colour: str) -> float:
    """WCAG 2 relative luminance of a colour Textual can parse."""

    def linear(channel: int) -> float:
        value = channel / 255
        return value / 12.92 if value <= 0.03928 else ((value + 0.055) / 1.055) ** 2.4

    parsed = Color.parse(colour)
    return 0.2126 * linear(parsed.r) + 0.7152 * linear(parsed.g) + 0.0722 * linear(parsed.b)


def contrast(foreground: str, background: str) -> float:
    """WCAG 2 contrast ratio, 1 to 21; text needs 4.5 to be read comfortably."""
    high, low = sorted((relative_luminance(foreground), relative_luminance(background)))[::-1]
    return (high + 0.05) / (low + 0.05)


def readable_on(background: str, *candidates: str) -> str:
    """The candidate text colour with the most contrast on `background` (black and white
    are always candidates, so one reaches 4.5)."""
    return max((*candidates, "#000000", "#ffffff"), key=lambda text: contrast(text, background))


def theme_variables(theme: Theme) -> dict[str, str]:
    """Every colour a theme resolves to, as Textual would compute them for its CSS: the
    base colours, derived ones and specdiff's variables, with defaults for those unset.

    Read from the theme itself, not from the app's variables, which are only updated
    once the new theme's CSS is applied (after the app hears of the change)."""
    return {**APP_VARIABLES, **theme.to_color_system().generate(), **theme.variables}


def theme_dirs() -> list[Path]:
    """Where themes are looked for: the source tree's themes/, the installed copy, and the
    user's config dir (later ones override earlier ones of the same name)."""
    import platformdirs

    return [
        Path(__file__).resolve().parents[2] / "themes",
        Path(sys.prefix) / "share" / "specdiff" / "themes",
        Path(platformdirs.user_config_dir("specdiff")) / "themes",
    ]


@dataclass
class ThemeSet:
    themes: dict[str, Theme] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def parse_theme(path: Path) -> Theme:
    """One theme file; ValueError with a one-line reason when it is bad."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"not valid TOML ({error})") from None
    allowed = {"name", "dark", "variables", *BASE_COLOURS}
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ValueError(f"unknown key {unknown[0]!r}")
    name = data.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ValueError("needs a name")
    if "primary" not in data:
        raise ValueError("needs a primary colour")
    colours: dict[str, str] = {}
    for key in BASE_COLOURS:
        if key in data:
            colours[key] = _colour(key, data[key])
    variables = data.get("variables", {})
    if not isinstance(variables, dict):
        raise ValueError("[variables] must be a table")
    extra = sorted(set(variables) - set(APP_VARIABLES))
    if extra:
        raise ValueError(f"unknown variable {extra[0]!r}; known: {', '.join(APP_VARIABLES)}")
    dark = data.get("dark", True)
    if not isinstance(dark, bool):
        raise ValueError("dark must be true or false")
    return Theme(
        name=name,
        primary=colours["primary"],
        secondary=colours.get("secondary"),
        warning=colours.get("warning"),
        error=colours.get("error"),
        success=colours.get("success"),
        accent=colours.get("accent"),
        foreground=colours.get("foreground"),
        background=colours.get("background"),
        surface=colours.get("surface"),
        panel=colours.get("panel"),
        boost=colours.get("boost"),
        dark=dark,
        variables={key: _colour(key, value) for key, value in variables.items()},
    )


def _colour(key: str, value: object) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{key} must be a colour string")
    try:
        Color.parse(value)
    except ColorParseError:
        raise ValueError(f"{key} = {value!r} is not a colour") from None
    return value


def load_themes(directories: list[Path] | None = None) -> ThemeSet:
    found = ThemeSet()
    for directory in directories if directories is not None else theme_dirs():
        if not directory.is_dir():
            continue
        for path in sorted(directory.glob("*.toml")):
            try:
                theme = parse_theme(path)
            except (ValueError, OSError) as error:
                found.problems.append(f"theme {path.name} skipped: {error}")
                continue
            found.themes[theme.name] = theme
    if DEFAULT_THEME not in found.themes:
        found.themes[DEFAULT_THEME] = Theme(
            name=DEFAULT_THEME, primary="#5fafff", dark=True, variables=dict(APP_VARIABLES)
        )
    return found
