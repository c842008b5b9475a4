"""The saved sessions in a folder: listed from their first and last lines only.

A finished session's header and footer say everything the list shows, so listing a
folder of long sessions reads a few kilobytes per file, not every step.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from specdiff.errors import SpecdiffError
from specdiff.sessions.format import RunSummary, SessionHeader
from specdiff.sessions.store import MAX_LINE_BYTES, PARTIAL_SUFFIX, SUFFIX, SessionError

FOOTER_WINDOW = 64 * 1024
"""A footer is a few hundred bytes; reading this much from the end always holds it."""


@dataclass(frozen=True)
class SessionInfo:
    path: Path
    created: str = ""
    pair: str = ""
    prompt: str = ""
    fork_index: int | None = None
    identical: bool | None = None
    generated: tuple[int, int] | None = None
    partial: bool = False
    problem: str | None = None
    """Why the file could not be read; the other fields are then empty."""

    @property
    def diverged(self) -> str:
        if self.problem is not None:
            return "unreadable"
        if self.partial:
            return "partial"
        if self.fork_index is not None:
            return f"token {self.fork_index}"
        return "identical" if self.identical else "lengths differ"

    @property
    def when(self) -> str:
        try:
            return datetime.fromisoformat(self.created).strftime("%Y-%m-%d %H:%M")
        except ValueError:
            return self.created[:16]


def _last_line(path: Path) -> bytes:
    with path.open("rb") as handle:
        handle.seek(0, os.SEEK_END)
        size = handle.tell()
        handle.seek(max(0, size - FOOTER_WINDOW))
        tail = handle.read()
    lines = tail.rstrip(b"\n").rsplit(b"\n", 1)
    return lines[-1]


def _count_steps(path: Path) -> tuple[int, int]:
    # A partial session has no footer to read the counts from, so its steps are
    # counted; lines are bounded as the loader bounds them, so a file with no newline
    # costs MAX_LINE_BYTES of memory, not its size.
    counts = {"a": 0, "b": 0}
    with path.open("rb") as handle:
        while line := handle.readline(MAX_LINE_BYTES + 1):
            if b'"step"' not in line:
                continue
            try:
                record = json.loads(line)
            except ValueError:
                break  # the line being written when the run was killed
            if isinstance(record, dict) and record.get("type") == "step":
                lane = record.get("lane")
                if lane in counts:
                    counts[lane] += 1
    return counts["a"], counts["b"]


def _footer(path: Path) -> RunSummary | None:
    try:
        record: Any = json.loads(_last_line(path).decode("utf-8"))
    except ValueError:
        return None  # a run killed mid-line: the file is a partial session
    if not (isinstance(record, dict) and record.get("type") == "footer"):
        return None
    return RunSummary.from_json(record)


def read_info(path: Path) -> SessionInfo:
    """What the list shows of one file; a file that cannot be read says why."""
    try:
        with path.open("rb") as handle:
            first = handle.readline(MAX_LINE_BYTES + 1)
        record: Any = json.loads(first.decode("utf-8"))
        if not isinstance(record, dict):
            raise ValueError("the first line is not a session header")
        header = SessionHeader.from_json(record)
        footer = _footer(path)
        info = SessionInfo(
            path=path, created=header.created, pair=header.pair.name, prompt=header.prompt
        )
        if footer is None:
            return replace(info, partial=True, generated=_count_steps(path))
        return replace(
            info,
            fork_index=footer.fork_index,
            identical=footer.identical,
            generated=footer.generated,
        )
    except KeyError as error:
        return SessionInfo(path=path, problem=f"missing field {error.args[0]!r}")
    except (OSError, ValueError, RecursionError, SpecdiffError) as error:
        return SessionInfo(path=path, problem=str(error) or type(error).__name__)


def list_sessions(directory: Path) -> list[SessionInfo]:
    """Every session in `directory` (finished and partial), oldest first."""
    try:
        folder = directory.resolve()
        paths = [
            path
            for path in directory.iterdir()
            if path.name.endswith((SUFFIX, PARTIAL_SUFFIX))
            and path.is_file()
            # what the list shows, `open` opens: nothing that leads out of the folder
            and path.resolve().is_relative_to(folder)
        ]
    except FileNotFoundError:
        return []
    except OSError as error:
        raise SessionError(
            f"cannot list the sessions folder {directory}: {error.strerror}"
        ) from None
    infos = [read_info(path) for path in paths]
    return sorted(infos, key=lambda info: (info.created, info.path.name))


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
    except (OSError, ValueError):
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
