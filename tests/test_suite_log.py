"""A suite whose stderr is not a terminal (a log file, a CI job) says a line per finished
run, and its reports say in plain words why each forked run forked.

A real `python3 -m specdiff suite` on the bundled model, stderr a pipe."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from specdiff.compare import FORK_CLASSES
from specdiff.prompts import load as load_prompts
from tests.conftest import ForkingPrompt

pytestmark = pytest.mark.model

CLASSES = "|".join(re.escape(kind) for kind in FORK_CLASSES)
RUN_LINE = re.compile(
    rf"suite: (?P<done>\d+)/(?P<jobs>\d+) ubatch (?P<prompt>\S+) "
    rf"(?P<result>forked at (?P<fork>\d+) \((?P<kind>{CLASSES})\)|identical \(\d+ tokens\)"
    rf"|same tokens, lengths \d+ / \d+) \d+\.\d s, eta (…|\d+s|\d+m\d\ds|\d+h\d\dm)"
)


@pytest.fixture(scope="module")
def logged_suite(
    tmp_path_factory: pytest.TempPathFactory, forking_prompt: Callable[[str, int], ForkingPrompt]
) -> tuple[Path, str]:
    """Two runs: one on a prompt that forks on this CPU (so the reports have a verdict to
    give), one on the first coding prompt."""
    folder = tmp_path_factory.mktemp("suite")
    found = forking_prompt("ubatch", 40)
    coding = load_prompts("coding")[0]
    prompts = folder / "prompts.jsonl"
    lines = [
        {"id": found.prompt_id, "prompt": found.prompt, "max_tokens": found.fork_index + 4},
        {"id": coding["id"], "prompt": coding["prompt"]},
    ]
    prompts.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    report = folder / "report"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "specdiff",
            "suite",
            str(prompts),
            "--pair",
            "ubatch",
            "--max-tokens",
            "16",
            "--report",
            str(report),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode in (0, 1), done.stderr
    return report, done.stderr


def test_a_redirected_stderr_gets_one_line_per_finished_run(logged_suite) -> None:
    report, stderr = logged_suite
    assert "\r" not in stderr, "no progress line rewritten in place in a log"
    lines = [match for line in stderr.splitlines() if (match := RUN_LINE.fullmatch(line))]
    assert [(m["done"], m["jobs"]) for m in lines] == [("1", "2"), ("2", "2")]
    records = json.loads((report / "report.json").read_text(encoding="utf-8"))["prompts"]
    for match, record in zip(lines, records):
        assert match["prompt"] == record["prompt_id"]
        fork = record["fork_index"]
        assert match["fork"] == (None if fork is None else str(fork))
        assert match["kind"] == (None if fork is None else record["fork_class"])


def test_every_report_says_why_each_forked_run_forked(logged_suite) -> None:
    report, _ = logged_suite
    records = json.loads((report / "report.json").read_text(encoding="utf-8"))["prompts"]
    rows = list(csv.DictReader((report / "results.csv").open(encoding="utf-8")))
    markdown = (report / "report.md").read_text(encoding="utf-8")
    page = (report / "report.html").read_text(encoding="utf-8")
    for record, row in zip(records, rows):
        verdict = record["verdict"]
        assert (verdict is None) == (record["fork_index"] is None)
        assert row["fork_verdict"] == (verdict or "")
        if verdict is not None:
            assert verdict.startswith(record["fork_class"])
    assert records[0]["verdict"], "the run on a forking prompt has a verdict"
    assert "## Why each run forked" in markdown
    assert "<h2>Why each run forked</h2>" in page
