"""`specdiff import` on runs made here and now: lm-eval and promptfoo against two real
llama-servers on the bundled model, one of which processes prompts two tokens at a
time, compared with what a plain reading of their files and statsmodels say."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdiff.cli import main
from tests.eval_runs import ITEMS, run_lm_eval, run_promptfoo, two_servers, write_task
from tests.test_imports import samples, statsmodels_p

pytestmark = [pytest.mark.model, pytest.mark.server]
MAX_TOKENS = 32


def check_lm_eval(runs: list[Path], report: Path, capsys) -> None:
    code = main(["import", "lm-eval", *map(str, runs), "--report", str(report)])
    out = capsys.readouterr().out
    data = json.loads((report / "report.json").read_text())
    a, b = samples(runs[0]), samples(runs[1])
    assert len(a) == len(ITEMS)
    differ = sorted(i for i in a if a[i]["resps"] != b[i]["resps"])
    with capsys.disabled():
        print(f"\nlm-eval: {out.strip()}")
    (group,) = data["groups"]
    assert sorted(int(p["item"]) for p in group["pairs"] if p["differs"]) == differ
    assert out.startswith(f"{len(differ)} of {len(ITEMS)} items differ;")
    for found in group["metrics"]:
        metric = found["metric"]
        pairs = [(a[i][metric] == 1.0, b[i][metric] == 1.0) for i in a]
        assert found["mcnemar_p"] == pytest.approx(statsmodels_p(pairs))
    assert code == (1 if differ else 0)


def check_promptfoo(files: list[Path], capsys) -> None:
    code = main(["import", "promptfoo", *map(str, files)])
    out = capsys.readouterr().out
    rows = [json.loads(f.read_text())["results"]["results"] for f in files]
    a, b = ({(r["testIdx"], r["promptIdx"]): r for r in lane} for lane in rows)
    differ = [k for k in a if a[k]["response"]["output"] != b[k]["response"]["output"]]
    pairs = [(a[k]["success"], b[k]["success"]) for k in a]
    with capsys.disabled():
        print(f"promptfoo: {out.strip()}")
    assert out.startswith(f"{len(differ)} of {len(ITEMS)} items differ;")
    assert f"McNemar p={statsmodels_p(pairs):.3g}" in out
    assert code == (1 if differ else 0)


def test_runs_against_two_servers_are_compared(capsys, tmp_path: Path, promptfoo: Path) -> None:
    task = write_task(tmp_path / "task", max_tokens=MAX_TOKENS)
    with two_servers() as urls:
        runs, files = [], []
        for lane, url in zip("ab", urls, strict=True):
            runs.append(run_lm_eval(url, task, tmp_path / f"run-{lane}", tmp_path))
            files.append(
                run_promptfoo(
                    url, tmp_path / f"pf-{lane}", tmp_path / f"{lane}.json", tmp_path, MAX_TOKENS
                )
            )
    check_lm_eval(runs, tmp_path / "report", capsys)
    check_promptfoo(files, capsys)
