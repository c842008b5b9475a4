"""The bundled prompt sets load, with unique ids and non-empty prompts (no model needed)."""

from __future__ import annotations

import re

import pytest

from specdiff import prompts
from specdiff.grading.graders import GRADER_FIELDS

MIN_COUNTS = {"coding": 30, "questions": 30, "repetitive": 12}
ID_PATTERN = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*")


@pytest.mark.parametrize("name", prompts.SETS)
def test_set_has_unique_kebab_ids_and_non_empty_prompts(name: str) -> None:
    entries = prompts.load(name)
    assert entries
    ids = [entry["id"] for entry in entries]
    assert len(ids) == len(set(ids))
    for entry in entries:
        assert {"id", "prompt"} <= set(entry) <= {"id", "prompt", "stop", *GRADER_FIELDS}
        assert ID_PATTERN.fullmatch(entry["id"]), entry["id"]
        assert entry["prompt"].strip(), entry["id"]
    assert len(entries) >= MIN_COUNTS.get(name, 1)


def test_coding_and_questions_prompts_are_short() -> None:
    assert all(len(entry["prompt"]) <= 400 for entry in prompts.load("coding"))
    assert all(len(entry["prompt"]) <= 200 for entry in prompts.load("questions"))


def test_unknown_set_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown prompt set"):
        prompts.load("nope")
