"""The SESSION argument of `replay`, `verify`, `export` and `serve replay`: a session
file, or the number or name `specdiff sessions` lists it by.

A saved run's name starts with the time it was saved, so a docs line or a shell history
can only name it by a pattern, and a pattern such as `sessions/*spec-vs-plain*.jsonl`
matches the bundled demo and every run saved beside it. The listing's number is the
short name a reader can type: the same reference `specdiff sessions open` takes. A
pattern the shell expanded to several files, or left as it was because it matched
none, gets one line naming the fix instead of argparse's "unrecognized arguments" or a
missing file.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from specdiff.errors import SpecdiffError
from specdiff.safe_text import visible

MORE_SESSIONS = "more_sessions"
"""Where the files after the first land: the rest of a pattern the shell expanded."""

PATTERN_CHARACTERS = frozenset("*?[")
"""What the shell expands in a word; left in one, the pattern matched no file."""

SHOWN_NAMES = 2
"""How many of several given files an error names before it counts the rest."""


def add_session_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "session",
        help="a session file (.jsonl), or its number or file name in `specdiff sessions`",
    )
    # hidden: it exists so that a pattern expanding to several files is reported as
    # such, and one SESSION is what the command takes
    parser.add_argument(MORE_SESSIONS, nargs="*", help=argparse.SUPPRESS)
    parser.add_argument(
        "--sessions-dir",
        help="the folder whose `specdiff sessions` list a number or name refers to "
        "(default: ./sessions or the user data dir)",
    )


def session_path(args: argparse.Namespace) -> Path:
    """The one session `args` names: an existing path as given, else the session
    `specdiff sessions` lists by that number or file name."""
    reference: str = args.session
    more: list[str] = getattr(args, MORE_SESSIONS, [])
    if more:
        raise SpecdiffError(several_given([reference, *more]))
    # an existing path is opened as given, whatever it looks like (a file named 2, a FIFO)
    if os.path.lexists(reference):
        return Path(reference)
    if PATTERN_CHARACTERS & set(reference):
        raise SpecdiffError(
            f"no file matches {visible(reference)}; name one session file, or its number "
            "in `specdiff sessions`"
        )
    return listed_session(reference, getattr(args, "sessions_dir", None))


def listed_session(reference: str, folder: str | None = None) -> Path:
    """The session that `reference`, a number or a file name, names in the list of
    `folder` (`--sessions-dir`; by default the folder `specdiff sessions` lists)."""
    # deferred: the engine, session and report modules load only for the command that runs
    from specdiff.sessions.catalog import list_sessions, resolve_in
    from specdiff.sessions.store import SessionError, sessions_dir

    directory = sessions_dir(folder).absolute()
    infos = list_sessions(directory)
    try:
        return resolve_in(directory, reference, infos)
    except SessionError:
        if reference.isascii() and reference.isdigit():
            raise  # its message counts the listed sessions and says how to see them
        raise SpecdiffError(
            f"session file not found: {visible(reference)}, here or in "
            f"{visible(str(directory))} (`specdiff sessions` lists the saved ones by number "
            "and name)"
        ) from None


def several_given(paths: list[str]) -> str:
    """One session given as several: a pattern matched more than the file meant."""
    names = ", ".join(visible(path) for path in paths[:SHOWN_NAMES])
    if len(paths) > SHOWN_NAMES:
        names += f" and {len(paths) - SHOWN_NAMES} more"
    return (
        f"{len(paths)} sessions given ({names}); name one: its file, or its number in "
        "`specdiff sessions` (a pattern such as sessions/*ubatch*.jsonl matches the runs "
        "saved beside a demo too)"
    )
