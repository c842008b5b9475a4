"""What the report needs of one prompt's run under one pair, read from its session file:
the fork, speeds, drafts and, when teacher-forced, where lane b's own pick flips."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from specdiff.compare import compare
from specdiff.sessions.store import Session
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
    """What the report needs of one prompt under one pair, read from its session."""

    pair: str
    quant: str
    prompt_id: str
    session: str
    """The session file, relative to the report folder."""
    generated: tuple[int, int]
    identical: bool
    fork_index: int | None
    fork_margins: tuple[float, float] | None
    near_ties: tuple[int, int]
    tokens_per_second: tuple[float, float]
    generation_seconds: float
    drafted: tuple[int, int]
    accepted: tuple[int, int]
    output_sha256: tuple[str, str]
    stop_reasons: tuple[str, str]
    errors: tuple[str | None, str | None]
    teacher: TeacherStats | None = None

    @property
    def failed(self) -> bool:
        return any(self.errors)


@dataclass(frozen=True)
class _Fork:
    identical: bool
    index: int | None
    margins: tuple[float, float] | None
    teacher: TeacherStats | None


def _fork_of(session: Session, near_tie: float) -> _Fork:
    a, b = session.steps["a"], session.steps["b"]
    if session.header.get("teacher_forced"):
        # B's token ids are A's by construction: B "forks" where its own pick first differs
        teacher = teacher_stats(a, b)
        index = teacher.flips[0] if teacher.flips else None
        margins = None if index is None else (a[index].margin, b[index].margin)
        return _Fork(not teacher.flips and len(a) == len(b), index, margins, teacher)
    comparison = compare(a, b, near_tie)
    fork = comparison.fork
    if fork is None:
        return _Fork(comparison.identical, None, None, None)
    return _Fork(comparison.identical, fork.index, (fork.a.margin, fork.b.margin), None)


def record_from_session(
    session: Session, label: str, quant: str, prompt_id: str, relative: str, near_tie: float
) -> PromptRecord:
    a, b = session.steps["a"], session.steps["b"]
    footer = session.footer or {}
    fork = _fork_of(session, near_tie)

    def pair_of(key: str, default: Any) -> tuple[Any, Any]:
        value = footer.get(key)
        return (value[0], value[1]) if isinstance(value, list) and len(value) == 2 else default

    return PromptRecord(
        pair=label,
        quant=quant,
        prompt_id=prompt_id,
        session=relative,
        generated=(len(a), len(b)),
        identical=fork.identical,
        fork_index=fork.index,
        fork_margins=fork.margins,
        near_ties=(
            sum(1 for s in a if s.margin < near_tie),
            sum(1 for s in b if s.margin < near_tie),
        ),
        tokens_per_second=pair_of("tokens_per_second", (0.0, 0.0)),
        generation_seconds=float(footer.get("generation_seconds", 0.0)),
        drafted=pair_of("drafted", (0, 0)),
        accepted=pair_of("accepted", (0, 0)),
        output_sha256=(
            hashlib.sha256(b"".join(s.piece for s in a)).hexdigest(),
            hashlib.sha256(b"".join(s.piece for s in b)).hexdigest(),
        ),
        stop_reasons=pair_of("stop_reasons", ("", "")),
        errors=pair_of("errors", (None, None)),
        teacher=fork.teacher,
    )
