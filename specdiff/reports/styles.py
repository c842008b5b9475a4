"""Colour for text a terminal shows, and nothing for anything else.

Reports build their lines once; where stdout is a terminal that wants colour, a few
words (the verdict, the fork token) are wrapped in SGR sequences from the closed set
here. `safe_text.styled_terminal_text` lets exactly these sequences through and
escapes every other control character, so text from a session or a server cannot
carry a colour, let alone a clipboard write, by looking like one.
"""

from __future__ import annotations

from dataclasses import dataclass

RESET = "\x1b[0m"
SGR = {
    "bad": "\x1b[1;31m",
    "good": "\x1b[1;32m",
    "warn": "\x1b[1;33m",
    "fork": "\x1b[1;7m",
    "heading": "\x1b[1m",
    "dim": "\x1b[2m",
}
"""Bold red for a fork, bold green for agreement, reverse video for the fork token
(readable on dark and light themes alike), dim for the numbers behind the words."""

SEQUENCES = (*SGR.values(), RESET)
"""Every control sequence a styled report may hold."""


@dataclass(frozen=True)
class Paint:
    """Wraps text in one of the SGR styles, or returns it as it is without colour."""

    colour: bool = False

    def __call__(self, role: str, text: str) -> str:
        if not self.colour or not text:
            return text
        return f"{SGR[role]}{text}{RESET}"


PLAIN = Paint(False)
