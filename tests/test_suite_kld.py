"""`suite --teacher-forced`: KL(a||b) over the whole vocabulary at every step of each run,
as `specdiff score` computes it; kept per pair for a resume, checked when read back, and
said to be missing for server lanes, whose rows are only top candidates."""

from __future__ import annotations

import json
import math
import threading
from dataclasses import asdict
from pathlib import Path

import pytest

from specdiff.cli import main
from specdiff.lanes import presets
from specdiff.scoring import PositionScore, summarise
from specdiff.suite import SuiteError
from specdiff.suite.kld import (
    SERVER_MISSING,
    kld_json,
    kld_path,
    read_scores,
    score_teacher_forced,
    write_scores,
)
from specdiff.suite.settings import SuiteSettings


def position(number: int, kld: float, flipped: bool = False) -> PositionScore:
    return PositionScore(
        position=number, token=7, kld=kld, top_a=7, top_b=9 if flipped else 7, margin_a=0.5,
        margin_b=0.25, logit_delta=0.125, logprob_a=-0.5, logprob_b=-0.75,
    )  # fmt: skip


SCORES = {
    "p0": [position(3, 0.0), position(4, 0.25, flipped=True)],
    "odd id | <b>": [position(9, 1e-6), position(10, 2.5), position(11, 0.5)],
}


@pytest.mark.parametrize("ids", [["p0"], ["odd id | <b>"], ["p0", "odd id | <b>", "never ran"]])
def test_the_pair_summary_pools_every_step_of_its_prompts(ids: list[str]) -> None:
    data = kld_json(SCORES, ids, None)
    pooled = [score for prompt_id in ids for score in SCORES.get(prompt_id, [])]
    assert data["summary"] == summarise(pooled).as_dict()
    assert [p["prompt_id"] for p in data["prompts"]] == [i for i in ids if i in SCORES]
    for prompt in data["prompts"]:
        assert prompt["flips"] == sum(not s.same_top for s in SCORES[prompt["prompt_id"]])


def test_stored_scores_read_back_as_written(tmp_path: Path) -> None:
    path = tmp_path / "kld.json"
    write_scores(path, SCORES)
    assert read_scores(path) == SCORES
    assert read_scores(tmp_path / "none.json") == {}


def stored(change: dict) -> dict:
    item = asdict(position(1, 0.5)) | change
    return {"prompts": {"p0": [item]}}


@pytest.mark.parametrize(
    ("content", "named"),
    [
        ("{not json", "kld.json"),
        (json.dumps([1, 2]), "the file must be an object"),
        (json.dumps({"prompts": []}), "prompts must be an object"),
        (json.dumps({"prompts": {"p0": {}}}), "prompts.p0 must be a list"),
        (json.dumps({"prompts": {"p0": ["x"]}}), "prompts.p0[0] must be an object"),
        (json.dumps(stored({"kld": "0.5"})), "prompts.p0[0].kld must be a number"),
        (json.dumps(stored({"top_a": 1.5})), "prompts.p0[0].top_a must be a whole number"),
        (json.dumps(stored({"token": -1})), "prompts.p0[0].token must be a whole number"),
        (json.dumps(stored({"margin_a": None})), "prompts.p0[0].margin_a must be a number"),
        (json.dumps(stored({"kld": True})), "prompts.p0[0].kld must be a number"),
    ],
)
def test_a_damaged_score_file_is_named_with_its_field(
    content: str, named: str, tmp_path: Path
) -> None:
    path = tmp_path / "kld.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(SuiteError) as raised:
        read_scores(path)
    message = str(raised.value)
    assert str(path) in message and named in message and "\n" not in message


@pytest.mark.parametrize("name", ["servers", "server-cache-vs-fresh"])
def test_server_lanes_say_why_their_kld_is_missing(name: str, tmp_path: Path) -> None:
    settings = SuiteSettings("p.jsonl", (presets()[name],), 8, teacher_forced=True)
    said: list[str] = []
    kld = score_teacher_forced(settings, tmp_path, [], threading.Event(), said.append)
    assert kld == {name: {"summary": None, "prompts": [], "missing": SERVER_MISSING}}
    assert said == [] and not any(tmp_path.iterdir())


def test_a_suite_that_is_not_teacher_forced_measures_none(tmp_path: Path) -> None:
    settings = SuiteSettings("p.jsonl", (presets()["quant"],), 8)
    assert score_teacher_forced(settings, tmp_path, [], threading.Event(), print) == {}


@pytest.mark.model
def test_the_suite_scores_every_teacher_forced_step_and_keeps_it_for_a_resume(
    tmp_path: Path, capsys
) -> None:
    report = tmp_path / "report"
    arguments = [
        "suite", "questions", "--report", str(report), "--pair", "quant", "--teacher-forced",
        "--limit", "2", "--max-tokens", "12",
    ]  # fmt: skip
    assert main([*arguments, "--quiet"]) in (0, 1)
    printed = capsys.readouterr().out
    data = json.loads((report / "report.json").read_text(encoding="utf-8"))
    summary = data["pairs"][0]["summary"]
    kld, teacher = summary["kld"], summary["teacher_forced"]
    assert kld["missing"] is None and len(kld["prompts"]) == 2
    # one scored step for every step lane b was fed
    assert kld["summary"]["positions"] == teacher["steps"]
    assert 0 <= kld["summary"]["median_kld"] <= kld["summary"]["max_kld"]
    assert math.isfinite(kld["summary"]["mean_kld"])
    stored_scores = read_scores(kld_path(report, "quant"))
    for record in data["prompts"]:
        scores = stored_scores[record["prompt_id"]]
        assert len(scores) == record["teacher"]["steps"]
        assert [s.position for s in scores] == list(
            range(scores[0].position, len(scores) + scores[0].position)
        )
        # lane a is greedy: each row predicts its own next pick, bar a near tie that the
        # batched evaluation decides the other way (a row out of step would match few)
        assert sum(score.top_a == score.token for score in scores) >= 0.75 * len(scores)
    assert "KL(a||b) over the whole vocabulary" in printed
    markdown = (report / "report.md").read_text(encoding="utf-8")
    assert "| prompt | steps | mean KLD |" in markdown
    # a resume scores nothing again: a damaged score file is refused, not overwritten
    kld_path(report, "quant").write_text('{"prompts": {"x": [{"kld": "high"}]}}\n')
    assert main(["suite", "--resume", "--report", str(report), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("specdiff: error:") and "kld.json" in err and "\n" not in err
