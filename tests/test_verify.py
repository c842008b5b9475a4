"""`specdiff run --save` writes as it streams; `specdiff verify` re-runs a session."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from specdiff.fork_words import quoted_piece
from specdiff.sessions.store import load_session
from tests.conftest import ForkingPrompt
from tests.test_cli import assert_one_line_error, specdiff


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, forking_prompt: Callable[[str, int], ForkingPrompt]) -> Path:
    """A saved 24-token ubatch run on a prompt where the pair forks on this CPU."""
    folder = tmp_path_factory.mktemp("sessions")
    completed = specdiff(
        "run",
        "--pair",
        "ubatch",
        "--prompt",
        forking_prompt("ubatch", 24).prompt,
        "--max-tokens",
        "24",
        "--save",
        "--sessions-dir",
        str(folder),
        "--quiet",
    )
    assert completed.returncode == 1, completed.stderr
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
    # the token as text, its id beside it
    step = load_session(altered).steps["b"][7]
    shown = f"{quoted_piece(step.piece)} [{target['token_id']}]"
    assert f"DRIFT at step 7 of lane b: recorded {shown}, now " in completed.stdout


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


ROOT = Path(__file__).resolve().parent.parent
DEMO = next(path for path in sorted((ROOT / "sessions").glob("*.jsonl")) if "ubatch" in path.name)
OTHER_CPUS = (
    {
        "cpu": "Intel(R) Xeon(R) Platinum 8480+",
        "system_info": "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | "
        "BMI2 = 1 | AVX512 = 1 | AVX512_VBMI = 1 | AVX512_VNNI = 1 | AVX512_BF16 = 1 | "
        "AMX_INT8 = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 |",
    },
    {
        "cpu": "AMD EPYC 7B13",
        "system_info": "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | "
        "BMI2 = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 |",
    },
)


@pytest.fixture(scope="module")
def this_cpu() -> dict[str, str]:
    from specdiff.engine.runtime import build_info  # deferred: it loads llama.cpp

    return {key: build_info()[key] for key in ("cpu", "system_info")}


def demo_recorded_on(cpu: dict[str, str], target: Path, tokens: int = 12) -> Path:
    """The ubatch demo session cut to its first `tokens` steps, its header saying it was
    recorded on `cpu`, and lane a's first token changed: the re-run drifts there on any
    CPU, so only the recorded machine decides whether verify blames the CPU."""
    records = [json.loads(line) for line in DEMO.read_text(encoding="utf-8").splitlines()]
    header, footer = records[0], records[-1]
    header["max_tokens"] = tokens
    header["build"].update(cpu)
    steps = [r for r in records[1:-1] if r["index"] < tokens]
    next(r for r in steps if r["lane"] == "a" and r["index"] == 0)["token_id"] += 1
    lines = [json.dumps(r) for r in [header, *steps, footer]]
    target.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return target


@pytest.mark.model
def test_verify_names_another_cpu_as_the_likely_cause(
    this_cpu: dict[str, str], tmp_path: Path
) -> None:
    other = next(cpu for cpu in OTHER_CPUS if cpu["system_info"] != this_cpu["system_info"])
    session = demo_recorded_on(other, tmp_path / "elsewhere.jsonl")
    completed = specdiff("verify", str(session), "--quiet")
    assert completed.returncode == 1, completed.stdout + completed.stderr
    assert "DRIFT at step 0 of lane a" in completed.stdout
    (cause,) = [line for line in completed.stdout.splitlines() if "likely cause" in line]
    assert cause.startswith(f"likely cause: recorded on another CPU ({other['cpu']}, ")
    assert f" -> {this_cpu['cpu']}" in cause and "round differently" in cause


@pytest.mark.model
def test_verify_blames_no_cpu_when_it_is_the_recording_one(
    this_cpu: dict[str, str], tmp_path: Path
) -> None:
    session = demo_recorded_on(this_cpu, tmp_path / "here.jsonl")
    completed = specdiff("verify", str(session), "--quiet")
    assert completed.returncode == 1, completed.stdout + completed.stderr
    assert "DRIFT at step 0 of lane a" in completed.stdout
    assert "another CPU" not in completed.stdout and "likely cause" not in completed.stdout


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
