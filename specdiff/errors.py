"""Errors a user can fix.

Every error that reaches the command line is one of these: its message is a single
line that names the problem and the fix, and the CLI turns it into exit code 2
without a traceback.
"""

import difflib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from specdiff.safe_text import visible


class SpecdiffError(Exception):
    """Bad input or an environment problem the user can fix."""

    lane: str | None = None
    """The lane ("a" or "b") the problem belongs to, where it is one lane's (its model,
    its settings, its server): set where the engine loads or checks that lane, so a
    front end shows the failure in that lane's pane without reading the message."""


@contextmanager
def lane_failure(lane_id: str) -> Iterator[None]:
    """Errors raised inside belong to lane `lane_id`, unless one already names its lane.
    The error keeps its type; the lane travels with it (pickled across a process, too)."""
    try:
        yield
    except SpecdiffError as error:
        if error.lane is None:
            error.lane = lane_id
        raise


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


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """"did you mean 'ubatch'? " where a known name is close to the mistyped one (the
    closest alone: a second guess is mostly noise, 'quant' for 'ubatc'), else "": the
    start of the fix an unknown-name error gives."""
    choices = list(known)
    close = difflib.get_close_matches(name, choices, n=1, cutoff=0.6)
    if not close:
        lowered = {choice.lower(): choice for choice in choices}
        close = [lowered[match] for match in difflib.get_close_matches(name.lower(), lowered, 1)]
    return f"did you mean {close[0]!r}? " if close else ""
