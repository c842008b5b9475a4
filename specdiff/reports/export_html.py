"""An exported session as one HTML page with inline CSS and no scripts: the fork token
marked, near ties before it underlined, tokens after it that the other lane does not
share tinted, margins on hover.
"""

from __future__ import annotations

from collections.abc import Sequence

from specdiff import __version__
from specdiff.compare import Fork
from specdiff.reports._markup import html_table, page_head, xml_text
from specdiff.reports.autopsy import format_autopsy, growth_svg
from specdiff.reports.export_content import (
    AUTOPSY_HEADING,
    FORK_HEADER,
    LANE_IDS,
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
from specdiff.reports.text import pick_text
from specdiff.safe_text import pictured

_CSS = """
:root{--mark:#ffd28a;--fork:#d1242f;--changed:rgba(224,118,27,.16);--tie:#3b7dd8;
--differs:rgba(209,36,47,.08);--partial:#9a6700;--complete:#1a7f37}
@media (prefers-color-scheme: dark){:root{--mark:#7a4a00;--fork:#ff7b72;
--changed:rgba(224,118,27,.24);--tie:#79b8ff;--differs:rgba(255,123,114,.12);--partial:#d29922;
--complete:#3fb950}}
body{margin:0}
main{max-width:1120px;margin:0 auto;padding:24px}
h1{font-size:1.5em;margin:0 0 4px}h2{font-size:1.2em;margin:28px 0 8px}
h3{font-size:1em;margin:16px 0 6px}
figcaption{color:var(--muted)}
.state{display:inline-block;padding:0 8px;border-radius:10px;border:1px solid currentColor;
font-size:.85em;margin-left:6px}
.state.partial{color:var(--partial)}.state.complete{color:var(--complete)}
.verdict{font-size:1.15em;font-weight:600}
pre{white-space:pre-wrap;overflow-wrap:anywhere;margin:0;padding:12px;background:var(--code);
border:1px solid var(--border);border-radius:6px;
font:13px/1.55 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
code{font:13px ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;overflow-wrap:anywhere}
mark{background:var(--mark);color:inherit;outline:2px solid var(--fork);border-radius:2px}
.changed{background:var(--changed)}
.tie{text-decoration:underline dotted var(--tie);text-underline-offset:3px}
.lanes{display:grid;grid-template-columns:repeat(auto-fit,minmax(340px,1fr));gap:16px}
table{margin:4px 0}
tr.differs>*{background:var(--differs)}
footer{margin-top:32px;color:var(--muted);font-size:.85em}
"""
"""What a session export adds to the base stylesheet: the fork, near-tie and changed-token
marks, the state badge and the lane grid."""


def _html_rows(
    header: Sequence[str], rows: Sequence[Sequence[str]], differs: Sequence[bool] | None = None
) -> str:
    """A table whose first column heads each row; cell text is escaped here, so callers
    pass plain text."""
    body = []
    for number, row in enumerate(rows):
        marked = differs is not None and differs[number]
        cells = [f"<th>{xml_text(row[0])}</th>"]
        cells += [f"<td><code>{xml_text(pictured(cell))}</code></td>" for cell in row[1:]]
        attribute = ' class="differs"' if marked else ""
        body.append(f"<tr{attribute}>{''.join(cells)}</tr>")
    return html_table(header, body)


def _html_text(report: SessionReport, lane_id: str) -> str:
    """A lane's text with the fork token in a <mark>, near ties before it underlined, and
    tokens after it that the other lane does not share tinted."""
    steps = report.steps(lane_id)
    texts = report.token_texts[lane_id]
    fork = report.fork
    threshold = report.comparison.near_tie_threshold
    changed = report.changed[lane_id]
    parts: list[str] = []
    run: list[str] = []
    run_class = ""

    def flush() -> None:
        if run:
            text = xml_text(pictured("".join(run)))
            parts.append(f'<span class="{run_class}">{text}</span>' if run_class else text)
            run.clear()

    for index, (step, text) in enumerate(zip(steps, texts)):
        if fork is not None and index == fork.index:
            flush()
            parts.append(
                f'<mark id="fork-{lane_id}" title="{xml_text(_fork_tooltip(fork, lane_id))}">'
                f"{xml_text(pictured(text))}</mark>"
            )
            continue
        before_fork = fork is None or index < fork.index
        if before_fork and step.margin < threshold:
            flush()
            parts.append(
                f'<span class="tie" title="near tie at token {index}: margin '
                f'{step.margin:.3f}">{xml_text(pictured(text))}</span>'
            )
            continue
        wanted = "changed" if index in changed else ""
        if wanted != run_class:
            flush()
            run_class = wanted
        run.append(text)
    flush()
    return "".join(parts)


def _fork_tooltip(fork: Fork, lane_id: str) -> str:
    view = fork.a if lane_id == "a" else fork.b
    other_lane = "b" if lane_id == "a" else "a"
    pieces = {fork.token_a: fork.piece_a, fork.token_b: fork.piece_b}
    return (
        f"fork at token {fork.index} · lane {lane_id} margin {view.margin:.3f} · "
        f"own pick {pick_text(view.own, pieces)} · "
        f"lane {other_lane}'s pick {pick_text(view.other, pieces)}"
    )


def html_document(report: SessionReport) -> str:
    sections = (
        _html_opening,
        _html_fork,
        _html_autopsy,
        _html_margins,
        _html_texts,
        _html_configuration,
    )
    body = [line for section in sections for line in section(report)]
    body.append(
        f"<footer>{xml_text(report.session.path.name)} · exported by specdiff "
        f"{xml_text(__version__)}</footer>"
    )
    return (
        page_head(xml_text(document_title(report.session)), _CSS)
        + "<body>\n<main>\n"
        + "\n".join(body)
        + "\n</main>\n</body>\n</html>\n"
    )


def _html_opening(report: SessionReport) -> list[str]:
    session = report.session
    header = session.header
    state = "partial" if session.partial else "complete"
    return [
        "<header>",
        f"<h1>specdiff {xml_text(session.pair.name)}"
        f'<span class="state {state}">{state}</span></h1>',
        f'<p class="muted">{xml_text(session.pair.description)} · created '
        f"{xml_text(header.created)}</p>",
        "</header>",
        f'<p class="verdict">{xml_text(verdict(session, report.comparison))}</p>',
        "<h2>Prompt</h2>",
        *(
            (f'<h3 class="muted">{xml_text(title)}</h3>' if title else "")
            + f'<pre class="prompt">{xml_text(pictured(text))}</pre>'
            for title, text in prompt_parts(session)
        ),
    ]


def _html_autopsy(report: SessionReport) -> list[str]:
    autopsy = report.autopsy
    if autopsy is None:
        return []
    return [
        f"<h2>{xml_text(AUTOPSY_HEADING.removeprefix('## '))}</h2>",
        f'<pre class="prompt">{xml_text(format_autopsy(autopsy))}</pre>',
        *([] if not autopsy.layers else [growth_svg(autopsy)]),
    ]


def _html_fork(report: SessionReport) -> list[str]:
    fork = report.fork
    out = [f"<h2>{xml_text(fork_heading(fork))}</h2>"]
    if fork is not None:
        out.append(_html_rows(FORK_HEADER, fork_rows(fork)))
    return out + [f"<p>{xml_text(line)}</p>" for line in findings(report)]


def _html_margins(report: SessionReport) -> list[str]:
    return [
        "<h2>Margins</h2>",
        "<figure>",
        margin_svg(report),
        "<figcaption>Top-1 minus top-2 logit at every step; below the dashed line a step "
        "was a near tie. Open circles are above the plotted range.</figcaption>",
        "</figure>",
    ]


def _html_texts(report: SessionReport) -> list[str]:
    out = [
        "<h2>Texts</h2>",
        '<p class="muted">The fork token is <mark>marked</mark>; before it, '
        '<span class="tie">near ties</span> are underlined; after it, '
        '<span class="changed">tokens the other lane does not share</span> are tinted. '
        "Hover for margins.</p>",
        '<div class="lanes">',
    ]
    for lane_id in LANE_IDS:
        description = lane_description(report.session, lane_id)
        out += [
            "<section>",
            f"<h3>Lane {lane_id}: {xml_text(description)} "
            f'<span class="muted">({len(report.steps(lane_id))} tokens)</span></h3>',
            f'<pre class="text">{_html_text(report, lane_id)}</pre>',
            "</section>",
        ]
    return [*out, "</div>"]


def _html_configuration(report: SessionReport) -> list[str]:
    out = ["<h2>Configuration</h2>"]
    for table in config_tables(report):
        note = table.note.format(differs="shaded")
        shown = f' <span class="muted">({xml_text(note)})</span>' if note else ""
        out.append(f"<h3>{table.title}{shown}</h3>")
        out.append(_html_rows(table.header, table.rows, table.differs))
    return out
