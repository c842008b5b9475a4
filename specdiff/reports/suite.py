"""A suite's report: report.json, report.md, report.html (inline SVG), results.csv.

Everything is rendered from the one JSON object `specdiff.suite.outcome.outcome_json`
builds, so the four files cannot disagree. Prompt ids, pair names, labels, model ids and
errors come from files and servers specdiff does not control: every Markdown cell goes
through `markdown_cell` (no HTML, link or table break survives) and every CSV cell
through `csv_cell` (no formula runs when a spreadsheet opens it).

This module writes the files and renders report.json; each other format has its module
(`suite_markdown`, `suite_html`, `suite_csv`), over the sentences (`suite_words`),
tables (`suite_tables`) and charts (`suite_charts`) they share. The names callers use
are importable from here.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from specdiff.files import write_chunks_atomic
from specdiff.json_numbers import finite_everywhere
from specdiff.reports.suite_charts import PAIR_COLORS, fork_histogram_svg, forked_by_length_svg
from specdiff.reports.suite_csv import results_csv, results_csv_chunks
from specdiff.reports.suite_html import html_chunks, html_report
from specdiff.reports.suite_markdown import markdown, markdown_chunks
from specdiff.reports.suite_tables import prompt_label, summary_table
from specdiff.reports.suite_words import backoff_text, classes_note, left_out_text, paired_line
from specdiff.safe_text import json_text
from specdiff.suite.outcome import SuiteReport

__all__ = [
    "PAIR_COLORS",
    "backoff_text",
    "classes_note",
    "fork_histogram_svg",
    "forked_by_length_svg",
    "html_report",
    "left_out_text",
    "markdown",
    "paired_line",
    "prompt_label",
    "report_json_chunks",
    "results_csv",
    "summary_table",
    "write_reports",
]


def write_reports(report_dir: Path, data: SuiteReport) -> list[Path]:
    """Write the four report files, each whole or not at all; their paths. Each is
    written as it is rendered, a run's row at a time: over thousands of prompts each
    text is megabytes, and none of it need be held."""
    outputs: dict[str, Callable[[SuiteReport], Iterable[str]]] = {
        "report.json": report_json_chunks,
        "report.md": markdown_chunks,
        "report.html": html_chunks,
        "results.csv": results_csv_chunks,
    }
    written = []
    for name, render in outputs.items():
        path = report_dir / name
        write_chunks_atomic(path, render(data))
        written.append(path)
    return written


JSON_BLOCK = 1 << 16
"""Characters of report.json written at a time."""


def report_json_chunks(data: SuiteReport) -> Iterator[str]:
    """`data` as indented JSON, its `prompts` (last, and read as they are iterated)
    written a record at a time: the text `json.dumps(data, indent=1)` would give, with
    the controls it leaves raw escaped (`json_text`, as an exported session's JSON), so
    `cat report.json` runs nothing a prompt id or a server's text held."""
    for chunk in _report_json_text(data):
        yield json_text(chunk)


def _report_json_text(data: SuiteReport) -> Iterator[str]:
    encoder = json.JSONEncoder(indent=1, ensure_ascii=False)
    head = encoder.iterencode(finite_everywhere({k: v for k, v in data.items() if k != "prompts"}))
    # the encoder's pieces are a few characters each: written in blocks, the last few
    # characters held back, for the head's closing "\n}" gives way to the prompts
    block = ""
    for piece in head:
        block += piece
        if len(block) > JSON_BLOCK:
            yield block[:-2]
            block = block[-2:]
    yield block[: -len("\n}")] + ',\n "prompts": ['
    separator = "\n"
    for record in data["prompts"]:
        # JSON escapes every newline inside a string, so each "\n" starts a line; not
        # splitlines, which also breaks at U+2028 and U+0085, left raw in strings
        text = json.dumps(finite_everywhere(record), indent=1, ensure_ascii=False)
        yield separator + "  " + text.replace("\n", "\n  ")
        separator = ",\n"
    yield "]\n}\n" if separator == "\n" else "\n ]\n}\n"
