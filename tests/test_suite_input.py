"""`specdiff suite`: prompts, options and the report folder checked before any model loads."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from specdiff.cli import main
from specdiff.cli.suite import new_report_dir
from specdiff.suite import SuiteError
from specdiff.suite.prompts import load_suite_prompts


def write_jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def one_line_error(capsys, code: int) -> str:
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("specdiff: error:"), err
    return err


def test_jsonl_prompts_with_optional_max_tokens(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "p.jsonl",
        [
            '{"id": "one", "prompt": "Once upon a time"}',
            "",
            '{"id": 2, "prompt": "def f(x):", "max_tokens": 30, "topic": "code"}',
        ],
    )
    prompts, problems = load_suite_prompts(str(path))
    assert [(p.id, p.prompt, p.max_tokens) for p in prompts] == [
        ("one", "Once upon a time", None),
        ("2", "def f(x):", 30),
    ]
    assert problems == [] and prompts[1].where.endswith("p.jsonl:3")


def test_a_folder_of_txt_files_and_the_bundled_sets(tmp_path: Path) -> None:
    (tmp_path / "b.txt").write_text("Second prompt\n", encoding="utf-8")
    (tmp_path / "a.txt").write_text("def f():\n    ", encoding="utf-8")
    (tmp_path / "notes.md").write_text("ignored", encoding="utf-8")
    prompts, _ = load_suite_prompts(str(tmp_path))
    assert [(p.id, p.prompt) for p in prompts] == [("a", "def f():\n    "), ("b", "Second prompt")]
    coding, _ = load_suite_prompts("coding")
    assert len(coding) >= 30
    assert len(load_suite_prompts("questions")[0]) >= 30
    assert len(load_suite_prompts("repetitive")[0]) >= 12


@pytest.mark.parametrize(
    "lines, message",
    [
        (['{"id": "a", "prompt": "x"}', "{not json"], "p.jsonl:2: not valid JSON"),
        (
            ['{"id": "a", "prompt": "x"}', '{"id": "a", "prompt": "y"}'],
            "p.jsonl:2: duplicate id 'a'",
        ),
        (['{"id": "a b", "prompt": "x"}', '{"id": "a-b", "prompt": "y"}'], "names the same file"),
        (['{"prompt": "x"}'], 'p.jsonl:1: missing "id"'),
        (['{"id": "a", "prompt": "  "}'], 'p.jsonl:1: missing "prompt"'),
        (['{"id": "a", "prompt": "x", "max_tokens": 0}'], '"max_tokens" must be'),
        (['["a", "x"]'], "p.jsonl:1: expected an object"),
        (['{"id": "a\\udc80", "prompt": "x"}'], 'p.jsonl:1: "id" and "prompt" must be text'),
        (['{"id": "a", "prompt": "x\\ud800y"}'], "without lone surrogates"),
    ],
)
def test_bad_lines_are_named_by_line_number(tmp_path, capsys, lines, message) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", lines)
    with pytest.raises(SuiteError, match="--skip-bad"):
        load_suite_prompts(str(path))
    err = one_line_error(capsys, main(["suite", str(path), "--report", str(tmp_path / "r")]))
    assert message in err
    assert not (tmp_path / "r").exists()  # nothing written


def test_skip_bad_keeps_the_good_lines(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "p.jsonl",
        [
            '{"id": "a", "prompt": "x"}',
            "{oops",
            '{"id": "a", "prompt": "z"}',
            '{"id": "b", "prompt": "y"}',
        ],
    )
    prompts, problems = load_suite_prompts(str(path), skip_bad=True)
    assert [p.id for p in prompts] == ["a", "b"]
    assert len(problems) == 2 and "p.jsonl:2" in problems[0] and "p.jsonl:3" in problems[1]


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda d: write_jsonl(d / "empty.jsonl", [""]), "holds no prompts"),
        (lambda d: d / "missing.jsonl", "no prompt file, folder or bundled set named"),
        (lambda d: (d / "nothing").mkdir() or d / "nothing", "no .txt files"),
    ],
)
def test_no_prompts_is_an_error(tmp_path, capsys, make, message) -> None:
    source = make(tmp_path)
    err = one_line_error(capsys, main(["suite", str(source), "--report", str(tmp_path / "r")]))
    assert message in err


def test_an_existing_report_folder_is_kept_unless_forced(tmp_path: Path, capsys) -> None:
    report = tmp_path / "r"
    report.mkdir()
    (report / "mine.txt").write_text("keep me", encoding="utf-8")
    err = one_line_error(capsys, main(["suite", "coding", "--report", str(report)]))
    assert "already exists; pass --force" in err and "--resume" in err
    assert sorted(p.name for p in report.iterdir()) == ["mine.txt"]


def test_without_report_the_folder_is_named_for_the_set_the_pairs_and_the_time(
    tmp_path: Path,
) -> None:
    """A new folder in the working one: never one that is there (a suite started in the
    same minute gets -2), a file's set by its stem, many pairs cut to the first two."""
    at = datetime(2026, 12, 7, 5, 30, 59, tzinfo=timezone.utc)
    folder = new_report_dir(tmp_path, "open", ["spec-vs-plain"], at)
    assert folder == tmp_path / "suite-open-spec-vs-plain-20261207T0530Z"
    folder.mkdir()
    assert new_report_dir(tmp_path, "open", ["spec-vs-plain"], at).name.endswith("0530Z-2")
    (tmp_path / f"{folder.name}-2").mkdir()
    assert new_report_dir(tmp_path, "open", ["spec-vs-plain"], at).name.endswith("0530Z-3")
    late = datetime(2026, 12, 7, 6, 30, tzinfo=timezone(timedelta(hours=1)))  # 05:30 UTC
    named = new_report_dir(tmp_path, "my prompts/a b.jsonl", ["x", "y y", "z", "w"], late)
    assert named.name == "suite-a-b-x+y-y+2-more-20261207T0530Z"


@pytest.mark.parametrize("prompts", [[], ["coding"]], ids=["alone", "with-prompts"])
def test_a_resume_names_the_folder_it_continues(
    tmp_path: Path, capsys, monkeypatch, prompts: list[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    err = one_line_error(capsys, main(["suite", *prompts, "--resume"]))
    assert "name it with --report DIR" in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--pair", "nope"], "unknown pair 'nope'"),
        (["--quants", "q8_0,q3"], "unknown weight type 'q3'"),
        (["--max-tokens", "0"], "--max-tokens: must be from 1 to"),
        (["--near-tie", "-1"], "--near-tie: must be a finite number of at least 0"),
        (["--lane-b", "n_ubatch=many"], "n_ubatch"),
    ],
)
def test_bad_options(tmp_path, capsys, arguments, message) -> None:
    err = one_line_error(
        capsys, main(["suite", "coding", "--report", str(tmp_path / "r"), *arguments])
    )
    assert message in err
    assert not (tmp_path / "r").exists()


def test_resume_needs_a_stopped_suite_with_the_same_settings(tmp_path: Path, capsys) -> None:
    report = tmp_path / "r"
    err = one_line_error(capsys, main(["suite", "--resume", "--report", str(report)]))
    assert "holds no stopped suite" in err
    report.mkdir()
    settings = {
        "specdiff": "0",
        "source": "coding",
        "prompts_sha256": "0" * 64,
        "prompt_ids": [],
        "pairs": [],
        "max_tokens": 10,
        "near_tie": 0.5,
        "teacher_forced": False,
        "quants": [],
        "stop": [],
    }
    (report / "suite.json").write_text(json.dumps(settings), encoding="utf-8")
    err = one_line_error(capsys, main(["suite", "--resume", "--report", str(report)]))
    assert "the prompts in coding changed since the suite" in err
    err = one_line_error(capsys, main(["suite", "coding", "--resume", "--report", str(report)]))
    assert "differ from the stopped suite's" in err
    err = one_line_error(
        capsys, main(["suite", "coding", "--resume", "--force", "--report", str(report)])
    )
    assert "pick one" in err
    err = one_line_error(capsys, main(["suite", "--report", str(report)]))
    assert "give the prompts" in err


def test_resume_takes_the_stopped_suites_settings(tmp_path: Path, capsys) -> None:
    report = tmp_path / "r"
    report.mkdir()
    (report / "suite.json").write_text(
        json.dumps({"source": "coding", "pairs": [], "max_tokens": 10, "near_tie": 0.5,
                    "teacher_forced": False}),
        encoding="utf-8",
    )  # fmt: skip
    err = one_line_error(
        capsys, main(["suite", "--resume", "--report", str(report), "--max-tokens", "5"])
    )
    assert "drop --max-tokens" in err
    # an older suite.json without the prompts' hash or weight types: one line, no traceback
    err = one_line_error(capsys, main(["suite", "--resume", "--report", str(report)]))
    assert "changed since the suite" in err


def test_the_report_header_counts_each_prompt_s_own_token_budget(tmp_path: Path) -> None:
    from specdiff.lanes import presets
    from specdiff.reports.suite_words import overview
    from specdiff.suite.settings import SuiteSettings

    path = write_jsonl(
        tmp_path / "p.jsonl",
        [
            '{"id": "a", "prompt": "Once upon a time", "max_tokens": 64}',
            '{"id": "b", "prompt": "def f(x):", "max_tokens": 30}',
            '{"id": "c", "prompt": "Roses are red"}',
        ],
    )
    prompts, _ = load_suite_prompts(str(path))
    settings = SuiteSettings(source=str(path), pairs=(presets()["spec-vs-plain"],), max_tokens=200)
    report = {"settings": settings.as_json(prompts), "complete": True, "jobs": 3,
              "finished": 3, "created": "2026-12-07T10:00:00", "specdiff": "0",
              "wall_seconds": 1.0}  # fmt: skip
    assert report["settings"]["prompt_budgets"] == [30, 200]
    assert "up to 30-200 tokens per lane (each prompt's own budget)" in overview(report)  # type: ignore[arg-type]
    same = settings.as_json(prompts[:1])
    assert same["prompt_budgets"] == [64, 64]
    assert "up to 64 tokens per lane ·" in overview({**report, "settings": same})  # type: ignore[arg-type]
    # a report.json written before budgets were recorded still reads
    older = {k: v for k, v in report["settings"].items() if k != "prompt_budgets"}
    assert "up to 200 tokens per lane ·" in overview({**report, "settings": older})  # type: ignore[arg-type]
