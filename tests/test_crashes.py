"""Native crashes in llama.cpp end one run, never specdiff: the lanes run in their own
process, and SPECDIFF_FAULT (read only there) kills it on any CPU, as a SIGSEGV in a
kernel or a GGML_ASSERT abort would."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from specdiff.lanes import presets
from specdiff.sessions.format import CRASHED
from specdiff.sessions.store import load_session
from specdiff.tui.app import make_app
from specdiff.tui.widgets import TokenView
from tests.conftest import wait_for, wait_until
from tests.tui_driver import drive

pytestmark = pytest.mark.model

PROMPT = "The history of the Roman Empire"


def specdiff(*args: str, fault: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key != "SPECDIFF_FAULT"}
    if fault is not None:
        env["SPECDIFF_FAULT"] = fault
    return subprocess.run(
        [sys.executable, "-m", "specdiff", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def one_line(completed: subprocess.CompletedProcess[str]) -> str:
    errors = [line for line in completed.stderr.splitlines() if line.startswith("specdiff: error")]
    assert len(errors) == 1, completed.stderr
    assert "Traceback" not in completed.stderr
    return errors[0]


@pytest.mark.parametrize(
    ("fault", "signal_name"), [("b:4:segv", "SIGSEGV"), ("a:2:abort", "SIGABRT")]
)
def test_run_survives_a_crash_and_names_lane_step_signal_build_and_cpu(
    fault: str, signal_name: str
) -> None:
    completed = specdiff(
        "run", "--pair", "ubatch", "--prompt", PROMPT, "--max-tokens", "12", "--quiet", fault=fault
    )
    assert completed.returncode == 2
    line = one_line(completed)
    lane, step, _ = fault.split(":")
    assert f"in lane {lane} at step {step}" in line and signal_name in line
    assert "llama.cpp" in line and "repack=false" in line
    assert "CRASHED" in completed.stdout


def test_a_crash_while_saving_keeps_every_step_and_records_it(tmp_path: Path) -> None:
    completed = specdiff(
        "run",
        "--pair",
        "ubatch",
        "--prompt",
        PROMPT,
        "--max-tokens",
        "12",
        "--save",
        "--sessions-dir",
        str(tmp_path),
        "--json",
        "--quiet",
        fault="b:4:segv",
    )
    assert completed.returncode == 2
    (saved,) = tmp_path.glob("*.jsonl")
    session = load_session(saved)
    # lockstep: both lanes' step i are handed over together, so a's step 4, computed
    # before b's crashed, never arrived; every step that did is kept
    assert len(session.steps["a"]) == 4 and len(session.steps["b"]) == 4
    assert not session.footer.identical  # cut short: not identical, whatever it held
    assert session.footer is not None and session.footer.crashed
    assert session.footer.stop_reasons == (CRASHED, CRASHED)
    assert "SIGSEGV" in (session.footer.errors[1] or "")
    data = json.loads(completed.stdout)
    assert data["stop_reasons"] == [CRASHED, CRASHED]
    assert data["lanes"]["a"]["token_ids"] == [s.token_id for s in session.steps["a"]]
    # a crashed recording is verified as far as it got, and a crashed re-run is one line
    assert specdiff("verify", str(saved), "--quiet").returncode == 0
    again = specdiff("verify", str(saved), "--quiet", fault="a:1:abort")
    assert again.returncode == 2 and "SIGABRT" in one_line(again)


def test_a_crash_at_the_first_step_is_one_line() -> None:
    completed = specdiff("run", "--max-tokens", "4", "--quiet", fault="a:0:segv")
    assert completed.returncode == 2
    assert "in lane a at step 0" in one_line(completed)


def test_a_lane_b_crash_is_named_lane_b_though_steps_arrive_in_pairs() -> None:
    completed = specdiff(
        "run",
        "--pair",
        "ubatch",
        "--prompt",
        PROMPT,
        "--max-tokens",
        "6",
        "--quiet",
        fault="b:0:ill",
    )
    assert completed.returncode == 2
    line = one_line(completed)
    assert "in lane b at step 0" in line and "SIGILL" in line


def test_the_front_end_never_loads_llama_cpp() -> None:
    code = (
        "import sys\n"
        "from specdiff.cli import main\n"
        "code = main(['run', '--max-tokens', '3', '--quiet', '--json'])\n"
        "assert 'llama_cpp' not in sys.modules, 'the front end loaded llama_cpp'\n"
        "sys.exit(code)\n"
    )
    completed = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300
    )
    assert completed.returncode in (0, 1), completed.stderr
    assert json.loads(completed.stdout)["generated"] == [3, 3]


async def test_the_tui_shows_a_crash_and_runs_again(monkeypatch) -> None:
    monkeypatch.setenv("SPECDIFF_FAULT", "b:3:segv")
    notes: list[str] = []
    app = make_app(presets(), "ubatch", PROMPT, 10)
    notify = app.notify
    app.notify = lambda message, **options: (notes.append(message), notify(message, **options))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: drive(app).result is not None)
        await pilot.pause()
        assert drive(app).result.crashed
        for lane_id in ("a", "b"):
            assert "SIGSEGV" in (drive(app).lanes[lane_id].error or "")
        assert sum("SIGSEGV" in note for note in notes) == 1
        # the whole message is readable in the pane: wrapped to its width, not cut
        view = app.query_one("#lane-b TokenView", TokenView)
        assert len(view.trailer_lines) > 1
        assert all(len(line) <= view.size.width for line in view.trailer_lines)
        assert "doctor" in " ".join(view.trailer_lines)
        assert len(drive(app).lanes["a"].steps) == 3 and len(drive(app).lanes["b"].steps) == 3
        # the app stays usable: the next run starts a fresh process
        monkeypatch.delenv("SPECDIFF_FAULT")
        drive(app).view.result = None
        await pilot.press("r")
        await wait_for(pilot, lambda: drive(app).result is not None and not drive(app).running)
        assert not drive(app).result.crashed and len(drive(app).lanes["b"].steps) == 10


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_after_a_crash_in_a_real_terminal_q_leaves_a_clean_shell(tmp_path: Path) -> None:
    session = f"specdiff-crash-{os.getpid()}"
    marker = tmp_path / "done"
    command = (
        f"SPECDIFF_FAULT=b:3:segv {sys.executable} -m specdiff live --pair ubatch "
        f"--max-tokens 10; echo EXIT=$? > {marker}; printf 'PROMPT-IS-CLEAN\\n'"
    )
    subprocess.run(
        [
            "tmux",
            "new-session",
            "-d",
            "-s",
            session,
            "-x",
            "100",
            "-y",
            "30",
            command + "; sleep 30",
        ],
        check=True,
    )
    try:
        wait_until(lambda: "crashed" in _capture(session), "the app to say a lane crashed", 120)
        subprocess.run(["tmux", "send-keys", "-t", session, "q"], check=True)
        wait_until(marker.exists, "the app to exit", 60)
        wait_until(lambda: "PROMPT-IS-CLEAN" in _capture(session), "the shell's line", 10)
        screen = _capture(session)
        assert marker.read_text().strip() == "EXIT=0"
        assert "PROMPT-IS-CLEAN" in screen
        # nothing of the app is left drawn over the shell
        assert "lane a" not in screen and "SIGSEGV" not in screen
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], check=False)


def _capture(session: str) -> str:
    return subprocess.run(
        ["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True
    ).stdout
