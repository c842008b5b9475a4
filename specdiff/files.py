"""Files that appear whole or not at all.

A file is written under a temporary name in its own folder and renamed into place, so
a crash, a full disk or a reader at the wrong moment never sees half of it, and an
older file of that name survives any failure.
"""

from __future__ import annotations

import errno
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def replacing(target: Path, suffix: str = ".tmp") -> Iterator[Path]:
    """A fresh temporary path beside target for the block to write; renamed onto
    target when the block ends normally, removed whatever happens."""
    # the process id and a random part keep two writers of one target apart
    temporary = target.with_name(f".{target.name}.{os.getpid()}-{secrets.token_hex(4)}{suffix}")
    try:
        yield temporary
        os.replace(temporary, target)
    finally:
        temporary.unlink(missing_ok=True)


def write_atomic(path: Path, data: bytes, *, overwrite: bool = True) -> None:
    """Write data to path through a synced temporary file. With overwrite False, a file
    that appeared at path while the data was written is kept and FileExistsError raised."""
    with replacing(path) as temporary:
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if not overwrite and path.exists():
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(path))


def write_text_atomic(path: Path, text: str, *, overwrite: bool = True) -> None:
    """write_atomic for text, as UTF-8 with newlines written as they are."""
    write_atomic(path, text.encode("utf-8"), overwrite=overwrite)
