"""One saved session as a self-contained report: Markdown, HTML or JSON.

Every number comes from the session's own records through compare.py and the text
summary's formatting, so a report says exactly what `specdiff run` and the TUI say.
A report needs nothing beside itself: the margin plot is inline SVG (a data URI in
Markdown), the HTML has inline CSS and no scripts, and nothing refers to the network.
"""

from __future__ import annotations

import base64
import codecs
import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdiff import __version__
from specdiff.autopsy import Autopsy, load_saved, saved_beside
from specdiff.chat import Conversation
from specdiff.compare import (
    DEFAULT_NEAR_TIE,
    DEFAULT_SPLIT_THRESHOLD,
    Comparison,
    Fork,
    ForkVerdict,
    run_fork_verdict,
)
from specdiff.control import control_sentence
from specdiff.errors import SpecdiffError, did_you_mean
from specdiff.files import lost_output, write_text_atomic
from specdiff.fork_words import run_fork_account, verdict_description
from specdiff.json_numbers import finite_everywhere
from specdiff.lanes import differences, headline
from specdiff.reports._markup import (
    html_table,
    md_block,
    md_code,
    md_escape,
    md_table,
    page_head,
    without_surrogates,
    xml_text,
)
from specdiff.reports.autopsy import format_autopsy, growth_svg
from specdiff.reports.svg import margin_plot
from specdiff.reports.text import (
    determinism_note,
    fork_json,
    pick_text,
    piece_text,
    rescored_note,
    unrescored_note,
)
from specdiff.safe_text import json_text, pictured, terminal_text
from specdiff.sessions.records import MEASURED_FIELDS
from specdiff.sessions.store import Session
from specdiff.steps import TokenStep, text_of

FORMATS = ("md", "html", "json")
SUFFIX_FORMATS = {".md": "md", ".markdown": "md", ".html": "html", ".htm": "html", ".json": "json"}
EXPORT_SCHEMA = "specdiff-export"
EXPORT_VERSION = 1
LANE_IDS = ("a", "b")

FORK_OPEN, FORK_CLOSE = "⟦", "⟧"

FORK_HEADER = ("lane", "margin", "its own pick: logit (rank, p)", "the other lane's pick")
LANE_HEADER = ("key", "lane a", "lane b")
KEY_VALUE_HEADER = ("key", "value")


class ExportError(SpecdiffError):
    """A report that cannot be made or written: bad format, or an output in the way."""


def report_format(requested: str | None, output: str | None) -> str:
    """--format if given, else what --output's suffix says, else Markdown."""
    if requested is not None:
        wanted = requested.strip().lower()
        if wanted not in FORMATS:
            raise ExportError(
                f"unknown format {requested!r}; {did_you_mean(wanted, FORMATS)}choose one of "
                f"{', '.join(FORMATS)}"
            )
        return wanted
    if output and output != "-":
        return SUFFIX_FORMATS.get(Path(output).suffix.lower(), "md")
    return "md"


AUTOPSY_HEADING = "## Why it forked, traced (specdiff explain)"
"""The section an export gains when the session's autopsy was saved beside it."""


# --- what every format shows -----------------------------------------------------


@dataclass(frozen=True)
class _Report:
    session: Session
    comparison: Comparison
    token_texts: dict[str, list[str]]
    """Each lane's text split by token, a character going to the token that completes it."""
    changed: dict[str, frozenset[int]]
    """Token indices after the fork that the other lane does not share."""
    verdict: ForkVerdict | None
    """The fork's class (in a teacher-forced session, the first flip's)."""
    why: str | None
    """Why the lanes forked: probabilities first, then logits; None without a fork."""
    autopsy: Autopsy | None = None
    """The fork traced to a setting and a layer (`specdiff explain SESSION --save` writes
    it beside the session), None where there is none."""

    @property
    def fork(self) -> Fork | None:
        return self.comparison.fork

    def steps(self, lane_id: str) -> list[TokenStep]:
        return self.session.steps[lane_id]

    def footer_value(self, key: str, lane_id: str) -> Any:
        """A per-lane footer field ([a, b]); None for a partial session."""
        footer = self.session.footer
        return None if footer is None else getattr(footer, key)[LANE_IDS.index(lane_id)]


def token_texts(steps: Sequence[TokenStep]) -> list[str]:
    """Per-token text that joins to exactly text_of(steps): a token may hold part of a
    UTF-8 character, and decoding it alone would show a replacement character where
    the whole text has none."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    texts = [decoder.decode(step.piece) for step in steps]
    tail = decoder.decode(b"", final=True)
    if tail:
        texts[-1] += tail
    return texts


def _changed_tokens(comparison: Comparison) -> dict[str, frozenset[int]]:
    fork = comparison.fork
    if fork is None:
        # no fork: only a lane that ran longer has tokens of its own
        shorter = min(comparison.length_a, comparison.length_b)
        return {
            "a": frozenset(range(shorter, comparison.length_a)),
            "b": frozenset(range(shorter, comparison.length_b)),
        }
    changed_a: set[int] = set()
    changed_b: set[int] = set()
    opcodes = comparison.after_fork.opcodes if comparison.after_fork is not None else ()
    for tag, a_start, a_end, b_start, b_end in opcodes:
        if tag != "equal":
            changed_a.update(range(fork.index + a_start, fork.index + a_end))
            changed_b.update(range(fork.index + b_start, fork.index + b_end))
    return {"a": frozenset(changed_a), "b": frozenset(changed_b)}


def _report(session: Session, near_tie: float) -> _Report:
    comparison = session.comparison(near_tie)
    return _Report(
        session,
        comparison,
        {lane_id: token_texts(session.steps[lane_id]) for lane_id in LANE_IDS},
        _changed_tokens(comparison),
        run_fork_verdict(
            session.steps["a"], session.steps["b"], session.header.teacher_forced, near_tie
        ),
        run_fork_account(
            session.steps["a"], session.steps["b"], session.header.teacher_forced, near_tie
        ),
        _saved_autopsy(session),
    )


def _saved_autopsy(session: Session) -> Autopsy | None:
    """The autopsy saved beside the session, when it is of this session's pair; a
    damaged one is one line naming it (AutopsyError), not an export without it."""
    path = saved_beside(session.path)
    if not path.is_file():
        return None
    autopsy = load_saved(path)
    return autopsy if autopsy.pair == session.pair.name else None


def verdict(session: Session, comparison: Comparison) -> str:
    """One line: identical, forked at token N of M, or what a partial session holds."""
    fork = comparison.fork
    length_a, length_b = comparison.length_a, comparison.length_b
    if fork is not None:
        text = f"forked at token {fork.index} of {max(length_a, length_b)}"
    elif session.stopped:
        text = f"no fork in the tokens recorded (lane a {length_a}, lane b {length_b})"
    elif comparison.identical:
        text = f"identical: both lanes produced the same {length_a} tokens"
    else:
        text = f"same tokens, different lengths: lane a {length_a}, lane b {length_b}"
    if session.cut_note is not None:
        return f"partial (the file is {session.cut_note}): {text}"
    if session.partial:
        return f"partial (the run did not finish): {text}"
    if session.footer is not None and session.footer.crashed:
        return f"crashed (the lanes' process died): {text}"
    if session.footer is not None and session.footer.cancelled:
        return f"{text} (the run was stopped early)"
    return text


def _title(session: Session) -> str:
    if session.partial:
        state = "partial"
    elif session.footer is not None and session.footer.crashed:
        state = "crashed"
    else:
        state = "complete"
    return f"specdiff {session.pair.name}: {session.header.created} ({state})"


def _lane_description(session: Session, lane_id: str) -> str:
    """What the lane is, leading with what differs from the other lane (as the TUI heads
    its panes)."""
    pair = session.pair
    return headline(pair.a, pair.b) if lane_id == "a" else headline(pair.b, pair.a)


def _fork_rows(fork: Fork) -> list[tuple[str, str, str, str]]:
    """Per lane: margin, its own pick and the other lane's pick as that lane scored them,
    formatted as the text summary formats them."""
    pieces = {fork.token_a: fork.piece_a, fork.token_b: fork.piece_b}
    return [
        (lane_id, f"{view.margin:.3f}", pick_text(view.own, pieces), pick_text(view.other, pieces))
        for lane_id, view in (("a", fork.a), ("b", fork.b))
    ]


def _fork_heading(fork: Fork | None) -> str:
    if fork is None:
        return "No fork"
    return (
        f"At the fork: token {fork.index}: lane a picked {piece_text(fork.piece_a)}, "
        f"lane b picked {piece_text(fork.piece_b)}"
    )


def _indices(indices: Sequence[int]) -> str:
    return ", ".join(str(i) for i in indices) if indices else "none"


def _findings(report: _Report) -> list[str]:
    """Sentences under the fork: its class, where the near ties lie, and how alike the
    texts stay after the fork."""
    comparison = report.comparison
    where = "before the fork" if comparison.fork is not None else "in the whole run"
    lines = [] if report.why is None else [f"Why it forked: {report.why}."]
    if report.verdict is not None:
        lines.append(f"Fork class: {verdict_description(report.verdict)}.")
    lines += [
        f"Near ties {where} (margin < {comparison.near_tie_threshold:g}): "
        f"lane a at {_indices(comparison.near_ties_a)}; "
        f"lane b at {_indices(comparison.near_ties_b)}."
    ]
    after = comparison.after_fork
    if after is not None:
        lines.append(
            f"After the fork the texts stay {after.similarity:.0%} similar "
            "(normalized Indel similarity)."
        )
    control = control_sentence(report.session.summary())
    if control is not None:
        lines.append(f"{control[0].upper()}{control[1:]}.")
    return lines + _lane_notes(report)


def _lane_notes(report: _Report) -> list[str]:
    """Per lane: where its numbers at the fork came from when rescored, and a server
    lane's determinism setup beside the result."""
    fork = report.comparison.fork
    notes = []
    for lane_id, lane in (("a", report.session.pair.a), ("b", report.session.pair.b)):
        rescored = "" if fork is None else rescored_note(report.steps(lane_id), fork.index)
        if rescored:
            notes.append(f"Lane {lane_id} at the fork: an accepted draft{rescored}.")
        if lane.backend == "server":
            notes.append(f"Lane {lane_id}: {determinism_note(lane)}.")
        unrescored = unrescored_note(report.session.header.executed[lane_id])
        if unrescored:
            notes.append(f"Lane {lane_id}: {unrescored}.")
    return notes


def _value_text(value: Any) -> str:
    if isinstance(value, str):
        return value if value else '""'
    return json.dumps(value, ensure_ascii=False)


def _config_rows(table_a: dict[str, Any], table_b: dict[str, Any]) -> list[tuple[str, str, str]]:
    keys = list(table_a) + [key for key in table_b if key not in table_a]
    return [
        (
            key,
            _value_text(table_a.get(key)) if key in table_a else "—",
            _value_text(table_b.get(key)) if key in table_b else "—",
        )
        for key in keys
    ]


def _run_rows(report: _Report) -> list[tuple[str, ...]]:
    """Per-lane facts of the run: counts, speed, stop reason, hashes."""
    executed = report.session.header.executed
    partial_note = "— (partial)" if report.session.partial else "—"

    def footer(key: str, lane_id: str, shown: str = "{}") -> str:
        value = report.footer_value(key, lane_id)
        return partial_note if value is None else shown.format(value)

    rows = [
        ("what", *(_lane_description(report.session, lane) for lane in LANE_IDS)),
        ("tokens recorded", *(str(len(report.steps(lane))) for lane in LANE_IDS)),
        ("tokens/s", *(footer("tokens_per_second", lane, "{:.1f}") for lane in LANE_IDS)),
        ("stop reason", *(footer("stop_reasons", lane) for lane in LANE_IDS)),
        ("output sha256", *(footer("output_sha256", lane) for lane in LANE_IDS)),
        (
            "model sha256",
            *(str(executed[lane].get("model_sha256", "—")) for lane in LANE_IDS),
        ),
    ]
    if any(report.footer_value("errors", lane) for lane in LANE_IDS):
        error_a, error_b = (str(report.footer_value("errors", lane) or "") for lane in LANE_IDS)
        rows.append(("error", error_a, error_b))
    return rows


def _source_rows(report: _Report) -> list[tuple[str, str]]:
    header = report.session.header
    return [
        ("file", report.session.path.name),
        ("session schema", _value_text(header.schema)),
        ("written by specdiff", _value_text(header.specdiff)),
        ("exported by specdiff", __version__),
        ("prompt tokens", str(len(header.prompt_token_ids))),
        ("max tokens", _value_text(header.max_tokens)),
        ("stop strings", _value_text(list(header.stop))),
    ]


@dataclass(frozen=True)
class _Table:
    """One table of the configuration section, as every format shows it."""

    title: str
    note: str
    """Shown after the title in parentheses; {differs} is how the format marks a row."""
    header: tuple[str, ...]
    rows: Sequence[Sequence[str]]
    differs: Sequence[bool] | None = None
    literal: bool = True
    """Values are settings and hashes (code) rather than prose."""


def _config_tables(report: _Report) -> list[_Table]:
    """The run's facts, both lanes' settings (asked and executed), the build, the file."""
    session = report.session
    header = session.header
    executed = header.executed
    differing = set(differences(session.pair.a, session.pair.b))
    lane_rows = _config_rows(session.pair.a.as_dict(), session.pair.b.as_dict())
    executed_rows = _config_rows(executed["a"], executed["b"])
    build = [(key, _value_text(value)) for key, value in header.build.items()]
    return [
        _Table("Run", "", ("", "lane a", "lane b"), _run_rows(report), literal=False),
        _Table(
            "Lanes",
            "every key; {differs} where they differ",
            LANE_HEADER,
            lane_rows,
            [key in differing for key, _, _ in lane_rows],
        ),
        _Table(
            "Executed",
            "as llama.cpp applied it",
            LANE_HEADER,
            executed_rows,
            [a != b for _, a, b in executed_rows],
        ),
        _Table("Build", "", KEY_VALUE_HEADER, build),
        _Table("Session", "", KEY_VALUE_HEADER, _source_rows(report)),
    ]


def _plot(report: _Report) -> str:
    return margin_plot(
        [step.margin for step in report.steps("a")],
        [step.margin for step in report.steps("b")],
        fork_index=None if report.fork is None else report.fork.index,
        near_tie=report.comparison.near_tie_threshold,
        title=f"Logit margin per token, {report.session.pair.name}",
    )


# --- Markdown -----------------------------------------------------------------------


def _marked_text(report: _Report, lane_id: str) -> str:
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


def _markdown(report: _Report) -> str:
    sections = (_md_opening, _md_fork, _md_autopsy, _md_margins, _md_texts, _md_configuration)
    return "\n".join(line for section in sections for line in section(report)) + "\n"


def _md_opening(report: _Report) -> list[str]:
    session = report.session
    out = [f"# {md_escape(_title(session))}", ""]
    if session.pair.description:
        out += [md_escape(session.pair.description), ""]
    out += [f"**Verdict:** {md_escape(verdict(session, report.comparison))}", ""]
    out += ["## Prompt", ""]
    for title, text in _prompt_parts(session):
        out += [f"**{md_escape(title)}**", ""] if title else []
        out += [md_block(pictured(text)), ""]
    return out


def _prompt_parts(session: Session) -> list[tuple[str, str]]:
    """The prompt as a document shows it: the text; or a conversation's messages, each
    under its role, then each chat lane's prompt as its template formatted it."""
    prompt = session.prompt
    if not isinstance(prompt, Conversation):
        return [("", prompt)]
    parts = [(message.role, message.content) for message in prompt.messages]
    formatted = session.header.lane_prompts
    shared = len(formatted) == 2 and formatted["a"] == formatted["b"]
    for lane_id, lane_prompt in sorted(formatted.items())[: 1 if shared else 2]:
        whose = (
            "both lanes, as their chat template formats it"
            if shared
            else (f"lane {lane_id}, as its chat template formats it")
        )
        count = len(lane_prompt.get("token_ids", ()))
        parts.append((f"{whose} ({count} tokens)", str(lane_prompt.get("text", ""))))
    return parts


def _md_autopsy(report: _Report) -> list[str]:
    if report.autopsy is None:
        return []
    return [AUTOPSY_HEADING, "", md_block(format_autopsy(report.autopsy)), ""]


def _md_fork(report: _Report) -> list[str]:
    fork = report.fork
    out = [f"## {md_escape(_fork_heading(fork))}", ""]
    if fork is not None:
        rows = [
            [lane, margin, md_code(own), md_code(other)]
            for lane, margin, own, other in _fork_rows(fork)
        ]
        out += [*md_table(FORK_HEADER, rows), ""]
    for line in _findings(report):
        out += [md_escape(line), ""]
    return out


def _md_margins(report: _Report) -> list[str]:
    plot = base64.b64encode(_plot(report).encode("utf-8")).decode("ascii")
    return [
        "## Margins",
        "",
        f"![Logit margin per token for both lanes](data:image/svg+xml;base64,{plot})",
        "",
    ]


def _md_texts(report: _Report) -> list[str]:
    out = ["## Texts", ""]
    if report.fork is not None:
        out += [f"The token at the fork is between {FORK_OPEN} and {FORK_CLOSE}.", ""]
    for lane_id in LANE_IDS:
        description = _lane_description(report.session, lane_id)
        count = len(report.steps(lane_id))
        out += [f"### Lane {lane_id}: {md_escape(description)} ({count} tokens)", ""]
        out += [md_block(pictured(_marked_text(report, lane_id))), ""]
    return out


def _md_configuration(report: _Report) -> list[str]:
    out = ["## Configuration"]
    for table in _config_tables(report):
        note = f" ({table.note.format(differs='≠ marks')})" if table.note else ""
        rows = [_md_config_row(table, number) for number in range(len(table.rows))]
        out += ["", f"### {table.title}{note}", "", *md_table(table.header, rows)]
    return out


def _md_config_row(table: _Table, number: int) -> list[str]:
    name, *values = table.rows[number]
    marked = table.differs is not None and table.differs[number]
    value_text = md_code if table.literal else md_escape
    return [
        f"**{md_escape(name)}** ≠" if marked else md_escape(name),
        *(value_text(value) for value in values),
    ]


# --- HTML ---------------------------------------------------------------------------

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


def _html_text(report: _Report, lane_id: str) -> str:
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


def _html(report: _Report) -> str:
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
        page_head(xml_text(_title(report.session)), _CSS)
        + "<body>\n<main>\n"
        + "\n".join(body)
        + "\n</main>\n</body>\n</html>\n"
    )


def _html_opening(report: _Report) -> list[str]:
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
            for title, text in _prompt_parts(session)
        ),
    ]


def _html_autopsy(report: _Report) -> list[str]:
    autopsy = report.autopsy
    if autopsy is None:
        return []
    return [
        f"<h2>{xml_text(AUTOPSY_HEADING.removeprefix('## '))}</h2>",
        f'<pre class="prompt">{xml_text(format_autopsy(autopsy))}</pre>',
        *([] if not autopsy.layers else [growth_svg(autopsy)]),
    ]


def _html_fork(report: _Report) -> list[str]:
    fork = report.fork
    out = [f"<h2>{xml_text(_fork_heading(fork))}</h2>"]
    if fork is not None:
        out.append(_html_rows(FORK_HEADER, _fork_rows(fork)))
    return out + [f"<p>{xml_text(line)}</p>" for line in _findings(report)]


def _html_margins(report: _Report) -> list[str]:
    return [
        "<h2>Margins</h2>",
        "<figure>",
        _plot(report),
        "<figcaption>Top-1 minus top-2 logit at every step; below the dashed line a step "
        "was a near tie. Open circles are above the plotted range.</figcaption>",
        "</figure>",
    ]


def _html_texts(report: _Report) -> list[str]:
    out = [
        "<h2>Texts</h2>",
        '<p class="muted">The fork token is <mark>marked</mark>; before it, '
        '<span class="tie">near ties</span> are underlined; after it, '
        '<span class="changed">tokens the other lane does not share</span> are tinted. '
        "Hover for margins.</p>",
        '<div class="lanes">',
    ]
    for lane_id in LANE_IDS:
        description = _lane_description(report.session, lane_id)
        out += [
            "<section>",
            f"<h3>Lane {lane_id}: {xml_text(description)} "
            f'<span class="muted">({len(report.steps(lane_id))} tokens)</span></h3>',
            f'<pre class="text">{_html_text(report, lane_id)}</pre>',
            "</section>",
        ]
    return [*out, "</div>"]


def _html_configuration(report: _Report) -> list[str]:
    out = ["<h2>Configuration</h2>"]
    for table in _config_tables(report):
        note = table.note.format(differs="shaded")
        shown = f' <span class="muted">({xml_text(note)})</span>' if note else ""
        out.append(f"<h3>{table.title}{shown}</h3>")
        out.append(_html_rows(table.header, table.rows, table.differs))
    return out


# --- JSON ---------------------------------------------------------------------------


def _json(report: _Report) -> str:
    session = report.session
    header = session.header.to_json()
    document = {
        "schema": EXPORT_SCHEMA,
        "version": EXPORT_VERSION,
        "exported_by": {"specdiff": __version__},
        "source": {
            "file": session.path.name,
            "session_schema": header["schema"],
            "written_by": header["specdiff"],
        },
        "title": _title(session),
        "partial": session.partial,
        "cut": session.cut_note,
        "cancelled": session.footer is not None and session.footer.cancelled,
        "verdict": verdict(session, report.comparison),
        "pair": header["pair"],
        "description": header["description"],
        "created": header["created"],
        "prompt": session.prompt,
        **(
            {"messages": session.prompt.to_json()}
            if isinstance(session.prompt, Conversation)
            else {}
        ),
        "prompt_token_ids": header["prompt_token_ids"],
        **({"lane_prompts": header["lane_prompts"]} if "lane_prompts" in header else {}),
        "max_tokens": header["max_tokens"],
        "stop": header["stop"],
        "config": {
            "lanes": header["lanes"],
            "lanes_differ_in": differences(session.pair.a, session.pair.b),
            "executed": header["executed"],
            "build": header["build"],
        },
        "summary": _json_summary(report),
        "lanes": {lane_id: _json_lane(report, lane_id) for lane_id in LANE_IDS},
        **({} if report.autopsy is None else {"autopsy": report.autopsy.to_json()}),
    }
    text = json.dumps(finite_everywhere(document), indent=2, ensure_ascii=False, allow_nan=False)
    return json_text(text) + "\n"


def _json_summary(report: _Report) -> dict[str, Any]:
    comparison, fork = report.comparison, report.fork
    after = comparison.after_fork
    summary = report.session.summary().to_json()
    del summary["type"]
    # the class below is read at this report's threshold, not the run's recorded one
    summary.pop("near_tie", None)
    if report.session.partial:
        # no footer: what only the run itself measured is unknown
        summary.update({key: [None, None] for key in MEASURED_FIELDS})
    verdict = report.verdict
    return summary | {
        # the class at this report's near-tie threshold (the footer's used the run's)
        "fork_class": None if verdict is None else verdict.kind,
        "fork_reference_lane": None if verdict is None else verdict.reference,
        "split_threshold": DEFAULT_SPLIT_THRESHOLD,
        "fork": fork_json(fork),
        "why": report.why,
        "near_tie_threshold": comparison.near_tie_threshold,
        "near_ties": {"a": list(comparison.near_ties_a), "b": list(comparison.near_ties_b)},
        "near_ties_are_before_fork": fork is not None,
        "similarity_after_fork": None if after is None else after.similarity,
    }


def _json_lane(report: _Report, lane_id: str) -> dict[str, Any]:
    steps = report.steps(lane_id)
    executed = report.session.header.executed
    return {
        "description": _lane_description(report.session, lane_id),
        "tokens": len(steps),
        "tokens_per_second": report.footer_value("tokens_per_second", lane_id),
        "stop_reason": report.footer_value("stop_reasons", lane_id),
        "error": report.footer_value("errors", lane_id),
        "output_sha256": report.footer_value("output_sha256", lane_id),
        "recorded_sha256": hashlib.sha256(b"".join(s.piece for s in steps)).hexdigest(),
        "model_sha256": executed[lane_id].get("model_sha256"),
        "text": text_of(steps),
        "token_ids": [step.token_id for step in steps],
        "margins": [round(step.margin, 5) for step in steps],
        "rescored_steps": [step.index for step in steps if step.source],
    }


# --- entry points -------------------------------------------------------------------

_RENDERERS = {"md": _markdown, "html": _html, "json": _json}


def export_session(session: Session, fmt: str, near_tie: float = DEFAULT_NEAR_TIE) -> str:
    """The session as one self-contained document in the format named (md, html, json)."""
    renderer = _RENDERERS.get(fmt)
    if renderer is None:
        raise ExportError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if near_tie < 0 or not math.isfinite(near_tie):
        raise ExportError(f"the near-tie threshold must be a number >= 0, got {near_tie}")
    # a prompt or header read from JSON may hold lone surrogates, which no encoder writes
    document = without_surrogates(renderer(_report(session, near_tie)))
    # a report is read in a terminal too (`export` prints it): whatever control
    # character a shared file slipped past the markup is shown as its escape
    return document if fmt == "json" else terminal_text(document)


def check_output(path: Path, force: bool) -> None:
    """Refuse, before any work, an output that cannot or must not be written."""
    if path.is_dir():
        raise ExportError(f"{path} is a folder; give --output a file name")
    # a dangling link counts: writing would replace the link a user put there
    if (path.exists() or path.is_symlink()) and not force:
        raise ExportError(f"{path} already exists; pass --force to overwrite it")
    parent = path.parent
    if not parent.is_dir():
        raise ExportError(
            f"cannot write {path}: the folder {parent} does not exist; create it first"
        )


def write_report(text: str, path: Path, force: bool = False) -> None:
    """Write the report whole or not at all: a failure never leaves a half-written report
    (or a damaged older one), and without force a file that appears meanwhile is kept."""
    check_output(path, force)
    try:
        write_text_atomic(path, text, overwrite=force)
    except FileExistsError:
        raise ExportError(f"{path} already exists; pass --force to overwrite it") from None
    except OSError as error:
        failed = ExportError(f"cannot write {path}: {error.strerror or error}")
        raise lost_output(error) or failed from None
