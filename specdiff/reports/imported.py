"""The report of two imported evaluation runs: report.json, report.md and report.html,
each rendered from the one object `ImportComparison.to_json` builds, so they cannot
disagree. Prompts, outputs, task and metric names come from the tools' files: every
Markdown cell goes through `markdown_cell`, every HTML text through `visible` and
`html.escape`, and report.json through `json_text`, as in a suite's report.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from specdiff.files import write_text_atomic
from specdiff.json_numbers import finite_everywhere
from specdiff.reports._markup import html_table, md_table, page_head
from specdiff.safe_text import json_text, markdown_cell, visible

METRIC_HEADER = ("metric", "items", "passed a", "passed b", "worse", "better", "McNemar p")
ITEM_HEADER = ("item", "parted at", "prompt", "a", "b", "grades a → b", "rerun fork")
SHOWN = 160
"""Characters of a prompt or an output shown in a table cell (report.json has them whole)."""
LEAD = 40
"""Characters of the shared text shown before the point where two outputs part."""
OWN_STYLE = """
body{max-width:1200px;margin:2rem auto;padding:0 1rem}
td.text{font-family:ui-monospace,monospace;white-space:pre-wrap;max-width:28rem}
"""


def write_import_reports(folder: Path, data: Mapping[str, Any]) -> list[Path]:
    """report.json, report.md and report.html in `folder`, each whole or not at all."""
    folder.mkdir(parents=True, exist_ok=True)
    rendered = {
        "report.json": report_json(data),
        "report.md": markdown(data),
        "report.html": html_report(data),
    }
    for name, text in rendered.items():
        write_text_atomic(folder / name, text)
    return [folder / name for name in rendered]


def report_json(data: Mapping[str, Any]) -> str:
    return json_text(json.dumps(finite_everywhere(dict(data)), indent=1, ensure_ascii=False)) + "\n"


def _rate(rate: Mapping[str, Any] | None) -> str:
    if rate is None:
        return "–"
    low, high = rate["interval"] or (0.0, 0.0)
    return f"{rate['count']}/{rate['of']} [{low:.2f}, {high:.2f}]"


def metric_rows(metrics: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    """A row per metric: pass rates with their Wilson 95% intervals, flips, McNemar."""
    rows = []
    for m in metrics:
        passed = m["passed"] or (None, None)
        p = m["mcnemar_p"]
        rows.append([
            m["metric"], str(m["items"]), _rate(passed[0]), _rate(passed[1]),
            str(len(m["worse"])), str(len(m["better"])), "–" if p is None else f"{p:.3g}",
        ])  # fmt: skip
    return rows


def _rerun(pair: Mapping[str, Any]) -> str:
    run = pair.get("rerun")
    if run is None:
        return "–"
    if run["fork_index"] is None:
        return f"{run['pair']}: identical" if run["identical"] else f"{run['pair']}: no fork"
    margins = "/".join(f"{m:.3f}" for m in run["fork_margins"] or ())
    return f"{run['pair']}: token {run['fork_index']}, margins {margins}"


def _grades(pair: Mapping[str, Any]) -> str:
    a, b = pair["grades"]
    changed = [f"{k} {a[k]:g}→{b[k]:g}" for k in a if k in b and a[k] != b[k]]
    return ", ".join(changed) or "same"


def item_rows(group: Mapping[str, Any], cut: Callable[[str], str]) -> list[list[str]]:
    """A row per item whose outputs differ, each output shown from a little before the
    character where the two part."""
    rows = []
    for pair in group["pairs"]:
        if not pair["differs"]:
            continue
        start = max(0, pair["parted_at"] - LEAD)
        a, b = (("…" if start else "") + text[start:] for text in pair["output"])
        rows.append([
            str(pair["item"]), str(pair["parted_at"]), cut(pair["prompt"]), cut(a), cut(b),
            _grades(pair), _rerun(pair),
        ])  # fmt: skip
    return rows


def _cut(text: str) -> str:
    return visible(text, SHOWN)


def _notes(data: Mapping[str, Any]) -> list[str]:
    runs = data["runs"]
    return [f"a: {runs[0]}", f"b: {runs[1]}", *data["notes"]]


def markdown(data: Mapping[str, Any]) -> str:
    lines = [f"# {data['tool']} runs compared", "", markdown_cell(data["summary"]), ""]
    lines += [f"- {markdown_cell(note)}" for note in _notes(data)] + [""]
    lines += _md_metrics(data["metrics"])
    for group in data["groups"]:
        lines += [f"## {markdown_cell(group['group'])}", ""]
        lines += [f"{group['differing']} of {group['items']} items differ.", ""]
        lines += _md_metrics(group["metrics"])
        rows = item_rows(group, _cut)
        if rows:
            lines += [*md_table(ITEM_HEADER, rows, markdown_cell), ""]
    return "\n".join(lines)


def _md_metrics(metrics: Sequence[Mapping[str, Any]]) -> list[str]:
    if not metrics:
        return []
    return [*md_table(METRIC_HEADER, metric_rows(metrics), markdown_cell), ""]


def _text(text: str) -> str:
    return html.escape(visible(text))


def _html_rows(rows: list[list[str]], text_columns: frozenset[int] = frozenset()) -> Iterator[str]:
    for row in rows:
        cells = "".join(
            f'<td class="text">{_text(c)}</td>' if i in text_columns else f"<td>{_text(c)}</td>"
            for i, c in enumerate(row)
        )
        yield f"<tr>{cells}</tr>"


def html_report(data: Mapping[str, Any]) -> str:
    title = _text(f"{data['tool']} runs compared")
    parts = [page_head(title, OWN_STYLE), "<body>", f"<h1>{title}</h1>"]
    parts.append(f"<p>{_text(data['summary'])}</p>")
    parts.append("<ul>" + "".join(f"<li>{_text(n)}</li>" for n in _notes(data)) + "</ul>")
    parts.append(html_table(METRIC_HEADER, _html_rows(metric_rows(data["metrics"]))))
    for group in data["groups"]:
        parts.append(f"<h2>{_text(group['group'])}</h2>")
        parts.append(f"<p>{group['differing']} of {group['items']} items differ.</p>")
        parts.append(html_table(METRIC_HEADER, _html_rows(metric_rows(group["metrics"]))))
        rows = item_rows(group, _cut)
        if rows:
            parts.append(html_table(ITEM_HEADER, _html_rows(rows, frozenset({2, 3, 4}))))
    parts.append("</body>\n</html>\n")
    return "\n".join(parts)
