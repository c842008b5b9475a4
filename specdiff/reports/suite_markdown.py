"""report.md: the suite report as Markdown, a run's row at a time. Every cell from a
file or a server goes through `markdown_cell`, so no HTML, link or table break survives.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from specdiff.reports._markup import md_table, md_table_lines
from specdiff.reports.suite_kld import KLD_PROMPT_HEADER, kld_line, kld_prompt_rows
from specdiff.reports.suite_lengths import LENGTH_HEADER, length_rows
from specdiff.reports.suite_tables import (
    LANE_HEADER,
    MARGIN_HEADER,
    PAIRED_HEADER,
    SERVING_HEADER,
    by_length_table,
    lane_rows,
    margin_rows,
    paired_rows,
    quant_matrix,
    report_lines,
    serving_rows,
    summary_table,
    teacher_rows,
)
from specdiff.reports.suite_words import (
    PAIRED_NOTE,
    SUMMARY_NOTE,
    backoff_text,
    classes_note,
    left_out_text,
    overview,
    pair_line,
    paired_line,
)
from specdiff.safe_text import markdown_cell
from specdiff.suite.outcome import PairReport, SuiteReport


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return md_table(header, rows, markdown_cell)


def _text_bars(bins: Sequence[dict[str, Any]], width: int = 30) -> list[str]:
    top = max((b["count"] for b in bins), default=0)
    lines = []
    for b in bins:
        bar = "█" * (round(width * b["count"] / top) if top else 0)
        lines.append(f"{b['from']:>5}–{b['to']:<5} {bar} {b['count']}")
    return lines


def markdown(data: SuiteReport) -> str:
    return "".join(markdown_chunks(data))


def markdown_chunks(data: SuiteReport) -> Iterator[str]:
    for line in report_lines(data, _md_overview, _md_pair, _md_section_lines):
        yield line + "\n"


def _md_section(title: str, header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    return list(_md_section_lines(title, header, rows))


def _md_section_lines(
    title: str, header: Sequence[str], rows: Iterable[Sequence[str]]
) -> Iterator[str]:
    """_md_section a line at a time."""
    yield from ("", f"## {title}", "")
    yield from md_table_lines(header, rows, markdown_cell)


def _md_overview(data: SuiteReport) -> list[str]:
    lines = [f"# specdiff suite: {markdown_cell(data['settings']['source'])}", "", overview(data)]
    lines += _md_section("Summary", *summary_table(data))
    lines += ["", SUMMARY_NOTE]
    lines += _md_section("Forked by generation length", *by_length_table(data))
    if length_rows(data):
        lines += _md_section("Fork rate by prompt length", LENGTH_HEADER, length_rows(data))
    matrix = quant_matrix(data)
    if matrix is not None:
        lines += _md_section("By weight type", *matrix)
    if data["skipped_prompts"]:
        lines += ["", "## Skipped", ""]
        lines += [f"- {markdown_cell(problem)}" for problem in data["skipped_prompts"]]
    return lines


def _md_pair(pair: PairReport) -> list[str]:
    summary = pair["summary"]
    lines = [
        "",
        f"## {markdown_cell(pair['label'])}",
        "",
        pair_line(summary),
        "",
        paired_line(summary),
        "",
        classes_note(summary),
        "",
        *_md_table(PAIRED_HEADER, paired_rows(summary)),
        *_md_paired_notes(summary),
        "",
        "First divergence index:",
        "",
        "```text",
        *_text_bars(summary["fork_histogram"]),
        "```",
    ]
    backoff, by_endpoint = backoff_text(summary), serving_rows(summary)
    if backoff:
        lines += ["", markdown_cell(backoff)]
    if by_endpoint:
        lines += ["", "By endpoint:", "", *_md_table(SERVING_HEADER, by_endpoint)]
    teacher = summary.get("teacher_forced")
    if teacher:
        lines += ["", "Teacher-forced:", "", *_md_table(["", ""], teacher_rows(teacher))]
        lines += [
            "",
            "Flips by lane a's margin m:",
            "",
            *_md_table(MARGIN_HEADER, margin_rows(teacher)),
        ]
    if kld_line(summary.get("kld")):
        lines += ["", markdown_cell(kld_line(summary["kld"]))]
        lines += ["", *_md_table(KLD_PROMPT_HEADER, kld_prompt_rows(summary["kld"]))]
    rows = lane_rows(pair.get("configuration"))
    if rows:
        lines += [
            "",
            "Configuration (* where the lanes differ):",
            "",
            *_md_table(LANE_HEADER, rows),
        ]
    return lines


def _md_paired_notes(summary: dict[str, Any]) -> list[str]:
    if not summary.get("grades"):
        return []
    left_out = left_out_text(summary)
    return ["", PAIRED_NOTE, *(["", markdown_cell(left_out)] if left_out else [])]
