"""Two report folders of one suite compared, times aside: report.json field by field,
results.csv row by row, and each session's steps. Run whole, in shards merged or on Ray,
a suite reports the same forks at the same tokens; only the clock differs."""

from __future__ import annotations

import csv
import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from specdiff.sessions.store import load_session
from specdiff.steps import TokenStep

TIMES = re.compile(r"seconds|per_second|speedup|^created$")
"""The fields and columns that time a run: they differ between any two runs."""


def without_times(value: object) -> object:
    if isinstance(value, dict):
        return {k: without_times(v) for k, v in value.items() if not TIMES.search(k)}
    if isinstance(value, list):
        return [without_times(item) for item in value]
    return value


def compare_fields(ours: object, theirs: object, where: str = "report") -> None:
    """Assert the two values agree field by field, naming the first that does not."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        assert ours.keys() == theirs.keys(), where
        for key in ours:
            compare_fields(ours[key], theirs[key], f"{where}.{key}")
    elif isinstance(ours, list) and isinstance(theirs, list):
        assert len(ours) == len(theirs), where
        for number, (a, b) in enumerate(zip(ours, theirs)):
            compare_fields(a, b, f"{where}[{number}]")
    else:
        assert ours == theirs, f"{where}: {ours!r} != {theirs!r}"


def report_json(folder: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((folder / "report.json").read_text(encoding="utf-8"))
    return data


def results(folder: Path) -> list[dict[str, str]]:
    """results.csv's rows, times left out."""
    with (folder / "results.csv").open(encoding="utf-8") as handle:
        rows = csv.DictReader(handle)
        return [{k: v for k, v in row.items() if not TIMES.search(k)} for row in rows]


def steps(folder: Path) -> dict[str, tuple[list[str], list[TokenStep]]]:
    """Each session's steps in file order (their times left out), by file name: a fork
    at the same token has the same logits, ranks and probes there."""
    found = {}
    for path in sorted((folder / "sessions").rglob("*.jsonl")):
        session = load_session(path)
        lanes = [replace(step, timestamp=0.0) for lane in "ab" for step in session.steps[lane]]
        found[path.name] = (session.order, lanes)
    return found


def with_lane_threads(report: dict[str, Any], threads: int) -> dict[str, Any]:
    """The report as if every lane had been set to `threads` (a Ray run keeps the lanes'
    default threads in its settings, and runs them on its actors' CPUs)."""
    report = json.loads(json.dumps(report))
    lanes = [pair[lane] for pair in report["settings"]["pairs"] for lane in "ab"]
    lanes += [pair["configuration"]["lanes"][lane] for pair in report["pairs"] for lane in "ab"]
    for lane in lanes:
        lane["threads"] = threads
    return report


def compare_reports(ours: dict[str, Any], theirs: dict[str, Any]) -> None:
    """report.json field by field, times and a merged report's `shards` section aside
    (a whole suite has none)."""
    mine, other = dict(ours), dict(theirs)
    mine.pop("shards", None)
    other.pop("shards", None)
    compare_fields(without_times(mine), without_times(other))


def assert_same_runs(ours: Path, theirs: Path) -> None:
    """results.csv row by row, and every session's steps."""
    assert results(ours) == results(theirs)
    assert steps(ours) == steps(theirs)


def assert_same_reports(ours: Path, theirs: Path) -> None:
    compare_reports(report_json(ours), report_json(theirs))
    assert_same_runs(ours, theirs)
