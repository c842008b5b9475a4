"""What one browser visitor of `specdiff serve` may cost: a bounded terminal, a bounded
number of visitors, an app that ends with its visitor and with the server (however busy,
and even when the server is killed), and refusals logged at a bounded rate. Checked on a
real `specdiff serve` process with real websocket and HTTP clients on 127.0.0.1; its apps
are found in /proc, their memory read from /proc/PID/status.

An app that ignores being told to quit and SIGTERM (one busy drawing a huge screen, say)
is stood for by an app stopped with SIGSTOP: it reads nothing and handles no signal until
it is killed, whatever the machine's load."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from specdiff.cli import build_parser
from specdiff.tui.browser import DEFAULT_MAX_VISITORS, RefusalLog
from specdiff.tui.visitors import (
    MAX_COLUMNS,
    MAX_ROWS,
    QUIT_SECONDS,
    TERMINATE_SECONDS,
    bounded_size,
    full_reason,
    size_from_query,
)
from tests.conftest import ROOT, process_running, wait_until
from tests.test_serve import SESSION, SLOW, fetch, running_server

REPLAY = ("replay", str(SESSION), "--speed", SLOW)
ENDS_WITHIN = QUIT_SECONDS + TERMINATE_SECONDS + 8.0
"""How long an app may take to end once its visitor left, a loaded machine allowed for."""
CURSOR_MOVE = re.compile(rb"\x1b\[(\d+);(\d+)H")


# -- without a server ----------------------------------------------------------------------


def test_a_terminal_size_is_bounded_to_what_a_screen_shows() -> None:
    assert bounded_size(120, 40) == (120, 40)
    assert bounded_size(20000, 20000) == (MAX_COLUMNS, MAX_ROWS)
    assert bounded_size(0, -5) == (1, 1)
    for hostile in (("80", 24), (80.5, 24), (True, 24), (None, None), ([80], 24)):
        assert bounded_size(*hostile) is None, hostile
    assert size_from_query({"width": "5000", "height": "3000"}) == (MAX_COLUMNS, MAX_ROWS)
    assert size_from_query({"width": "9" * 5000, "height": "x"}) == (80, 24)
    assert size_from_query({}) == (80, 24)


def test_max_visitors_is_serve_s_own_option_and_8_unless_given() -> None:
    parser = build_parser()
    assert parser.parse_args(["serve", "replay", "a.jsonl"]).max_visitors == 8
    assert DEFAULT_MAX_VISITORS == 8
    args = parser.parse_args(["serve", "--max-visitors", "2", "replay", "a.jsonl"])
    assert args.max_visitors == 2 and args.inner == ["replay", "a.jsonl"]
    assert len(full_reason(1000).encode()) <= 123  # what a websocket close frame holds


def test_refusals_beyond_five_a_second_are_one_line_with_their_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    logger = logging.getLogger("specdiff.test-refusals")

    async def burst() -> None:
        refusals = RefusalLog(logger)
        for number in range(300):
            refusals.refused(f"refused {number}")
        await asyncio.sleep(1.2)  # the second ends: its count is written without a refusal

    with caplog.at_level(logging.WARNING, logger.name):
        asyncio.run(burst())
    assert [record.getMessage() for record in caplog.records] == [
        *(f"refused {number}" for number in range(5)),
        "… 295 more refused in the same second",
    ]


def test_the_readme_names_serve_s_extra() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    mention = readme[readme.index("specdiff serve replay SESSION") :][:300]
    assert "pip install -e '.[serve]'" in mention


# -- processes -----------------------------------------------------------------------------


def children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):  # the thread or process ended meanwhile
            found += [int(child) for child in (task / "children").read_text().split()]
    return found


def status(pid: int) -> dict[str, str]:
    """/proc/PID/status as a dict; empty once the process is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    return dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)


def rss_mib(pid: int) -> float:
    return int(status(pid).get("VmRSS", "0 kB").split()[0]) / 1024


def apps_of(server: int) -> list[int]:
    """The server's running app processes (each visitor's `specdiff replay`)."""
    apps = []
    for child in children(server):
        with contextlib.suppress(OSError):
            words = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
            if b"replay" in words and process_running(child):
                apps.append(child)
    return apps


# -- a real server -------------------------------------------------------------------------


class Visitor:
    """A page's websocket: what its app wrote, read until a condition holds."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.received = b""

    async def read_until(self, condition: Callable[[bytes], bool], seconds: float = 60) -> None:
        import aiohttp

        deadline = time.monotonic() + seconds
        while not condition(self.received):
            left = deadline - time.monotonic()
            assert left > 0, f"not shown in {seconds} s: {self.received[-300:]!r}"
            with contextlib.suppress(asyncio.TimeoutError):
                message = await asyncio.wait_for(self.ws.receive(), min(left, 5))
                assert message.type in (aiohttp.WSMsgType.BINARY, aiohttp.WSMsgType.TEXT), message
                if message.type == aiohttp.WSMsgType.BINARY:
                    self.received += message.data

    async def replaying(self) -> None:
        await self.read_until(lambda data: b"replaying at" in data)

    async def read_for(self, seconds: float) -> None:
        """Read what the app writes for `seconds`, as an open page does."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.read_until(lambda _: False, seconds + 60), seconds)


def furthest_cursor(data: bytes) -> tuple[int, int]:
    """(row, column): the furthest cell the app moved its cursor to."""
    moves = [(int(row), int(column)) for row, column in CURSOR_MOVE.findall(data)]
    assert moves, "the app drew nothing"
    return max(row for row, _ in moves), max(column for _, column in moves)


@pytest.mark.server
def test_a_visitor_cannot_ask_for_a_screen_larger_than_500_by_200() -> None:
    import aiohttp

    async def visit(url: str, server: int) -> None:
        async with (
            aiohttp.ClientSession() as client,
            client.ws_connect(f"{url}/ws?width=5000&height=3000", headers={"Origin": url}) as ws,
        ):
            visitor = Visitor(ws)
            await visitor.replaying()
            row, column = furthest_cursor(visitor.received)
            assert row == MAX_ROWS and column <= MAX_COLUMNS, (row, column)  # bounded, kept
            await ws.send_json(["resize", {"width": 100, "height": 30}])
            visitor.received = b""
            await visitor.read_until(lambda data: b"replaying at" in data and len(data) > 2000)
            await ws.send_json(["resize", {"width": 20000, "height": 20000}])
            visitor.received = b""
            # drawn again, on a screen larger than 30 rows but no larger than the bound
            await visitor.read_until(
                lambda data: bool(CURSOR_MOVE.search(data)) and furthest_cursor(data)[0] > 30
            )
            await visitor.read_for(2)  # a screen of 20000 x 20000 grows by the second
            row, column = furthest_cursor(visitor.received)
            assert row == MAX_ROWS and column <= MAX_COLUMNS, (row, column)
            [app] = apps_of(server)
            assert rss_mib(app) < 400, f"the app holds {rss_mib(app):.0f} MiB"

    with running_server(*REPLAY) as (url, process):
        asyncio.run(visit(url, process.pid))


@pytest.mark.server
def test_visitors_beyond_the_cap_are_told_the_page_is_full() -> None:
    import aiohttp

    async def visit(url: str, server: int) -> None:
        async with aiohttp.ClientSession() as client:
            sockets = [
                await client.ws_connect(f"{url}/ws?width=80&height=24", headers={"Origin": url})
                for _ in range(4)
            ]
            visitors = [Visitor(ws) for ws in sockets]
            for visitor in visitors[:2]:
                await visitor.replaying()
            for ws in sockets[2:]:  # turned away at once, told why
                # the page is sent to the address that says so (it shows "Session
                # ended." for any close, whatever its reason)
                message = await asyncio.wait_for(ws.receive(), 30)
                assert message.type == aiohttp.WSMsgType.TEXT, message
                kind, target = json.loads(message.data)
                assert kind == "open_url" and target["new_tab"] is False
                status, page = fetch(target["url"])
                assert status == 503 and full_reason(2) in page.decode()
                message = await asyncio.wait_for(ws.receive(), 30)
                assert message.type == aiohttp.WSMsgType.CLOSE, message
                assert ws.close_code == 1013
                assert message.extra == full_reason(2) and "--max-visitors" in message.extra
            assert len(apps_of(server)) == 2
            status, page = fetch(url + "/")
            assert status == 503 and full_reason(2) in page.decode()

            # a visitor who leaves after a resize and a few seconds of reading: its app
            # ends, and its place is free again
            await sockets[0].send_json(["resize", {"width": 120, "height": 40}])
            await visitors[0].read_for(3)
            await sockets[0].close()
            await asyncio.to_thread(
                wait_until, lambda: len(apps_of(server)) == 1, "the app's end", ENDS_WITHIN
            )
            await asyncio.to_thread(
                wait_until, lambda: fetch(url + "/")[0] == 200, "the place given back", 10
            )
            async with client.ws_connect(f"{url}/ws", headers={"Origin": url}) as ws:
                await Visitor(ws).replaying()
            for ws in sockets[1:]:
                await ws.close()

    with running_server("--max-visitors", "2", *REPLAY) as (url, process):
        asyncio.run(visit(url, process.pid))


@pytest.mark.server
def test_apps_end_when_their_visitors_leave_while_they_draw() -> None:
    """A page closed while its app draws: the app, its output no longer relayed, still
    reads the quit it is sent, and ends by itself, neither left running nor killed."""
    import aiohttp

    async def leave_while_drawing(url: str, client: aiohttp.ClientSession, width: int) -> None:
        async with client.ws_connect(f"{url}/ws", headers={"Origin": url}) as ws:
            visitor = Visitor(ws)
            await visitor.replaying()
            await visitor.read_for(3)
            # closed while the app draws a larger screen, more than a pipe holds
            await ws.send_json(["resize", {"width": width, "height": 150}])
            await visitor.read_for(0.3)

    async def visit(url: str) -> None:
        async with aiohttp.ClientSession() as client:
            await asyncio.gather(*(leave_while_drawing(url, client, 400 + n) for n in range(3)))

    with running_server(*REPLAY) as (url, process):
        asyncio.run(visit(url))
        wait_until(lambda: apps_of(process.pid) == [], "every app's end", ENDS_WITHIN)
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
    assert "killed" not in err, err


async def connected(url: str, server: int) -> tuple[tuple[Any, Any], int]:
    """A visitor's websocket, open, with its app drawing; ((its client session, the
    websocket), the app's PID)."""
    import aiohttp

    client = aiohttp.ClientSession()
    ws = await client.ws_connect(f"{url}/ws?width=100&height=30", headers={"Origin": url})
    await Visitor(ws).replaying()
    [app] = apps_of(server)
    return (client, ws), app


@pytest.mark.server
def test_an_app_that_ignores_quit_and_sigterm_is_killed_when_its_visitor_leaves() -> None:
    async def visit(url: str, server: int) -> int:
        (client, ws), app = await connected(url, server)
        os.kill(app, signal.SIGSTOP)
        await ws.close()
        await client.close()
        return app

    with running_server(*REPLAY) as (url, process):
        app = asyncio.run(visit(url, process.pid))
        wait_until(lambda: not process_running(app), "the stopped app's end", ENDS_WITHIN)
        assert apps_of(process.pid) == []
        assert process.poll() is None  # the server serves on


@pytest.mark.server
def test_stopping_the_server_kills_an_app_that_ignores_quit_and_sigterm() -> None:
    async def visit(url: str, server: int) -> int:
        import aiohttp

        (client, ws), app = await connected(url, server)
        os.kill(app, signal.SIGSTOP)
        os.kill(server, signal.SIGINT)
        async with client:  # the page is told its session ended
            drawing = (aiohttp.WSMsgType.BINARY, aiohttp.WSMsgType.TEXT)
            while (await asyncio.wait_for(ws.receive(), 60)).type in drawing:
                pass
        return app

    with running_server(*REPLAY) as (url, process):
        app = asyncio.run(visit(url, process.pid))
        _, err = process.communicate(timeout=60)
        assert process.returncode == 130, err
        assert not process_running(app), "an app outlived the server"
        assert err.splitlines() == [
            "specdiff serve: a visitor's app ignored quit and SIGTERM: killed",
            "specdiff serve: stopped",
        ]


@pytest.mark.server
def test_an_app_does_not_outlive_a_killed_server() -> None:
    async def visit(url: str, server: int) -> int:
        (client, ws), app = await connected(url, server)
        # an app's input ending is no reason for Textual's web driver to quit
        os.kill(server, signal.SIGKILL)
        await client.close()
        return app

    with running_server(*REPLAY) as (url, process):
        app = asyncio.run(visit(url, process.pid))
        process.wait(timeout=30)
        wait_until(lambda: not process_running(app), "the app's end with its server", 10)


@pytest.mark.server
def test_a_flood_of_refused_requests_is_logged_in_a_few_lines() -> None:
    import aiohttp

    async def flood(url: str) -> None:
        port = url.rsplit(":", 1)[1]
        async with aiohttp.ClientSession() as client:

            async def refused() -> None:
                async with client.get(url + "/", headers={"Host": f"elsewhere:{port}"}) as r:
                    assert r.status == 403

            await asyncio.gather(*(refused() for _ in range(300)))

    with running_server(*REPLAY) as (url, process):
        began = time.monotonic()
        asyncio.run(flood(url))
        seconds = time.monotonic() - began
        time.sleep(1.5)  # the last second's count is written when it is over
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
    lines = err.splitlines()
    refusals = [line for line in lines if "refused a request for host elsewhere" in line]
    held = [int(n) for n in re.findall(r"… (\d+) more refused in the same second", err)]
    assert held and len(refusals) <= 5 * (int(seconds) + 2), err
    assert len(refusals) + sum(held) == 300
    assert len(lines) == len(refusals) + len(held)
