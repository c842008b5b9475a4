"""Running a model-written program: each in a fresh ``python -I`` subprocess, never in
specdiff's own process.

What every program gets, on every system:

- a fresh temporary directory as its working directory and HOME, removed afterwards;
- an environment of PATH, LANG and LC_ALL only (no API keys, nothing of specdiff's);
- its own session and process group, killed as a group when it ends or times out;
- a timeout (``DEFAULT_TIMEOUT``) and rlimits: address space, CPU time, file size,
  processes, no core files;
- its output captured into an unlinked file that RLIMIT_FSIZE bounds, and read back
  only up to ``OUTPUT_LIMIT``.

Before the first program, specdiff makes its own process non-dumpable
(PR_SET_DUMPABLE 0), so that a program running as the same user cannot read specdiff's
/proc/<pid>/environ (a server lane's API key) or its memory.

Model-written code never runs as root. When specdiff runs as root it confines the
program further, since root's own permissions would stop nothing:

- the program runs as a uid of its own (``SANDBOX_UID_BASE`` + specdiff's pid), so it
  can write nowhere but its directory and world-writable places, cannot read other
  users' files or another process's environment, and RLIMIT_NPROC binds it; every
  process of that uid is killed when the program ends, so a child that left the
  process group (setsid) dies too;
- in a private mount and network namespace where the system allows one: /tmp,
  /var/tmp and /dev/shm are fresh, empty tmpfs mounts that vanish with the program, and
  there is no network. Where it does not, the program runs as its own uid alone, and
  shares /tmp and the network;
- where no program can run as another uid (a user namespace that maps root alone, say),
  nothing runs: ``current_confinement`` refuses with a SpecdiffError.

As an ordinary user, the program runs as that user: it can write where the user can,
and a child that calls setsid survives the group kill until the timeout of nothing;
RLIMIT_NPROC then counts the user's other processes too, so the limit is set above
their count.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import IO

from specdiff.errors import SpecdiffError
from specdiff.grading import DEFAULT_TIMEOUT
from specdiff.secrecy import hide_environment

MEMORY_LIMIT = 1 << 30
"""RLIMIT_AS: a program's address space."""
FILE_LIMIT = 16 << 20
"""RLIMIT_FSIZE: the largest file a program may write, its captured output included."""
MAX_CHILDREN = 32
"""How many processes a program may run beside those its uid already has."""
OUTPUT_LIMIT = 64 << 10
"""How much of a program's output is read back (its end, where a traceback is)."""
SANDBOX_UID_BASE = 0x60000000
"""Programs run by root get uid (and gid) base + specdiff's pid: used by nothing else."""
PRIVATE_DIRS = ("/tmp", "/var/tmp", "/dev/shm")
SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
SYSTEM_PYTHON = "/usr/bin/python3"
"""Tried when the uid a program runs as cannot reach specdiff's own interpreter (one
installed under /root, say): graded programs need the standard library only."""

_CLONE_NEWNS = 0x00020000
_CLONE_NEWNET = 0x40000000
_MS_NOSUID = 0x2
_MS_NODEV = 0x4
_MS_REC = 0x4000
_MS_PRIVATE = 1 << 18
_LIBC = ctypes.CDLL(None, use_errno=True)
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*)(?::|$)")


@dataclass(frozen=True)
class Confinement:
    """How programs run here: the interpreter, the uid (None: specdiff's own) and
    whether each gets private temporary directories and no network."""

    interpreter: str
    uid: int | None
    private: bool

    def describe(self) -> str:
        """One line for the user, the suite.json and the report: what a program can reach."""
        if self.uid is None:
            where = "as specdiff's own user, sharing its files, /tmp and the network"
        elif self.private:
            where = f"as uid {self.uid} of its own, with a private /tmp and no network"
        else:
            where = (
                f"as uid {self.uid} of its own, sharing /tmp and the network (no namespaces here)"
            )
        return f"`{self.interpreter} -I` {where}, in a temporary directory"


@dataclass(frozen=True)
class ProgramRun:
    passed: bool
    reason: str
    """"passed", "failed: AssertionError", "timeout after 10 s", "crashed: signal 9"."""
    seconds: float
    output: str
    """The end of what the program printed (stdout and stderr together)."""


def run_program(source: str, timeout: float = DEFAULT_TIMEOUT) -> ProgramRun:
    """Run `source` as a program under the confinement this system allows."""
    _hide_own_process()
    confinement = current_confinement()
    began = time.perf_counter()
    with (
        tempfile.TemporaryDirectory(prefix="specdiff-grade-") as home,
        open(Path(home) / "program.py", "w+b") as program,
        tempfile.TemporaryFile() as output,
    ):
        program.write(source.encode("utf-8", "surrogatepass"))
        program.flush()
        program.seek(0)
        os.unlink(program.name)  # the open file is the program's stdin; nothing to find
        process = _start(confinement, home, timeout, program, output)
        try:
            code: int | None = process.wait(timeout)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            _end(process, confinement)
        seconds = time.perf_counter() - began
        text = _tail(output)
    return ProgramRun(code == 0, _reason(code, text, timeout), seconds, text)


def current_confinement() -> Confinement:
    """The strictest confinement that starts a program here; SpecdiffError where
    specdiff runs as root and no program starts as a uid of its own, since the program
    would run as root."""
    confinement = _strictest_confinement()
    if confinement is None:
        raise SpecdiffError(
            f"specdiff runs as root and cannot start a program as uid "
            f"{SANDBOX_UID_BASE + os.getpid()} (setuid is refused, as in a user namespace "
            f"that maps root alone, or that uid cannot run {sys.executable} nor "
            f"{SYSTEM_PYTHON}), so model-written code would run as root; run specdiff as "
            "an ordinary user, or grade with --no-exec"
        )
    return confinement


@cache
def _strictest_confinement() -> Confinement | None:
    """Tried once per process; None: as root, nothing starts without root."""
    if os.geteuid() != 0:
        return Confinement(sys.executable, None, False)
    uid = SANDBOX_UID_BASE + os.getpid()
    for confinement in (
        Confinement(sys.executable, uid, True),
        Confinement(SYSTEM_PYTHON, uid, True),
        Confinement(sys.executable, uid, False),
        Confinement(SYSTEM_PYTHON, uid, False),
    ):
        if _starts(confinement):
            return confinement
    return None


@cache
def _hide_own_process() -> None:
    """Keep a program running as specdiff's own user from reading the API keys in
    specdiff's environment."""
    failed = hide_environment()
    if failed is not None:
        raise SpecdiffError(
            f"cannot make specdiff's process non-dumpable ({failed}), so a graded "
            "program could read its environment; grade with --no-exec"
        )


def _starts(confinement: Confinement) -> bool:
    if not os.access(confinement.interpreter, os.X_OK):
        return False
    run = None
    try:
        with tempfile.TemporaryDirectory(prefix="specdiff-grade-") as home:
            if confinement.uid is not None:
                os.chown(home, confinement.uid, confinement.uid)
            with tempfile.TemporaryFile() as nothing:
                run = _start(confinement, home, DEFAULT_TIMEOUT, nothing, nothing)
                return run.wait(DEFAULT_TIMEOUT) == 0
    except (OSError, subprocess.SubprocessError):
        return False
    finally:
        if run is not None:
            _end(run, confinement)


def _start(
    confinement: Confinement, home: str, timeout: float, program: IO[bytes], output: IO[bytes]
) -> subprocess.Popen[bytes]:
    if confinement.uid is not None:
        os.chown(home, confinement.uid, confinement.uid)
    return subprocess.Popen(
        [confinement.interpreter, "-I", "-"],
        stdin=program,
        stdout=output,
        stderr=subprocess.STDOUT,
        cwd=home,
        env={"PATH": SAFE_PATH, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": home},
        start_new_session=True,
        close_fds=True,
        preexec_fn=_confine(confinement, home, _limits(confinement, timeout)),
    )


def _limits(confinement: Confinement, timeout: float) -> list[tuple[int, int]]:
    cpu = int(timeout) + 1
    processes = MAX_CHILDREN + (_processes_of(os.getuid()) if confinement.uid is None else 0)
    return [
        (resource.RLIMIT_AS, MEMORY_LIMIT),
        (resource.RLIMIT_CPU, cpu),
        (resource.RLIMIT_FSIZE, FILE_LIMIT),
        (resource.RLIMIT_NPROC, processes),
        (resource.RLIMIT_CORE, 0),
    ]


def _processes_of(uid: int) -> int:
    """How many processes `uid` runs now: RLIMIT_NPROC counts them all."""
    count = 0
    try:
        entries = list(os.scandir("/proc"))
    except OSError:
        return 0  # no /proc to count from: the limit is MAX_CHILDREN alone
    for entry in entries:
        if entry.name.isdigit():
            try:
                count += entry.stat().st_uid == uid
            except OSError:
                continue
    return count


def _confine(
    confinement: Confinement, home: str, limits: list[tuple[int, int]]
) -> Callable[[], None]:
    """What the child does between fork and exec; any failure stops the exec."""

    def confine() -> None:
        for kind, value in limits:
            # CPU: the soft limit's SIGXCPU comes a second before the hard limit's kill
            hard = value + 1 if kind == resource.RLIMIT_CPU else value
            resource.setrlimit(kind, (min(value, hard), hard))
        if confinement.private:
            _private_directories(home, confinement.uid)
        if confinement.uid is not None:
            os.setgroups([])
            os.setgid(confinement.uid)
            os.setuid(confinement.uid)

    return confine


def _private_directories(home: str, uid: int | None) -> None:
    """A mount namespace with fresh /tmp, /var/tmp and /dev/shm, and a network
    namespace with no interface up; `home` is made again inside the new /tmp."""
    if _LIBC.unshare(_CLONE_NEWNS | _CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "unshare")
    if _LIBC.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
        raise OSError(ctypes.get_errno(), "mount --make-rprivate /")
    for directory in PRIVATE_DIRS:
        if os.path.isdir(directory):
            flags = _MS_NOSUID | _MS_NODEV
            if _LIBC.mount(b"tmpfs", directory.encode(), b"tmpfs", flags, b"size=64m") != 0:
                raise OSError(ctypes.get_errno(), f"mount tmpfs {directory}")
    os.makedirs(home, mode=0o700, exist_ok=True)
    if uid is not None:
        os.chown(home, uid, uid)
    os.chdir(home)


def _end(process: subprocess.Popen[bytes], confinement: Confinement) -> None:
    """Kill the program's process group, then every process of its uid (a child that
    left the group), and reap the program."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    if confinement.uid is not None:
        _kill_uid(confinement.uid)
    process.wait()


def _kill_uid(uid: int) -> None:
    """kill(-1) from a process of `uid` reaches every process of that uid but itself."""

    def kill_all() -> None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        with contextlib.suppress(ProcessLookupError):  # none left
            os.kill(-1, signal.SIGKILL)

    true = next(
        (f"{d}/true" for d in SAFE_PATH.split(":") if os.access(f"{d}/true", os.X_OK)),
        sys.executable,
    )
    subprocess.run(
        [true],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={},
        cwd="/",
        preexec_fn=kill_all,
        check=False,
    )


def _tail(output: IO[bytes]) -> str:
    size = output.seek(0, os.SEEK_END)
    output.seek(max(0, size - OUTPUT_LIMIT))
    return output.read().decode("utf-8", "replace")


def _reason(code: int | None, output: str, timeout: float) -> str:
    if code is None:
        return f"timeout after {timeout:g} s"
    if code == 0:
        return "passed"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "signal"
        return f"crashed: signal {-code} ({name})"
    traceback = output.rfind("Traceback (most recent call last):")
    # the exception's line is the first after the last traceback that is not indented;
    # a syntax error has no traceback, and its line ends the output
    lines = output[traceback:].splitlines()[1:] if traceback >= 0 else output.splitlines()[-1:]
    line = next((line for line in lines if line and not line[0].isspace()), "")
    match = _EXCEPTION_LINE.match(line)
    if match and (traceback >= 0 or match.group(1).endswith("Error")):
        return f"failed: {match.group(1)[:80]}"
    return f"failed: exit status {code}"
