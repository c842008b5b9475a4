"""Shared fixtures: the real bundled model, assembled once per test run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdiff.engine.models import bundled_model_path, make_variant

PROMPTS_DIR = Path(__file__).resolve().parent.parent / "specdiff" / "prompts"


def load_prompts(name: str) -> list[dict]:
    with (PROMPTS_DIR / f"{name}.jsonl").open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


@pytest.fixture(scope="session")
def model_path() -> Path:
    return bundled_model_path()


@pytest.fixture(scope="session")
def q8_model_path(model_path: Path) -> Path:
    return make_variant(model_path, "q8_0", threads=2)
