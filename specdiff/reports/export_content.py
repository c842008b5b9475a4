"""What every format of an exported session shows, computed once from the session's own
records through compare.py and the text summary's formatting: the verdict, the fork and
why it happened, the near ties, each lane's text by token, the configuration tables and
the margin plot. The formats (`export_markdown`, `export_html`, `export_json`) only lay
it out, so a report says exactly what `specdiff run` and the TUI say.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from specdiff import __version__
from specdiff.autopsy import Autopsy, load_saved, saved_beside
from specdiff.chat import Conversation
from specdiff.compare import (
    Comparison,
    Fork,
    ForkVerdict,
    run_fork_verdict,
)
from specdiff.control import control_sentence
from specdiff.fork_words import run_fork_account, verdict_description
from specdiff.lanes import differences, headline
from specdiff.reports.svg import margin_plot
from specdiff.reports.text import (
    determinism_note,
    pick_text,
    piece_text,
    rescored_note,
    unrescored_note,
)
from specdiff.sessions.store import Session
from specdiff.steps import TokenStep

LANE_IDS = ("a", "b")


FORK_HEADER = ("lane", "margin", "its own pick: logit (rank, p)", "the other lane's pick")


LANE_HEADER = ("key", "lane a", "lane b")


KEY_VALUE_HEADER = ("key", "value")


AUTOPSY_HEADING = "## Why it forked, traced (specdiff explain)"
"""The section an export gains when the session's autopsy was saved beside it."""


@dataclass(frozen=True)
class SessionReport:
    """A session and what every format shows of it, computed once."""

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


def session_report(session: Session, near_tie: float) -> SessionReport:
    comparison = session.comparison(near_tie)
    return SessionReport(
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
    """The autopsy saved beside the session, when it is of this session's pair, its cause
    naming what the pair's lanes did before the fork as explain and the TUI name it; a
    damaged one is one line naming it (AutopsyError), not an export without it."""
    path = saved_beside(session.path)
    if not path.is_file():
        return None
    autopsy = load_saved(path)
    if autopsy.pair != session.pair.name:
        return None
    return autopsy.with_lanes(session.pair.a, session.pair.b)


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


def document_title(session: Session) -> str:
    if session.partial:
        state = "partial"
    elif session.footer is not None and session.footer.crashed:
        state = "crashed"
    else:
        state = "complete"
    return f"specdiff {session.pair.name}: {session.header.created} ({state})"


def lane_description(session: Session, lane_id: str) -> str:
    """What the lane is, leading with what differs from the other lane (as the TUI heads
    its panes)."""
    pair = session.pair
    return headline(pair.a, pair.b) if lane_id == "a" else headline(pair.b, pair.a)


def fork_rows(fork: Fork) -> list[tuple[str, str, str, str]]:
    """Per lane: margin, its own pick and the other lane's pick as that lane scored them,
    formatted as the text summary formats them."""
    pieces = {fork.token_a: fork.piece_a, fork.token_b: fork.piece_b}
    return [
        (lane_id, f"{view.margin:.3f}", pick_text(view.own, pieces), pick_text(view.other, pieces))
        for lane_id, view in (("a", fork.a), ("b", fork.b))
    ]


def fork_heading(fork: Fork | None) -> str:
    if fork is None:
        return "No fork"
    return (
        f"At the fork: token {fork.index}: lane a picked {piece_text(fork.piece_a)}, "
        f"lane b picked {piece_text(fork.piece_b)}"
    )


def _indices(indices: Sequence[int]) -> str:
    return ", ".join(str(i) for i in indices) if indices else "none"


def findings(report: SessionReport) -> list[str]:
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


def _lane_notes(report: SessionReport) -> list[str]:
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


def _run_rows(report: SessionReport) -> list[tuple[str, ...]]:
    """Per-lane facts of the run: counts, speed, stop reason, hashes."""
    executed = report.session.header.executed
    partial_note = "— (partial)" if report.session.partial else "—"

    def footer(key: str, lane_id: str, shown: str = "{}") -> str:
        value = report.footer_value(key, lane_id)
        return partial_note if value is None else shown.format(value)

    rows = [
        ("what", *(lane_description(report.session, lane) for lane in LANE_IDS)),
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


def _source_rows(report: SessionReport) -> list[tuple[str, str]]:
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
class ConfigTable:
    """One table of the configuration section, as every format shows it."""

    title: str
    note: str
    """Shown after the title in parentheses; {differs} is how the format marks a row."""
    header: tuple[str, ...]
    rows: Sequence[Sequence[str]]
    differs: Sequence[bool] | None = None
    literal: bool = True
    """Values are settings and hashes (code) rather than prose."""


def config_tables(report: SessionReport) -> list[ConfigTable]:
    """The run's facts, both lanes' settings (asked and executed), the build, the file."""
    session = report.session
    header = session.header
    executed = header.executed
    differing = set(differences(session.pair.a, session.pair.b))
    lane_rows = _config_rows(session.pair.a.as_dict(), session.pair.b.as_dict())
    executed_rows = _config_rows(executed["a"], executed["b"])
    build = [(key, _value_text(value)) for key, value in header.build.items()]
    return [
        ConfigTable("Run", "", ("", "lane a", "lane b"), _run_rows(report), literal=False),
        ConfigTable(
            "Lanes",
            "every key; {differs} where they differ",
            LANE_HEADER,
            lane_rows,
            [key in differing for key, _, _ in lane_rows],
        ),
        ConfigTable(
            "Executed",
            "as llama.cpp applied it",
            LANE_HEADER,
            executed_rows,
            [a != b for _, a, b in executed_rows],
        ),
        ConfigTable("Build", "", KEY_VALUE_HEADER, build),
        ConfigTable("Session", "", KEY_VALUE_HEADER, _source_rows(report)),
    ]


def margin_svg(report: SessionReport) -> str:
    return margin_plot(
        [step.margin for step in report.steps("a")],
        [step.margin for step in report.steps("b")],
        fork_index=None if report.fork is None else report.fork.index,
        near_tie=report.comparison.near_tie_threshold,
        title=f"Logit margin per token, {report.session.pair.name}",
    )


def prompt_parts(session: Session) -> list[tuple[str, str]]:
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
