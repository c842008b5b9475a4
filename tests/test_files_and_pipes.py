"""Output that cannot be written to the end: a full disk (a file-size limit set with
RLIMIT_FSIZE, or /dev/full), a reader that closed its pipe, and a target that is not a
regular file. Every case runs `python -m specdiff` in a real process and expects one
line on stderr, no traceback, exit 1 (lost output) or 2 (a target refused), no
temporary file left behind and no good file replaced by half of one."""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from specdiff.cli import main
from specdiff.files import NotRegularFile, write_text_atomic

ROOT = Path(__file__).resolve().parent.parent
SESSION = ROOT / "tests" / "data" / "ubatch-roman-empire.jsonl"
FULL_DEVICE = Path("/dev/full")


def limited_to(size: int) -> Callable[[], None]:
    """preexec_fn for a child that may write files of at most `size` bytes: a write past
    it fails with EFBIG, as on a full disk, instead of the process dying of SIGXFSZ."""

    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))

    return apply


def specdiff(
    *args: str,
    stdout: int | None = subprocess.PIPE,
    file_limit: int | None = None,
) -> subprocess.CompletedProcess[bytes]:
    """specdiff in a process group of its own; once it exits, nothing it started (a
    lane worker, a probe) may still run in that group."""
    process = subprocess.Popen(
        [sys.executable, "-m", "specdiff", *args],
        stdout=stdout,
        stderr=subprocess.PIPE,
        preexec_fn=None if file_limit is None else limited_to(file_limit),
        start_new_session=True,
    )
    output, errors = process.communicate(timeout=180)
    with pytest.raises(ProcessLookupError):
        os.killpg(process.pid, 0)
    return subprocess.CompletedProcess(process.args, process.returncode, output, errors)


def one_line(completed: subprocess.CompletedProcess[bytes], code: int, *fragments: str) -> str:
    """The single stderr line of a command that exited with `code`."""
    stderr = completed.stderr.decode("utf-8", "replace")
    assert completed.returncode == code, stderr
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specdiff: error: "), stderr
    assert not any(ord(c) < 0x20 or c == "\x7f" for c in lines[0])
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def leftovers(folder: Path) -> list[str]:
    """Temporary files a writer would leave: hidden .tmp and .partial names."""
    return sorted(
        str(path.relative_to(folder))
        for path in folder.rglob("*")
        if path.name.endswith((".tmp", ".partial")) or path.name.startswith(".")
    )


@pytest.fixture
def closed_pipe() -> Iterator[int]:
    """The write end of a pipe whose reader has already gone: every write is EPIPE."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    yield write_end
    os.close(write_end)


# -- targets that are not regular files -------------------------------------------------
def not_a_file(kind: str, folder: Path) -> Path:
    """A path in folder that is `kind`: a FIFO, a folder, or a link to either or to a
    device node."""
    path = folder / "report.html"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    elif kind == "link to a fifo":
        os.mkfifo(folder / "pipe")
        path.symlink_to(folder / "pipe")
    elif kind == "link to a device":
        path.symlink_to(os.devnull)
    return path


NOT_FILES = ["fifo", "folder", "link to a fifo", "link to a device"]


@pytest.mark.parametrize("kind", NOT_FILES)
def test_atomic_write_refuses_what_is_not_a_regular_file(tmp_path: Path, kind: str) -> None:
    target = not_a_file(kind, tmp_path)
    before = target.lstat()
    with pytest.raises(NotRegularFile, match="only replaces regular files"):
        write_text_atomic(target, "report")
    after = target.lstat()
    assert (after.st_mode, after.st_ino) == (before.st_mode, before.st_ino)
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("kind", NOT_FILES)
def test_export_force_replaces_only_regular_files(tmp_path: Path, capsys, kind: str) -> None:
    target = not_a_file(kind, tmp_path)
    before = target.lstat()
    assert main(["export", str(SESSION), "-o", str(target), "--force"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith(f"specdiff: error: {target} is ") and "\n" not in error
    assert "only replaces regular files" in error
    after = target.lstat()
    assert (after.st_mode, after.st_ino) == (before.st_mode, before.st_ino)
    assert leftovers(tmp_path) == []


def test_export_force_refuses_a_fifo_in_a_real_process(tmp_path: Path) -> None:
    target = not_a_file("fifo", tmp_path)
    completed = specdiff("export", str(SESSION), "-o", str(target), "--force")
    one_line(completed, 2, str(target), "is a named pipe (FIFO)")
    assert stat.S_ISFIFO(target.lstat().st_mode)


@pytest.mark.skipif(os.geteuid() != 0, reason="only root could replace /dev/null")
def test_export_force_leaves_dev_null_a_device() -> None:
    completed = specdiff("export", str(SESSION), "-o", os.devnull, "--force")
    one_line(completed, 2, "/dev/null is a character device")
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)


# -- a full disk ------------------------------------------------------------------------
def test_export_onto_a_full_disk_keeps_the_older_report(tmp_path: Path) -> None:
    target = tmp_path / "report.html"
    target.write_text("the older report\n", encoding="utf-8")
    completed = specdiff("export", str(SESSION), "-o", str(target), "--force", file_limit=200)
    one_line(completed, 1, f"cannot write {target}", "ulimit -f")
    assert target.read_text(encoding="utf-8") == "the older report\n"
    assert leftovers(tmp_path) == []


@pytest.mark.skipif(not FULL_DEVICE.exists(), reason="no /dev/full on this system")
@pytest.mark.parametrize(
    "args",
    [
        ["export", str(SESSION), "--format", "html"],
        ["sessions", "--sessions-dir", "FOLDER", "--json"],
        ["--version"],
    ],
    ids=["export html", "sessions json", "version"],
)
def test_stdout_on_a_full_device(tmp_path: Path, args: list[str]) -> None:
    shutil.copy(SESSION, tmp_path / SESSION.name)
    args = [str(tmp_path) if arg == "FOLDER" else arg for arg in args]
    with FULL_DEVICE.open("wb") as full:
        completed = specdiff(*args, stdout=full.fileno())
    one_line(completed, 1, "standard output", "No space left on device")


# -- a reader that went away ----------------------------------------------------------
@pytest.mark.parametrize(
    "args",
    [
        ["export", str(SESSION), "--format", "json"],
        ["sessions", "--sessions-dir", "FOLDER"],
        ["run", "--help"],
    ],
    ids=["export json", "sessions", "help"],
)
def test_stdout_into_a_closed_pipe(tmp_path: Path, closed_pipe: int, args: list[str]) -> None:
    shutil.copy(SESSION, tmp_path / SESSION.name)
    args = [str(tmp_path) if arg == "FOLDER" else arg for arg in args]
    completed = specdiff(*args, stdout=closed_pipe)
    one_line(completed, 1, "standard output", "closed the pipe")


def test_stdout_into_a_pipe_closed_after_one_byte(tmp_path: Path) -> None:
    """`specdiff sessions | head -c1` with a listing longer than the pipe's buffer, so
    the reader is gone while specdiff still writes."""
    for number in range(250):  # 355 bytes each: 88 KB, more than a pipe holds
        shutil.copy(SESSION, tmp_path / f"{number:04d}-{'x' * 120}.jsonl")
    process = subprocess.Popen(
        [sys.executable, "-m", "specdiff", "sessions", "--sessions-dir", str(tmp_path), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None and process.stderr is not None
    assert process.stdout.read(1) == b"{"
    process.stdout.close()
    stderr = process.stderr.read()
    process.wait(timeout=180)
    one_line(subprocess.CompletedProcess([], process.returncode, b"", stderr), 1, "pipe")


# -- server lanes: a session, a summary and a suite report that do not fit ------------
SERVER_LANES = ["--pair", "servers", "--prompt", "Hello there", "--max-tokens", "4"]


def server_run(url: str, *extra: str, **options) -> subprocess.CompletedProcess[bytes]:
    lanes = ["--lane-a", f"endpoint={url}", "--lane-b", f"endpoint={url}"]
    return specdiff("run", *SERVER_LANES, *lanes, "--quiet", *extra, **options)


@pytest.mark.server
def test_run_save_on_a_full_disk_keeps_a_loadable_partial(tmp_path: Path) -> None:
    from tests.servers import fault_server

    whole, cut = tmp_path / "whole", tmp_path / "cut"
    with fault_server("die") as url:
        server_run(url, "--save", "--sessions-dir", str(whole))
        (saved,) = whole.iterdir()
        lines = saved.read_bytes().splitlines(keepends=True)
        # room for the header and one step and a half: the disk fills mid-line
        room = len(lines[0]) + len(lines[1]) + len(lines[2]) // 2
        completed = server_run(url, "--save", "--sessions-dir", str(cut), file_limit=room)
    (partial,) = cut.iterdir()
    assert partial.name.endswith(".jsonl.partial") and partial.stat().st_size == room
    one_line(completed, 1, f"cannot write {partial}", "ulimit -f")
    exported = specdiff("export", str(partial), "--format", "json")
    assert exported.returncode == 0, exported.stderr
    report = json.loads(exported.stdout)
    assert "partial" in report["title"]


@pytest.mark.server
@pytest.mark.parametrize("where", ["full device", "closed pipe"])
def test_run_summary_that_cannot_be_written(tmp_path: Path, closed_pipe: int, where: str) -> None:
    from tests.servers import fault_server

    with fault_server("ok") as url:
        if where == "closed pipe":
            completed = server_run(url, "--json", stdout=closed_pipe)
        else:
            with FULL_DEVICE.open("wb") as full:
                completed = server_run(url, "--json", stdout=full.fileno())
    one_line(completed, 1, "standard output")


@pytest.mark.server
def test_suite_report_on_a_full_disk_leaves_no_temporary_file(tmp_path: Path) -> None:
    from tests.servers import fault_server

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"id": "p1", "prompt": "Hello"}\n{"id": "p2", "prompt": "Hi"}\n')
    report = tmp_path / "report"
    with fault_server("ok") as url:
        completed = specdiff(
            "suite",
            str(prompts),
            "--pair",
            "servers",
            "--lane-a",
            f"endpoint={url}",
            "--lane-b",
            f"endpoint={url}",
            "--max-tokens",
            "4",
            "--report",
            str(report),
            "--quiet",
            # room for suite.json and both sessions, not for the HTML report
            file_limit=10_000,
        )
    one_line(completed, 1, f"cannot write {report}", "ulimit -f")
    assert leftovers(report) == []
    written = {path.name for path in report.iterdir()}
    assert "suite.json" in written and "report.html" not in written


NOT_SESSIONS = {
    "fifo": ("a named pipe (FIFO)", lambda path: os.mkfifo(path)),
    "device": ("a character device", None),
    "folder": ("a folder", lambda path: path.mkdir()),
}


@pytest.mark.parametrize("command", ["export", "verify", "replay"])
@pytest.mark.parametrize("kind", sorted(NOT_SESSIONS))
def test_a_session_path_that_is_no_regular_file_is_one_line_not_a_hang(
    tmp_path: Path, command: str, kind: str
) -> None:
    """Opening a named pipe waits for a writer that never comes and a device never ends:
    each is refused when opened, before a byte is read."""
    named, make = NOT_SESSIONS[kind]
    path = Path("/dev/zero") if make is None else tmp_path / "shared.jsonl"
    if make is not None:
        make(path)
    extra = ["-o", "-"] if command == "export" else []
    completed = subprocess.run(
        [sys.executable, "-m", "specdiff", command, str(path), *extra],
        capture_output=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    one_line(completed, 2, f"is {named}, not a session file")


def test_export_keeps_a_dangling_link_without_force(tmp_path: Path) -> None:
    """A link whose target is missing is still something the user put there: replacing
    it needs --force like any existing file."""
    link = tmp_path / "report.md"
    link.symlink_to(tmp_path / "missing-target.md")
    session = Path(__file__).parent / "data" / "ubatch-roman-empire.jsonl"
    command = [sys.executable, "-m", "specdiff", "export", str(session), "-o", str(link)]
    one_line(subprocess.run(command, capture_output=True, timeout=60), 2, "--force")
    assert link.is_symlink() and not link.exists()
    forced = subprocess.run([*command, "--force"], capture_output=True, timeout=60)
    assert forced.returncode == 0, forced.stderr
    assert link.read_text(encoding="utf-8").startswith("# specdiff")
