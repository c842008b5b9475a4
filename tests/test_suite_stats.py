"""A suite's paired figures from graded records: the line that reads like the field's
tables, pass@1 with intervals, the 2×2 table, McNemar, the fork classes, and the same
figures in report.md, report.html, results.csv and the terminal summary. The records are
built by hand from real-looking values, so no model runs."""

from __future__ import annotations

import csv
import html
import io
import json
import random
import subprocess
import sys
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st
from markdown_it import MarkdownIt

from specdiff.cli.suite import print_summary
from specdiff.compare import DEFAULT_SPLIT_THRESHOLD, FORK_CLASSES, MEASURED_NOISE_P99
from specdiff.lanes import presets
from specdiff.reports.suite import (
    classes_note,
    html_report,
    markdown,
    paired_line,
    results_csv,
)
from specdiff.sessions.format import CRASHED
from specdiff.sessions.records import Grade, RunSummary
from specdiff.suite.ledger import Ledger
from specdiff.suite.outcome import SuiteOutcome, outcome_json
from specdiff.suite.paired import mcnemar_exact, wilson_interval
from specdiff.suite.prompts import SuitePrompt
from specdiff.suite.records import PromptRecord
from specdiff.suite.settings import SuiteSettings
from tests.test_terminal_safety import ENCODABLE_IDS, ENCODABLE_TEXTS, assert_terminal_safe

PAIR = "spec-vs-plain"


@dataclass(frozen=True)
class Run:
    """One prompt's run as a suite records it: whether it forked, what class the fork
    was, each lane's grade (None: not graded), and whether it failed or crashed."""

    identical: bool
    passes: tuple[bool | None, bool | None] | None
    fork_class: str | None = None
    failure: str | None = None  # None, "failed" or "crashed"


def _grade(passed: bool | None) -> Grade | None:
    if passed is None:
        return None
    return Grade(passed, "passed" if passed else "failed: AssertionError", "tests")


def record(prompt_id: str, run: Run, error: str = "llama_decode returned -3") -> PromptRecord:
    forked = not run.identical
    stop = CRASHED if run.failure == "crashed" else "eos"
    errors = (error, None) if run.failure == "failed" else (None, None)
    if run.failure == "crashed":
        errors = ("the process running the lanes died (signal 11)",) * 2
    return PromptRecord(
        pair=PAIR,
        quant="",
        prompt_id=prompt_id,
        session=f"sessions/{PAIR}/{prompt_id}.jsonl",
        summary=RunSummary(
            identical=run.identical,
            fork_index=17 if forked else None,
            fork_margins=(0.031, 0.0) if forked else None,
            generated=(48, 48),
            tokens_per_second=(61.5, 40.2),
            output_sha256=("a" * 64, ("b" if forked else "a") * 64),
            stop_reasons=(stop, stop),
            errors=errors,
            cancelled=False,
            seconds=(0.78, 1.19),
            grades=None if run.passes is None else (_grade(run.passes[0]), _grade(run.passes[1])),
            fork_class=run.fork_class if forked else None,
        ),
        near_ties=(3, 2),
    )


def suite_data(runs: list[Run], ids: list[str] | None = None) -> dict:
    ids = ids or [f"HumanEval/{n}" for n in range(len(runs))]
    outcome = SuiteOutcome(
        settings=SuiteSettings(source="humaneval", pairs=(presets()[PAIR],), max_tokens=48),
        prompts=[SuitePrompt(id=i, prompt="def f():") for i in ids],
        ledger=Ledger.of([record(i, run) for i, run in zip(ids, runs)]),
        executed={},
        skipped=[],
        cancelled=False,
        wall_seconds=312.0,
        resumed=0,
        started="2026-11-30T00:00:00+00:00",
    )
    return outcome_json(outcome)


def table(identical_both, both, only_a, only_b, neither, classes=(), failures=()) -> list[Run]:
    """Runs with these counts: identical prompts where both lanes pass, then forked ones
    by outcome; the forks take `classes` in turn; `failures` are appended."""
    forked = (
        [(True, True)] * both
        + [(True, False)] * only_a
        + [(False, True)] * only_b
        + [(False, False)] * neither
    )
    kinds = list(classes) or [None]
    runs = [Run(True, (True, True)) for _ in range(identical_both)]
    runs += [Run(False, p, kinds[n % len(kinds)]) for n, p in enumerate(forked)]
    return runs + [Run(False, None, failure=f) for f in failures]


FONTE_CLASSES = ["near tie"] * 30 + ["ambiguous"] * 8 + ["large-margin split"] * 5
FIELD_TABLES = [
    pytest.param(
        table(7, 22, 5, 4, 12, FONTE_CLASSES),
        "identical 7/50 [0.07, 0.26] · solved a 34 b 33 · only a 5 · only b 4 · McNemar p 1.00"
        " · forks: near tie 30, ambiguous 8, large-margin split 5",
        id="fonte",
    ),
    pytest.param(
        table(7, 22, 5, 4, 12, FONTE_CLASSES, failures=("crashed", "failed")),
        "identical 7/50 [0.07, 0.26] · solved a 34 b 33 · only a 5 · only b 4 · McNemar p 1.00"
        " · forks: near tie 30, ambiguous 8, large-margin split 5",
        id="fonte-with-a-crash-and-a-failure-left-out",
    ),
    pytest.param(
        table(169, 54, 6, 7, 46),
        "identical 169/282 [0.54, 0.65] · solved a 229 b 230 · only a 6 · only b 7"
        " · McNemar p 1.00 · forks: near tie 0, ambiguous 0, large-margin split 0,"
        " unclassified 113",
        id="unclassified-forks-from-older-sessions",
    ),
    pytest.param(
        table(20, 16, 1, 20, 3, ["large-margin split"]),
        "identical 20/60 [0.23, 0.46] · solved a 37 b 56 · only a 1 · only b 20"
        " · McNemar p 2.1e-05 · forks: near tie 0, ambiguous 0, large-margin split 40",
        id="a-broken-lane",
    ),
    pytest.param(
        table(5, 0, 0, 0, 0),
        "identical 5/5 [0.57, 1.00] · solved a 5 b 5 · only a 0 · only b 0 · McNemar p 1.00",
        id="nothing-forked",
    ),
]


@pytest.mark.parametrize(("runs", "line"), FIELD_TABLES)
def test_the_pair_line_reads_like_the_fields_tables(runs, line, capsys):
    data = suite_data(runs)
    summary = data["pairs"][0]["summary"]
    assert paired_line(summary) == line
    assert f"\n\n{line}\n\n" in markdown(data)
    assert f'<p class="paired">{html.escape(line)}</p>' in html_report(data)
    print_summary(data, [io.StringIO()] * 4)  # type: ignore[list-item]
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(f"{PAIR}: {line} · speed a/b 1.53x")


def test_failed_and_crashed_runs_are_counted_named_and_left_out_of_pass_at_1(capsys):
    runs = table(7, 22, 5, 4, 12, failures=("crashed", "failed"))
    data = suite_data(runs)
    summary = data["pairs"][0]["summary"]
    grades = summary["grades"]
    assert (summary["failed"], summary["crashed"]) == (1, 1)
    assert grades["graded"] == 50 and [r["of"] for r in grades["pass_at_1"]] == [50, 50]
    assert grades["excluded"] == [
        {"prompt_id": "HumanEval/50", "why": "crashed"},
        {"prompt_id": "HumanEval/51", "why": "failed: llama_decode returned -3"},
    ]
    note = "Left out of pass@1: HumanEval/50 (crashed); HumanEval/51 (failed: llama_decode"
    assert note.replace("_", "\\_") in markdown(data)
    assert note in html_report(data)
    print_summary(data, [io.StringIO()] * 4)  # type: ignore[list-item]
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith(" · 1 failed · 1 crashed")
    assert lines[1].strip().startswith(note)


def test_an_ungraded_suite_shows_identical_with_its_interval_and_the_classes_only(capsys):
    runs = [Run(i % 3 == 0, None, FORK_CLASSES[i % 3]) for i in range(12)]
    data = suite_data(runs)
    summary = data["pairs"][0]["summary"]
    assert summary["grades"] is None
    line = paired_line(summary)
    assert (
        line == "identical 4/12 [0.14, 0.61] · forks: near tie 0, ambiguous 4, large-margin split 4"
    )
    report = markdown(data)
    assert "| pass@1 a |" not in report and "McNemar p (exact" not in report
    assert "| identical | 4/12 | \\[0.14, 0.61\\] |" in report
    rows = list(csv.DictReader(io.StringIO(results_csv(data))))
    assert {(row["grade_a"], row["grade_b"]) for row in rows} == {("", "")}
    assert [row["fork_class"] for row in rows] == [
        "" if run.identical else run.fork_class for run in runs
    ]


RUNS = st.builds(
    Run,
    identical=st.booleans(),
    passes=st.one_of(
        st.none(),
        st.tuples(st.booleans(), st.booleans()),
        st.tuples(st.none() | st.booleans(), st.none() | st.booleans()),
    ),
    fork_class=st.sampled_from([*FORK_CLASSES, None]),
    failure=st.sampled_from([None, None, None, "failed", "crashed"]),
)


@given(st.lists(RUNS, min_size=1, max_size=40))
def test_the_figures_equal_a_count_of_the_runs_in_every_output(runs):
    data = suite_data(runs)
    summary = data["pairs"][0]["summary"]
    finished = [run for run in runs if run.failure is None]
    identical = sum(run.identical for run in finished)
    assert summary["identical_rate"]["count"] == identical
    assert summary["identical_rate"]["of"] == len(finished)
    interval = wilson_interval(identical, len(finished))
    assert summary["identical_rate"]["interval"] == (None if interval is None else list(interval))
    forked = [run for run in finished if not run.identical]
    for kind in FORK_CLASSES:
        assert summary["fork_classes"][kind] == sum(run.fork_class == kind for run in forked)
    assert summary["fork_classes"]["unclassified"] == sum(run.fork_class is None for run in forked)
    _check_grades(runs, summary["grades"])
    _check_csv(runs, results_csv(data))


def _check_grades(runs: list[Run], grades: dict | None) -> None:
    if all(run.passes is None for run in runs):
        assert grades is None
        return
    assert grades is not None
    paired = [
        (run.passes, run.identical)
        for run in runs
        if run.failure is None and run.passes is not None and None not in run.passes
    ]
    assert grades["graded"] == len(paired)
    assert len(grades["excluded"]) == len(runs) - len(paired)
    only_a = sum(p == (True, False) for p, _ in paired)
    only_b = sum(p == (False, True) for p, _ in paired)
    assert (grades["only_a"], grades["only_b"]) == (only_a, only_b)
    assert grades["both"] == sum(p == (True, True) for p, _ in paired)
    assert grades["neither"] == sum(p == (False, False) for p, _ in paired)
    assert grades["mcnemar_p"] == mcnemar_exact(only_a, only_b)
    for lane in (0, 1):
        solved = sum(bool(p[lane]) for p, _ in paired)
        assert grades["pass_at_1"][lane]["count"] == solved
        forked = [p for p, identical in paired if not identical]
        assert grades["forked_pass_at_1"][lane]["count"] == sum(bool(p[lane]) for p in forked)
        assert grades["forked_pass_at_1"][lane]["of"] == len(forked)


def _check_csv(runs: list[Run], text: str) -> None:
    rows = list(csv.DictReader(io.StringIO(text)))
    assert len(rows) == len(runs)
    words = {None: "", True: "pass", False: "fail"}
    for row, run in zip(rows, runs):
        passes = run.passes or (None, None)
        assert (row["grade_a"], row["grade_b"]) == (words[passes[0]], words[passes[1]])
        assert row["fork_class"] == ("" if run.identical or not run.fork_class else run.fork_class)


def test_the_html_and_markdown_tables_carry_pass_at_1_with_intervals():
    data = suite_data(table(7, 22, 5, 4, 12, FONTE_CLASSES))
    page = html_report(data)
    paired = page.split('<table class="paired">')[1].split("</table>")[0]
    for cells in (
        ("pass@1 a", "34/50", "[0.54, 0.79]"),
        ("pass@1 b", "33/50", "[0.52, 0.78]"),
        ("both pass", "29", ""),
        ("neither", "12", ""),
        ("McNemar p (exact, 9 discordant)", "1.00", ""),
        ("pass@1 a, forked only", "27/43", "[0.48, 0.76]"),
        ("forks: large-margin split", "5", ""),
    ):
        assert "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>" in paired
    report = markdown(data)
    assert "| pass@1 a, forked only | 27/43 | \\[0.48, 0.76\\] |" in report
    assert "| 34 / 33 of 50 | 1.00 | 30 / 8 / 5 |" in report


@pytest.mark.parametrize("hostile", ENCODABLE_TEXTS, ids=ENCODABLE_IDS)
def test_names_of_left_out_runs_stay_text_in_every_output(hostile, capsys):
    runs = table(2, 1, 1, 0, 0, failures=("failed",))
    ids = [f"p{n}" for n in range(len(runs) - 1)] + [hostile]
    data = suite_data(runs, ids)
    rendered = MarkdownIt("commonmark", {"html": True}).enable("table").render(markdown(data))
    assert "<script" not in rendered and "<a " not in rendered
    assert_terminal_safe(markdown(data))
    assert "<script" not in html_report(data)
    print_summary(data, [io.StringIO()] * 4)  # type: ignore[list-item]
    assert_terminal_safe(capsys.readouterr().out)


def test_a_shuffled_suite_gives_the_same_figures():
    runs = table(7, 22, 5, 4, 12, FONTE_CLASSES, failures=("crashed",))
    shuffled = runs[:]
    random.Random(7).shuffle(shuffled)
    one, other = (suite_data(r)["pairs"][0]["summary"] for r in (runs, shuffled))
    assert paired_line(one) == paired_line(other)
    for key in ("pass_at_1", "forked_pass_at_1", "mcnemar_p", "both", "neither"):
        assert one["grades"][key] == other["grades"][key]


@pytest.mark.model
def test_a_real_graded_suite_prints_the_line_its_report_and_csv_hold(tmp_path):
    """`specdiff suite` as a process on the bundled model: the terminal's line is the one
    report.md and report.html hold, and its counts are those of results.csv's grades."""
    report = tmp_path / "report"
    pair = "spec-vs-plain"
    done = subprocess.run(
        [sys.executable, "-m", "specdiff", "suite", "questions", "--pair", pair, "--no-exec"]
        + ["--limit", "3", "--max-tokens", "16", "--report", str(report), "--quiet"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode in (0, 1), done.stderr[-2000:]
    data = json.loads((report / "report.json").read_text(encoding="utf-8"))
    summary = data["pairs"][0]["summary"]
    line = paired_line(summary)
    assert done.stdout.splitlines()[0].startswith(f"{pair}: {line}")
    assert line in (report / "report.md").read_text(encoding="utf-8")
    assert html.escape(line) in (report / "report.html").read_text(encoding="utf-8")
    with (report / "results.csv").open(encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    graded = [(row["grade_a"], row["grade_b"]) for row in rows if row["error"] == ""]
    assert len(graded) == 3 and all(words in {"pass", "fail"} for g in graded for words in g)
    solved = [sum(g[lane] == "pass" for g in graded) for lane in (0, 1)]
    assert line.split(" · ")[1] == f"solved a {solved[0]} b {solved[1]}"
    only = [sum(g == ("pass", "fail") for g in graded), sum(g == ("fail", "pass") for g in graded)]
    assert [summary["grades"]["only_a"], summary["grades"]["only_b"]] == only
    assert summary["grades"]["mcnemar_p"] == mcnemar_exact(*only)
    forked = sum(row["identical"] == "0" for row in rows)
    assert sum(summary["fork_classes"].values()) == forked - summary["lengths_differ"]
    assert {row["fork_class"] for row in rows if row["fork_index"]} <= set(FORK_CLASSES)


def test_the_reports_put_the_split_threshold_beside_the_noise_scale() -> None:
    data = suite_data([Run(False, None, FORK_CLASSES[2])])
    summary = data["pairs"][0]["summary"]
    note = classes_note(summary)
    assert f"{DEFAULT_SPLIT_THRESHOLD:g} logits" in note
    assert f"p99 {MEASURED_NOISE_P99:.2f}" in note  # no teacher-forced figure of its own
    assert note in markdown(data) and html.escape(note) in html_report(data)
    summary["teacher_forced"] = {"delta_logit": {"p99": 0.4321}}
    assert "this pair's own teacher-forced |Δlogit| p99 is 0.432" in classes_note(summary)
