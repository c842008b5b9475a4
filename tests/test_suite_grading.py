"""A graded suite on the bundled model, run as a real `python3 -m specdiff suite`: each
lane's grade lands in its session's footer, in report.json and in results.csv, and an
independent re-grading (its own subprocesses, not specdiff's sandbox) agrees with every
one. A resumed graded suite keeps its selection and grading; other options are refused.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from specdiff import prompts
from specdiff.lanes import presets
from specdiff.sessions.store import load_session
from specdiff.tui.app import make_app
from tests.conftest import wait_for
from tests.tui_driver import drive

pytestmark = pytest.mark.model

SUITE_TIMEOUT = 900


def specdiff(*args: str, timeout: float = SUITE_TIMEOUT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "specdiff", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module", params=["coding", "questions"])
def graded(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A graded suite's report folder: two prompts of a bundled set, short budgets."""
    report = tmp_path_factory.mktemp(f"graded-{request.param}")
    budget = "24" if request.param == "coding" else "12"
    done = specdiff(
        "suite",
        request.param,
        "--pair",
        "spec-vs-plain",
        "--grade",
        "--limit",
        "2",
        "--max-tokens",
        budget,
        "--report",
        str(report),
        "--force",
        "--quiet",
    )
    assert done.returncode in (0, 1), done.stderr[-2000:]
    return report


def sessions(report: Path) -> list[Path]:
    found = sorted((report / "sessions").rglob("*.jsonl"))
    assert len(found) == 2
    return found


def lane_text(steps: list[Any]) -> str:
    return b"".join(step.piece for step in steps).decode("utf-8", "replace")


def cut_at_stop(text: str, stop: tuple[str, ...]) -> str:
    """The completion a grader sees, found by scanning rather than by specdiff's helper."""
    end = len(text)
    for marker in stop:
        where = text.find(marker) if marker else -1
        if 0 <= where < end:
            end = where
    return text[:end]


def own_tests_verdict(entry: dict[str, Any], completion: str) -> bool:
    """Run the program as HumanEval's harness would, in a plain subprocess of our own."""
    source = (
        entry["prompt"]
        + completion
        + "\n"
        + entry["tests"]
        + "\n\n"
        + f"check({entry['entry_point']})\n"
    )
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "solution.py"
        path.write_text(source, encoding="utf-8")
        try:
            done = subprocess.run(
                [sys.executable, "-I", str(path)],
                cwd=folder,
                capture_output=True,
                timeout=10,
                env={"PATH": "/usr/bin:/bin"},
            )
        except subprocess.TimeoutExpired:
            return False
    return done.returncode == 0


def own_answer_verdict(entry: dict[str, Any], completion: str) -> bool:
    lines = [line for line in completion.split("\n") if line.strip()]
    first = lines[0] if lines else ""
    tokens = "".join(c.lower() if c.isalnum() else " " for c in first).split()
    for answer in entry["answers"]:
        wanted = "".join(c.lower() if c.isalnum() else " " for c in answer).split()
        for start in range(len(tokens) - len(wanted) + 1):
            if tokens[start : start + len(wanted)] == wanted:
                return True
    return False


def regraded(report: Path) -> dict[str, tuple[bool, bool]]:
    """prompt id -> (lane a passed, lane b passed), graded here from the session files."""
    source = json.loads((report / "suite.json").read_text())["source"]
    entries = {entry["id"]: entry for entry in prompts.load(source)}
    verdicts = {}
    for path in sessions(report):
        session = load_session(path)
        entry = entries[path.stem]
        judge = own_tests_verdict if "tests" in entry else own_answer_verdict
        failed = session.footer.errors if session.footer else (None, None)
        verdicts[path.stem] = tuple(
            error is None
            and judge(entry, cut_at_stop(lane_text(session.steps[lane]), session.header.stop))
            for lane, error in zip("ab", failed)
        )
    return verdicts


def test_every_session_footer_holds_both_lanes_grades(graded: Path) -> None:
    for path in sessions(graded):
        footer = json.loads(path.read_text().splitlines()[-1])
        assert footer["type"] == "footer"
        grades = footer["grades"]
        assert len(grades) == 2 and all(isinstance(g["passed"], bool) for g in grades)
        assert {g["grader"] for g in grades} <= {"tests", "answer"}
        assert load_session(path).summary().grades is not None


def test_an_independent_regrading_agrees_with_the_sessions(graded: Path) -> None:
    recorded = {
        path.stem: tuple(g.passed for g in load_session(path).summary().grades or ())
        for path in sessions(graded)
    }
    assert regraded(graded) == recorded


def test_report_json_and_results_csv_carry_the_same_grades(graded: Path) -> None:
    mine = regraded(graded)
    records = json.loads((graded / "report.json").read_text())["prompts"]
    from_json = {r["prompt_id"]: tuple(g["passed"] for g in r["grades"]) for r in records}
    assert from_json == mine
    with (graded / "results.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    from_csv = {r["prompt_id"]: (r["grade_a"] == "pass", r["grade_b"] == "pass") for r in rows}
    assert from_csv == mine


def test_suite_json_says_whether_code_was_executed(graded: Path) -> None:
    settings = json.loads((graded / "suite.json").read_text())
    executes = settings["source"] == "coding"
    assert settings["grade"] is True and settings["executed_code"] is executes
    assert settings["limit"] == 2 and len(settings["prompt_ids"]) == 2
    said = "model-written code was executed"
    for report in ("report.md", "report.html"):
        text = (graded / report).read_text(encoding="utf-8")
        assert (said in text) is executes, report
        assert ("graded by matching answers" in text) is not executes, report


def test_a_resume_keeps_the_selection_and_runs_nothing_again(graded: Path) -> None:
    before = {path: path.stat().st_mtime_ns for path in sessions(graded)}
    done = specdiff("suite", "--resume", "--report", str(graded), "--quiet")
    assert done.returncode in (0, 1), done.stderr[-2000:]
    assert {path: path.stat().st_mtime_ns for path in sessions(graded)} == before
    assert json.loads((graded / "report.json").read_text())["resumed"] == 2


@pytest.mark.parametrize(
    "changed",
    [["--limit", "3"], ["--ids", "FIRST"], ["--grade-timeout", "5"], ["--no-exec"], []],
    ids=["limit", "ids", "timeout", "no-exec", "no-grade"],
)
def test_a_resume_with_other_grading_or_selection_is_refused(
    graded: Path, changed: list[str]
) -> None:
    settings = json.loads((graded / "suite.json").read_text())
    source = settings["source"]
    # one of the suite's own prompts: a selection it holds, but not the one it ran
    changed = [settings["prompt_ids"][0] if arg == "FIRST" else arg for arg in changed]
    grade = [] if changed == [] else ["--grade"]
    limit = [] if changed[:1] == ["--limit"] else ["--limit", "2"]
    budget = "24" if source == "coding" else "12"
    done = specdiff(
        "suite",
        source,
        "--pair",
        "spec-vs-plain",
        *grade,
        *limit,
        *changed,
        "--max-tokens",
        budget,
        "--report",
        str(graded),
        "--resume",
        timeout=120,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


async def test_a_replay_shows_each_panes_grade(graded: Path) -> None:
    path = sessions(graded)[0]
    session = load_session(path)
    grades = session.summary().grades
    assert grades is not None
    app = make_app(
        presets(), session.header.pair.name, session.prompt, 60, session=session, replay_speed=None
    )
    async with app.run_test(size=(160, 36)) as pilot:
        await wait_for(
            pilot,
            lambda: all(g.reason in drive(app).stats_line(lane) for lane, g in zip("ab", grades)),
            20,
            "each pane's grade in its stats line",
        )
        for lane, grade in zip("ab", grades):
            stats = drive(app).stats_line(lane)
            assert ("PASS" if grade.passed else "FAIL") in stats and grade.reason in stats
