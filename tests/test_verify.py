"""`specdiff run --save` writes as it streams; `specdiff verify` re-runs a session."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specdiff.sessions.store import load_session
from tests.test_cli import assert_one_line_error, specdiff


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("sessions")
    completed = specdiff(
        "run",
        "--pair",
        "ubatch",
        "--prompt",
        "The history of the Roman Empire",
        "--max-tokens",
        "24",
        "--save",
        "--sessions-dir",
        str(folder),
        "--quiet",
    )
    assert completed.returncode == 1, completed.stderr  # this pair forks here
    (path,) = folder.glob("*.jsonl")
    assert f"saved session {path}" in completed.stderr
    return path


@pytest.mark.model
def test_saved_run_loads_with_its_summary(recorded: Path) -> None:
    session = load_session(recorded)
    assert not session.partial
    assert len(session.steps["a"]) == len(session.steps["b"]) == 24
    assert session.footer.fork_index == session.comparison().fork.index
    assert session.header.max_tokens == 24 and session.header.stop == ()


@pytest.mark.model
def test_verify_passes_on_a_fresh_recording(recorded: Path) -> None:
    completed = specdiff("verify", str(recorded), "--quiet")
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "verified: all 48 recorded steps" in completed.stdout


@pytest.mark.model
def test_verify_names_the_step_of_an_altered_token(recorded: Path, tmp_path: Path) -> None:
    lines = recorded.read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in lines]
    target = next(
        r for r in records if r["type"] == "step" and r["lane"] == "b" and r["index"] == 7
    )
    target["token_id"] += 1
    altered = tmp_path / "altered.jsonl"
    altered.write_text("\n".join(json.dumps(r) for r in records) + "\n", encoding="utf-8")
    completed = specdiff("verify", str(altered), "--quiet")
    assert completed.returncode == 1
    assert f"DRIFT at step 7 of lane b: recorded token {target['token_id']}" in completed.stdout


@pytest.mark.model
def test_verify_fails_when_the_lane_configuration_changed(recorded: Path, tmp_path: Path) -> None:
    records = [json.loads(line) for line in recorded.read_text(encoding="utf-8").splitlines()]
    records[0]["lanes"]["b"]["n_batch"] = 512  # lane b recorded with n_batch 2, re-run at 512
    records[0]["lanes"]["b"]["n_ubatch"] = 512
    changed = tmp_path / "changed.jsonl"
    changed.write_text("\n".join(json.dumps(r) for r in records) + "\n", encoding="utf-8")
    completed = specdiff("verify", str(changed), "--quiet")
    fork = load_session(recorded).comparison().fork.index
    assert completed.returncode == 1
    assert f"DRIFT at step {fork} of lane b" in completed.stdout
    assert "lane b n_batch: 2 -> 512" in completed.stdout


def test_verify_bad_input(tmp_path: Path) -> None:
    assert_one_line_error(specdiff("verify", str(tmp_path / "absent.jsonl")), "not found")
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"type": "header", "schema": 1\n', encoding="utf-8")
    assert_one_line_error(specdiff("verify", str(broken)), "broken.jsonl:1:")


@pytest.mark.model
def test_killed_run_leaves_a_partial_session(tmp_path: Path) -> None:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "specdiff",
            "run",
            "--max-tokens",
            "3000",
            "--save",
            "--sessions-dir",
            str(tmp_path),
            "--quiet",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 120
        partial = None
        while time.monotonic() < deadline:
            found = list(tmp_path.glob("*.jsonl.partial"))
            if found and found[0].read_text(encoding="utf-8").count("\n") > 20:
                partial = found[0]
                break
            time.sleep(0.2)
        assert partial is not None, "no steps were written"
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    assert not list(tmp_path.glob("*.jsonl"))  # never finished, never renamed
    written = partial.read_text(encoding="utf-8").splitlines()
    session = load_session(partial) if written[-1].endswith("}") else None
    if session is None:  # the kill may cut the last line: every complete line still loads
        trimmed = tmp_path / "trimmed.jsonl"
        trimmed.write_text("\n".join(written[:-1]) + "\n", encoding="utf-8")
        session = load_session(trimmed)
        complete_steps = len(written) - 2
    else:
        complete_steps = len(written) - 1
    assert session.partial
    assert len(session.steps["a"]) + len(session.steps["b"]) == complete_steps


def test_demo_sessions_load_and_fork() -> None:
    demos = sorted((Path(__file__).resolve().parent.parent / "sessions").glob("*.jsonl"))
    pairs = {load_session(path).pair.name for path in demos}
    assert {"spec-vs-plain", "cache-vs-fresh", "ubatch"} <= pairs
    for path in demos:
        session = load_session(path)
        assert not session.partial and session.comparison().fork is not None, path.name


def test_replay_bad_input(tmp_path: Path) -> None:
    assert_one_line_error(specdiff("replay", str(tmp_path / "absent.jsonl")), "not found")


@pytest.mark.model
def test_verify_checks_a_stopped_run_as_far_as_it_got(recorded: Path, tmp_path: Path) -> None:
    records = [json.loads(line) for line in recorded.read_text(encoding="utf-8").splitlines()]
    header, footer = records[0], records[-1]
    steps = [r for r in records if r["type"] == "step" and r["index"] < 10]
    footer["cancelled"] = True
    stopped = tmp_path / "stopped.jsonl"
    stopped.write_text("\n".join(json.dumps(r) for r in [header, *steps, footer]) + "\n")
    completed = specdiff("verify", str(stopped), "--quiet")
    assert completed.returncode == 0, completed.stdout
    assert "all 20 recorded steps" in completed.stdout


@pytest.mark.model
def test_save_with_bad_input_leaves_no_file(tmp_path: Path) -> None:
    completed = specdiff(
        "run",
        "--pair",
        "cache-vs-fresh",
        "--lane-a",
        "prefix_tokens=500",
        "--prompt",
        "short prompt",
        "--save",
        "--sessions-dir",
        str(tmp_path),
    )
    assert_one_line_error(completed, "cached prefix of 500 tokens")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.model
def test_sessions_dir_that_is_a_file(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    completed = specdiff(
        "run",
        "--max-tokens",
        "2",
        "--save",
        "--sessions-dir",
        str(blocker / "sub"),
    )
    assert_one_line_error(completed, "cannot create the sessions folder")
