"""Helpers shared by the benchmarks."""

from __future__ import annotations

import statistics

from specdiff.prompts import load


def prompts(name: str) -> list[str]:
    return [entry["prompt"] for entry in load(name)]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")
