"""The sandbox that runs graded programs, against hostile programs: a fork bomb, a memory
hog, an infinite loop, a flood of output, writes outside its directory, reading
specdiff's secrets (as another uid and as specdiff's own user), reaching the network.
None may hurt the run or leak; and as root where no other uid is usable, nothing runs.
(No model.)"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from specdiff.grading.sandbox import (
    OUTPUT_LIMIT,
    SYSTEM_PYTHON,
    Confinement,
    ProgramRun,
    current_confinement,
    run_program,
)
from tests.conftest import ROOT, process_running

CONFINEMENT = current_confinement()
PR_GET_DUMPABLE = 3
OWN_UID = pytest.mark.skipif(
    CONFINEMENT.uid is None,
    reason="programs run as specdiff's own user here (not root): its files are theirs",
)
PRIVATE = pytest.mark.skipif(
    not CONFINEMENT.private, reason="no private mount and network namespace here (not root)"
)


@pytest.mark.parametrize(
    ("source", "passed", "reason"),
    [
        ("print('ok')", True, "passed"),
        ("assert 1 == 2", False, "failed: AssertionError"),
        ("raise ValueError('x')", False, "failed: ValueError"),
        ("def f(:\n    pass", False, "failed: SyntaxError"),
        ("import sys\nsys.exit(3)", False, "failed: exit status 3"),
        ("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)", False, "crashed: signal 11"),
        ("input()", False, "failed: EOFError"),
        ("print('Result: 5')\nraise KeyError(1)", False, "failed: KeyError"),
        (
            "try:\n    1 / 0\nexcept ZeroDivisionError:\n    raise TypeError('t')",
            False,
            "failed: TypeError",
        ),
    ],
)
def test_each_ending_gives_its_reason(source: str, passed: bool, reason: str) -> None:
    run = run_program(source, timeout=5)
    assert run.passed is passed
    assert run.reason.startswith(reason), run


def test_an_infinite_loop_times_out_and_costs_only_its_timeout() -> None:
    began = time.perf_counter()
    run = run_program("while True:\n    pass", timeout=1)
    assert (run.passed, run.reason) == (False, "timeout after 1 s")
    assert time.perf_counter() - began < 4


@pytest.mark.parametrize(
    "hog",
    [
        "x = bytearray(4 << 30)",
        "import mmap\nmaps = []\nwhile True:\n    maps.append(mmap.mmap(-1, 256 << 20))",
        "x = [0] * (10 ** 10)",
    ],
    ids=["one-block", "growing", "list"],
)
def test_a_memory_hog_fails_without_taking_the_memory(hog: str) -> None:
    run = run_program(hog, timeout=10)
    assert not run.passed
    assert run.reason in ("failed: MemoryError", "failed: OSError"), run


def test_a_flood_of_output_is_cut_and_read_back_bounded() -> None:
    run = run_program("while True:\n    print('x' * 4096)", timeout=10)
    assert not run.passed
    # Python ignores SIGXFSZ: the write past RLIMIT_FSIZE fails instead, and so does the
    # program (the exit status 120 of a failed flush, or the OSError)
    assert run.reason.startswith(("failed: ", "crashed: signal 25")), run.reason
    assert len(run.output) <= OUTPUT_LIMIT


FORK_BOMB = """
import os, sys, time
children = []
for _ in range(200):  # bounded, so a sandbox that failed could not take the machine down
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        os.setsid()  # leave the process group: only a kill by uid reaches it
        time.sleep(120)
        os._exit(0)
    children.append(pid)
print("children", *children, flush=True)
print("forked", len(children), flush=True)
"""


def test_a_fork_bomb_is_capped_and_leaves_no_process_behind() -> None:
    run = run_program(FORK_BOMB, timeout=10)
    line = next(line for line in run.output.splitlines() if line.startswith("children"))
    children = [int(pid) for pid in line.split()[1:]]
    assert children, run.output
    if CONFINEMENT.uid is not None:
        # RLIMIT_NPROC binds a uid of its own; as an ordinary user the user's other
        # processes count too, and the cap is above them
        assert len(children) < 64
        deadline = time.monotonic() + 5
        while any(map(process_running, children)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(map(process_running, children)), list(filter(process_running, children))
    else:
        for pid in children:  # setsid children escape the group kill as this user
            if process_running(pid):
                os.kill(pid, 9)


@OWN_UID
@pytest.mark.parametrize(
    "target",
    ["repo", "home", "tmp", "parent-of-cwd", "var-tmp"],
)
def test_writes_outside_its_directory_leave_nothing(target: str) -> None:
    name = f"specdiff-escape-{uuid.uuid4().hex}"
    path = {
        "repo": ROOT / name,
        "home": Path.home() / name,
        "tmp": Path("/tmp") / name,
        "parent-of-cwd": Path("..") / name,
        "var-tmp": Path("/var/tmp") / name,
    }[target]
    run = run_program(f"open({str(path)!r}, 'w').write('escaped')\nprint('wrote it')")
    outside = path if path.is_absolute() else Path("/tmp") / name
    try:
        assert not outside.exists(), run
    finally:
        outside.unlink(missing_ok=True)


@pytest.mark.parametrize(
    "reader",
    [
        "import os\nprint(dict(os.environ))",
        "import os\nprint(open(f'/proc/{os.getppid()}/environ', 'rb').read())",
        "print(open('/proc/1/environ', 'rb').read())",
    ],
    ids=["environ", "parent-environ", "init-environ"],
)
def test_a_program_cannot_read_specdiffs_secrets(
    reader: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = f"sk-{uuid.uuid4().hex}"
    monkeypatch.setenv("SPECDIFF_TEST_SECRET", secret)
    if reader.startswith("print(open('/proc/1/") and CONFINEMENT.uid is None:
        pytest.skip("as an ordinary user, init may be this user's own process (a container)")
    run = run_program(reader, timeout=5)
    assert secret not in run.output
    if reader.startswith("import os\nprint(dict"):
        assert run.passed and "HOME" in run.output and "PATH" in run.output


@PRIVATE
def test_a_program_cannot_reach_the_network() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        run = run_program(
            f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)",
            timeout=5,
        )
    assert not run.passed and run.reason.startswith("failed: "), run


def test_the_program_runs_in_a_fresh_directory_that_is_removed() -> None:
    run = run_program(
        "import os\nprint(os.getcwd(), os.environ['HOME'], sorted(os.listdir('.')))\n"
        "open('left.txt', 'w').write('x')"
    )
    assert run.passed, run
    cwd, home, listing = run.output.split(maxsplit=2)
    assert cwd == home and listing.strip() == "[]"
    assert not Path(cwd).exists()


def test_two_programs_do_not_see_each_other() -> None:
    first = run_program("open('mark', 'w').write('x')")
    second: ProgramRun = run_program("import os\nassert not os.path.exists('mark')")
    assert first.passed and second.passed, (first, second)


def test_specdiff_is_not_dumpable_once_a_program_ran() -> None:
    """Non-dumpable: /proc/<pid>/environ and mem are root's, not the user's."""
    run_program("pass")
    assert ctypes.CDLL(None).prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) == 0


# Calls run_program in a process of its own with a secret in its environment; the
# program reads that process's /proc environ (it is the program's parent).
SAME_USER_READER = """
import json, sys
sys.path.insert(0, sys.argv[1])
from specdiff.grading.sandbox import current_confinement, run_program
run = run_program("import os\\nprint(open(f'/proc/{os.getppid()}/environ', 'rb').read())")
print(json.dumps([current_confinement().uid, run.passed, run.output]))
"""


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv") or not os.access(SYSTEM_PYTHON, os.X_OK),
    reason="needs root (to start an ordinary user's process), setpriv and " + SYSTEM_PYTHON,
)
def test_a_program_run_as_specdiffs_own_user_cannot_read_its_environment() -> None:
    secret = f"sk-{uuid.uuid4().hex}"
    nobody = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]
    done = subprocess.run(
        [*nobody, SYSTEM_PYTHON, "-I", "-c", SAME_USER_READER, str(ROOT)],
        env={"PATH": "/usr/bin:/bin", "SPECDIFF_TEST_SECRET": secret},
        cwd="/",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    uid, passed, output = json.loads(done.stdout)
    assert uid is None  # the path an ordinary user takes: the program runs as that user
    assert not passed and secret not in output, output


@pytest.mark.parametrize(
    ("confinement", "says"),
    [
        (Confinement("/usr/bin/python3", 7, True), "as uid 7 of its own, with a private /tmp"),
        (Confinement("/usr/bin/python3", 7, False), "as uid 7 of its own, sharing /tmp and"),
        (Confinement("/usr/bin/python3", None, False), "as specdiff's own user, sharing its"),
    ],
    ids=["own-uid-private", "own-uid-shared", "own-user"],
)
def test_a_confinement_says_what_a_program_can_reach(confinement: Confinement, says: str) -> None:
    text = confinement.describe()
    assert text.startswith("`/usr/bin/python3 -I` ") and says in text
    assert ("no network" in text) is confinement.private


def root_alone(*command: str) -> list[str]:
    """`command` as root in a user namespace that maps root alone: no setuid works."""
    return ["unshare", "--map-root-user", *command]


ROOT_ALONE = pytest.mark.skipif(
    not shutil.which("unshare")
    or subprocess.run(root_alone("true"), capture_output=True, check=False).returncode != 0,
    reason="no user namespaces here",
)


@ROOT_ALONE
@pytest.mark.parametrize("caller", ["suite", "run_program"])
def test_as_root_with_no_other_uid_nothing_runs(caller: str, tmp_path: Path) -> None:
    source = tmp_path / "set.jsonl"
    marker = tmp_path / "ran"
    line = {
        "id": "a",
        "prompt": f"open({str(marker)!r}, 'w').write('ran as root')\n",
        "tests": "def check(f):\n    pass\n",
        "entry_point": "print",
    }
    source.write_text(json.dumps(line) + "\n", encoding="utf-8")
    report = tmp_path / "report"
    if caller == "suite":
        command = ["-m", "specdiff", "suite", str(source), "--grade", "--report", str(report)]
    else:
        call = f"from specdiff.grading.sandbox import run_program; run_program({line['prompt']!r})"
        command = ["-c", call]
    done = subprocess.run(
        root_alone(sys.executable, *command),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert "run specdiff as an ordinary user" in done.stderr, done.stderr[-2000:]
    assert not marker.exists() and not report.exists()
    if caller == "suite":
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_a_process_that_hides_its_environment_is_not_dumpable() -> None:
    """The lanes' worker and the suite's process call it: each holds the API keys."""
    probe = (
        "import ctypes; from specdiff.secrecy import hide_environment; "
        "before = ctypes.CDLL(None).prctl(3, 0, 0, 0, 0); failed = hide_environment(); "
        "print(before, failed, ctypes.CDLL(None).prctl(3, 0, 0, 0, 0))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.stdout.split() == ["1", "None", "0"], done.stderr
