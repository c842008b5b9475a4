"""`specdiff suite` on the real model: the report agrees with independent runs, stops and
resumes cleanly, renders in a browser, and teacher forcing ranks Q8_0 below Q4_K_M."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from specdiff.cli import main
from specdiff.prompts import load as load_prompts
from specdiff.sessions.store import load_session
from tests.conftest import wait_until

pytestmark = pytest.mark.model

TOKENS = 48
PAIRS = ("spec-vs-plain", "ubatch")


@pytest.fixture(scope="module")
def small_set(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("prompts")
    path = folder / "coding4.jsonl"
    lines = [json.dumps(item) for item in load_prompts("coding")[:4]]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def report(small_set: Path, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("suite") / "report"
    arguments = ["suite", str(small_set), "--report", str(folder), "--max-tokens", str(TOKENS)]
    for pair in PAIRS:
        arguments += ["--pair", pair]
    assert main([*arguments, "--quiet"]) == 0
    return folder


def test_without_report_a_new_folder_is_named_and_said_at_the_start_and_the_end(
    small_set: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    arguments = ["suite", str(small_set), "--pair", "ubatch", "--limit", "1", "--max-tokens", "2"]
    assert main(arguments) in (0, 1)
    [folder] = tmp_path.iterdir()
    assert re.fullmatch(r"suite-coding4-ubatch-\d{8}T\d{4}Z", folder.name), folder.name
    assert (folder / "report.json").is_file()
    out, err = capsys.readouterr()
    assert f"-> {folder.name}" in err.splitlines()[0]
    assert f"report: {Path(folder.name) / 'report.html'}" in out


def report_json(folder: Path) -> dict:
    return json.loads((folder / "report.json").read_text(encoding="utf-8"))


def test_the_report_matches_independent_runs(report: Path, small_set: Path, capsys) -> None:
    data = report_json(report)
    assert data["complete"] and data["finished"] == 8
    prompts = [json.loads(line) for line in small_set.read_text().splitlines()]
    for pair in data["pairs"]:
        label = pair["label"]
        records = [r for r in data["prompts"] if r["pair"] == label]
        summary = pair["summary"]
        identical = 0
        for prompt in prompts[:3]:
            capsys.readouterr()
            code = main(
                [
                    "run",
                    "--pair",
                    label,
                    "--prompt",
                    prompt["prompt"],
                    "--max-tokens",
                    str(TOKENS),
                    "--json",
                    "--quiet",
                    # the set's own stop strings, which the suite stops its lanes on
                    *(f"--stop={stop}" for stop in prompt.get("stop", [])),
                ]
            )
            alone = json.loads(capsys.readouterr().out)
            record = next(r for r in records if r["prompt_id"] == prompt["id"])
            assert code == (0 if record["identical"] else 1)
            assert record["identical"] == alone["identical"]
            fork = alone["fork"]["index"] if alone["fork"] else None
            assert record["fork_index"] == fork, (label, prompt["id"])
            assert record["generated"] == alone["generated"]
            session = load_session(report / record["session"])
            # one record, three views: the footer's fields, unchanged, in the suite's
            # record and in run --json (speeds and times are measured anew by the run)
            assert session.footer is not None
            footer = session.footer.to_json()
            del footer["type"]
            assert {key: record[key] for key in footer} == footer
            for key in set(footer) - {"tokens_per_second", "seconds", "first_token_seconds"}:
                assert alone[key] == footer[key], (label, prompt["id"], key)
            for lane_id in ("a", "b"):
                assert [s.token_id for s in session.steps[lane_id]] == alone["lanes"][lane_id][
                    "token_ids"
                ]
            alone_ratio = alone["speedup_a_over_b"]
            suite_ratio = record["tokens_per_second"][0] / record["tokens_per_second"][1]
            # speed is measured, not replayed: the same order of magnitude, not the same digits
            assert 0.6 < suite_ratio / alone_ratio < 1.6, (label, suite_ratio, alone_ratio)
            identical += alone["identical"]
        # X of N: the three re-run prompts count as the report counts them
        assert identical == sum(1 for r in records[:3] if r["identical"])
        assert summary["identical"] == sum(1 for r in records if r["identical"])
        forks = [r["fork_index"] for r in records if r["fork_index"] is not None]
        assert sorted(summary["fork_indices"]) == sorted(forks)
        for bin_ in summary["fork_histogram"]:
            assert bin_["count"] == sum(1 for f in forks if bin_["from"] <= f < bin_["to"])
        speeds = [
            sorted(r["tokens_per_second"][i] for r in records)[
                len(records) // 2 - 1 : len(records) // 2 + 1
            ]
            for i in (0, 1)
        ]
        medians = [sum(pair_) / 2 for pair_ in speeds]
        assert summary["tokens_per_second_median"] == pytest.approx(medians)
        assert summary["speedup"] == pytest.approx(medians[0] / medians[1])


def test_csv_and_markdown_hold_every_run(report: Path) -> None:
    data = report_json(report)
    with (report / "results.csv").open(encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == len(data["prompts"]) == 8
    for row, record in zip(rows, data["prompts"]):
        assert row["sha256_a"] == record["output_sha256"][0]
        assert row["fork_index"] == (
            "" if record["fork_index"] is None else str(record["fork_index"])
        )
        assert (report / row["session"]).is_file()
    text = (report / "report.md").read_text(encoding="utf-8")
    for pair in data["pairs"]:
        assert f"| {pair['label']} | {pair['summary']['identical']} of 4 |" in text
    assert "## Build" in text and "model\\_sha256" in text  # Markdown's _ escaped in a cell
    assert "```text" in text  # the histogram as text bars


@pytest.mark.browser
def test_the_html_report_renders_in_chromium(report: Path, tmp_path: Path) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "headless Chromium is needed (apt-get install chromium)"
    page = (report / "report.html").resolve().as_uri()
    common = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
    dom = subprocess.run(
        [*common, "--dump-dom", page], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    # one "forked by length" chart plus one histogram per pair, drawn with marks in them
    assert dom.count("<svg") == 1 + len(PAIRS)
    assert dom.count("<rect") >= 2 and "<polyline" in dom
    for pair in PAIRS:
        assert f"First divergence index, {pair}" in dom
    shot = tmp_path / "report.png"
    subprocess.run(
        [*common, "--window-size=1200,1600", f"--screenshot={shot}", page],
        capture_output=True,
        timeout=120,
        check=True,
    )
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 50_000  # a page with charts on it


def test_ctrl_c_stops_cleanly_and_resume_finishes(small_set: Path, tmp_path: Path) -> None:
    folder = tmp_path / "report"
    command = [
        sys.executable,
        "-m",
        "specdiff",
        "suite",
        str(small_set),
        "--report",
        str(folder),
        "--pair",
        "ubatch",
        "--max-tokens",
        "64",
    ]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sessions = folder / "sessions" / "ubatch"
    # stopped in the middle of the next prompt, once the first has finished
    wait_until(
        lambda: list(sessions.glob("*.jsonl")) and list(sessions.glob("*.jsonl.partial")),
        "a finished run and the next one under way",
        240,
    )
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 130, err
    assert "Traceback" not in err and "--resume --report" in err
    data = report_json(folder)
    assert not data["complete"] and 1 <= data["finished"] < 4
    finished = {p.name: p.stat().st_mtime_ns for p in sessions.glob("*.jsonl")}
    assert len(finished) == data["finished"]
    assert "stopped after" in (folder / "report.md").read_text(encoding="utf-8")

    resumed = subprocess.run(
        [sys.executable, "-m", "specdiff", "suite", "--resume", "--report", str(folder)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert resumed.returncode == 0, resumed.stderr
    data = report_json(folder)
    assert data["complete"] and data["finished"] == 4 and data["resumed"] == len(finished)
    for name, mtime in finished.items():
        assert (sessions / name).stat().st_mtime_ns == mtime  # not run again
    assert not list(sessions.glob("*.partial"))


def test_teacher_forced_suite_reports_each_weight_type(tmp_path: Path, capsys) -> None:
    """Both weight types teacher-forced over the same prompts: each gets its flips and
    |Δlogit| over the same steps, and the report its by-weight table. Which of them
    flips more is the CPU's rounding (it differs between machines): printed, not
    asserted."""
    prompts = tmp_path / "p.jsonl"
    lines = [json.dumps(item) for item in load_prompts("divergence")[:4]]
    prompts.write_text("\n".join(lines) + "\n", encoding="utf-8")
    folder = tmp_path / "report"
    code = main(
        [
            "suite",
            str(prompts),
            "--pair",
            "ubatch",
            "--quants",
            "base,q8_0",
            "--teacher-forced",
            "--no-kld",  # test_suite_kld covers that pass; here it would double the time
            "--max-tokens",
            "48",
            "--report",
            str(folder),
            "--quiet",
        ]
    )
    assert code == 0
    assert not list(folder.rglob("kld.json")), "--no-kld ran the KL divergence pass"
    data = report_json(folder)
    teacher = {p["quant"]: p["summary"]["teacher_forced"] for p in data["pairs"]}
    q4, q8 = teacher["base"], teacher["q8_0"]
    with capsys.disabled():
        for name, t in (("Q4_K_M", q4), ("Q8_0", q8)):
            print(
                f"\nubatch teacher-forced {name}: flips {t['flips']}/{t['steps']} "
                f"({t['flip_rate']:.3%}), mean |Δlogit| {t['delta_logit']['mean']:.4f}, "
                f"p90 {t['delta_logit']['p90']:.4f}"
            )
    # lane b is fed lane a's tokens, so both weight types score as many steps as lane a
    # generated under each
    assert q4["steps"] > 0 and q8["steps"] > 0
    for t in (q4, q8):
        assert 0 <= t["flips"] <= t["steps"] and t["flip_rate"] == t["flips"] / t["steps"]
        assert t["delta_logit"]["mean"] >= 0 and t["delta_logit"]["p90"] >= 0
    # the by-weight table of the report
    text = (folder / "report.md").read_text(encoding="utf-8")
    assert "## By weight type" in text and re.search(r"\| q8\\_0 \| \d+ of 4 identical \|", text)
    assert os.path.getsize(folder / "report.html") > 0
