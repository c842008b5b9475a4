"""`specdiff run --save` stopped by a signal, as a terminal or a supervisor stops it:
real processes, real model. SIGTERM ends the run as Ctrl+C does: the session is
finished and marked stopped, the worker process is gone, and the exit status is 128 +
the signal. A run stopped before its first token says so instead of calling two empty
texts identical."""

from __future__ import annotations

import contextlib
import json
import random
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from specdiff.cli import main
from specdiff.sessions.store import load_session
from tests.conftest import process_running

pytestmark = pytest.mark.model


def start_run(folder: Path, *options: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "specdiff", "run", "--save", "--sessions-dir", str(folder)),
            *("--max-tokens", "200", *options),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_partial(process: subprocess.Popen[str], folder: Path) -> None:
    """Until the run's session file exists, however long the model takes to load on a
    busy machine."""
    deadline = time.monotonic() + 240
    while not list(folder.glob("*.jsonl.partial")):
        assert process.poll() is None, process.communicate()[1]
        assert time.monotonic() < deadline, "no session file in 240 s"
        time.sleep(0.01)


def children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):  # the thread ended meanwhile
            found += [int(child) for child in (task / "children").read_text().split()]
    return found


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
def test_a_stop_signal_finishes_the_saved_session(tmp_path: Path, stop: signal.Signals) -> None:
    folder = tmp_path / "sessions"
    process = start_run(folder, "--json", "--quiet")
    wait_for_partial(process, folder)
    workers = children(process.pid)
    process.send_signal(stop)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + stop, stderr
    assert "Traceback" not in stderr and "Exception ignored" not in stderr
    words = "interrupted" if stop == signal.SIGINT else "stopped by SIGTERM"
    assert f"specdiff: {words}; " in stderr
    # one finished session, no .partial beside it
    (saved,) = folder.iterdir()
    assert saved.name.endswith(".jsonl") and f"saved session {saved}" in stderr
    session = load_session(saved)
    assert not session.partial and session.stopped and session.footer is not None
    assert session.footer.cancelled
    data = json.loads(stdout)
    assert data["cancelled"] is True
    produced = tuple(len(data["lanes"][lane]["token_ids"]) for lane in "ab")
    assert session.footer.generated == produced
    # named by the start the list shows
    started = datetime.fromisoformat(session.header.created).astimezone(timezone.utc)
    assert saved.name.startswith(started.strftime("%Y%m%dT%H%M%SZ"))
    assert workers and not any(process_running(pid) for pid in workers)


def long_prompt(path: Path) -> Path:
    """About 1,500 tokens: their prefill takes long enough that a stop sent as the
    session file appears lands before either lane's first token."""
    words = ("apple", "river", "stone", "cloud", "music", "garden", "window", "paper")
    chooser = random.Random(1)
    path.write_text(" ".join(chooser.choice(words) for _ in range(1500)), encoding="utf-8")
    return path


def test_a_run_stopped_before_its_first_token_says_so(tmp_path: Path, capsys) -> None:
    folder = tmp_path / "sessions"
    process = start_run(folder, "--prompt-file", str(long_prompt(tmp_path / "prompt.txt")))
    wait_for_partial(process, folder)
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    assert "specdiff: interrupted; before any token, so nothing was compared" in stderr
    assert "STOPPED BEFORE ANY TOKEN" in stdout and "IDENTICAL" not in stdout
    (saved,) = folder.iterdir()
    footer = json.loads(saved.read_text(encoding="utf-8").splitlines()[-1])
    assert footer["type"] == "footer" and footer["generated"] == [0, 0]
    assert footer["identical"] is False and footer["stopped_before_first_token"] is True
    assert main(["sessions", "--sessions-dir", str(folder)]) == 0
    (row,) = [line for line in capsys.readouterr().out.splitlines() if line[:3].strip() == "1"]
    assert "stopped before any token" in row and " 0/0 " in row
