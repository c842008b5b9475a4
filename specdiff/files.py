"""Files that appear whole or not at all, and writes that fail in words.

A file is written under a temporary name in its own folder and renamed into place, so
a crash, a full disk or a reader at the wrong moment never sees half of it, and an
older file of that name survives any failure. Only a regular file is ever replaced: a
device node, a pipe or a folder at the target is refused before anything is written.

A write that fails because the disk is full, a file-size limit was reached or the
reader of a pipe went away is not bad input: `lost_output` turns it into one line that
says which file and what to do, and the command exits 1.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from specdiff.errors import SpecdiffError

NO_ROOM = {
    errno.ENOSPC: "free some space and run again",
    errno.EDQUOT: "free some space (the disk quota is used up) and run again",
    errno.EFBIG: "the file reached this system's size limit (ulimit -f); raise it and run again",
}
"""Write errors that mean the output does not fit, and what the user can do."""
PIPE_CLOSED = (errno.EPIPE, errno.ECONNRESET)
"""Write errors that mean whoever read the output stopped reading."""


class OutputLost(SpecdiffError):
    """Output that could not be written to the end: the disk is full, a size limit was
    reached, or the reader of a pipe went away. The input was good, so this exits 1."""


class NotRegularFile(SpecdiffError):
    """The path to write names a device, a pipe, a socket or a folder, which writing a
    file in its place would destroy or silently swallow."""


def lost_output(error: OSError) -> OutputLost | None:
    """The one-line OutputLost a failed write means, or None when it means something
    else (permission, a missing folder): those are the caller's to word."""
    target = error.filename or "standard output"
    reason = os.strerror(error.errno) if error.errno else str(error)
    if error.errno in NO_ROOM:
        return OutputLost(f"cannot write {target}: {reason}; {NO_ROOM[error.errno]}")
    if error.errno in PIPE_CLOSED or isinstance(error, BrokenPipeError):
        return OutputLost(
            f"cannot write {target}: its reader closed the pipe before the end; "
            "the output is incomplete"
        )
    return None


@contextmanager
def naming(path: str | os.PathLike[str]) -> Iterator[None]:
    """Writes in the block that fail say which file they were writing: an OSError from
    write() or flush() carries no file name of its own."""
    try:
        yield
    except OSError as error:
        if error.filename is None:
            error.filename = os.fspath(path)
        raise


def kind_of(mode: int) -> str | None:
    """What a file of this st_mode is when it is not a regular file ("a character
    device", "a folder", ...); None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    kinds = (
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a named pipe (FIFO)"),
        (stat.S_ISSOCK, "a socket"),
    )
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def file_kind(path: Path) -> str | None:
    """kind_of the file at path, following symbolic links; None for a regular file or
    for nothing there."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return None  # missing, or a dangling link: writing creates a file
    return kind_of(mode)


def open_for_reading(path: Path) -> tuple[int, str | None]:
    """A blocking read-only descriptor of path and kind_of it (None for a regular file).
    The open itself is non-blocking, so that a FIFO returns at once instead of waiting
    for a writer; the caller refuses what is not a regular file and closes the
    descriptor. Raises OSError when it cannot be opened."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    os.set_blocking(descriptor, True)
    return descriptor, kind_of(os.fstat(descriptor).st_mode)


def read_limited(path: Path, limit: int) -> bytes:
    """The bytes of a regular file of at most `limit` bytes: a pipe, a device or a
    folder would block, never end or fail late, and a huge file would fill memory.
    Raises OSError when it cannot be opened or read, ValueError (the rest of a
    sentence starting with the path) when it is not a regular file or is too large."""
    descriptor, kind = open_for_reading(path)
    try:
        if kind is not None:
            raise ValueError(f"is {kind}, not a file")
        with os.fdopen(descriptor, "rb", closefd=False) as handle:
            data = handle.read(limit + 1)
    finally:
        os.close(descriptor)
    if len(data) > limit:
        raise ValueError(f"is larger than {limit:,} bytes")
    return data


def check_replaceable(path: Path) -> None:
    """Refuse a target that is not a regular file: os.replace would put a file where a
    device node or pipe was (as root, /dev/null itself)."""
    kind = file_kind(path)
    if kind is not None:
        raise NotRegularFile(
            f"{path} is {kind}; specdiff only replaces regular files, so name a file path"
        )


@contextmanager
def replacing(target: Path, suffix: str = ".tmp") -> Iterator[Path]:
    """A fresh temporary path beside target for the block to write; renamed onto
    target when the block ends normally, removed whatever happens."""
    check_replaceable(target)  # before any work, and again before the rename below
    # the process id and a random part keep two writers of one target apart
    temporary = target.with_name(f".{target.name}.{os.getpid()}-{secrets.token_hex(4)}{suffix}")
    try:
        yield temporary
        check_replaceable(target)
        os.replace(temporary, target)
    finally:
        temporary.unlink(missing_ok=True)


@contextmanager
def _atomic_file(path: Path, *, overwrite: bool = True) -> Iterator[BinaryIO]:
    """A temporary file beside path for the block to write, synced and renamed onto path
    when the block ends normally. With overwrite False, a file that appeared at path
    meanwhile is kept and FileExistsError raised. A failed write raises its OSError with
    path as its file name."""
    with replacing(path) as temporary, naming(path):
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(descriptor, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        if not overwrite and path.exists():
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(path))


def write_atomic(path: Path, data: bytes, *, overwrite: bool = True) -> None:
    """Write data to path through a synced temporary file (`_atomic_file`)."""
    with _atomic_file(path, overwrite=overwrite) as handle:
        handle.write(data)


def write_text_atomic(path: Path, text: str, *, overwrite: bool = True) -> None:
    """write_atomic for text, as UTF-8 with newlines written as they are."""
    write_atomic(path, text.encode("utf-8"), overwrite=overwrite)


def write_chunks_atomic(path: Path, chunks: Iterable[str]) -> None:
    """write_text_atomic for text made as it is written: each chunk is encoded and
    written as it comes, so the whole text is never held."""
    with _atomic_file(path) as handle:
        for chunk in chunks:
            handle.write(chunk.encode("utf-8"))
