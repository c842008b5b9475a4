"""What the report needs of one prompt's run under one pair, read from its session file:
the fork, speeds, drafts and, when teacher-forced, where lane b's own pick flips."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict, TypeGuard

from specdiff.errors import SpecdiffError, printable
from specdiff.fork_words import run_fork_account
from specdiff.results import LaneOutcome
from specdiff.sessions.records import RunSummary, Serving
from specdiff.sessions.store import Session, load_session
from specdiff.steps import TokenStep

MARGIN_BUCKETS = (0.0, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, math.inf)
"""Teacher-forced flips are counted by the reference lane's margin in these buckets."""


@dataclass
class TeacherStats:
    """Lane B fed lane A's tokens: where B's own argmax differs (a flip)."""

    steps: int = 0
    flips: list[int] = field(default_factory=list)
    deltas: list[float] = field(default_factory=list)
    """|logit of A's token in B - in A| per step."""
    bucket_steps: list[int] = field(default_factory=lambda: [0] * (len(MARGIN_BUCKETS) - 1))
    bucket_flips: list[int] = field(default_factory=lambda: [0] * (len(MARGIN_BUCKETS) - 1))


def teacher_stats(a: Sequence[TokenStep], b: Sequence[TokenStep]) -> TeacherStats:
    stats = TeacherStats()
    for index in range(min(len(a), len(b))):
        reference, forced = a[index], b[index]
        chosen = reference.token_id
        stats.steps += 1
        flipped = forced.top[0].token_id != chosen
        if flipped:
            stats.flips.append(index)
        own = reference.logit_of(chosen)
        other = forced.logit_of(chosen)
        if own is not None and other is not None:
            stats.deltas.append(abs(other - own))
        bucket = bucket_index(reference.margin, MARGIN_BUCKETS)
        stats.bucket_steps[bucket] += 1
        stats.bucket_flips[bucket] += int(flipped)
    return stats


def bucket_index(value: float, edges: Sequence[float]) -> int:
    """Which of the buckets between consecutive `edges` holds `value` (the last one
    holds everything above it)."""
    for number in range(len(edges) - 1):
        if value < edges[number + 1]:
            return number
    return len(edges) - 2


@dataclass
class PromptRecord:
    """What the report needs of one prompt under one pair: the run's summary, as its
    session file holds it, and what the suite adds to it."""

    pair: str
    quant: str
    prompt_id: str
    session: str
    """The session file, relative to the report folder."""
    summary: RunSummary
    near_ties: tuple[int, int]
    teacher: TeacherStats | None = None
    verdict: str | None = None
    """Why the run forked: probabilities first, then logits; None without a fork."""

    def to_json(self) -> dict[str, Any]:
        """The session footer's fields, and the suite's beside them."""
        data: dict[str, Any] = {
            "pair": self.pair,
            "quant": self.quant,
            "prompt_id": self.prompt_id,
            "session": self.session,
        }
        data.update(self.summary.to_json())
        del data["type"]
        data["near_ties"] = list(self.near_ties)
        data["verdict"] = self.verdict
        data["teacher"] = None
        if self.teacher is not None:
            data["teacher"] = {
                "steps": self.teacher.steps,
                "flips": self.teacher.flips,
                "max_delta_logit": max(self.teacher.deltas, default=None),
            }
        return data


def record_from_session(
    session: Session, label: str, quant: str, prompt_id: str, relative: str, near_tie: float
) -> PromptRecord:
    a, b = session.steps["a"], session.steps["b"]
    return PromptRecord(
        pair=label,
        quant=quant,
        prompt_id=prompt_id,
        session=relative,
        summary=session.summary(),
        near_ties=(
            sum(1 for s in a if s.margin < near_tie),
            sum(1 for s in b if s.margin < near_tie),
        ),
        teacher=teacher_stats(a, b) if session.header.teacher_forced else None,
        verdict=run_fork_account(a, b, session.header.teacher_forced, near_tie),
    )


def lane_serving(outcome: LaneOutcome, restarts: int = 0) -> Serving | None:
    """How a server lane's run was served, from its executed table after the run (the
    endpoint the pool picked, its retries and back-off), with the `restarts` of the whole
    prompt counted as retries; None for an in-process lane."""
    executed = outcome.executed
    endpoint = executed.get("served_by")
    if not isinstance(endpoint, str):
        return None
    retries = executed.get("retries")
    waited = executed.get("waited_seconds")
    return Serving(
        endpoint,
        restarts + (retries if type(retries) is int and retries >= 0 else 0),
        float(waited) if _finite_count(waited) else 0.0,
    )


def _finite_count(value: object) -> TypeGuard[int | float]:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    )


UNREADABLE = "unreadable"
"""Both lanes' stop reason in the record of a run whose session file cannot be read."""


def unreadable_record(
    label: str, quant: str, prompt_id: str, relative: str, why: str
) -> PromptRecord:
    """The record of a run whose session file cannot be read (corrupt, cut short, a value
    a reader rejects): a failed run with the reason as both lanes' error, so the report
    counts it and `--resume` runs it again."""
    return PromptRecord(
        pair=label,
        quant=quant,
        prompt_id=prompt_id,
        session=relative,
        summary=RunSummary(
            identical=False,
            fork_index=None,
            fork_margins=None,
            generated=(0, 0),
            tokens_per_second=(0.0, 0.0),
            output_sha256=("", ""),
            stop_reasons=(UNREADABLE, UNREADABLE),
            errors=(why, why),
            cancelled=False,
        ),
        near_ties=(0, 0),
    )


UNREADABLE_ERRORS = (SpecdiffError, ValueError, TypeError, KeyError, IndexError, RecursionError)
"""What reading a session file back may raise: a file shared, edited or cut short must
fail its own run, never the suite."""


class Configuration(TypedDict):
    """What one pair (variant) of a suite ran, from the header of its first readable
    session file: the report's configuration table and build."""

    lanes: dict[str, Any]
    executed: dict[str, Any]
    build: dict[str, Any]


def read_record(
    path: Path, relative: str, label: str, quant: str, prompt_id: str, near_tie: float
) -> tuple[PromptRecord, Configuration] | str:
    """The run's record from its session file and what the session ran, or why the file
    cannot give them."""
    try:
        session = load_session(path)
        if session.footer is None:
            return f"{relative} ends before its footer (the run was cut short)"
        record = record_from_session(session, label, quant, prompt_id, relative, near_tie)
        header = session.header.to_json()
    except UNREADABLE_ERRORS as error:
        if isinstance(error, SpecdiffError):
            return printable(str(error), 300)
        return f"cannot read {relative}: {printable(repr(error), 300)}"
    return record, Configuration(
        lanes=header["lanes"], executed=header["executed"], build=header["build"]
    )
