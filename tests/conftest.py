"""Shared fixtures: the real bundled model, assembled once per test run."""

from __future__ import annotations

from pathlib import Path

import pytest

from specdiff.engine.models import bundled_model_path, make_variant
from specdiff.prompts import load as load_prompts

__all__ = ["load_prompts"]


@pytest.fixture(scope="session")
def model_path() -> Path:
    return bundled_model_path()


@pytest.fixture(scope="session")
def q8_model_path(model_path: Path) -> Path:
    return make_variant(model_path, "q8_0", threads=2)
