"""`specdiff serve`: the TUI in a web browser, for a talk or a shared screen.

Each browser that opens the page gets a fresh app process of its own, started by
running `python -m specdiff replay SESSION ...` or `python -m specdiff live ...`. A
replay loads no model, so a room full of visitors costs little; a live app loads the
model for each visitor.

The inner command is read by that command's own parser, and its app built once here,
before the server starts: a missing session file or a bad option is one line now, not
a page that stays blank for every visitor.
"""

from __future__ import annotations

import argparse
import ipaddress
import shlex
import signal
import sys
from collections.abc import Sequence
from urllib.parse import urlsplit

from specdiff.cli import options
from specdiff.cli.common import (
    ArgumentError,
    CommandParser,
    Exit,
    Subcommands,
    add_command,
)
from specdiff.safe_text import visible

SERVED_COMMANDS = ("replay", "live")
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
DEFAULT_MAX_VISITORS = 8
"""As tui/browser.py's default; written here too, as this module loads no web server."""
MAX_VISITORS = 1000
OWN_OPTIONS = {
    "--host": True,
    "--port": True,
    "--public-url": True,
    "--max-visitors": True,
    "-h": False,
    "--help": False,
}
"""serve's own options, each with whether it takes a value: given before the inner
command. Written out in full (no abbreviations), as live's own options begin alike."""
STDIN_OPTIONS = ("--prompt-file", "--messages")


class ServeParser(CommandParser):
    """serve's options come first; the first word that is none of them starts the inner
    command, whose options (live's --pair, say) this parser does not know. argparse
    would refuse those as unrecognised, so the words are split here."""

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        own, inner = split_words(list(sys.argv[1:] if args is None else args))
        parsed, extras = super().parse_known_args(own, namespace)
        parsed.inner = inner
        return parsed, extras


def split_words(words: list[str]) -> tuple[list[str], list[str]]:
    """(serve's own words, the inner command's words)."""
    at = 0
    while at < len(words):
        name, joined, _ = words[at].partition("=")
        if name not in OWN_OPTIONS:
            break
        at += 2 if OWN_OPTIONS[name] and not joined else 1
    inner = words[at:]
    return words[:at], inner[1:] if inner[:1] == ["--"] else inner


def add_parser(commands: Subcommands) -> None:
    serve = add_command(
        commands,
        "serve",
        "the TUI in a web browser: a replay (no model per visitor) or live",
        command_serve,
    )
    # argparse makes each command's parser of one class; this one splits its own words
    serve.__class__ = ServeParser
    serve.usage = (
        "specdiff serve [--host HOST] [--port N] [--public-url URL]\n"
        "                      [--max-visitors N]\n"
        "                      [replay SESSION [replay options] | [live] [live options]]"
    )
    # the examples keep their lines; the description is wrapped for 80 columns by hand
    serve.formatter_class = argparse.RawDescriptionHelpFormatter
    serve.description = (
        "Serve the TUI to web browsers: each visitor gets a fresh app of their own.\n"
        "A replay of a saved session loads no model; live loads it for every visitor.\n"
        "Anyone who can open the page drives an app on this machine as you."
    )
    serve.epilog = (
        "examples:\n"
        "  specdiff serve replay sessions/NAME.jsonl --speed 0.5 --pause-at-fork\n"
        "  specdiff serve --port 9000 --pair ubatch --max-tokens 100\n"
        "  specdiff serve --host 0.0.0.0 --public-url http://laptop.local:8000 \\\n"
        "      replay talk.jsonl"
    )
    _add_own_options(serve)


def _add_own_options(serve: argparse.ArgumentParser) -> None:
    """serve's options, each listed in OWN_OPTIONS, then the inner command's words."""
    serve.add_argument(
        "--host",
        default=DEFAULT_HOST,
        help=f"address to listen on (default {DEFAULT_HOST}: this machine only; "
        "0.0.0.0 for every network, with --public-url)",
    )
    serve.add_argument(
        "--port",
        type=options.whole_number(1, 65535),
        metavar="N",
        default=DEFAULT_PORT,
        help=f"port to listen on (default {DEFAULT_PORT})",
    )
    serve.add_argument(
        "--public-url",
        metavar="URL",
        help="the address visitors open, when it is not http://HOST:PORT (behind a "
        "proxy, or with --host 0.0.0.0), e.g. http://laptop.local:8000",
    )
    serve.add_argument(
        "--max-visitors",
        type=options.whole_number(1, MAX_VISITORS),
        metavar="N",
        default=DEFAULT_MAX_VISITORS,
        help=f"how many visitors may have an app at once (default {DEFAULT_MAX_VISITORS}); "
        "the next one is told the page is full",
    )
    serve.add_argument(
        "inner",
        nargs=argparse.REMAINDER,
        metavar="COMMAND ...",
        help="after serve's own options: replay SESSION and replay's options, or live's "
        "options (live is the default); see specdiff replay --help, specdiff live --help",
    )


def inner_command(inner: list[str]) -> list[str]:
    """The command each visitor's app runs: live when none is named."""
    command = list(inner)
    if not command or command[0].startswith("-"):
        command = ["live", *command]
    if command[0] not in SERVED_COMMANDS:
        hint = (
            f"; for a session file, serve replay {visible(command[0], 80)}"
            if command[0].endswith(".jsonl")
            else ""
        )
        raise ArgumentError(
            f"serve shows replay or live in a browser, not {visible(command[0], 40)!r}{hint}"
        )
    return command


def app_command(command: list[str]) -> str:
    """The shell command line textual-serve runs for each visitor: this Python, so the
    visitor's app is this specdiff, with every word quoted (paths with spaces).

    A Ctrl+C in serve's terminal reaches every process in its group, and an app
    interrupted in its threads' shutdown prints a traceback; ignored here (Python keeps
    a SIGINT it inherits ignored), each app is stopped by the server instead, which
    tells it to quit. `exec` makes the app the shell's own process, not a shell
    waiting on it."""
    return "trap '' INT; exec " + shlex.join([sys.executable, "-m", "specdiff", *command])


def check_command(command: list[str]) -> None:
    """Parse the inner command with its own parser and build its app, as each
    visitor's process will: a mistake is refused now, in one line."""
    # deferred: the package imports this module to build its parser
    from specdiff.cli import build_parser

    try:
        args = build_parser().parse_args(command)
    except ArgumentError as error:
        misplaced = [word for word in command if word.partition("=")[0] in OWN_OPTIONS]
        if not misplaced or misplaced[0] in ("-h", "--help"):
            raise
        raise ArgumentError(
            f"{error}; serve's own options ({misplaced[0].partition('=')[0]}) come before "
            "the command"
        ) from None
    if command[0] == "live":
        _check_live(args)
    else:
        _check_replay(args)


def _check_live(args: argparse.Namespace) -> None:
    from specdiff.cli.live import live_app  # deferred: loads the lanes and Textual

    for option in STDIN_OPTIONS:
        if getattr(args, option[2:].replace("-", "_")) == "-":
            raise ArgumentError(
                f"{option} -: every visitor's app would read stdin, which is read only "
                f"once; give a file ({option} FILE)"
            )
    live_app(args)


def _check_replay(args: argparse.Namespace) -> None:
    from specdiff.cli.replay import open_for_replay, replay_app  # deferred, as above
    from specdiff.cli.session_arg import session_path

    session, stream = open_for_replay(session_path(args))
    try:
        replay_app(session, stream, args)
    finally:
        stream.close()


def host_kind(host: str) -> str:
    """Who can reach `host`: "loopback" (this machine only), "any" (every address:
    0.0.0.0, ::, empty) or "network" (one address other machines can reach)."""
    if host.lower() == "localhost":
        return "loopback"
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return "any" if not host else "network"
    if address.is_loopback:
        return "loopback"
    return "any" if address.is_unspecified else "network"


def exposure_warning(host: str) -> str | None:
    """One line for a host other machines can reach, or None for loopback."""
    if host_kind(host) == "loopback":
        return None
    return (
        f"specdiff serve: warning: {visible(host, 40) or 'every address'} is reachable from "
        "other machines; anyone who opens the page drives an app here as you"
    )


def public_url(args: argparse.Namespace, kind: str) -> str:
    """The address visitors open, checked: http(s)://host[:port][/path]."""
    if args.public_url is None:
        if kind == "any":
            raise ArgumentError(
                f"--host {visible(args.host, 40) or repr('')} listens on every address, so "
                "the page cannot tell a visitor's browser where to connect; give "
                f"--public-url http://NAME:{args.port}, the address visitors open"
            )
        host = args.host.strip("[]")
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{args.port}"
    url: str = args.public_url.strip().rstrip("/")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (read for its check: a port that is no number raises)
    except ValueError:
        parts = None
    if (
        parts is None
        or parts.scheme not in ("http", "https")
        or not parts.hostname
        or parts.query
        or parts.fragment
    ):
        raise ArgumentError(
            f"--public-url {visible(args.public_url, 80)!r} is not a web address; give "
            "one like http://laptop.local:8000"
        )
    return url


def command_serve(args: argparse.Namespace) -> int:
    command = inner_command(args.inner)
    check_command(command)
    kind = host_kind(args.host)
    url = public_url(args, kind)
    try:
        # deferred: only this command needs the web server, an optional dependency
        from specdiff.tui.browser import BrowserServer, listen
    except ImportError as error:
        raise ArgumentError(
            f"specdiff serve needs textual-serve ({visible(str(error), 80)}); install it "
            "with pip install -e '.[serve]' in specdiff's folder, or pip install textual-serve"
        ) from None
    listening = listen(args.host, args.port)
    warning = exposure_warning(args.host)
    if warning is not None:
        _warn(warning)
    server = BrowserServer(
        app_command(command), args.host, args.port, url, kind == "loopback", args.max_visitors
    )
    what = "a replay" if command[0] == "replay" else "live (each visitor's app loads the model)"
    print(f"specdiff serve: open {visible(url)} in a browser: {what}; Ctrl+C stops", flush=True)
    with listening:
        stopped_by = server.serve_on(listening)
    if stopped_by == signal.SIGINT:
        _warn("specdiff serve: stopped")
        return Exit.INTERRUPTED
    return 128 + stopped_by if stopped_by else Exit.SAME


def _warn(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
