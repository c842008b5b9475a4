"""Each browser visitor's app process, kept to what one browser tab may cost.

textual-serve starts a process for every websocket and believes what the browser says:
the terminal size in the address or in a resize message becomes the app's screen, however
large (one 20000 x 20000 screen grew an app to gigabytes, drawing long after its visitor
left), and its `AppService.stop()` tells the app to quit, then waits for it forever, so an
app too busy to read its input outlives its visitor and the server. Here:

- a terminal is at most MAX_COLUMNS x MAX_ROWS, more than any screen shows;
- when its visitor leaves, or the server stops, an app is told to quit, then sent
  SIGTERM, then SIGKILL, each after a grace period, and reaped;
- on Linux the kernel kills an app whose server died, even by SIGKILL (PR_SET_PDEATHSIG);
- at most so many visitors at once: a place is taken when a websocket is accepted and
  given back only once its app's process has been reaped.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import sys
from asyncio.subprocess import Process
from collections.abc import Callable, Mapping

from aiohttp import web
from textual_serve.app_service import AppService
from textual_serve.download_manager import DownloadManager

MAX_COLUMNS = 500
MAX_ROWS = 200
"""The largest terminal a visitor's app draws: more cells than a 4K screen shows in a
readable font, and far below what made an app's memory grow without end."""
DEFAULT_SIZE = (80, 24)
QUIT_SECONDS = 2.0
"""How long an app told to quit has to finish before it is sent SIGTERM."""
TERMINATE_SECONDS = 2.0
"""How long an app sent SIGTERM has before SIGKILL."""
READ_SECONDS = 2.0
"""How long the app's last output may take to be relayed once its process has ended."""
FULL_CLOSE_CODE = 1013
"""The websocket close code for "try again later" (RFC 6455's registry)."""
_PR_SET_PDEATHSIG = 1

log = logging.getLogger("specdiff.serve")


def bounded_size(width: object, height: object) -> tuple[int, int] | None:
    """(columns, rows) within 1..MAX_COLUMNS and 1..MAX_ROWS, or None for a size that is
    not two whole numbers (a hostile message's strings, floats or booleans)."""
    if not all(type(value) is int for value in (width, height)):
        return None
    assert isinstance(width, int) and isinstance(height, int)  # for the type checker
    return min(max(width, 1), MAX_COLUMNS), min(max(height, 1), MAX_ROWS)


def size_from_query(query: Mapping[str, str]) -> tuple[int, int]:
    """The first terminal size, from the websocket address's width and height, bounded;
    a missing or unreadable number is the default's."""
    numbers = []
    for name, default in zip(("width", "height"), DEFAULT_SIZE):
        try:
            numbers.append(int(query.get(name, default)))
        except ValueError:  # also a number of more digits than int() reads
            numbers.append(default)
    size = bounded_size(*numbers)
    assert size is not None  # int() gave both
    return size


def full_reason(limit: int) -> str:
    """Why a visitor was turned away: short enough for a websocket close frame."""
    return f"specdiff serve: all {limit} places are taken (--max-visitors); try again later"


def _die_with_server() -> Callable[[], None] | None:
    """What a freshly forked app runs before it starts: on Linux, ask the kernel for
    SIGKILL when the server ends, so an app never outlives a server that was killed."""
    if not sys.platform.startswith("linux"):
        return None
    # looked up now: the forked child should only call, never load a library
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    server = os.getpid()

    def die_with_server() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != server:  # the server died before the request was made
            os.kill(os.getpid(), signal.SIGKILL)

    return die_with_server


class VisitorApp(AppService):
    """One visitor's app: its terminal bounded, its process ended and reaped when
    stopped, however busy, and killed by the kernel if the server dies."""

    def __init__(
        self,
        command: str,
        websocket: web.WebSocketResponse,
        downloads: DownloadManager,
        on_reaped: Callable[[], None],
    ) -> None:
        async def close_page() -> None:
            await websocket.close()

        super().__init__(
            command,
            write_bytes=websocket.send_bytes,
            write_str=websocket.send_str,
            close=close_page,
            download_manager=downloads,
        )
        self.on_reaped = on_reaped
        self._ending: asyncio.Task[None] | None = None

    async def _open_app_process(self, width: int = 80, height: int = 24) -> Process:
        environment = self._build_environment(width=width, height=height)
        self._process = process = await asyncio.create_subprocess_shell(
            self.command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=environment,
            preexec_fn=_die_with_server(),
        )
        assert process.stdin is not None
        self._stdin = process.stdin
        return process

    async def start(self, width: int, height: int) -> None:
        size = bounded_size(width, height) or DEFAULT_SIZE
        await super().start(*size)

    async def set_terminal_size(self, width: int, height: int) -> None:
        size = bounded_size(width, height)
        if size is not None:
            await super().set_terminal_size(*size)

    async def on_data(self, payload: bytes) -> None:
        # once the page is gone the app's output is still read, to its end: an app
        # whose output pipe filled would block writing and never read the quit it is sent
        with contextlib.suppress(ConnectionResetError):
            await super().on_data(payload)

    async def on_meta(self, data: bytes) -> None:
        with contextlib.suppress(ConnectionResetError):  # as on_data
            await super().on_meta(data)

    async def run(self) -> None:
        await super().run()
        # the app ended (it quit, or was stopped): the page says "Session ended"
        await self.remote_close()

    async def stop(self) -> None:
        """End the app and reap its process; at most QUIT_SECONDS + TERMINATE_SECONDS
        and a moment for SIGKILL. Called twice by a connection that ends as the server
        stops, and from a handler that may be cancelled: one ending, run to its end."""
        if self._ending is None:
            self._ending = asyncio.ensure_future(self._end())
            self._ending.add_done_callback(lambda _: self.on_reaped())
        await asyncio.shield(self._ending)

    async def _end(self) -> None:
        process = self._process
        if process is None:
            return
        with contextlib.suppress(Exception):  # a failing download is no reason to stay
            await self._download_manager.cancel_app_downloads(app_service_id=self.app_service_id)
        # an app that does not read its input fills the pipe: the quit is not waited on
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.send_meta({"type": "quit"}), QUIT_SECONDS / 2)
        if not await _ended(process, QUIT_SECONDS):
            _signal(process, signal.SIGTERM)
            if not await _ended(process, TERMINATE_SECONDS):
                log.warning("a visitor's app ignored quit and SIGTERM: killed")
                _signal(process, signal.SIGKILL)
                await process.wait()
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), READ_SECONDS)
            except asyncio.TimeoutError:  # a process the app started holds its output
                self._task.cancel()
        self._task = None


async def _ended(process: Process, seconds: float) -> bool:
    """Whether `process` ends (and is reaped) within `seconds`."""
    try:
        await asyncio.wait_for(process.wait(), seconds)
    except asyncio.TimeoutError:
        return False
    return True


def _signal(process: Process, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
        process.send_signal(signum)
