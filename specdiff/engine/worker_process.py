"""The front end's handle on one worker process: start it, send it requests, read its
replies, pass a cancel on, and when it dies, say how and where.

The child is a fresh interpreter (so the front-end process never loads llama.cpp, and
no caller's main module is imported again as multiprocessing's spawn would), in a
session of its own, on one end of a socket pair. PairWorker and `call_in_worker` each
hold one of these and ask it different things.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import NoReturn, TypeVar

from specdiff.engine.worker_messages import (
    CANCEL_SIGNAL,
    Bug,
    Close,
    DueStep,
    Progressed,
    Raised,
    Reply,
    Request,
)
from specdiff.errors import SpecdiffError, printable

WORKER_MAIN = (
    # the current folder first on sys.path (python -c puts it there) could shadow the
    # installed packages with whatever the user's folder holds
    "import sys; sys.path.pop(0); from specdiff.engine.worker_child import serve; "
    "serve(int(sys.argv[1]), sys.argv[2], int(sys.argv[3]))"
)
POLL_SECONDS = 0.05
"""How often a silent worker is checked for death and a cancel is passed on."""
CLOSE_SECONDS = 5.0
LOG_TAIL_BYTES = 4096

R = TypeVar("R", bound=Reply)


class WorkerCrashed(SpecdiffError):
    """The worker process died: a native crash in llama.cpp, or an unexpected exit."""


class WorkerFailed(SpecdiffError):
    """The worker hit a Python error it could not report as bad input: a bug."""


class WorkerProcess:
    """One worker process and the socket to it.

    `who` and `repack_off` name it and the option to try in a crash message; `doing`
    says what it was at unless it was streaming steps, where `places_steps` has the
    message name the lane and step the decode loop was computing."""

    def __init__(
        self,
        who: str,
        repack_off: str,
        cancel: threading.Event,
        doing: str,
        places_steps: bool = False,
        read_every: float = 0.0,
    ) -> None:
        self.who = who
        self.repack_off = repack_off
        self.cancel = cancel
        self.doing = doing
        self.places_steps = places_steps
        self.read_every = read_every
        """Seconds a streaming reader waits before it drains what has arrived, when
        nothing is waiting (0: woken by each message)."""
        self.build: dict[str, str] = {}
        """llama.cpp's build and the CPU, once the worker said: for a crash message."""
        self.streaming = False
        """Steps (or a function's events) are arriving: a cancel is passed on."""
        self.busy = True
        """The worker is loading or running, so closing it kills it."""
        self._cancel_sent_at = 0.0
        self._spawn()

    def _spawn(self) -> None:
        """Start the child interpreter on one end of a socket pair, in a session of its
        own: the terminal's Ctrl+C is the front end's to handle, and closing the worker
        ends everything it started (a kernel probe included)."""
        self._folder = Path(tempfile.mkdtemp(prefix="specdiff-worker-"))
        self._due = self._folder / "due"
        self._due.touch()
        # asked to see everything llama.cpp prints: leave stderr alone
        keep_stderr = os.environ.get("SPECDIFF_LLAMA_LOG") == "1"
        self._log = None if keep_stderr else self._folder / "log"
        ours, theirs = socket.socketpair()
        self._conn = Connection(ours.detach())
        # the child reads the other end and ends itself at EOF: this end closes however
        # this process ends (a SIGKILL included), and no other process holds it
        lifeline, self._lifeline = os.pipe()
        try:
            with theirs, contextlib.ExitStack() as files:
                files.callback(os.close, lifeline)
                # llama.cpp's own aborts (GGML_ASSERT) write to fd 2: keep them off the
                # terminal, where a TUI is drawn, and let the crash message quote them
                log = None if self._log is None else files.enter_context(self._log.open("ab"))
                arguments = (str(theirs.fileno()), str(self._due), str(lifeline))
                self.process = subprocess.Popen(
                    [sys.executable, "-c", WORKER_MAIN, *arguments],
                    pass_fds=(theirs.fileno(), lifeline),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL if log is None else log,
                    stderr=None if log is None else subprocess.STDOUT,
                    start_new_session=True,
                )
        except BaseException:
            self.close()
            raise

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    # -- messages

    def send(self, request: Request) -> None:
        if not self.alive:
            raise self.death()
        try:
            self._conn.send(request)
        except (BrokenPipeError, ConnectionResetError, OSError):
            raise self.death() from None

    def begin_streaming(self) -> None:
        """Before a request whose replies stream: no cancel sent yet, no step due."""
        self._cancel_sent_at = 0.0
        self._due.write_bytes(b"")

    def reply(self, progress: Callable[[str], None], wanted: type[R]) -> R:
        """Messages until one of the type `wanted`, passing progress on; errors are raised."""
        while True:
            message = self.next()
            if isinstance(message, wanted):
                return message
            if isinstance(message, Progressed):
                progress(message.text)
            else:
                self.unexpected(message)

    def unexpected(self, message: Reply) -> NoReturn:
        if isinstance(message, Raised):
            raise message.error
        if isinstance(message, Bug):
            raise WorkerFailed(f"{self.who} failed: {message.traceback.strip().splitlines()[-1]}")
        raise WorkerFailed(f"the lanes' worker sent an unknown message {type(message).__name__}")

    def next(self) -> Reply:
        """The worker's next message; WorkerCrashed once it has died and said everything."""
        while True:
            # checked on every message, not only when the worker is silent: steps may
            # arrive faster than the poll's timeout for a whole run
            self._pass_cancel_on()
            try:
                if self.streaming and self.read_every and not self._conn.poll(0):
                    time.sleep(self.read_every)
                if self._conn.poll(POLL_SECONDS):
                    message: Reply = self._conn.recv()
                    return message
            except (EOFError, OSError):
                raise self.death() from None
            if not self.alive:
                try:
                    if self._conn.poll():
                        continue  # what it sent before it died is read first
                except OSError:
                    pass
                raise self.death()

    def _pass_cancel_on(self) -> None:
        """Signal the worker while a cancel is asked for: again now and then, since one
        signal may land before the worker reads the request it belongs to."""
        if not (self.streaming and self.cancel.is_set()):
            return
        now = time.monotonic()
        if now - self._cancel_sent_at >= POLL_SECONDS:
            self._cancel_sent_at = now
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(CANCEL_SIGNAL)

    # -- a crash

    def death(self) -> WorkerCrashed:
        try:
            code: int | None = self.process.wait(CLOSE_SECONDS)
        except subprocess.TimeoutExpired:
            code = None
        how = _how_it_ended(code)
        build = self.build.get("llama_cpp_build", "unknown build")
        cpu = self.build.get("cpu") or _cpu_name()
        native = self._native_message()
        return WorkerCrashed(
            f"{self.who} crashed {self._doing()} ({how}) in llama.cpp {build} on {cpu}"
            + (f": {native}" if native else "")
            + f"; try {self.repack_off} (llama.cpp's repacked CPU kernels), and run "
            "`specdiff doctor` for a report"
        )

    def _doing(self) -> str:
        """What the worker was at, for the crash message."""
        return self._where() if self.places_steps and self.streaming else self.doing

    def _where(self) -> str:
        """The lane and step the decode loop was computing, as the worker marked it."""
        due = DueStep.read(self._due)
        if due is None:
            return "before its first step"
        return f"in lane {due[0]} at step {due[1]}"

    def _native_message(self) -> str:
        """llama.cpp's last words (a GGML_ASSERT line), from the worker's log."""
        if self._log is None:
            return ""
        try:
            with self._log.open("rb") as handle:
                handle.seek(max(0, self._log.stat().st_size - LOG_TAIL_BYTES))
                tail = handle.read().decode("utf-8", "replace")
        except OSError:
            return ""
        lines = [line.strip() for line in tail.splitlines() if line.strip()]
        for line in reversed(lines):
            if "GGML_ASSERT" in line or "error" in line.lower():
                return printable(line)
        return ""

    # -- life cycle

    def close(self) -> None:
        """End the worker: asked to close when idle, killed when busy (loading, running,
        or a run left unfinished), with whatever it started."""
        process = getattr(self, "process", None)
        if process is not None and process.poll() is None and not self.busy:
            with contextlib.suppress(OSError):
                self._conn.send(Close())
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(CLOSE_SECONDS)
        if process is not None:
            self.kill()
        self._conn.close()
        with contextlib.suppress(OSError):
            os.close(self._lifeline)
        shutil.rmtree(self._folder, ignore_errors=True)

    def kill(self) -> None:
        """The worker's whole session (a kernel probe it started too), then reap it."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(CLOSE_SECONDS)


def _how_it_ended(code: int | None) -> str:
    if code is None:
        return "it stopped answering"
    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return f"exit status {code}"


def _cpu_name() -> str:
    # deferred: runtime is cheap to import (llama.cpp itself loads only on first use)
    from specdiff.engine.runtime import cpu_name

    return cpu_name()
