"""`specdiff proxy` as its users run it: a process of its own, its address read from the
line it prints, stopped with SIGTERM as a service manager stops it."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import ROOT, wait_until

ADDRESS = re.compile(r"http://127\.0\.0\.1:(\d+)/v1")


@dataclass
class RunningProxy:
    process: subprocess.Popen[str]
    report: Path
    port: int
    stderr_path: Path
    stdout_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def stderr(self) -> str:
        return self.stderr_path.read_text(encoding="utf-8")

    def stop(self) -> int:
        """SIGTERM, as a service manager stops it; its exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=120)

    def sessions(self, *under: str) -> list[Path]:
        return sorted(self.report.joinpath(*under, "sessions").glob("*/*.jsonl"))


def proxy_environment() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}


@contextlib.contextmanager
def running_proxy(where: Path, *options: str) -> Iterator[RunningProxy]:
    """A proxy on a free port writing its suite to where/suite; stopped on leaving."""
    report = where / "suite"
    stdout_path, stderr_path = where / "proxy.out", where / "proxy.err"
    with stdout_path.open("w") as out, stderr_path.open("w") as err:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "specdiff",
                "proxy",
                "--port",
                "0",
                "--report",
                str(report),
                *options,
            ],  # fmt: skip
            stdout=out,
            stderr=err,
            text=True,
            env=proxy_environment(),
        )
    found: list[int] = []

    def listening() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"the proxy exited: {stderr_path.read_text()}")
        match = ADDRESS.search(stdout_path.read_text())
        if match:
            found.append(int(match.group(1)))
        return bool(found)

    proxy = None
    try:
        wait_until(listening, "the proxy to print its address", timeout=120)
        proxy = RunningProxy(process, report, found[0], stderr_path, stdout_path)
        yield proxy
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
