"""`specdiff import lm-eval` on two runs made here and now: lm-eval against two real
llama-servers on the bundled model, one of which processes prompts two tokens at a time,
compared with what a plain reading of the two samples files and statsmodels say."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdiff.cli import main
from tests.eval_runs import ITEMS, run_lm_eval, two_servers, write_task
from tests.test_imports import samples, statsmodels_p

pytestmark = [pytest.mark.model, pytest.mark.server]


def test_lm_eval_runs_against_two_servers_are_compared(capsys, tmp_path: Path) -> None:
    task = write_task(tmp_path / "task", max_tokens=32)
    with two_servers() as urls:
        runs = [
            run_lm_eval(url, task, tmp_path / f"run-{lane}", tmp_path)
            for lane, url in zip("ab", urls, strict=True)
        ]
    code = main(["import", "lm-eval", *map(str, runs), "--report", str(tmp_path / "report")])
    out = capsys.readouterr().out
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    a, b = samples(runs[0]), samples(runs[1])
    assert len(a) == len(ITEMS)
    differ = sorted(i for i in a if a[i]["resps"] != b[i]["resps"])
    print(f"\n{out.strip()}")
    (group,) = report["groups"]
    assert sorted(int(p["item"]) for p in group["pairs"] if p["differs"]) == differ
    assert out.startswith(f"{len(differ)} of {len(ITEMS)} items differ;")
    for found in group["metrics"]:
        metric = found["metric"]
        pairs = [(a[i][metric] == 1.0, b[i][metric] == 1.0) for i in a]
        assert found["mcnemar_p"] == pytest.approx(statsmodels_p(pairs))
    assert code == (1 if differ else 0)
