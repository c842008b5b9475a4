"""`specdiff ARGS` run by `main()` inside the test process, for the many tests that check
a refusal made before any lane loads: a fresh interpreter costs ~0.5 s of imports (more
on a busy machine), `main()` a few milliseconds. What a process adds beyond `main()`
(exit status, a traceback reaching stderr, stdin closed) keeps its own tests, which
still spawn `python -m specdiff`."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys

from specdiff.cli import main


class StdinRead(AssertionError):
    """Raised by a read of stdin where the test gave none: the command was to refuse
    before reading it (a process would wait on a terminal or a pipe left open)."""


class _Unreadable(io.RawIOBase):
    def readable(self) -> bool:
        return True

    def readinto(self, buffer: object) -> int:
        raise StdinRead("specdiff read stdin")


def specdiff_here(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """What `python -m specdiff ARGS` with `stdin` would give, from `main()`: its return
    value, and what it wrote to stdout and stderr (an uncaught exception propagates,
    failing the test, where a process would print a traceback). Without `stdin`, any
    read of it fails the test."""
    out, err = io.StringIO(), io.StringIO()
    raw = _Unreadable() if stdin is None else io.BytesIO(stdin.encode("utf-8"))
    given = io.TextIOWrapper(io.BufferedReader(raw), encoding="utf-8")
    saved = sys.stdin
    sys.stdin = given
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(args))
    finally:
        sys.stdin = saved
    return subprocess.CompletedProcess(["specdiff", *args], code, out.getvalue(), err.getvalue())
