"""Errors a user can fix.

Every error that reaches the command line is one of these: its message is a single
line that names the problem and the fix, and the CLI turns it into exit code 2
without a traceback.
"""

from specdiff.safe_text import visible


class SpecdiffError(Exception):
    """Bad input or an environment problem the user can fix."""


class LaneConfigError(SpecdiffError):
    """A lane or pair definition names an unknown key or an invalid value."""


class ModelError(SpecdiffError):
    """A model file is missing, is not GGUF, is truncated, or does not fit its role."""


class PromptError(SpecdiffError):
    """The prompt is empty or does not fit the context."""


def printable(text: str, limit: int = 200) -> str:
    """Text from outside (a child's stderr, a server) made safe for a one-line message:
    control characters, escape sequences included, shown as visible escapes (\\x1b),
    and cut at `limit`."""
    return visible(text, limit)
