"""`specdiff proxy`: both lanes of a pair behind one OpenAI-compatible endpoint, so that
any OpenAI client (an eval harness, an app) runs through specdiff unchanged, every
request saved as a session of a suite folder.

Ctrl+C or SIGTERM stops taking requests, lets those in flight finish, writes the
reports and exits 130."""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import signal
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
    known_pairs,
    note_unread_keys,
    resolve_pair,
)
from specdiff.lanes import Pair
from specdiff.safe_text import visible
from specdiff.secrecy import hide_environment

if TYPE_CHECKING:
    from specdiff.proxy.folder import Recorded
    from specdiff.proxy.server import ProxyServer

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
    proxy.add_argument(
        "--api-key",
        metavar="KEY",
        help="the key clients must send (Authorization: Bearer KEY); needed off loopback",
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
    """Serve until Ctrl+C or SIGTERM; exit 130 then, with the reports written."""
    # deferred: the proxy's modules (and through them the engine) load only for this command
    from specdiff.proxy.server import ProxyServer
    from specdiff.proxy.service import ProxySettings, Service

    check_limits(args.max_tokens, args.near_tie)
    check_address(args.host, args.api_key)
    pair = chosen_pair(args)
    report_dir = chosen_report_dir(args.report, pair)
    status = Status(sys.stderr, not args.quiet)
    live = LiveLine(status)
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
    service = Service(settings, live.recorded, live.message)
    try:
        server = ProxyServer((args.host, args.port), service, args.api_key)
    except OSError as error:
        raise ArgumentError(
            f"cannot listen on {visible(args.host, 80)}:{args.port}: {error.strerror}; pick "
            "another --port (0 picks a free one)"
        ) from None
    status.message(f"proxy: loading {pair.name} ({pair.description or 'custom pair'})")
    try:
        service.start()
    except BaseException:
        server.server_close()
        raise
    print(f"specdiff proxy: http://{args.host}:{server.port}/v1 model {pair.name} -> "
          f"{report_dir}", flush=True)  # fmt: skip
    serve_until_stopped(server)
    reports = service.stop(cancelled=False)
    server.server_close()
    status.done()
    for report in reports:
        print(f"report: {report}", flush=True)
    status.message(f"proxy: stopped after {live.count} pairs")
    return Exit.INTERRUPTED


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


class LiveLine:
    """The count of pairs saved and the latest fork, on one line of stderr; on a log
    (stderr redirected), a line a pair."""

    def __init__(self, status: Status) -> None:
        self.status = status
        self.count = 0
        self.forked = 0
        self.latest = "no fork yet"
        self._lock = threading.Lock()

    def recorded(self, recorded: Recorded, folder: str) -> None:
        record = recorded.record
        summary = record.summary
        with self._lock:
            self.count += 1
            fork = summary.fork_index
            if summary.errors[0] or summary.errors[1]:
                word = "failed"
            elif fork is None:
                word = "identical"
            else:
                self.forked += 1
                word = f"forked at token {fork}"
                self.latest = f"latest fork {record.prompt_id} at token {fork}"
            line = f"proxy: {self.count} pairs · {self.forked} forked · {self.latest}"
            if self.status.live:
                self.status.update(line)
            else:
                self.status.message(f"proxy: {record.prompt_id} {word} -> {folder}")

    def message(self, text: str) -> None:
        with self._lock:
            self.status.message(text)
