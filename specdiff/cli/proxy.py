"""`specdiff proxy`: both lanes of a pair behind one OpenAI-compatible endpoint, so that
any OpenAI client (an eval harness, an app) runs through specdiff unchanged, every
request saved as a session of a suite folder.

Ctrl+C or SIGTERM stops taking requests, lets those in flight finish, writes the
reports and exits 130. With --tui, the TUI shows the newest pair saved while the proxy
serves in a thread beside it; quitting it (q, Ctrl+C) stops the proxy the same way."""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import os
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from specdiff.cli import options
from specdiff.cli.common import (
    ArgumentError,
    Exit,
    Status,
    Subcommands,
    add_command,
    check_limits,
    config_theme,
    is_terminal,
    known_pairs,
    note_unread_keys,
    resolve_pair,
)
from specdiff.lanes import Pair
from specdiff.safe_text import visible
from specdiff.secrecy import hide_environment

if TYPE_CHECKING:
    from specdiff.proxy.folder import Recorded
    from specdiff.proxy.progress import ProxyProgress
    from specdiff.proxy.server import ProxyServer
    from specdiff.proxy.service import Service
    from specdiff.tui.proxy_app import ProxyApp

DEFAULT_PORT = 8090
DEFAULT_MAX_QUEUE = 16
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def add_parser(commands: Subcommands) -> None:
    proxy = add_command(
        commands,
        "proxy",
        "serve a pair as one OpenAI-compatible endpoint; every request runs on both lanes "
        "and is saved into a suite folder",
        command_proxy,
    )
    options.add_lane_options(proxy)
    add_listen_options(proxy)
    proxy.add_argument(
        "--report",
        metavar="DIR",
        help="the suite folder (default: a new one here, e.g. suite-proxy-spec-vs-plain-"
        "20261207T0530Z)",
    )
    proxy.add_argument(
        "--serve",
        choices=("a", "b"),
        default="a",
        help="the lane whose answer clients get (default a)",
    )
    options.add_max_tokens(proxy)
    options.add_near_tie(proxy)
    options.add_control(proxy)
    add_load_options(proxy)
    proxy.add_argument(
        "--tui",
        action="store_true",
        help="show the newest pair saved in the TUI, with the count of requests and forks, "
        "in place of the live line; q or Ctrl+C stops the proxy. Needs a terminal "
        "(stdin, stdout and stderr): refused otherwise",
    )
    proxy.add_argument("--theme", help="the TUI's theme (with --tui)")
    options.add_quiet(proxy)


def add_listen_options(proxy: argparse.ArgumentParser) -> None:
    proxy.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1; any other needs --api-key)",
    )
    proxy.add_argument(
        "--port",
        type=options.whole_number(0, 65535),
        default=DEFAULT_PORT,
        help=f"port to listen on (default {DEFAULT_PORT}; 0 picks a free one and prints it)",
    )
    key = proxy.add_mutually_exclusive_group()
    key.add_argument(
        "--api-key",
        metavar="KEY",
        help="the key clients must send (Authorization: Bearer KEY); needed off loopback. "
        "Other users can read a command line: --api-key-env keeps the key out of it",
    )
    key.add_argument(
        "--api-key-env",
        metavar="VAR",
        help="the environment variable that holds the key clients must send",
    )


def add_load_options(proxy: argparse.ArgumentParser) -> None:
    proxy.add_argument(
        "--concurrency",
        type=options.whole_number(1, 64),
        default=1,
        metavar="N",
        help="server lanes: up to N requests in flight at once (default 1)",
    )
    proxy.add_argument(
        "--max-queue",
        type=options.whole_number(0, 100_000),
        default=DEFAULT_MAX_QUEUE,
        metavar="N",
        help=f"requests that may wait for a free runner; past it, HTTP 429 (default "
        f"{DEFAULT_MAX_QUEUE})",
    )


def command_proxy(args: argparse.Namespace) -> int:
    """Serve until Ctrl+C or SIGTERM (or, with --tui, until the TUI is quit); exit 130
    then, with the reports written."""
    # deferred: the proxy's modules (and through them the engine) load only for this command
    from specdiff.proxy.server import ProxyServer
    from specdiff.proxy.service import ProxySettings, Service

    if args.tui:
        check_terminal()
    check_limits(args.max_tokens, args.near_tie)
    api_key = client_key(args.api_key, args.api_key_env)
    check_address(args.host, api_key)
    pair = chosen_pair(args)
    report_dir = chosen_report_dir(args.report, pair)
    status = Status(sys.stderr, not args.quiet)
    feed = Feed(LiveLine(status))
    settings = ProxySettings(
        pair=pair,
        report_dir=report_dir,
        max_tokens=args.max_tokens,
        near_tie=args.near_tie,
        control=args.control,
        serve=args.serve,
        concurrency=args.concurrency,
        max_queue=args.max_queue,
    )
    # the keys server lanes read stay in this long-running process's environment
    hide_environment()
    service = Service(settings, feed.recorded, feed.message)
    try:
        server = ProxyServer((args.host, args.port), service, api_key)
    except socket.gaierror as error:  # the host, not the port: no IPv4 address for it
        raise ArgumentError(
            f"cannot listen on {visible(args.host, 80)}: {error.strerror}; give --host an "
            "IPv4 address or a name that has one, e.g. 127.0.0.1"
        ) from None
    except OSError as error:
        raise ArgumentError(
            f"cannot listen on {visible(args.host, 80)}:{args.port}: {error.strerror}; pick "
            "another --port (0 picks a free one)"
        ) from None
    status.message(f"proxy: loading {pair.name} ({pair.description or 'custom pair'})")
    endpoint = f"http://{args.host}:{server.port}/v1"
    serve(server, service, feed, args if args.tui else None, endpoint)
    status.done()
    status.message(f"proxy: stopped after {feed.tally.requests} pairs")
    return Exit.INTERRUPTED


def serve(
    server: ProxyServer,
    service: Service,
    feed: Feed,
    tui: argparse.Namespace | None,
    endpoint: str,
) -> None:
    """Load the pair, serve until stopped (by a signal, or by quitting the TUI), then
    finish what is in flight and print the reports' paths."""
    settings = service.settings
    try:
        service.start()
    except BaseException:
        server.server_close()
        raise
    print(f"specdiff proxy: {endpoint} model {settings.pair.name} -> {settings.report_dir}",
          flush=True)  # fmt: skip
    if tui is None:
        serve_until_stopped(server)
    else:
        # deferred: Textual loads only for the commands that open a screen
        from specdiff.tui.proxy_app import make_proxy_app

        app = make_proxy_app(
            settings.pair, settings.max_tokens, endpoint, tui.theme or config_theme()
        )
        feed.app = app
        serve_until_quit(server, app)
        feed.app = None
    reports = service.stop(cancelled=False)
    server.server_close()
    for report in reports:
        print(f"report: {report}", flush=True)


def check_terminal() -> None:
    """--tui reads keys from stdin, draws on stderr and sizes the screen from stdout: on
    anything but a terminal it would draw for one 80 columns wide, or wait for keys that
    never come."""
    for name, stream in (("stdin", sys.stdin), ("stdout", sys.stdout), ("stderr", sys.stderr)):
        if not is_terminal(stream):
            raise ArgumentError(
                f"--tui needs a terminal, and {name} is not one; drop --tui (the proxy then "
                "prints a line a pair on stderr) or run it in a terminal"
            )


def client_key(given: str | None, variable: str | None) -> str | None:
    """The key clients must send: --api-key's, or the value of --api-key-env's variable."""
    if variable is None:
        return given
    # read once and dropped: the lanes' worker processes, which inherit the environment,
    # have no use for the clients' key
    value = os.environ.pop(variable, None)
    if not value or not value.strip():
        state = "is empty" if value is not None else "is not set"
        raise ArgumentError(
            f"--api-key-env {visible(variable, 80)}: the variable {state}; export it with the "
            "key clients must send"
        )
    return value


def check_address(host: str, api_key: str | None) -> None:
    """Loopback only, unless clients must give a key."""
    if api_key is not None and not api_key.strip():
        raise ArgumentError("--api-key is empty; give the key clients must send")
    if api_key is None and not loopback(host):
        raise ArgumentError(
            f"--host {visible(host, 80)} lets other machines in: give --api-key KEY (clients "
            "send it as a bearer token), or listen on 127.0.0.1"
        )


def loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def chosen_pair(args: argparse.Namespace) -> Pair:
    """The pair as `run` builds it, refused with --control where lane a cannot run
    again cold, and with --concurrency where a lane runs in process."""
    from specdiff.control import refuse_uncontrollable

    pair = resolve_pair(args, known_pairs(args))
    note_unread_keys((("a", pair.a), ("b", pair.b)))
    if args.control:
        refuse_uncontrollable(pair)
    if args.concurrency > 1 and "local" in (pair.a.backend, pair.b.backend):
        raise ArgumentError(
            f"--concurrency {args.concurrency} needs server lanes, and pair {pair.name} runs "
            "a lane in process, one request at a time; drop --concurrency"
        )
    return pair


def chosen_report_dir(report: str | None, pair: Pair) -> Path:
    from specdiff.cli.suite import new_report_dir

    if report is not None:
        folder = Path(report).expanduser()
        if folder.exists():
            raise ArgumentError(
                f"the report folder {visible(str(folder), 200)} already exists; name a new "
                "one with --report (each proxy run fills a suite folder of its own)"
            )
        return folder
    return new_report_dir(Path(), "proxy", [pair.name], datetime.now(timezone.utc))


def serve_until_stopped(server: ProxyServer) -> None:
    """Serve in a thread until Ctrl+C or SIGTERM, then stop taking connections."""
    stop = threading.Event()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    with stop_signals(stop):
        thread.start()
        while not stop.wait(0.5):
            pass
    server.shutdown()
    thread.join()


def serve_until_quit(server: ProxyServer, app: ProxyApp) -> None:
    """Serve in a thread while the app runs here; SIGTERM quits the app as q does."""
    stop = threading.Event()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    quitter = threading.Thread(target=quit_when_stopped, args=(stop, app), daemon=True)
    with stop_signals(stop):
        thread.start()
        quitter.start()
        try:
            app.run()
        finally:
            app.closed.set()
            stop.set()
            quitter.join()
            server.shutdown()
            thread.join()


def quit_when_stopped(stop: threading.Event, app: ProxyApp) -> None:
    stop.wait()
    if not app.closed.is_set():
        # the app may close between the check and the call: then there is nothing to quit
        with contextlib.suppress(RuntimeError):
            app.call_from_thread(app.exit, 0)


@contextlib.contextmanager
def stop_signals(stop: threading.Event) -> Iterator[None]:
    def on_signal(_signum: int, _frame: object) -> None:
        stop.set()

    previous = {signum: signal.signal(signum, on_signal) for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


class Feed:
    """Where the proxy's service reports: each pair saved, counted, goes to the TUI while
    one runs, else to the live line; so do its messages."""

    def __init__(self, live: LiveLine) -> None:
        # deferred: the proxy's modules load only for this command
        from specdiff.proxy.progress import ProxyTally

        self.live = live
        self.tally = ProxyTally()
        self.app: ProxyApp | None = None

    def recorded(self, recorded: Recorded, folder: str) -> None:
        progress = self.tally.add(recorded, folder)
        app = self.app
        if app is not None:
            app.saved(progress)
        else:
            self.live.recorded(progress, folder)

    def message(self, text: str) -> None:
        app = self.app
        if app is None or not app.said(text):
            self.live.message(text)


class LiveLine:
    """The count of pairs saved and the latest fork, on one line of stderr; on a log
    (stderr redirected), a line a pair."""

    def __init__(self, status: Status) -> None:
        self.status = status
        self.latest = "no fork yet"
        self._lock = threading.Lock()

    def recorded(self, progress: ProxyProgress, folder: str) -> None:
        fork = progress.fork_index
        with self._lock:
            if progress.failed:
                word = "failed"
            elif fork is None:
                word = "identical"
            else:
                word = f"forked at token {fork}"
                self.latest = f"latest fork {progress.prompt_id} at token {fork}"
            line = f"proxy: {progress.requests} pairs · {progress.forked} forked · {self.latest}"
            if self.status.live:
                self.status.update(line)
            else:
                self.status.message(f"proxy: {progress.prompt_id} {word} -> {folder}")

    def message(self, text: str) -> None:
        with self._lock:
            self.status.message(text)
