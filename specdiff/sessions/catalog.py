"""The saved sessions in a folder: listed from their first and last lines only.

A finished session's header and footer say everything the list shows, and a partial
one's last steps say how far each lane got, so listing a folder reads the first line
and the last FOOTER_WINDOW bytes of each file, whatever its size.
"""

from __future__ import annotations

import contextlib
import errno
import os
from dataclasses import dataclass, field, replace
from datetime import timezone
from pathlib import Path
from typing import Any

from specdiff.errors import SpecdiffError
from specdiff.sessions.format import LANE_IDS
from specdiff.sessions.header import SessionHeader
from specdiff.sessions.records import RunSummary
from specdiff.sessions.store import (
    MAX_LINE_BYTES,
    PARTIAL_SUFFIX,
    SUFFIX,
    SessionError,
    ends_mid_line,
    parse_line,
    start_time,
)

FOOTER_WINDOW = 64 * 1024
"""A footer is a few hundred bytes; reading this much from the end always holds it, and
a partial session's last steps of both lanes (a step is about 1 KB)."""


STOPPED_EARLY = "stopped before any token"
"""What the list says of a run stopped before either lane produced a token."""

STOPPED_AGREEING = "stopped, same so far"
"""What the list says of a run stopped before its end whose lanes had agreed until then:
not "identical", which would claim the whole run."""


@dataclass(frozen=True)
class SessionInfo:
    path: Path
    created: str = ""
    pair: str = ""
    prompt: str = ""
    fork_index: int | None = None
    identical: bool | None = None
    generated: tuple[int | None, int | None] | None = None
    """Each lane's steps; None for a lane a long partial file no longer shows near its end."""
    partial: bool = False
    stopped_before_first_token: bool = False
    """Stopped before either lane produced a token: nothing was compared."""
    cancelled: bool = False
    """Stopped before the end (Ctrl+C, a closed terminal): the lanes ran only so far."""
    problem: str | None = None
    """Why the file could not be read; the other fields are then empty."""
    folder: str = ""
    """The subfolder of the listed folder that holds the file ("" for the folder itself):
    a suite keeps each pair's sessions in a folder of their own."""

    @property
    def diverged(self) -> str:
        if self.problem is not None:
            return "unreadable"
        if self.partial:
            return "partial"
        if self.stopped_before_first_token:
            return STOPPED_EARLY
        if self.fork_index is not None:
            return f"token {self.fork_index}"
        if self.identical and self.cancelled:
            return STOPPED_AGREEING
        return "identical" if self.identical else "lengths differ"

    @property
    def when(self) -> str:
        """The run's start, in UTC: the time its file is named by."""
        started = start_time(self.created)
        if started is None:
            return self.created[:16]
        return started.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M")


def _tail_records(path: Path) -> tuple[list[dict[str, Any]], bool]:
    """The whole lines in the last FOOTER_WINDOW bytes, parsed where they parse (the
    last may be the line a killed run was writing), and whether the window reaches the
    file's first line (then it holds every step)."""
    with path.open("rb") as handle:
        handle.seek(0, os.SEEK_END)
        start = max(0, handle.tell() - FOOTER_WINDOW)
        handle.seek(start)
        tail = handle.read(FOOTER_WINDOW)
    lines = tail.split(b"\n")
    if start > 0:
        lines = lines[1:]  # the window starts inside a line
    records = []
    for line in lines:
        try:
            record = parse_line(line)
        except ValueError:
            continue
        if record is not None:
            records.append(record)
    return records, start == 0


def _counts(records: list[dict[str, Any]], whole: bool) -> tuple[int | None, int | None]:
    """Each lane's steps, from its last step in the tail (steps are numbered from 0); a
    lane with none there has none at all when the tail is the whole file, else is
    unknown (it stopped long before the other)."""
    counts: dict[str, int | None] = dict.fromkeys(LANE_IDS, 0 if whole else None)
    for record in records:
        index = record.get("index")
        lane = record.get("lane")
        # a list or object as the lane would not even hash: only the ids themselves count
        if record.get("type") == "step" and lane in LANE_IDS and type(index) is int:
            counts[lane] = index + 1
    return counts["a"], counts["b"]


def read_info(path: Path) -> SessionInfo:
    """What the list shows of one file, from its first line and its last FOOTER_WINDOW
    bytes only, so a file of any size costs the same; a file that cannot be read says
    why."""
    try:
        with path.open("rb") as handle:
            first = handle.readline(MAX_LINE_BYTES + 1)
        try:
            record = parse_line(first, first=True)
        except ValueError:
            # as the loader reads it: a whole header without its newline is a header
            if ends_mid_line(first):
                raise ValueError("the file ends inside its header line") from None
            raise
        if record is None:
            raise ValueError("the first line is not a session header")
        header = SessionHeader.from_json(record)
        tail, whole = _tail_records(path)
        info = SessionInfo(
            path=path, created=header.created, pair=header.pair.name, prompt=header.prompt
        )
        if not tail or tail[-1].get("type") != "footer":
            return replace(info, partial=True, generated=_counts(tail, whole))
        footer = RunSummary.from_json(tail[-1])
        return replace(
            info,
            fork_index=footer.fork_index,
            # a footer written before a stop before the first token was told apart
            # calls that run identical
            identical=footer.identical and not footer.stopped_before_first_token,
            generated=footer.generated,
            stopped_before_first_token=footer.stopped_before_first_token,
            cancelled=footer.cancelled,
        )
    except KeyError as error:
        return SessionInfo(path=path, problem=f"missing field {error.args[0]!r}")
    except (OSError, ValueError, RecursionError, SpecdiffError) as error:
        return SessionInfo(path=path, problem=str(error) or type(error).__name__)


SUBFOLDER_DEPTH = 2
"""How deep below the listed folder sessions are looked for: a suite's report folder
holds sessions/PAIR/*.jsonl, so its report folder or its sessions folder both list."""


@dataclass(frozen=True)
class SkippedLink:
    """A symbolic link named like a session that leads to no file: left out of the
    list, and named beside it, so that one bad link neither hides the rest nor goes
    unseen."""

    path: Path
    why: str


def _broken_link(entry: os.DirEntry[str]) -> str | None:
    """Why a link named like a session leads to no file; None for anything else."""
    if not entry.is_symlink():
        return None
    try:
        os.stat(entry.path)
    except FileNotFoundError:
        return "a symbolic link to a missing file"
    except OSError as error:
        if error.errno == errno.ELOOP:
            return "a symbolic link that loops"
        return f"a symbolic link that cannot be followed ({error.strerror})"
    return None


@dataclass
class _Walk:
    """Session files found under `folder` (its resolved path), and the links skipped."""

    folder: Path
    found: list[Path] = field(default_factory=list)
    skipped: list[SkippedLink] = field(default_factory=list)

    def scan(self, directory: Path, depth: int) -> None:
        """Session files in `directory` and its subfolders down to `depth` more levels;
        a symlinked folder is not entered (no loop, nothing outside), and a file that
        leads out of `folder` is not listed (what the list shows, `open` opens)."""
        with os.scandir(directory) as entries:
            for entry in entries:
                path = Path(entry.path)
                if entry.is_dir(follow_symlinks=False):
                    if depth > 0:
                        with contextlib.suppress(OSError):  # a subfolder it may not read
                            self.scan(path, depth - 1)
                elif entry.name.endswith((SUFFIX, PARTIAL_SUFFIX)):
                    self._consider(entry, path)

    def _consider(self, entry: os.DirEntry[str], path: Path) -> None:
        broken = _broken_link(entry)
        if broken is not None:
            self.skipped.append(SkippedLink(path, broken))
        elif entry.is_file() and path.resolve().is_relative_to(self.folder):
            self.found.append(path)


def _subfolder(path: Path, directory: Path) -> str:
    relative = path.parent.relative_to(directory)
    return "" if relative == Path() else relative.as_posix()


@dataclass(frozen=True)
class Listing:
    """The sessions of a folder, oldest first, and the links named like one that were
    skipped because they lead to no file."""

    sessions: list[SessionInfo]
    skipped: list[SkippedLink]


def scan_sessions(directory: Path) -> Listing:
    """Every session in `directory` and its subfolders (finished and partial), oldest
    first, and every link named like a session that leads nowhere."""
    walk = _Walk(directory.resolve())
    try:
        walk.scan(directory, SUBFOLDER_DEPTH)
    except FileNotFoundError:
        return Listing([], [])
    except OSError as error:
        raise SessionError(
            f"cannot list the sessions folder {directory}: {error.strerror}"
        ) from None
    infos = [replace(read_info(path), folder=_subfolder(path, directory)) for path in walk.found]
    infos.sort(key=lambda info: (info.created, info.folder, info.path.name))
    return Listing(infos, sorted(walk.skipped, key=lambda link: link.path))


def list_sessions(directory: Path) -> list[SessionInfo]:
    """Every session in `directory` and its subfolders (finished and partial), oldest
    first."""
    return scan_sessions(directory).sessions


def resolve_in(directory: Path, reference: str, infos: list[SessionInfo]) -> Path:
    """A session named by its number in the list, its file name or a path in the folder.

    A path that leads outside the folder (`..`, an absolute path, a symlink out) is
    refused: the list opens what it lists.
    """
    if reference.isascii() and reference.isdigit():
        number = int(reference)
        if not 1 <= number <= len(infos):
            raise SessionError(
                f"no session number {number} in {directory} "
                f"({len(infos)} saved; run `specdiff sessions` to see them)"
            )
        return infos[number - 1].path
    folder = directory.resolve()
    candidate = Path(reference)
    if not candidate.is_absolute():
        candidate = directory / candidate
    try:
        target = candidate.resolve()
    except (OSError, RuntimeError, ValueError) as error:
        # a loop is a RuntimeError before Python 3.13, an OSError (ELOOP) from it on
        if isinstance(error, RuntimeError) or getattr(error, "errno", None) == errno.ELOOP:
            raise SessionError(
                f"{reference} is a symbolic link that loops, not a session"
            ) from None
        raise SessionError(f"{reference!r} is not a path specdiff can open") from None
    if not target.is_relative_to(folder):
        raise SessionError(
            f"{reference} is outside the sessions folder {directory}; "
            "open any file with `specdiff replay PATH`"
        )
    if not target.is_file():
        raise SessionError(
            f"no session {reference!r} in {directory} (run `specdiff sessions` to list them)"
        )
    return target
