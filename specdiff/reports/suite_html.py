"""report.html: the suite report as one page with its charts inline (SVG), a run's row
at a time. Text from prompts, servers and sessions shows its control characters as
escapes, then is HTML-escaped.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Iterator, Sequence

from specdiff.reports._markup import html_table, page_head
from specdiff.reports.suite_charts import (
    PAIR_COLORS,
    delta_histogram_svg,
    fork_histogram_svg,
    forked_by_length_svg,
)
from specdiff.reports.suite_kld import KLD_PROMPT_HEADER, kld_line, kld_prompt_rows
from specdiff.reports.suite_lengths import (
    LENGTH_HEADER,
    fork_rate_by_prompt_length_svg,
    length_rows,
)
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
    backoff_text,
    classes_note,
    left_out_text,
    overview,
    pair_line,
    paired_line,
)
from specdiff.safe_text import visible
from specdiff.suite.outcome import PairReport, SuiteReport


def _html_text(text: str, quote: bool = True) -> str:
    """Text from prompts, servers and sessions in the HTML report: control characters
    shown as escapes (a `cat report.html` must not run them), then HTML-escaped."""
    return html.escape(visible(text), quote=quote)


SUITE_STYLE = """
body{max-width:1200px;margin:2rem auto;padding:0 1rem}
h1{font-size:1.6rem}
table{margin:.6rem 0 1rem;font-size:.9rem}
.wide{overflow-x:auto}
details{margin:.6rem 0}summary{cursor:pointer;color:var(--muted)}
table.config td{overflow-wrap:anywhere}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.charts{display:flex;flex-wrap:wrap;gap:1rem}
code{font-size:.85em}
"""
"""What the suite report adds to the base stylesheet: its page width and chart row."""


def _html_table(header: Sequence[str], rows: Sequence[Sequence[str]], css_class: str = "") -> str:
    return html_table(header, (_html_row(row) for row in rows), _html_text, css_class)


def _html_row(cells: Sequence[str]) -> str:
    return "<tr>" + "".join(f"<td>{_html_text(cell)}</td>" for cell in cells) + "</tr>"


def html_report(data: SuiteReport) -> str:
    return "".join(html_chunks(data))


def html_chunks(data: SuiteReport) -> Iterator[str]:
    for line in report_lines(data, _html_overview, _html_pair, _html_section_lines):
        yield line + "\n"
    yield "</body></html>\n"


def _html_section(title: str, header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    return [f"<h2>{title}</h2>", _html_table(header, list(rows))]


def _html_section_lines(
    title: str, header: Sequence[str], rows: Iterable[Sequence[str]]
) -> Iterator[str]:
    """_html_section with a line per row, each written as it is read; the build folded
    away (what ran, for tracing a number, not for reading first)."""
    folded = title in FOLDED_SECTIONS
    yield f"<details><summary>{title}</summary>" if folded else f"<h2>{title}</h2>"
    opening, closing = _html_table(header, []).split("<tbody></tbody>")
    yield opening + "<tbody>"
    yield from (_html_row(row) for row in rows)
    yield "</tbody>" + closing + ("</details>" if folded else "")


FOLDED_SECTIONS = ("Build",)


def _html_overview(data: SuiteReport) -> list[str]:
    source = _html_text(data["settings"]["source"])
    parts = [
        page_head(f"specdiff suite: {source}", SUITE_STYLE) + "<body>",
        f"<h1>specdiff suite: {source}</h1>",
        # quotes need no escaping in text, and the wording has an apostrophe
        f'<p class="muted">{_html_text(overview(data), quote=False)}</p>',
        "<h2>Summary</h2>",
        '<div class="wide">' + _html_table(*summary_table(data)) + "</div>",
        '<div class="charts">',
        f'<figure class="plot" id="forked-by-length">{forked_by_length_svg(data)}</figure>',
    ]
    for number, pair in enumerate(data["pairs"]):
        color = PAIR_COLORS[number % len(PAIR_COLORS)]
        parts.append(f'<figure class="plot">{fork_histogram_svg(pair, color)}</figure>')
    parts.append("</div>")
    parts += _html_section("Forked by generation length", *by_length_table(data))
    if length_rows(data):
        parts += _html_section("Fork rate by prompt length", LENGTH_HEADER, length_rows(data))
        parts.append(f'<figure class="plot">{fork_rate_by_prompt_length_svg(data)}</figure>')
    matrix = quant_matrix(data)
    if matrix is not None:
        parts += _html_section("By weight type", *matrix)
    if data["skipped_prompts"]:
        items = "".join(f"<li>{_html_text(p)}</li>" for p in data["skipped_prompts"])
        parts += ["<h2>Skipped</h2>", f"<ul>{items}</ul>"]
    return parts


def _html_pair(pair: PairReport) -> list[str]:
    summary = pair["summary"]
    parts = [
        f"<h2>{_html_text(pair['label'])}</h2>",
        f"<p>{_html_text(pair_line(summary))}</p>",
        f'<p class="paired">{_html_text(paired_line(summary))}</p>',
        f'<p class="muted">{_html_text(classes_note(summary))}</p>',
        _html_table(PAIRED_HEADER, paired_rows(summary), "paired"),
    ]
    if summary.get("grades"):
        parts.append(f'<p class="muted">{_html_text(PAIRED_NOTE)}</p>')
        left_out = left_out_text(summary)
        if left_out:
            parts.append(f"<p>{_html_text(left_out)}</p>")
    backoff, by_endpoint = backoff_text(summary), serving_rows(summary)
    if backoff:
        parts.append(f"<p>{_html_text(backoff)}</p>")
    if by_endpoint:
        parts += ["<h3>By endpoint</h3>", _html_table(SERVING_HEADER, by_endpoint)]
    teacher = summary.get("teacher_forced")
    if teacher:
        parts += [
            "<h3>Teacher-forced</h3>",
            _html_table(["", ""], teacher_rows(teacher)),
            f'<figure class="plot">{delta_histogram_svg(pair)}</figure>',
            "<p>Flips by lane a's margin m:</p>",
            _html_table(MARGIN_HEADER, margin_rows(teacher)),
        ]
    if kld_line(summary.get("kld")):
        parts.append(f"<p>{_html_text(kld_line(summary['kld']))}</p>")
        parts.append(_html_table(KLD_PROMPT_HEADER, kld_prompt_rows(summary["kld"])))
    rows = lane_rows(pair.get("configuration"))
    if rows:
        differ = [row[0].removesuffix(" *") for row in rows if row[0].endswith(" *")]
        named = f": the lanes differ in {', '.join(differ)}" if differ else ""
        parts += [
            f"<details><summary>Configuration, {len(rows)} settings{_html_text(named)} "
            "(* where the lanes differ)</summary>",
            _html_table(LANE_HEADER, rows, "config"),
            "</details>",
        ]
    return parts
