"""`specdiff serve`: the inner command checked before any server starts, the command line
each visitor's app runs, the page served with nothing from the internet, pages from other
sites refused, and a committed session replayed in headless Chromium that takes keys."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import re
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from specdiff.cli import main
from specdiff.cli.serve import (
    app_command,
    check_command,
    exposure_warning,
    host_kind,
    inner_command,
    public_url,
    split_words,
)
from specdiff.tui.browser import (
    BrowserServer,
    OfflineTemplates,
    OneLine,
    ServeError,
    allowed_origins,
    listen,
    origin_of,
)
from tests.conftest import ROOT

SESSION = ROOT / "sessions" / "20261129T095647Z-spec-vs-plain-cd1458d9.jsonl"
SLOW = "0.05"
"""The replay's pace in the browser tests: slow enough that it is still playing when a
loaded machine gets to the key press."""


def serve_args(*words: str) -> Any:
    from specdiff.cli import build_parser

    return build_parser().parse_args(["serve", *words])


# -- the command line ------------------------------------------------------------------


def test_serve_options_come_first_and_the_rest_is_the_inner_command() -> None:
    assert split_words(["--port", "9000", "--pair", "ubatch"]) == (
        ["--port", "9000"],
        ["--pair", "ubatch"],
    )
    assert split_words(["--host=::1", "replay", "a.jsonl", "--port", "3"]) == (
        ["--host=::1"],
        ["replay", "a.jsonl", "--port", "3"],
    )
    assert split_words(["--", "--port", "3"]) == ([], ["--port", "3"])
    # no abbreviations: live's --prompt is not serve's --public-url
    assert split_words(["--p", "x"]) == ([], ["--p", "x"])
    args = serve_args("--port", "9001", "--pair", "ubatch", "--max-tokens", "9")
    assert args.port == 9001 and args.inner == ["--pair", "ubatch", "--max-tokens", "9"]


def test_the_inner_command_is_live_unless_replay_is_named() -> None:
    assert inner_command([]) == ["live"]
    assert inner_command(["--pair", "ubatch"]) == ["live", "--pair", "ubatch"]
    assert inner_command(["replay", "a b.jsonl"]) == ["replay", "a b.jsonl"]


def test_each_visitor_runs_this_python_with_every_word_quoted() -> None:
    line = app_command(["replay", "/tmp/my talk/a session.jsonl", "--speed", "0.5"])
    assert shlex.split(line) == [
        "trap",
        "",
        "INT;",
        "exec",
        sys.executable,
        "-m",
        "specdiff",
        "replay",
        "/tmp/my talk/a session.jsonl",
        "--speed",
        "0.5",
    ]


def test_the_examples_in_serve_help_are_accepted() -> None:
    from specdiff.cli import build_parser

    serve = build_parser()._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr]
    examples = serve.epilog.split("examples:", 1)[1].replace("\\\n", " ")
    lines = [line.split() for line in examples.strip().splitlines()]
    assert len(lines) == 3
    for words in lines:
        assert words[:2] == ["specdiff", "serve"]
        words = [str(SESSION) if word.endswith(".jsonl") else word for word in words[2:]]
        check_command(inner_command(split_words(words)[1]))


def test_a_good_replay_and_a_good_live_command_pass_the_check() -> None:
    check_command(["replay", str(SESSION), "--speed", "2", "--pause-at-fork"])
    check_command(["live", "--pair", "ubatch", "--max-tokens", "20", "--no-start"])


@pytest.mark.parametrize(
    ("words", "expected"),
    [
        (["replay", "missing.jsonl"], "session file not found: missing.jsonl"),
        (["replay", str(SESSION), "--speed", "0"], "argument --speed: must be"),
        (["replay"], "the following arguments are required: session"),
        (["run"], "serve shows replay or live in a browser, not 'run'"),
        (["x.jsonl"], "for a session file, serve replay x.jsonl"),
        (["--pair", "nope"], "unknown pair 'nope'"),
        (["--max-tokens", "0"], "--max-tokens"),
        (["--prompt-file", "-"], "--prompt-file -: every visitor's app would read stdin"),
        (["--messages", "-"], "--messages -: every visitor's app would read stdin"),
        (["replay", str(SESSION), "--port", "9000"], "serve's own options (--port) come before"),
        (["--port", "0", "replay", str(SESSION)], "argument --port: must be from 1 to 65535"),
        (["--port", "http", "replay", str(SESSION)], "argument --port: must be a whole number"),
        (
            ["--host", "0.0.0.0", "replay", str(SESSION)],
            "give --public-url http://NAME:8000, the address visitors open",
        ),
        (
            ["--public-url", "ftp://laptop:8000", "replay", str(SESSION)],
            "--public-url 'ftp://laptop:8000' is not a web address",
        ),
        (
            ["--public-url", "http://laptop:port", "replay", str(SESSION)],
            "is not a web address",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2_before_any_server(
    words: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", *words]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("specdiff: error: "), captured.err
    assert expected in lines[0]


def test_without_textual_serve_the_command_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # None in sys.modules is how Python marks a module that cannot be imported
    monkeypatch.setitem(sys.modules, "textual_serve.server", None)
    monkeypatch.delitem(sys.modules, "specdiff.tui.browser")
    with socket.socket() as taken:  # had the import worked: "in use", never a server
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = str(taken.getsockname()[1])
        assert main(["serve", "--port", port, "replay", str(SESSION)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "specdiff serve needs textual-serve" in err and "pip install textual-serve" in err
    assert "pip install -e '.[serve]'" in err  # the extra the README names


def test_hosts_are_told_apart() -> None:
    for host in ("127.0.0.1", "127.3.2.1", "::1", "[::1]", "localhost", "LOCALHOST"):
        assert host_kind(host) == "loopback", host
    for host in ("0.0.0.0", "::", ""):
        assert host_kind(host) == "any", host
    for host in ("192.168.1.20", "laptop.local", "fe80::1"):
        assert host_kind(host) == "network", host
    assert exposure_warning("127.0.0.1") is None
    warning = exposure_warning("192.168.1.20")
    assert warning is not None and "\n" not in warning
    assert "reachable from other machines" in warning


def test_the_public_url_is_the_address_given_or_host_and_port() -> None:
    assert public_url(serve_args("--port", "8123"), "loopback") == "http://127.0.0.1:8123"
    assert public_url(serve_args("--host", "::1"), "loopback") == "http://[::1]:8000"
    given = serve_args("--host", "0.0.0.0", "--public-url", "https://talk.example/demo/")
    assert public_url(given, "any") == "https://talk.example/demo"


# -- the server's parts, without serving ---------------------------------------------------


def test_a_port_in_use_and_an_address_not_here_are_one_line_errors() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with pytest.raises(ServeError, match=f"port {port} is in use on 127.0.0.1; give another"):
            listen("127.0.0.1", port)
    with pytest.raises(ServeError, match="no address this machine can find"):
        listen("no-such-host.invalid", 8000)
    with pytest.raises(ServeError, match="not an address of this machine"):
        listen("192.0.2.1", 8000)  # TEST-NET-1: documentation only, never assigned


def test_only_pages_from_this_address_may_drive_an_app() -> None:
    server = BrowserServer("true", "127.0.0.1", 8123, "http://127.0.0.1:8123", loopback=True)
    for host in ("127.0.0.1:8123", "localhost:8123", "[::1]:8123", "LOCALHOST:8123"):
        assert server.refusal(host, None) is None, host
        assert server.refusal(host, f"http://{host}") is None, host
    refusal = server.refusal("127.0.0.1:8123", "http://attacker.example")
    assert refusal is not None and "http://attacker.example" in refusal
    assert server.refusal("127.0.0.1:8123", "http://127.0.0.1:9999") is not None
    assert server.refusal("127.0.0.1:8123", "null") is not None  # a sandboxed frame
    # origins no URL parser reads are refused, not answered with a 500 and a traceback
    for unreadable in ("http://[", "http://127.0.0.1:99999", "http://127.0.0.1:port"):
        refused = server.refusal("127.0.0.1:8123", unreadable)
        assert refused is not None and "refused a connection" in refused, unreadable
    # a name pointed at 127.0.0.1 by someone's DNS server
    rebound = server.refusal("attacker.example:8123", "http://attacker.example:8123")
    assert rebound is not None and "attacker.example:8123" in rebound
    shared = BrowserServer("true", "0.0.0.0", 8000, "https://talk.example/demo", loopback=False)
    assert shared.refusal("talk.example", "https://talk.example") is None
    assert shared.refusal("localhost:8000", "http://localhost:8000") is not None


def test_origins_are_compared_as_browsers_write_them() -> None:
    assert origin_of("HTTP://Laptop.Local:80/x") == "http://laptop.local"
    assert origin_of("https://talk.example:443") == "https://talk.example"
    assert origin_of("http://[::1]:8000") == "http://[::1]:8000"
    assert allowed_origins("http://127.0.0.1:8000", 8000, loopback=False) == {
        "http://127.0.0.1:8000"
    }


def test_the_page_asks_nothing_of_the_internet_and_its_font_is_bundled() -> None:
    import jinja2
    import textual_serve

    base = Path(textual_serve.__file__).parent
    environment = jinja2.Environment(loader=OfflineTemplates(base / "templates"))
    page = environment.get_template("app_index.html").render(
        config={"static": {"url": "http://127.0.0.1:8000/static/"}},
        app_websocket_url="ws://127.0.0.1:8000/ws",
        font_size=16,
        application={"name": "specdiff"},
    )
    assert "googleapis" not in page
    assert remote_references(page, "http://127.0.0.1:8000") == []
    assert "@font-face" in page
    for font in re.findall(r"http://127\.0\.0\.1:8000/static/(fonts/[^\"]+)", page):
        assert (base / "static" / font).is_file(), font


def remote_references(page: str, origin: str) -> list[str]:
    """Addresses the page loads that are not on `origin` (an SVG's xmlns is no load)."""
    found = re.findall(r"""(?:src|href|url)\s*[=(]\s*["']?((?:https?:)?//[^"')\s]+)""", page)
    return [url for url in found if not url.startswith(origin + "/")]


# -- a real server -------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def running_server(*inner: str) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """`specdiff serve` on a free loopback port, in a process group of its own that is
    killed whatever the test did; (the address it printed, the process)."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "specdiff", "serve", "--port", str(port), *inner],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        start_new_session=True,
    )
    try:
        assert process.stdout is not None
        # the server listens once this is printed
        found = read_until(process.stdout.fileno(), r"open (http://\S+) in a browser")
        assert found[1] == f"http://127.0.0.1:{port}"
        yield found[1], process
    finally:
        kill_group(process)


def read_until(fd: int, pattern: str, seconds: float = 120) -> re.Match[str]:
    """Read a child's output until `pattern` shows: a child that hangs or dies before
    printing it fails the test, rather than hanging it."""
    seen = ""
    deadline = time.monotonic() + seconds
    while (found := re.search(pattern, seen)) is None:
        left = deadline - time.monotonic()
        assert left > 0, f"{pattern!r} not printed in {seconds} s: {seen!r}"
        if select.select([fd], [], [], min(left, 1.0))[0]:
            chunk = os.read(fd, 65536)
            assert chunk, f"the process ended before printing {pattern!r}: {seen!r}"
            seen += chunk.decode("utf-8", "replace")
    return found


def read_to_end(fd: int) -> None:
    with contextlib.suppress(OSError):  # closed once the process is gone
        while os.read(fd, 65536):
            pass


def kill_group(process: subprocess.Popen[str], drain: threading.Thread | None = None) -> None:
    """Kill the process and everything in its group, then close its pipes."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # an app the server had not yet reaped
    if drain is not None:
        drain.join(timeout=30)
    for stream in (process.stdout, process.stderr):
        if stream is not None:
            stream.close()


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def fetch(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


async def first_bytes(url: str, origin: str | None) -> bytes:
    """What the app behind /ws writes in its first seconds, connected as a page from
    `origin` would be."""
    import aiohttp

    headers = {} if origin is None else {"Origin": origin}
    received = b""
    async with (
        aiohttp.ClientSession() as client,
        client.ws_connect(f"{url}/ws?width=120&height=40", headers=headers) as ws,
    ):
        deadline = time.monotonic() + 60
        while b"replaying at" not in received and time.monotonic() < deadline:
            with contextlib.suppress(asyncio.TimeoutError):
                message = await asyncio.wait_for(ws.receive(), 5)
                if message.type == aiohttp.WSMsgType.BINARY:
                    received += message.data
                elif message.type != aiohttp.WSMsgType.TEXT:
                    break
    return received


@pytest.mark.server
def test_the_served_page_is_offline_and_other_sites_are_refused() -> None:
    import aiohttp

    with running_server("replay", str(SESSION), "--speed", SLOW) as (url, process):
        status, page = fetch(url + "/")
        assert status == 200
        text = page.decode("utf-8")
        assert "googleapis" not in text and remote_references(text, url) == []
        for font in re.findall(re.escape(url) + r"/static/(fonts/[^\"]+)", text):
            status, body = fetch(f"{url}/static/{font}")
            assert status == 200 and body[:4] == b"\x00\x01\x00\x00", font  # TrueType

        # a page from another site, and a name someone's DNS points here
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            asyncio.run(first_bytes(url, "http://attacker.example"))
        assert refused.value.status == 403
        assert fetch(url + "/", {"Host": f"attacker.example:{url.rsplit(':', 1)[1]}"})[0] == 403

        # the page's own origin gets an app: the replay's own status line comes back
        assert b"replaying at" in asyncio.run(first_bytes(url, url))
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
        assert process.returncode == 128 + signal.SIGTERM
        assert "attacker.example" in err and "Traceback" not in err


@pytest.mark.server
def test_ctrl_c_stops_the_server_and_every_app_with_exit_130() -> None:
    with running_server("replay", str(SESSION), "--speed", SLOW) as (url, process):

        async def connected_then_interrupted() -> bytes:
            import aiohttp

            async with (
                aiohttp.ClientSession() as client,
                client.ws_connect(f"{url}/ws?width=100&height=30") as ws,
            ):
                received = b""
                while b"replaying at" not in received:
                    message = await asyncio.wait_for(ws.receive(), 60)
                    assert message.type == aiohttp.WSMsgType.BINARY, message
                    received += message.data
                apps = subprocess.run(
                    ["ps", "-o", "args=", "-g", str(process.pid)],
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout
                assert "specdiff replay" in apps  # a visitor's app is running
                os.killpg(process.pid, signal.SIGINT)  # a terminal's Ctrl+C reaches all
                return received

        asyncio.run(connected_then_interrupted())
        out, err = process.communicate(timeout=60)
        assert process.returncode == 130, err
        assert err.splitlines() == ["specdiff serve: stopped"]
        deadline = time.monotonic() + 30
        while group_alive(process.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not group_alive(process.pid), "an app outlived the server"


# -- in a browser --------------------------------------------------------------------------

TERMINAL_TEXT = r"""
(objects) => {
  // the page keeps its xterm.js terminal in a closure: find it among the page's objects
  for (const o of objects) {
    try {
      const buffer = o && o.buffer && o.buffer.active;
      if (buffer && typeof buffer.getLine === 'function' && typeof o.cols === 'number') {
        const rows = [];
        for (let y = 0; y < o.rows; y++) {
          const line = buffer.getLine(buffer.viewportY + y);
          rows.push(line ? line.translateToString(true) : '');
        }
        return rows.join('\n');
      }
    } catch (error) {}
  }
  return null;
}
"""


class DevTools:
    """The few Chrome DevTools protocol calls the browser test needs, over aiohttp's
    websocket client."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.ids = itertools.count(1)
        self.events: list[dict[str, Any]] = []

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        number = next(self.ids)
        await self.ws.send_json({"id": number, "method": method, "params": params})
        while True:
            message = await asyncio.wait_for(self.ws.receive_json(), 60)
            if message.get("id") == number:
                assert "error" not in message, (method, message["error"])
                return dict(message["result"])
            self.events.append(message)

    async def evaluate(self, expression: str) -> Any:
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result["result"].get("value")

    async def terminal_text(self) -> str:
        prototype = await self.call("Runtime.evaluate", expression="Object.prototype")
        objects = await self.call(
            "Runtime.queryObjects", prototypeObjectId=prototype["result"]["objectId"]
        )
        handle = objects["objects"]["objectId"]
        text = await self.call(
            "Runtime.callFunctionOn",
            functionDeclaration=TERMINAL_TEXT,
            objectId=handle,
            arguments=[{"objectId": handle}],
            returnByValue=True,
        )
        await self.call("Runtime.releaseObject", objectId=handle)
        return str(text["result"].get("value") or "")

    async def press(self, key: str) -> None:
        await self.call("Input.dispatchKeyEvent", type="keyDown", key=key, text=key)
        await self.call("Input.dispatchKeyEvent", type="keyUp", key=key)

    async def wait_for_text(self, condition: Callable[[str], bool], what: str) -> str:
        deadline = time.monotonic() + 90
        text = ""
        while time.monotonic() < deadline:
            text = await self.terminal_text()
            if condition(text):
                return text
            await asyncio.sleep(0.5)
        raise AssertionError(f"the page never showed {what}; it showed:\n{text}")


@contextlib.contextmanager
def headless_chromium(profile: Path) -> Iterator[str]:
    """Headless Chromium with its DevTools port open; the page target's websocket URL."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "headless Chromium is needed (apt-get install chromium)"
    browser = subprocess.Popen(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--remote-debugging-address=127.0.0.1",
            "--remote-debugging-port=0",
            f"--user-data-dir={profile}",
            "--window-size=1280,800",
            "about:blank",
        ],
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    drain = None
    try:
        assert browser.stderr is not None
        found = read_until(
            browser.stderr.fileno(), r"DevTools listening on ws://127\.0\.0\.1:(\d+)/"
        )
        # Chromium keeps logging: a full pipe would stop it
        drain = threading.Thread(target=read_to_end, args=(browser.stderr.fileno(),), daemon=True)
        drain.start()
        with urllib.request.urlopen(f"http://127.0.0.1:{found[1]}/json/list", timeout=30) as r:
            targets = json.load(r)
        yield next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
    finally:
        kill_group(browser, drain)


@pytest.mark.browser
def test_a_committed_session_replays_in_chromium_and_takes_keys() -> None:
    with (
        running_server("replay", str(SESSION), "--speed", SLOW) as (url, _),
        tempfile.TemporaryDirectory() as profile,
        headless_chromium(Path(profile)) as page_socket,
    ):
        asyncio.run(drive_the_page(url, page_socket))


async def drive_the_page(url: str, page_socket: str) -> None:
    import aiohttp

    async with (
        aiohttp.ClientSession() as client,
        client.ws_connect(page_socket, max_msg_size=0) as ws,
    ):
        tools = DevTools(ws)
        await tools.call("Runtime.enable")
        await tools.call("Page.enable")
        await tools.call("Page.navigate", url=url + "/")
        # the panes: both lanes' labels from the session's header, and the status
        # line only a replay has
        shown = await tools.wait_for_text(
            lambda text: "replaying at 0.05x" in text, "the replay's status"
        )
        assert "A · speculative · ngram 3" in shown and "B · plain" in shown
        assert "The history of the Roman Empire" in shown
        classes = await tools.evaluate("document.body.className")
        assert "-first-byte" in classes.split()  # the page's own 'connected' mark
        assert "specdiff keys" not in shown
        await tools.evaluate("document.querySelector('.xterm-helper-textarea').focus()")
        await tools.press(" ")
        await tools.wait_for_text(lambda text: "paused: space resumes" in text, "a pause")
        await tools.press("?")
        await tools.wait_for_text(lambda text: "specdiff keys" in text, "the help screen")
        errors = [e for e in tools.events if e.get("method") == "Runtime.exceptionThrown"]
        assert errors == [], errors


def test_a_logged_error_is_one_escaped_line_without_its_traceback() -> None:
    import logging
    import sys

    try:
        raise ValueError("bad Origin \x1b[2J")
    except ValueError:
        record = logging.LogRecord(
            "aiohttp.server", logging.ERROR, __file__, 1, "Error handling request", None,
            sys.exc_info(),
        )
    line = OneLine().format(record)
    assert line == "specdiff serve: Error handling request: ValueError: bad Origin \\x1b[2J"
    assert "\n" not in line and "Traceback" not in line
