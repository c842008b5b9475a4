"""An exported session as Markdown: the fork token between brackets in each lane's text,
the margin plot as an inline SVG data URI, every value from the file escaped.
"""

from __future__ import annotations

import base64

from specdiff.reports._markup import md_block, md_code, md_escape, md_table
from specdiff.reports.autopsy import format_autopsy
from specdiff.reports.export_content import (
    AUTOPSY_HEADING,
    FORK_HEADER,
    LANE_IDS,
    ConfigTable,
    SessionReport,
    config_tables,
    document_title,
    findings,
    fork_heading,
    fork_rows,
    lane_description,
    margin_svg,
    prompt_parts,
    verdict,
)
from specdiff.safe_text import pictured

FORK_OPEN, FORK_CLOSE = "⟦", "⟧"


def _marked_text(report: SessionReport, lane_id: str) -> str:
    texts = report.token_texts[lane_id]
    fork = report.fork
    if fork is None:
        return "".join(texts)
    return (
        "".join(texts[: fork.index])
        + FORK_OPEN
        + texts[fork.index]
        + FORK_CLOSE
        + "".join(texts[fork.index + 1 :])
    )


def markdown_document(report: SessionReport) -> str:
    sections = (_md_opening, _md_fork, _md_autopsy, _md_margins, _md_texts, _md_configuration)
    return "\n".join(line for section in sections for line in section(report)) + "\n"


def _md_opening(report: SessionReport) -> list[str]:
    session = report.session
    out = [f"# {md_escape(document_title(session))}", ""]
    if session.pair.description:
        out += [md_escape(session.pair.description), ""]
    out += [f"**Verdict:** {md_escape(verdict(session, report.comparison))}", ""]
    out += ["## Prompt", ""]
    for title, text in prompt_parts(session):
        out += [f"**{md_escape(title)}**", ""] if title else []
        out += [md_block(pictured(text)), ""]
    return out


def _md_autopsy(report: SessionReport) -> list[str]:
    if report.autopsy is None:
        return []
    return [AUTOPSY_HEADING, "", md_block(format_autopsy(report.autopsy)), ""]


def _md_fork(report: SessionReport) -> list[str]:
    fork = report.fork
    out = [f"## {md_escape(fork_heading(fork))}", ""]
    if fork is not None:
        rows = [
            [lane, margin, md_code(own), md_code(other)]
            for lane, margin, own, other in fork_rows(fork)
        ]
        out += [*md_table(FORK_HEADER, rows), ""]
    for line in findings(report):
        out += [md_escape(line), ""]
    return out


def _md_margins(report: SessionReport) -> list[str]:
    plot = base64.b64encode(margin_svg(report).encode("utf-8")).decode("ascii")
    return [
        "## Margins",
        "",
        f"![Logit margin per token for both lanes](data:image/svg+xml;base64,{plot})",
        "",
    ]


def _md_texts(report: SessionReport) -> list[str]:
    out = ["## Texts", ""]
    if report.fork is not None:
        out += [f"The token at the fork is between {FORK_OPEN} and {FORK_CLOSE}.", ""]
    for lane_id in LANE_IDS:
        description = lane_description(report.session, lane_id)
        count = len(report.steps(lane_id))
        out += [f"### Lane {lane_id}: {md_escape(description)} ({count} tokens)", ""]
        out += [md_block(pictured(_marked_text(report, lane_id))), ""]
    return out


def _md_configuration(report: SessionReport) -> list[str]:
    out = ["## Configuration"]
    for table in config_tables(report):
        note = f" ({table.note.format(differs='≠ marks')})" if table.note else ""
        rows = [_md_config_row(table, number) for number in range(len(table.rows))]
        out += ["", f"### {table.title}{note}", "", *md_table(table.header, rows)]
    return out


def _md_config_row(table: ConfigTable, number: int) -> list[str]:
    name, *values = table.rows[number]
    marked = table.differs is not None and table.differs[number]
    value_text = md_code if table.literal else md_escape
    return [
        f"**{md_escape(name)}** ≠" if marked else md_escape(name),
        *(value_text(value) for value in values),
    ]
