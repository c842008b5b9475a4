"""The TUI served to web browsers by textual-serve, for a talk or a shared screen.

textual-serve runs a command line for each browser connection, so every visitor gets a
fresh app process of their own, and relays that app's terminal over a websocket. This
module adds what a demo on someone else's network needs:

- the page works with no network at all: textual-serve's page asks Google Fonts for its
  font, which here comes from the copy textual-serve's wheel bundles;
- only pages served from this address may drive an app. Browsers let any web site open a
  websocket to any address, loopback included, so without a check a page open in another
  tab could connect and type into specdiff (point a lane at its own server, with an API
  key variable, say). The Host header is checked as well, so a name that a hostile DNS
  server points at 127.0.0.1 does not pass for this address;
- the listening socket is opened before anything is served, so a port in use or an
  address that is not this machine's is one line from the command, not a log traceback;
- a visitor costs a bounded share of the machine (visitors.py): a bounded terminal, a
  bounded number of visitors, an app that ends with its visitor and with the server;
- refusals are logged at most REFUSALS_PER_SECOND lines a second: anyone who reaches
  the port can send thousands, and the presenter's terminal should stay readable.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import re
import signal
import socket
import sys
import threading
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

import aiohttp_jinja2
import jinja2
from aiohttp import WSMsgType, web
from aiohttp.web_runner import GracefulExit
from textual_serve.server import Server

from specdiff.errors import SpecdiffError
from specdiff.safe_text import visible
from specdiff.tui.visitors import (
    FULL_CLOSE_CODE,
    VisitorApp,
    bounded_size,
    full_reason,
    size_from_query,
)

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
"""The names a browser on this machine may use for a loopback address."""
SHUTDOWN_SECONDS = 3.0
"""How long open connections get to finish once the server has stopped every app."""
REAP_SECONDS = 5.0
"""How long a stopped server waits for its apps' processes to be reaped once they were
told to quit."""
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
DEFAULT_MAX_VISITORS = 8
REFUSALS_PER_SECOND = 5
HEARTBEAT_SECONDS = 15.0
"""textual-serve's ping interval: a visitor whose browser vanished is found and let go."""

_REMOTE_FONT = re.compile(r"<link\b[^>]*\bhref=\"https?://fonts\.googleapis\.com[^>]*>", re.S)
_BUNDLED_FONT = """<link rel="preload" as="font" type="font/ttf" crossorigin
      href="{{ config.static.url }}fonts/RobotoMono-VariableFont_wght.ttf" />
    <style>
      @font-face {
        font-family: "Roboto Mono";
        src: url("{{ config.static.url }}fonts/RobotoMono-VariableFont_wght.ttf")
          format("truetype");
        font-weight: 100 700;
      }
    </style>"""
"""The font textual-serve's wheel bundles, preloaded: the page's terminal measures its
cells when the page has loaded, and a font that came later would not fit them."""

log = logging.getLogger("specdiff.serve")


class ServeError(SpecdiffError):
    """The server cannot listen where it was asked to."""


class OfflineTemplates(jinja2.FileSystemLoader):
    """textual-serve's page with its one remote resource, a Google Fonts stylesheet,
    replaced by the font bundled beside the page's script."""

    def get_source(
        self, environment: jinja2.Environment, template: str
    ) -> tuple[str, str, Callable[[], bool]]:
        source, filename, uptodate = super().get_source(environment, template)
        return _REMOTE_FONT.sub(_BUNDLED_FONT, source), filename, uptodate


class OneLine(logging.Formatter):
    """A log record as one escaped line: its message, then its exception's type and
    text, never the traceback."""

    def format(self, record: logging.LogRecord) -> str:
        line = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            error = record.exc_info[1]
            line = f"{line}: {type(error).__name__}: {error}"
        return f"specdiff serve: {visible(line, 300)}"


class RefusalLog:
    """Refusals logged one line each, at most `per_second` lines a second; the rest of
    that second are counted and written as one line when it is over."""

    def __init__(self, logger: logging.Logger, per_second: int = REFUSALS_PER_SECOND) -> None:
        self.logger = logger
        self.per_second = per_second
        self.second_began = -1.0
        self.written = 0
        self.held = 0
        self.summary: asyncio.TimerHandle | None = None

    def refused(self, line: str) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        if now - self.second_began >= 1.0 or self.second_began < 0:
            self.flush()
            self.second_began, self.written = now, 0
        if self.written < self.per_second:
            self.written += 1
            self.logger.warning(line)
            return
        self.held += 1
        if self.summary is None:
            self.summary = loop.call_at(self.second_began + 1.0, self.flush)

    def flush(self) -> None:
        """Write how many refusals were held back, if any."""
        if self.summary is not None:
            self.summary.cancel()
            self.summary = None
        if self.held:
            self.logger.warning(f"… {self.held} more refused in the same second")
            self.held = 0


def origin_of(url: str) -> str:
    """scheme://host[:port] as a browser writes it in an Origin header: lower case, the
    scheme's default port left out."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    if ":" in host:
        host = f"[{host}]"
    default = 443 if parts.scheme == "https" else 80
    port = "" if parts.port in (None, default) else f":{parts.port}"
    return f"{parts.scheme}://{host}{port}"


def _origin_or_none(url: str) -> str | None:
    """An Origin header as `origin_of` writes it; None for one no URL parser reads
    (a hostile `http://[` or a port out of range), which is refused, never a 500."""
    try:
        return origin_of(url)
    except ValueError:
        return None


def allowed_origins(public_url: str, port: int, loopback: bool) -> frozenset[str]:
    """The origins whose pages may drive an app: the public URL's, and on loopback each
    name this machine's browser may use for it."""
    origins = {origin_of(public_url)}
    if loopback:
        origins |= {origin_of(f"http://{name}:{port}") for name in LOOPBACK_NAMES}
    return frozenset(origins)


def listen(host: str, port: int) -> socket.socket:
    """A socket listening on host:port, or ServeError naming what is wrong and the fix."""
    try:
        found = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except (socket.gaierror, UnicodeError):
        raise ServeError(
            f"--host {visible(host, 80)} is no address this machine can find; give an IP "
            "address or a name it resolves (127.0.0.1 serves this machine only)"
        ) from None
    family, kind, protocol, _, address = found[0]
    listening = socket.socket(family, kind, protocol)
    try:
        # a restart right after a stop finds the port free (a closed connection's
        # TIME_WAIT would otherwise hold it); a port another server listens on stays taken
        listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listening.bind(address)
        listening.listen(128)
    except OSError as error:
        listening.close()
        raise ServeError(_listen_problem(error, host, port)) from None
    return listening


def _listen_problem(error: OSError, host: str, port: int) -> str:
    where = f"{visible(host, 80)}:{port}"
    if error.errno == errno.EADDRINUSE:
        return f"port {port} is in use on {visible(host, 80)}; give another with --port N"
    if error.errno == errno.EADDRNOTAVAIL:
        return (
            f"--host {visible(host, 80)} is not an address of this machine; give one of its "
            "addresses, or 127.0.0.1 for this machine only"
        )
    if error.errno == errno.EACCES:
        return f"listening on port {port} needs more rights; give one above 1023 with --port N"
    return f"cannot listen on {where}: {error.strerror}"


class BrowserServer(Server):
    """textual-serve's server with an offline page, a same-origin check on every
    request, a socket opened beforehand, no banner of its own, and visitors whose apps
    cost a bounded share of the machine."""

    def __init__(
        self,
        command: str,
        host: str,
        port: int,
        public_url: str,
        loopback: bool,
        max_visitors: int = DEFAULT_MAX_VISITORS,
    ) -> None:
        super().__init__(command, host=host, port=port, title="specdiff", public_url=public_url)
        self.origins = allowed_origins(public_url, port, loopback)
        self.hosts = frozenset(origin.partition("://")[2] for origin in self.origins)
        self.max_visitors = max_visitors
        self.visitors: set[VisitorApp] = set()
        """Each visitor's app, from the websocket's acceptance until its process is reaped."""
        self.refusals = RefusalLog(log)

    def initialize_logging(self) -> None:
        # textual-serve's own lines (an app that failed to start) as plain lines on
        # stderr, without its colour and local-variable tracebacks
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(OneLine())
        # aiohttp's server logs a malformed request (anyone who reaches the port can send
        # one) with a full traceback: on a presenter's terminal that is one line too
        for name in ("textual-serve", log.name, "aiohttp.server", "aiohttp.web"):
            logger = logging.getLogger(name)
            logger.handlers[:] = [handler]
            logger.setLevel(logging.WARNING)
            logger.propagate = False

    async def on_startup(self, app: web.Application) -> None:
        """The command prints the address itself, before the first connection."""

    async def _make_app(self) -> web.Application:
        app = await super()._make_app()
        aiohttp_jinja2.setup(app, loader=OfflineTemplates(self.templates_path))

        @web.middleware
        async def same_origin(
            request: web.Request,
            handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
        ) -> web.StreamResponse:
            refusal = self.refusal(request.host, request.headers.get("Origin"))
            if refusal is not None:
                self.refusals.refused(refusal)
                raise web.HTTPForbidden(text=refusal)
            return await handler(request)

        app.middlewares.append(same_origin)
        app.on_cleanup.append(_reap_apps)
        return app

    def refusal(self, host: str, origin: str | None) -> str | None:
        """Why a request is refused, or None. A browser sends Origin with every
        websocket, so a page from elsewhere is caught there; a client with no Origin
        is no browser page and could reach the port directly anyway."""
        if host.lower() not in self.hosts:
            return (
                f"refused a request for host {visible(host, 80)}: this server answers to "
                f"{', '.join(sorted(self.hosts))} (give --public-url for another name)"
            )
        if origin is not None and _origin_or_none(origin) not in self.origins:
            return (
                f"refused a connection from a page at {visible(origin, 80)}: only pages "
                f"from {', '.join(sorted(self.origins))} may drive the app"
            )
        return None

    def full(self) -> bool:
        return len(self.visitors) >= self.max_visitors

    async def handle_index(self, request: web.Request) -> web.StreamResponse:
        if self.full():
            self.refusals.refused(f"refused a page: {full_reason(self.max_visitors)}")
            raise web.HTTPServiceUnavailable(text=full_reason(self.max_visitors))
        return await super().handle_index(request)  # type: ignore[no-any-return]

    async def handle_websocket(self, request: web.Request) -> web.WebSocketResponse:
        """A visitor's app for as long as the visitor stays, within the bounds of
        visitors.py; a visitor beyond --max-visitors is told so (`turn_away`)."""
        websocket = web.WebSocketResponse(heartbeat=HEARTBEAT_SECONDS)
        await websocket.prepare(request)
        if self.full():  # checked and taken with no await between: no race for a place
            await self.turn_away(websocket)
            return websocket
        visitor = VisitorApp(
            self.command, websocket, self.download_manager, lambda: self.visitors.discard(visitor)
        )
        self.visitors.add(visitor)
        try:
            await visitor.start(*size_from_query(request.query))
            await self.relay_messages(websocket, visitor)
        except Exception as error:  # noqa: BLE001 (one visitor's failure, logged in one line)
            log.warning("a visitor's connection failed", exc_info=error)
        finally:
            await visitor.stop()
            await websocket.close()
        return websocket

    async def turn_away(self, websocket: web.WebSocketResponse) -> None:
        """The page's websocket refused for want of a place. textual-serve's page says
        "Session ended." whatever a close frame holds, so it is first sent to its own
        address (textual-serve's open_url message, which it follows in the same tab):
        while the places are taken, that page is the one line saying so, and once one
        is free it is the app. The close frame still gives the reason, for any other
        client."""
        reason = full_reason(self.max_visitors)
        self.refusals.refused(f"refused a visitor: {reason}")
        page = {"url": f"{self.public_url}/", "new_tab": False}
        with contextlib.suppress(ConnectionResetError):  # a visitor already gone
            await websocket.send_str(json.dumps(["open_url", page]))
        await websocket.close(code=FULL_CLOSE_CODE, message=reason.encode())

    async def relay_messages(self, websocket: web.WebSocketResponse, visitor: VisitorApp) -> None:
        """The page's messages to its app until the visitor leaves; a message that is
        not textual-serve's shape is skipped, never an error."""
        async for message in websocket:
            if message.type != WSMsgType.TEXT:
                continue
            kind, data = _envelope(message.data)
            if kind == "stdin" and isinstance(data, str):
                await visitor.send_bytes(data.encode("utf-8"))
            elif kind == "resize" and isinstance(data, dict):
                size = bounded_size(data.get("width"), data.get("height"))
                if size is not None:
                    await visitor.set_terminal_size(*size)
            elif kind == "ping":
                await websocket.send_json(["pong", data])
            elif kind == "blur":
                await visitor.blur()
            elif kind == "focus":
                await visitor.focus()

    async def on_shutdown(self, app: web.Application) -> None:
        """Every visitor's app ended and reaped before the connections are closed."""
        await asyncio.gather(*(visitor.stop() for visitor in list(self.visitors)))
        self.refusals.flush()

    def serve_on(self, listening: socket.socket) -> int:
        """Serve on `listening` until SIGINT or SIGTERM; the signal's number. Every
        app is stopped first (visitors.py), then open connections get SHUTDOWN_SECONDS."""
        self.initialize_logging()
        loop = asyncio.new_event_loop()
        stopped_by: list[int] = []

        def stop(signum: int) -> None:
            stopped_by.append(signum)
            raise GracefulExit

        for signum in STOP_SIGNALS:
            loop.add_signal_handler(signum, stop, signum)
        try:
            web.run_app(
                self._make_app(),
                sock=listening,
                handle_signals=False,
                loop=loop,
                print=None,
                access_log=None,
                shutdown_timeout=SHUTDOWN_SECONDS,
            )
        finally:
            asyncio.set_event_loop(None)
        return stopped_by[0] if stopped_by else 0


def _envelope(text: str) -> tuple[object, object]:
    """(kind, data) of a page's message, `["kind", data]`; (None, None) for any other."""
    try:
        envelope = json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: a hostile page's deep nesting
        return None, None
    if not isinstance(envelope, list) or not envelope:
        return None, None
    return envelope[0], envelope[1] if len(envelope) > 1 else None


async def _reap_apps(app: web.Application) -> None:
    """Keep the loop open until each app's process, told to quit, has been reaped: a
    thread of asyncio's child watcher waits for each one and hands its exit to the loop,
    and a loop closed first makes asyncio log "Loop ... that handles pid ... is closed"
    across the stopped server's last line."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + REAP_SECONDS
    while loop.time() < deadline and any(
        "waitpid-" in thread.name and thread.is_alive()  # asyncio-waitpid-N from 3.12
        for thread in threading.enumerate()
    ):
        await asyncio.sleep(0.05)
