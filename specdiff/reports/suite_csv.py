"""results.csv: one row per run, a row at a time. Every cell goes through `csv_cell`, so
no formula runs when a spreadsheet opens the file.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Iterator
from typing import Any

from specdiff.reports.suite_tables import errors_text, grade_words
from specdiff.safe_text import csv_cell
from specdiff.suite.outcome import SuiteReport

CSV_COLUMNS = (
    "pair",
    "quant",
    "prompt_id",
    "identical",
    "fork_index",
    "fork_margin_a",
    "fork_margin_b",
    "fork_class",
    "fork_verdict",
    "tokens_a",
    "tokens_b",
    "tokens_per_second_a",
    "tokens_per_second_b",
    "drafted_a",
    "accepted_a",
    "drafted_b",
    "accepted_b",
    "near_ties_a",
    "near_ties_b",
    "stop_reason_a",
    "stop_reason_b",
    "error",
    "grade_a",
    "grade_b",
    "teacher_flips",
    "sha256_a",
    "sha256_b",
    "session",
    "concurrency",
    "served_by_a",
    "served_by_b",
    "retries_a",
    "retries_b",
    "wait_seconds_a",
    "wait_seconds_b",
)


def results_csv(data: SuiteReport) -> str:
    return "".join(results_csv_chunks(data))


def results_csv_chunks(data: SuiteReport) -> Iterator[str]:
    """The CSV a row at a time: its header, then a run's row as each is read."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")

    def row(cells: Iterable[Any]) -> str:
        buffer.seek(0)
        buffer.truncate()
        writer.writerow(cells)
        return buffer.getvalue()

    yield row(CSV_COLUMNS)
    load = data["settings"].get("concurrency", 1)
    for record in data["prompts"]:
        cells = [*_csv_row(record), load, *_serving_cells(record)]
        yield row(csv_cell(cell) for cell in cells)


def _csv_row(r: dict[str, Any]) -> list[Any]:
    """One run in CSV_COLUMNS order, up to its session (the suite's load and how each
    lane was served follow)."""
    margins = r["fork_margins"] or (None, None)
    teacher = r.get("teacher")
    return [
        r["pair"],
        r["quant"],
        r["prompt_id"],
        int(r["identical"]),
        "" if r["fork_index"] is None else r["fork_index"],
        _csv_number(margins[0]),
        _csv_number(margins[1]),
        r.get("fork_class") or "",
        r.get("verdict") or "",
        r["generated"][0],
        r["generated"][1],
        _csv_number(r["tokens_per_second"][0]),
        _csv_number(r["tokens_per_second"][1]),
        r["drafted"][0],
        r["accepted"][0],
        r["drafted"][1],
        r["accepted"][1],
        r["near_ties"][0],
        r["near_ties"][1],
        r["stop_reasons"][0],
        r["stop_reasons"][1],
        errors_text(r),
        *grade_words(r),
        "" if teacher is None else len(teacher["flips"]),
        r["output_sha256"][0],
        r["output_sha256"][1],
        r["session"],
    ]


def _serving_cells(record: dict[str, Any]) -> list[Any]:
    """Each lane's endpoint, retries and back-off seconds; blank for a lane not served
    over HTTP or a run that did not record it."""
    lanes = record.get("serving") or (None, None)
    cells: list[Any] = []
    for field in ("endpoint", "retries", "wait_seconds"):
        cells += ["" if lane is None else lane[field] for lane in lanes]
    return cells


def _csv_number(value: float | None) -> str:
    return "" if value is None or not math.isfinite(value) else f"{value:.6g}"
