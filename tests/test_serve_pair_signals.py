"""`specdiff serve-pair` stopped by SIGTERM or SIGHUP (a closed terminal) stops its two
llama-servers, and every other process it started, before it exits with 128 + the
signal: checked by PID on a real serve-pair process, while the servers start and while
the run streams."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.conftest import process_running, wait_until

pytestmark = [pytest.mark.model, pytest.mark.server]

LONG_RUN = ["--max-tokens", "3000", "--prompt", "Count from one to a thousand in words:"]
"""Far more tokens than the seconds the test waits can produce: the run is still going."""


def children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):  # the thread or process ended meanwhile
            found += [int(c) for c in (task / "children").read_text().split()]
    return found


def descendants(pid: int) -> list[int]:
    out = []
    for child in children(pid):
        out += [child, *descendants(child)]
    return out


def command_line(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def llama_servers(pid: int) -> list[int]:
    return [c for c in children(pid) if Path(command_line(c)[0] or "?").name == "llama-server"]


def healthy(server: int) -> bool:
    arguments = command_line(server)
    if "--port" not in arguments:
        return False
    port = arguments[arguments.index("--port") + 1]
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def decoding(server: int) -> bool:
    """Whether a slot of the server is processing a request: the run is under way."""
    arguments = command_line(server)
    if "--port" not in arguments:
        return False
    port = arguments[arguments.index("--port") + 1]
    try:
        slots = httpx.get(f"http://127.0.0.1:{port}/slots", timeout=1).json()
    except (httpx.HTTPError, ValueError):
        return False
    return isinstance(slots, list) and any(
        isinstance(slot, dict) and slot.get("is_processing") is True for slot in slots
    )


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
@pytest.mark.parametrize("phase", ["starting", "running"])
def test_a_stop_signal_stops_both_servers(stop: signal.Signals, phase: str, tmp_path: Path) -> None:
    err_path = tmp_path / "stderr.txt"
    with err_path.open("wb") as err:
        process = subprocess.Popen(
            [sys.executable, "-m", "specdiff", "serve-pair", "--threads", "1", "run", *LONG_RUN],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    started: list[int] = []
    try:
        if phase == "starting":
            wait_until(lambda: llama_servers(process.pid), "the first llama-server to start", 120)
        else:
            wait_until(
                lambda: (
                    len(llama_servers(process.pid)) == 2
                    and all(healthy(s) for s in llama_servers(process.pid))
                ),
                "both llama-servers to answer /health",
                240,
            )
            wait_until(
                lambda: any(decoding(s) for s in llama_servers(process.pid)),
                "a llama-server to decode the run",
                60,
            )
        started = descendants(process.pid)
        servers = llama_servers(process.pid)
        assert servers, "no llama-server to check"
        process.send_signal(stop)
        code = process.wait(timeout=60)
        stderr = err_path.read_text(encoding="utf-8", errors="replace")
        assert code == 128 + stop, stderr
        assert f"{stop.name}: stopping both llama-servers" in stderr
        assert "Traceback" not in stderr
        with contextlib.suppress(AssertionError):  # the check below names who is left
            wait_until(
                lambda: not any(process_running(pid) for pid in started),
                "every process serve-pair started to end",
                15,
            )
        left = [pid for pid in started if process_running(pid)]
        assert not left, f"processes serve-pair started outlived it: {left}"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        for pid in started:  # a failed check must not leave servers behind for others
            if process_running(pid):
                os.kill(pid, signal.SIGKILL)
