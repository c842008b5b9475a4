"""A native crash in the lanes' worker process, injected with SPECDIFF_FAULT, through
`specdiff suite` and `specdiff repeat`: the suite records the crashed prompt and goes
on, --resume runs it again, and repeat says what happened in one line."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from specdiff.cli import main
from specdiff.engine import worker
from specdiff.engine.faults import FAULT_ENV
from specdiff.engine.worker import WorkerCrashed
from specdiff.lanes import presets
from specdiff.prompts import load as load_prompts
from specdiff.sessions.format import CRASHED
from specdiff.sessions.store import load_session
from specdiff.suite.prompts import SuitePrompt
from specdiff.suite.runner import SuiteRun
from specdiff.suite.settings import SuiteSettings

TOKENS = 6
FAULT_STEP = 3


def report_json(folder: Path) -> dict:
    return json.loads((folder / "report.json").read_text(encoding="utf-8"))


@pytest.fixture
def three_prompts(tmp_path: Path) -> Path:
    """Three prompts of which only the first runs long enough to reach FAULT_STEP, so
    the fault crashes one run of the suite."""
    items = load_prompts("coding")[:3]
    lines = [dict(items[0])] + [dict(item, max_tokens=FAULT_STEP) for item in items[1:]]
    path = tmp_path / "three.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n", encoding="utf-8")
    return path


@pytest.mark.model
def test_a_crash_is_recorded_the_suite_goes_on_and_resume_runs_it_again(
    three_prompts: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    folder = tmp_path / "report"
    monkeypatch.setenv(FAULT_ENV, f"b:{FAULT_STEP}:segv")
    arguments = ["suite", str(three_prompts), "--pair", "ubatch", "--report", str(folder)]
    code = main([*arguments, "--max-tokens", str(TOKENS)])
    err = capsys.readouterr().err
    assert code == 1, err  # a crashed run, like a failed one, is not a clean suite
    assert "Traceback" not in err
    crash_lines = [line for line in err.splitlines() if line.startswith("crashed:")]
    assert len(crash_lines) == 1 and "SIGSEGV" in crash_lines[0], err

    data = report_json(folder)
    summary = data["pairs"][0]["summary"]
    assert data["complete"] and data["finished"] == 3
    assert summary["crashed"] == 1 and summary["failed"] == 0
    assert summary["identical"] + summary["forked"] + summary["lengths_differ"] == 2
    crashed = [r for r in data["prompts"] if CRASHED in r["stop_reasons"]]
    assert len(crashed) == 1 and crashed[0]["prompt_id"] == data["prompts"][0]["prompt_id"]
    assert "lane b at step 3" in crashed[0]["errors"][1]
    # the session keeps every step before the crash, and its footer names the crash
    session_file = folder / crashed[0]["session"]
    session = load_session(session_file)
    assert session.footer is not None and session.footer.stop_reasons == (CRASHED, CRASHED)
    # both lanes' step 3 are handed over together: a's, computed before b's crashed,
    # never arrived
    assert [s.index for s in session.steps["b"]] == list(range(FAULT_STEP))
    assert [s.index for s in session.steps["a"]] == list(range(FAULT_STEP))
    assert "SIGSEGV" in (session.footer.errors[1] or "")
    assert "| crashed |" in (folder / "report.md").read_text(encoding="utf-8")
    sessions = session_file.parent
    finished = {p.name: p.stat().st_mtime_ns for p in sessions.glob("*.jsonl") if p != session_file}
    assert len(finished) == 2

    monkeypatch.delenv(FAULT_ENV)
    assert main(["suite", "--resume", "--report", str(folder), "--quiet"]) == 0
    data = report_json(folder)
    assert data["pairs"][0]["summary"]["crashed"] == 0
    assert data["finished"] == 3 and data["resumed"] == 2
    again = load_session(session_file)
    assert again.footer is not None and CRASHED not in again.footer.stop_reasons
    assert len(again.steps["b"]) > FAULT_STEP
    # the crashed file was replaced, nothing else was run again or left behind
    assert sorted(p.name for p in sessions.iterdir()) == sorted([*finished, session_file.name])
    for name, mtime in finished.items():
        assert (sessions / name).stat().st_mtime_ns == mtime


def test_a_pair_whose_worker_crashes_loading_is_skipped(monkeypatch, tmp_path: Path) -> None:
    def crashing(*_args: object, **_kwargs: object) -> None:
        raise WorkerCrashed("the lanes' worker crashed while loading or preparing the lanes")

    monkeypatch.setattr(worker, "PairWorker", crashing)
    prompts = [SuitePrompt(id=name, prompt=f"{name} prompt", where=name) for name in "xy"]
    settings = SuiteSettings("two", (presets()["ubatch"],), TOKENS)
    messages: list[str] = []
    outcome = SuiteRun(
        settings, prompts, tmp_path, on_message=messages.append, cancel=threading.Event()
    ).run()
    assert outcome.ledger.count == 0 and outcome.skipped_runs == 2 and not outcome.cancelled
    assert [m for m in messages if m.startswith("skipped ubatch:")] == [
        "skipped ubatch: the lanes' worker crashed while loading or preparing the lanes"
    ]


@pytest.mark.model
def test_a_crash_in_repeat_is_one_line_and_exit_2(monkeypatch, capsys) -> None:
    monkeypatch.setenv(FAULT_ENV, "a:2:abort")
    code = main(["repeat", "-n", "2", "--companions", "1", "--max-tokens", "4", "--quiet"])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("specdiff: error: the worker crashed while repeating the prompt")
    assert "SIGABRT" in err and "--lane repack=false" in err
