"""A worker process ends with the program that started it, however that program ends:
a worker left behind holds a model's memory and a core with nobody to read its steps.

The worker is kept busy (a function call that sleeps, as a decode loop would run, once it
has said so in a file), so it reads no request that would tell it the front end has
gone; the front end is a small Python program killed by SIGTERM (whose default action
runs no cleanup) or SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, process_running, wait_until

BUSY = """
import pathlib
import time


def sleep(seconds, started, cancel):
    pathlib.Path(started).write_text("busy")
    time.sleep(seconds)
"""

FRONT_END = """
import sys

import busy
from specdiff.engine.worker import call_in_worker

print("calling", flush=True)
call_in_worker(busy.sleep, [120, sys.argv[1]])
"""

WORKER_MODULE = b"specdiff.engine.worker_child"


def _children(parent: int) -> list[int]:
    """The worker processes whose parent is `parent`, read from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        # the command's name may hold spaces and parentheses: fields follow the last ")"
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[1]) == parent and WORKER_MODULE in command:
            found.append(int(entry.name))
    return found


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_busy_worker_ends_with_its_front_end(tmp_path: Path, how: signal.Signals) -> None:
    (tmp_path / "busy.py").write_text(BUSY)
    paths = [str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")]
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in paths if p))
    started = tmp_path / "started"
    front_end = subprocess.Popen(
        [sys.executable, "-c", FRONT_END, str(started)],
        env=environment,
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    worker = None
    try:
        assert front_end.stdout is not None
        assert front_end.stdout.readline() == b"calling\n"
        wait_until(started.exists, "the worker to begin the call", 30)
        (worker,) = _children(front_end.pid)
        assert process_running(worker)  # busy in the call
        front_end.send_signal(how)
        front_end.wait(10)
        wait_until(
            lambda: not process_running(worker),
            f"the worker to end with its front end's {how.name}",
            2,
        )
    finally:
        front_end.kill()
        front_end.wait(10)
        if worker is not None and process_running(worker):
            os.kill(worker, signal.SIGKILL)
