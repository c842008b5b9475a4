"""The certificate as text (the terminal) and as a self-contained HTML page.

Both read the certificate's JSON only, so a certificate saved with --json renders the
same later. Every text a server or a model produced (token pieces, identities, reasons
quoting a server) is made visible (text) or escaped (HTML) here.
"""

from __future__ import annotations

from typing import Any

from specdiff.reports._markup import html_table, page_head, xml_text
from specdiff.safe_text import visible

VERDICT_MARKS = {"holds": "HOLDS", "broken": "BROKEN", "not tested": "NOT TESTED"}


def _number(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}g}"


def _subject_line(data: dict[str, Any]) -> str:
    subject = data["subject"]
    if subject.get("kind") == "server":
        what = f"{subject.get('engine', 'server')} at {subject.get('endpoint', '?')}"
    else:
        lane = subject.get("lane", {})
        what = (
            f"in-process {subject.get('model', 'model')} "
            f"(repack={lane.get('repack')}, threads={lane.get('threads')})"
        )
    flag = subject.get("mode_flag")
    return what + (f", with {flag}" if flag else "")


def fork_text(fork: dict[str, Any] | None) -> str:
    """The first fork in words: where, which picks, both margins."""
    if fork is None:
        return "no fork"
    margins = f"margins {_number(fork['reference_margin'])} / {_number(fork['other_margin'])}"
    return (
        f"token {fork['index']} ({fork['pair']}): {fork['reference_pick']!r} vs "
        f"{fork['other_pick']!r}, {margins}"
    )


def certificate_text(data: dict[str, Any]) -> str:
    lines = [
        f"specdiff certificate: {_subject_line(data)}",
        f"outcome: {data['outcome']}",
        "",
    ]
    for entry in data["properties"]:
        mark = VERDICT_MARKS[entry["verdict"]]
        lines.append(f"{mark:<10}  {entry['title']}")
        lines.append(f"            {entry['why']}")
        if entry["compared"]:
            lines.append(
                f"            {entry['identical']} of {entry['compared']} identical; first fork: "
                f"{fork_text(entry['fork'])}; largest log-probability difference "
                f"{_number(entry['largest_difference'])}"
            )
        proof = entry.get("proof") or {}
        if proof.get("how") and entry["verdict"] == "broken":  # a hold's reason says it
            lines.append(f"            evidence: {proof['how']}")
    control = data.get("control")
    if control:
        lines += ["", f"without the switch ({control['endpoint']}): {control['outcome']}"]
    cost = data.get("cost") or {}
    if cost.get("wall_seconds") is not None:
        speed = cost.get("tokens_per_second")
        lines += [
            "",
            f"cost: {cost['requests']} requests, {cost['tokens']} tokens in "
            f"{cost['wall_seconds']:.1f} s ({_number(speed)} tokens/s while requests ran; "
            f"battery / request time {_number(cost.get('overhead'))})",
        ]
        if cost.get("bare_client_seconds") is not None:
            lines.append(
                f"      one {cost['bare_client_tokens']}-token request: "
                f"{cost['bare_client_seconds']:.2f} s from a bare client, "
                f"{cost['through_specdiff_seconds']:.2f} s streamed through specdiff"
            )
        if cost.get("against_other") is not None:
            lines.append(
                f"      throughput against the other endpoint: {cost['against_other']:.2f}x"
            )
    lines += ["", *(f"note: {note}" for note in data.get("notes", []))]
    return "\n".join(visible(line) if line else line for line in lines)


STYLE = """
.verdict{font-weight:600;padding:1px 6px;border-radius:4px}
.holds{background:#1a7f37;color:#fff}.broken{background:#cf222e;color:#fff}
.not-tested{background:#59636e;color:#fff}
main{max-width:1100px;margin:auto;padding:0 16px}
"""


def _row(entry: dict[str, Any]) -> str:
    css = entry["verdict"].replace(" ", "-")
    proof = (entry.get("proof") or {}).get("how", "")
    cells = [
        f'<td><span class="verdict {css}">{xml_text(VERDICT_MARKS[entry["verdict"]])}</span></td>',
        f"<td>{xml_text(entry['title'])}</td>",
        f"<td>{xml_text(entry['why'])}</td>",
        f"<td>{entry['identical']} of {entry['compared']}</td>",
        f"<td>{xml_text(fork_text(entry['fork']))}</td>",
        f"<td>{xml_text(_number(entry['largest_difference']))}</td>",
        f"<td>{xml_text(proof)}</td>",
    ]
    return f'<tr class="property" data-verdict="{xml_text(entry["verdict"])}">{"".join(cells)}</tr>'


def certificate_html(data: dict[str, Any]) -> str:
    header = [
        "verdict",
        "property",
        "why",
        "identical",
        "first fork",
        "largest difference",
        "evidence it happened",
    ]
    table = html_table(header, [_row(entry) for entry in data["properties"]], css_class="cert")
    parts = [
        page_head("specdiff certificate", STYLE),
        "<body><main>",
        "<h1>specdiff certificate</h1>",
        f"<p>{xml_text(_subject_line(data))}</p>",
        f'<p id="outcome"><strong>{xml_text(data["outcome"])}</strong></p>',
        table,
    ]
    control = data.get("control")
    if control:
        parts.append(
            f"<h2>Without the switch</h2><p>{xml_text(control['endpoint'])}: "
            f"{xml_text(control['outcome'])}</p>"
        )
    cost = data.get("cost") or {}
    if cost.get("wall_seconds") is not None:
        parts.append(
            f"<h2>Cost</h2><p>{cost['requests']} requests, {cost['tokens']} tokens in "
            f"{cost['wall_seconds']:.1f} s; {xml_text(_number(cost.get('tokens_per_second')))} "
            "tokens/s while requests ran</p>"
        )
    notes = "".join(f"<li>{xml_text(note)}</li>" for note in data.get("notes", []))
    parts += [f'<ul class="muted">{notes}</ul>', "</main></body></html>\n"]
    return "\n".join(parts)
