"""Repeat mode on the real model: the same prompt beside other sequences in the batch."""

from __future__ import annotations

import json

import pytest

from specdiff.cli import main
from specdiff.engine.llama.batched import BatchedLane
from specdiff.engine.llama.lane import LocalLane
from specdiff.lanes import Lane
from specdiff.prompts import DEFAULT_PROMPT
from specdiff.repeat import companions_for, first_split


@pytest.mark.model
def test_alone_in_its_batches_a_run_equals_the_plain_lane() -> None:
    lane = Lane()
    plain = LocalLane(lane, "a")
    try:
        prompt = plain.tokenize(DEFAULT_PROMPT)
        expected = [step.token_id for step in plain.generate(prompt, 40)]
    finally:
        plain.close()
    with BatchedLane(lane, 2) as batched:
        alone = batched.run(prompt, [], 40)
        again = batched.run(prompt, [], 40)
        beside = batched.run(prompt, [batched.tokenize("Once upon a time")], 40)
    assert alone.token_ids == expected == again.token_ids
    assert set(alone.widths) == {1} and set(beside.widths) == {2}
    assert len(beside.steps) == 40


def test_companions_rotate_and_grow_with_the_run_number() -> None:
    assert [companions_for(r, 3, 12) for r in range(5)] == [[], [1], [2, 3], [3, 4, 5], []]


def test_first_split() -> None:
    assert first_split([[1, 2, 3], [1, 2, 3]]) is None
    assert first_split([[1, 2, 3], [1, 5, 3], [1, 2, 4]]) == 1
    assert first_split([[1, 2], [1, 2, 3]]) == 2


@pytest.mark.model
def test_repeat_reports_unique_completions_and_the_split(capsys) -> None:
    code = main(
        ["repeat", "-n", "4", "--companions", "3", "--max-tokens", "40", "--json", "--quiet"]
    )
    data = json.loads(capsys.readouterr().out)
    assert data["runs"] == 4 and sum(g["count"] for g in data["groups"]) == 4
    assert data["unique"] == len(data["groups"])
    assert sorted(r for g in data["groups"] for r in g["runs"]) == [0, 1, 2, 3]
    assert [r["companions"] for r in data["per_run"]][0] == []
    assert code == (0 if data["unique"] == 1 else 1)
    if data["unique"] > 1:
        split = data["first_split"]
        pieces = {g["at_split"]["token_id"] for g in data["groups"] if "at_split" in g}
        assert len(pieces) > 1 or any("at_split" not in g for g in data["groups"])
        assert all(g["at_split"]["margin"] >= 0 for g in data["groups"] if "at_split" in g)
        assert isinstance(split, int)
    print(
        f"\nrepeat, 4 runs beside 0..3 sequences: {data['unique']} unique, split at "
        f"{data['first_split']}"
    )


def test_repeat_refuses_a_speculative_lane_and_bad_counts(capsys) -> None:
    for arguments, message in (
        (["--lane", "speculation=ngram"], "repeat runs a plain lane"),
        (["-n", "0"], "--runs: must be from 1 to"),
        (["--companions", "-1"], "--companions: must be from 0 to"),
    ):
        assert main(["repeat", "--quiet", *arguments]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1
