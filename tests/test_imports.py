"""`specdiff import`: real lm-eval and promptfoo outputs (tests/data/imports, made by
tests/eval_runs.py) compared, checked against a reading of the same files with plain json
and McNemar's test from statsmodels; and each kind of bad input refused in one line."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from statsmodels.stats.contingency_tables import mcnemar

from specdiff.cli import main

DATA = Path(__file__).parent / "data" / "imports"


def samples(run: Path) -> dict[int, dict[str, Any]]:
    (file,) = run.rglob("samples_*.jsonl")
    return {row["doc_id"]: row for row in map(json.loads, file.read_text().splitlines())}


def statsmodels_p(pairs: list[tuple[bool, bool]]) -> float:
    table = [
        [sum(a and b for a, b in pairs), sum(a and not b for a, b in pairs)],
        [sum(b and not a for a, b in pairs), sum(not a and not b for a, b in pairs)],
    ]
    return float(mcnemar(table, exact=True).pvalue)


def import_report(capsys, tmp_path: Path, *arguments: str) -> tuple[int, str, dict[str, Any]]:
    report = tmp_path / "report"
    code = main(["import", *arguments, "--report", str(report)])
    out = capsys.readouterr().out
    return code, out, json.loads((report / "report.json").read_text())


def test_lm_eval_runs_compared_as_the_samples_files_say(capsys, tmp_path) -> None:
    a, b = samples(DATA / "lm-eval-a"), samples(DATA / "lm-eval-b")
    differ = sorted(i for i in a if a[i]["resps"] != b[i]["resps"])
    code, out, report = import_report(
        capsys, tmp_path, "lm-eval", str(DATA / "lm-eval-a"), str(DATA / "lm-eval-b")
    )
    (group,) = report["groups"]
    assert group["group"] == "facts"
    assert sorted(int(p["item"]) for p in group["pairs"] if p["differs"]) == differ
    assert out.startswith(f"{len(differ)} of {len(a)} items differ;")
    assert code == (1 if differ else 0)
    for metric in ("exact_match", "contains"):
        pairs = [(a[i][metric] == 1.0, b[i][metric] == 1.0) for i in a]
        (found,) = (m for m in group["metrics"] if m["metric"] == metric)
        assert found["mcnemar_p"] == pytest.approx(statsmodels_p(pairs))
        worse = sorted(str(i) for i in a if a[i][metric] > b[i][metric])
        better = sorted(str(i) for i in a if a[i][metric] < b[i][metric])
        assert (sorted(found["worse"]), sorted(found["better"])) == (worse, better)
        assert f"{metric} flipped {len(worse) + len(better)} ({len(worse)} worse" in out
    # the committed runs hold a real flip: a later word the graded answer needed
    assert any(m["worse"] or m["better"] for m in group["metrics"])


def test_lm_eval_report_folder_has_every_format(capsys, tmp_path) -> None:
    main(["import", "lm-eval", str(DATA / "lm-eval-a"), str(DATA / "lm-eval-b"),
          "--report", str(tmp_path)])  # fmt: skip
    capsys.readouterr()
    markdown = (tmp_path / "report.md").read_text()
    page = (tmp_path / "report.html").read_text()
    for pair in json.loads((tmp_path / "report.json").read_text())["groups"][0]["pairs"]:
        shown = f"| {pair['item']} | {pair['parted_at']} |"
        assert (shown in markdown) == pair["differs"]
    assert page.startswith("<!DOCTYPE html>") and "McNemar p" in page


def test_promptfoo_runs_compared_as_the_json_says(capsys, tmp_path) -> None:
    rows = [
        json.loads((DATA / f"promptfoo-{lane}.json").read_text())["results"]["results"]
        for lane in "ab"
    ]
    by_key = [{(r["testIdx"], r["promptIdx"]): r for r in lane} for lane in rows]
    a, b = by_key
    differ = sorted(k for k in a if a[k]["response"]["output"] != b[k]["response"]["output"])
    pairs = [(a[k]["success"], b[k]["success"]) for k in a]
    code, out, report = import_report(
        capsys,
        tmp_path,
        "promptfoo",
        str(DATA / "promptfoo-a.json"),
        str(DATA / "promptfoo-b.json"),
    )
    (group,) = report["groups"]
    found = [p["item"] for p in group["pairs"] if p["differs"]]
    assert found == [f"test {t}, prompt {p}" for t, p in differ]
    (passed,) = report["metrics"]
    assert passed["metric"] == "pass"
    assert passed["mcnemar_p"] == pytest.approx(statsmodels_p(pairs))
    assert len(passed["worse"]) == sum(x and not y for x, y in pairs)
    assert out.startswith(f"{len(differ)} of {len(a)} items differ;")
    assert code == (1 if differ else 0)


def refused(capsys, *arguments: str) -> str:
    assert main(["import", *arguments]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1, captured.err
    assert "Traceback" not in captured.err
    return captured.err


def lm_eval_copy(tmp_path: Path, name: str) -> Path:
    run = tmp_path / name
    shutil.copytree(DATA / "lm-eval-b", run)
    return run


def rewrite_samples(run: Path, keep: Any) -> None:
    (file,) = run.rglob("samples_*.jsonl")
    rows = [json.loads(line) for line in file.read_text().splitlines()]
    file.write_text("".join(json.dumps(row) + "\n" for row in rows if keep(row)))


def test_missing_run_is_refused(capsys, tmp_path) -> None:
    err = refused(capsys, "lm-eval", str(tmp_path / "nowhere"), str(DATA / "lm-eval-b"))
    assert "nowhere does not exist" in err


def test_a_folder_without_samples_is_refused(capsys, tmp_path) -> None:
    err = refused(capsys, "lm-eval", str(tmp_path), str(DATA / "lm-eval-b"))
    assert "no samples_<task>_<time>.jsonl" in err and "--log_samples" in err


def test_malformed_samples_line_is_refused(capsys, tmp_path) -> None:
    run = lm_eval_copy(tmp_path, "broken")
    (file,) = run.rglob("samples_*.jsonl")
    file.write_text(file.read_text() + '{"doc_id": 12, "resps": \n')
    err = refused(capsys, "lm-eval", str(DATA / "lm-eval-a"), str(run))
    assert "line 13 is not JSON" in err


def test_a_line_that_is_not_a_sample_is_refused(capsys, tmp_path) -> None:
    run = lm_eval_copy(tmp_path, "other")
    (file,) = run.rglob("samples_*.jsonl")
    file.write_text('{"id": 1}\n')
    err = refused(capsys, "lm-eval", str(DATA / "lm-eval-a"), str(run))
    assert "line 1 is not an lm-eval sample" in err


def test_missing_doc_ids_are_named(capsys, tmp_path) -> None:
    run = lm_eval_copy(tmp_path, "fewer")
    rewrite_samples(run, lambda row: row["doc_id"] not in (3, 7))
    err = refused(capsys, "lm-eval", str(DATA / "lm-eval-a"), str(run))
    assert "facts: doc ids 3, 7 are missing from" in err and str(run) in err


def test_different_tasks_are_named(capsys, tmp_path) -> None:
    run = lm_eval_copy(tmp_path, "renamed")
    (file,) = run.rglob("samples_*.jsonl")
    file.rename(file.with_name(file.name.replace("samples_facts_", "samples_trivia_")))
    err = refused(capsys, "lm-eval", str(DATA / "lm-eval-a"), str(run))
    assert "has task facts that" in err and "has task trivia that" in err


def test_different_prompts_for_one_doc_are_refused(capsys, tmp_path) -> None:
    run = lm_eval_copy(tmp_path, "reworded")

    def reword(row: dict[str, Any]) -> bool:
        if row["doc_id"] == 4:
            row["prompt_hash"] = "0" * 64
        return True

    rewrite_samples(run, reword)
    err = refused(capsys, "lm-eval", str(DATA / "lm-eval-a"), str(run))
    assert "item 4 has a different prompt in each run" in err


def test_malformed_promptfoo_json_is_refused(capsys, tmp_path) -> None:
    broken = tmp_path / "out.json"
    broken.write_text('{"results": {"results": [')
    err = refused(capsys, "promptfoo", str(DATA / "promptfoo-a.json"), str(broken))
    assert "is not JSON" in err


def test_json_that_is_not_promptfoo_output_is_refused(capsys, tmp_path) -> None:
    other = tmp_path / "other.json"
    other.write_text('{"results": [1, 2]}')
    err = refused(capsys, "promptfoo", str(other), str(DATA / "promptfoo-b.json"))
    assert "not promptfoo eval output" in err


def test_lm_eval_output_given_to_promptfoo_is_refused(capsys) -> None:
    (samples_file,) = (DATA / "lm-eval-a").rglob("samples_*.jsonl")
    err = refused(capsys, "promptfoo", str(samples_file), str(DATA / "promptfoo-b.json"))
    assert "is not JSON" in err


def test_missing_promptfoo_items_are_named(capsys, tmp_path) -> None:
    data = json.loads((DATA / "promptfoo-b.json").read_text())
    data["results"]["results"] = data["results"]["results"][:-1]
    fewer = tmp_path / "fewer.json"
    fewer.write_text(json.dumps(data))
    err = refused(capsys, "promptfoo", str(DATA / "promptfoo-a.json"), str(fewer))
    assert "items test 11, prompt 0 are missing from" in err


def test_rerun_without_a_report_folder_is_refused(capsys) -> None:
    err = refused(capsys, "lm-eval", str(DATA / "lm-eval-a"), str(DATA / "lm-eval-b"), "--rerun")
    assert "give --report DIR" in err


@pytest.mark.model
def test_rerun_finds_each_differing_items_fork_in_its_session(capsys, tmp_path) -> None:
    report = tmp_path / "report"
    code = main([
        "import", "lm-eval", str(DATA / "lm-eval-a"), str(DATA / "lm-eval-b"),
        "--report", str(report), "--rerun", "--pair", "ubatch", "--max-tokens", "8",
    ])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 1
    data = json.loads((report / "report.json").read_text())
    reruns = [p for g in data["groups"] for p in g["pairs"] if p["differs"]]
    assert reruns and all("rerun" in p for p in reruns)
    forked = 0
    for item in reruns:
        lines = (report / "rerun" / item["rerun"]["session"]).read_text().splitlines()
        steps = [json.loads(line) for line in lines]
        assert steps[0]["prompt"] == item["prompt"]
        ids = {lane: [s["token_id"] for s in steps if s.get("lane") == lane] for lane in "ab"}
        fork = next((i for i, (x, y) in enumerate(zip(ids["a"], ids["b"])) if x != y), None)
        assert item["rerun"]["fork_index"] == fork
        forked += fork is not None
    assert f"rerun through ubatch: {forked} of {len(reruns)} differing items fork" in out


def test_rerun_through_an_unknown_pair_is_refused_before_anything_runs(capsys, tmp_path) -> None:
    err = refused(
        capsys, "lm-eval", str(DATA / "lm-eval-a"), str(DATA / "lm-eval-b"),
        "--report", str(tmp_path / "r"), "--rerun", "--pair", "ubatc",
    )  # fmt: skip
    assert "ubatc" in err and "ubatch" in err
    assert not (tmp_path / "r").exists()


def test_missing_promptfoo_file_is_refused(capsys, tmp_path) -> None:
    err = refused(capsys, "promptfoo", str(tmp_path / "none.json"), str(DATA / "promptfoo-b.json"))
    assert "none.json does not exist" in err


def test_outputs_from_the_files_cannot_break_the_report(capsys, tmp_path) -> None:
    data = json.loads((DATA / "promptfoo-b.json").read_text())
    hostile = "<script>alert(1)</script> | col \x1b[31m red\n# heading"
    data["results"]["results"][0]["response"]["output"] = hostile
    changed = tmp_path / "b.json"
    changed.write_text(json.dumps(data))
    import_report(capsys, tmp_path, "promptfoo", str(DATA / "promptfoo-a.json"), str(changed))
    page = (tmp_path / "report" / "report.html").read_text()
    markdown = (tmp_path / "report" / "report.md").read_text()
    assert "<script>" not in page and "\x1b" not in page + markdown
    row = next(line for line in markdown.splitlines() if line.startswith("| test 0, prompt 0 |"))
    header = next(line for line in markdown.splitlines() if line.startswith("| item |"))
    unescaped = lambda line: len(re.findall(r"(?<!\\)\|", line))  # noqa: E731
    assert unescaped(row) == unescaped(header)
    assert "\x1b" not in (tmp_path / "report" / "report.json").read_text()


def test_promptfoo_output_given_to_lm_eval_is_refused(capsys) -> None:
    err = refused(capsys, "lm-eval", str(DATA / "promptfoo-a.json"), str(DATA / "lm-eval-b"))
    assert "is not named as lm-eval names a samples file" in err


def test_one_samples_file_is_a_run(capsys) -> None:
    (a,) = (DATA / "lm-eval-a").rglob("samples_*.jsonl")
    (b,) = (DATA / "lm-eval-b").rglob("samples_*.jsonl")
    main(["import", "lm-eval", str(a), str(b)])
    single = capsys.readouterr().out
    main(["import", "lm-eval", str(DATA / "lm-eval-a"), str(DATA / "lm-eval-b")])
    assert single == capsys.readouterr().out
