"""Helpers shared by the benchmarks: prompt sets and a median."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

PROMPTS = Path(__file__).resolve().parent.parent / "specdiff" / "prompts"


def prompts(name: str) -> list[str]:
    with (PROMPTS / f"{name}.jsonl").open(encoding="utf-8") as handle:
        return [json.loads(line)["prompt"] for line in handle if line.strip()]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")
