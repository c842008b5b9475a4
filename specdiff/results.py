"""A pair run's result in memory: each lane's outcome and both together. Made by the
engine (PairRun, PairWorker), shown by the reports and the TUI, written by the session
store; owned by none of them, so that the engine and the session files meet only in
these records.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from specdiff.compare import Comparison, compare
from specdiff.lanes import Lane, LaneId, Pair
from specdiff.sessions.format import CRASHED
from specdiff.sessions.header import SessionHeader
from specdiff.sessions.records import ControlRun, RunSummary
from specdiff.steps import TokenStep


@dataclass
class LaneOutcome:
    """What one lane produced and how fast."""

    lane_id: LaneId
    lane: Lane
    steps: list[TokenStep] = field(default_factory=list)
    seconds: float = 0.0
    """Wall time spent inside this lane's decode loop, prompt included."""
    first_token_seconds: float = 0.0
    """Prompt decode plus the first token."""
    stop_reason: str = ""
    error: str | None = None
    drafted: int = 0
    accepted: int = 0
    verify_calls: int = 0
    prefix_tokens: int = 0
    executed: dict[str, Any] = field(default_factory=dict)
    reported_tokens_per_second: float | None = None
    """A server lane's speed: the server's own count, or the rate its tokens arrived at
    (the time spent waiting on it in lockstep with the other lane says nothing)."""

    @property
    def tokens_per_second(self) -> float:
        """Generation speed after the first token (prompt decode excluded)."""
        if self.reported_tokens_per_second is not None:
            return self.reported_tokens_per_second
        decode_seconds = self.seconds - self.first_token_seconds
        if len(self.steps) < 2 or decode_seconds <= 0:
            return 0.0
        return (len(self.steps) - 1) / decode_seconds

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def token_ids(self) -> list[int]:
        return [step.token_id for step in self.steps]


@dataclass(frozen=True)
class RunRequest:
    """One run as it was asked for: the prompt, its settings, and when it started. The
    in-process runner and the worker's front end each make one and build their result
    from it, so a run cut short by a crash reads like one that finished."""

    prompt: str
    prompt_tokens: list[int]
    """Lane a's token ids of the prompt."""
    max_tokens: int
    stop: list[str]
    near_tie: float
    teacher_forced: bool
    started: str
    """ISO time, to the second, in UTC."""


@dataclass
class PairResult:
    """Both lanes of one run on one prompt, with what executed them."""

    pair: Pair
    prompt: str
    prompt_tokens: list[int]
    max_tokens: int
    a: LaneOutcome
    b: LaneOutcome
    comparison: Comparison
    build: dict[str, str]
    started: str
    cancelled: bool = False
    teacher_forced: bool = False
    """Lane B was fed lane A's tokens: compare B's argmax with A's pick, step by step."""
    stop: list[str] = field(default_factory=list)
    control: LaneOutcome | None = None
    """Lane a run again, cold, after the pair (--control); None without it."""

    @classmethod
    def assemble(
        cls,
        pair: Pair,
        request: RunRequest,
        outcomes: Mapping[LaneId, LaneOutcome],
        build: dict[str, str],
        cancelled: bool = False,
        control: LaneOutcome | None = None,
    ) -> PairResult:
        """The result of `request` on `pair` from both lanes' outcomes, compared."""
        a, b = outcomes["a"], outcomes["b"]
        return cls(
            pair=pair,
            prompt=request.prompt,
            prompt_tokens=request.prompt_tokens,
            max_tokens=request.max_tokens,
            a=a,
            b=b,
            comparison=compare(a.steps, b.steps, request.near_tie),
            build=build,
            started=request.started,
            cancelled=cancelled,
            teacher_forced=request.teacher_forced,
            stop=list(request.stop),
            control=control,
        )

    @property
    def speedup(self) -> float | None:
        """Lane A's tokens/s over lane B's."""
        if self.a.tokens_per_second and self.b.tokens_per_second:
            return self.a.tokens_per_second / self.b.tokens_per_second
        return None

    def lane(self, lane_id: LaneId) -> LaneOutcome:
        return self.a if lane_id == "a" else self.b

    @property
    def crashed(self) -> bool:
        return CRASHED in (self.a.stop_reason, self.b.stop_reason)

    def error_lines(self) -> list[str]:
        """Each lane's error, once: a crash names its lane and is the same for both."""
        if self.a.error is not None and self.a.error == self.b.error:
            return [self.a.error]
        return [f"lane {o.lane_id}: {o.error}" for o in (self.a, self.b) if o.error]

    def header(self) -> SessionHeader:
        return SessionHeader(
            pair=self.pair,
            prompt=self.prompt,
            prompt_token_ids=tuple(self.prompt_tokens),
            max_tokens=self.max_tokens,
            stop=tuple(self.stop),
            executed={"a": self.a.executed, "b": self.b.executed},
            build=dict(self.build),
            created=self.started,
            teacher_forced=self.teacher_forced,
        )

    def summary(self) -> RunSummary:
        return RunSummary.of_steps(
            self.a.steps,
            self.b.steps,
            teacher_forced=self.teacher_forced,
            tokens_per_second=(self.a.tokens_per_second, self.b.tokens_per_second),
            stop_reasons=(self.a.stop_reason, self.b.stop_reason),
            errors=(self.a.error, self.b.error),
            cancelled=self.cancelled,
            drafted=(self.a.drafted, self.b.drafted),
            accepted=(self.a.accepted, self.b.accepted),
            seconds=(self.a.seconds, self.b.seconds),
            first_token_seconds=(self.a.first_token_seconds, self.b.first_token_seconds),
            near_tie=self.comparison.near_tie_threshold,
            control=None
            if self.control is None
            else ControlRun.of_steps(
                self.a.steps, self.control.steps, self.control.stop_reason, self.control.error
            ),
        )
