"""The session file's last line and what it carries: the footer (RunSummary), grades,
serving, and the noise-floor control, each with the `to_json` that writes it and the
`from_json` that reads it back through the field checks. The same records are what
every other view of a run serialises: ``run --json``, ``export --format json`` and a
suite's per-prompt record start from ``RunSummary.to_json()`` and only add fields. The
header is `sessions/header.py`.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from specdiff.compare import (
    DEFAULT_NEAR_TIE,
    FORK_CLASSES,
    first_divergence,
    run_fork_index,
    run_fork_verdict,
)
from specdiff.json_numbers import finite_or_null
from specdiff.sessions.checks import (
    GRADERS,
    MAX_GRADE_REASON,
    MAX_INDEX,
    MAX_NEAR_TIE,
    check_bool,
    check_float,
    check_int,
    check_object,
    check_text,
    per_lane,
)
from specdiff.sessions.format import CRASHED
from specdiff.steps import TokenStep


@dataclass(frozen=True)
class Grade:
    """Whether one lane's text passed its prompt's grader, and why."""

    passed: bool
    reason: str
    """"passed", "failed: AssertionError", "timeout after 10 s", "crashed: signal 9",
    "no match", "not graded: lane failed"..."""
    grader: str
    """One of GRADERS."""

    def to_json(self) -> dict[str, Any]:
        return {"passed": self.passed, "reason": self.reason, "grader": self.grader}

    @classmethod
    def from_json(cls, value: object) -> Grade:
        record = check_object(value, "a grade")
        reason = check_text(record.get("reason"), "a grade's reason")
        if len(reason) > MAX_GRADE_REASON:
            raise ValueError(f"a grade's reason is longer than {MAX_GRADE_REASON} characters")
        grader = check_text(record.get("grader"), "a grade's grader")
        if grader not in GRADERS:
            raise ValueError(
                f"a grade's grader must be one of {', '.join(GRADERS)}, got {grader!r:.40}"
            )
        return cls(check_bool(record.get("passed"), "a grade's passed"), reason, grader)


MAX_ENDPOINT_CHARS = 2048
"""The longest endpoint a footer's serving record may name."""


@dataclass(frozen=True)
class Serving:
    """How a server lane's request was served under load: the endpoint that answered
    (credentials stripped), the retries it took and the seconds spent backing off."""

    endpoint: str
    retries: int = 0
    wait_seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "endpoint": self.endpoint,
            "retries": self.retries,
            "wait_seconds": self.wait_seconds,
        }

    @classmethod
    def from_json(cls, value: object) -> Serving:
        record = check_object(value, "a serving record")
        endpoint = check_text(record.get("endpoint"), "a serving record's endpoint")
        if len(endpoint) > MAX_ENDPOINT_CHARS:
            raise ValueError(f"a serving record's endpoint is over {MAX_ENDPOINT_CHARS} characters")
        retries = check_int(record.get("retries", 0), "a serving record's retries", 0, 1 << 20)
        wait = _speed(record.get("wait_seconds", 0.0), "a serving record's wait_seconds")
        return cls(endpoint, retries, wait)


NOISE_FLOOR = "noise floor"
"""a vs a' forked at the a-vs-b fork or before it: the fork is within run-to-run noise."""
EFFECT = "effect"
"""a vs a' agreed through the a-vs-b fork: what the lanes differ in moved the text."""
CUT_SHORT = "control cut short"
"""a' stopped (failed or was stopped) before the a-vs-b fork: nothing to say."""
LABELS = (NOISE_FLOOR, EFFECT, CUT_SHORT)


def noise_floor_label(
    fork_index: int | None, control_fork: int | None, control_length: int
) -> str | None:
    """The label of a run's a-vs-b fork at `fork_index` given its control: where a vs a'
    first differ (`control_fork`) and how many tokens a' produced. None without a fork."""
    if fork_index is None:
        return None
    if control_fork is not None and control_fork <= fork_index:
        return NOISE_FLOOR
    if control_length <= fork_index:
        return CUT_SHORT
    return EFFECT


@dataclass(frozen=True)
class ControlRun:
    """The noise-floor control: lane a run again, cold, compared with lane a's first run
    (see specdiff.control, and `noise_floor_label` above)."""

    fork_index: int | None
    """The first step where a and a' differ; None where one is a prefix of the other."""
    fork_margins: tuple[float, float] | None
    """Lane a's and a''s margins at that step."""
    generated: int
    """Tokens a' produced."""
    output_sha256: str
    stop_reason: str = ""
    error: str | None = None

    @property
    def identical(self) -> bool:
        return self.fork_index is None and not self.error

    @classmethod
    def of_steps(
        cls, a: Sequence[TokenStep], again: Sequence[TokenStep], stop_reason: str, error: str | None
    ) -> ControlRun:
        fork = first_divergence(a, again)
        return cls(
            fork_index=fork,
            fork_margins=None if fork is None else (a[fork].margin, again[fork].margin),
            generated=len(again),
            output_sha256=output_sha256(again),
            stop_reason=stop_reason,
            error=error,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "fork_index": self.fork_index,
            "fork_margins": None
            if self.fork_margins is None
            else [finite_or_null(m) for m in self.fork_margins],
            "generated": self.generated,
            "output_sha256": self.output_sha256,
            "stop_reason": self.stop_reason,
            "error": self.error,
        }

    @classmethod
    def from_json(cls, value: object) -> ControlRun:
        record = check_object(value, "control")
        fork = _optional(
            record.get("fork_index"), lambda v: check_int(v, "control.fork_index", 0, MAX_INDEX)
        )
        generated = _count(record.get("generated"), "control.generated")
        if fork is not None and fork > generated:
            # a' can fork from a at most where a' ended
            raise ValueError(f"control.fork_index {fork} is past control.generated {generated}")
        return cls(
            fork_index=fork,
            fork_margins=_optional(record.get("fork_margins"), _margins),
            generated=generated,
            output_sha256=check_text(record.get("output_sha256"), "control.output_sha256"),
            stop_reason=check_text(record.get("stop_reason", ""), "control.stop_reason"),
            error=_error(record.get("error"), "control.error"),
        )


MEASURED_FIELDS = ("tokens_per_second", "stop_reasons", "errors", "drafted", "accepted")
"""RunSummary fields only the run itself knows: a partial session (no footer) lacks them,
while the rest follow from its steps."""


def output_sha256(steps: Sequence[TokenStep]) -> str:
    return hashlib.sha256(b"".join(step.piece for step in steps)).hexdigest()


@dataclass(frozen=True)
class RunSummary:
    """What a finished run came to: the session footer, and the core of every other
    view of a run's result."""

    identical: bool
    fork_index: int | None
    """The first differing step; in a teacher-forced run, the first flip."""
    fork_margins: tuple[float, float] | None
    generated: tuple[int, int]
    tokens_per_second: tuple[float, float]
    output_sha256: tuple[str, str]
    stop_reasons: tuple[str, str]
    errors: tuple[str | None, str | None]
    cancelled: bool
    drafted: tuple[int, int] = (0, 0)
    accepted: tuple[int, int] = (0, 0)
    seconds: tuple[float, float] | None = None
    """Each lane's time in its decode loop; absent from files written before it was recorded."""
    first_token_seconds: tuple[float, float] | None = None
    grades: tuple[Grade | None, Grade | None] | None = None
    """Each lane's grade when the run was graded; None for a lane left ungraded."""
    fork_class: str | None = None
    """One of compare.FORK_CLASSES where the lanes forked; None without a fork."""
    near_tie: float | None = None
    """The near-tie threshold `fork_class` was read at (the run's --near-tie); None in
    files written before it was recorded."""
    serving: tuple[Serving | None, Serving | None] | None = None
    """Per server lane: the endpoint that served the run, its retries and back-off; None
    for an in-process lane and in files written before it was recorded."""
    control: ControlRun | None = None
    """Lane a run again, cold (--control); None for a run without the control."""

    @property
    def control_label(self) -> str | None:
        """The fork's noise-floor label (`noise_floor_label`); None without a fork or a
        control."""
        if self.control is None:
            return None
        return noise_floor_label(self.fork_index, self.control.fork_index, self.control.generated)

    @property
    def stopped_before_first_token(self) -> bool:
        """Stopped (Ctrl+C, SIGTERM, the TUI's stop) before either lane produced a token:
        nothing was compared, so the run is neither identical nor forked."""
        return self.cancelled and self.generated == (0, 0)

    @property
    def generation_seconds(self) -> float:
        return sum(self.seconds) if self.seconds is not None else 0.0

    @property
    def failed(self) -> bool:
        return any(self.errors)

    @property
    def crashed(self) -> bool:
        return CRASHED in self.stop_reasons

    @classmethod
    def of_steps(
        cls,
        a: Sequence[TokenStep],
        b: Sequence[TokenStep],
        teacher_forced: bool = False,
        **measured: Any,
    ) -> RunSummary:
        """The summary the steps imply, with what was measured beside them. In a
        teacher-forced run B's token ids are A's by construction, so B "forks" where
        its own pick first differs (the first flip)."""
        fork_index = run_fork_index(a, b, teacher_forced)
        stop_reasons = measured.pop("stop_reasons", ("", ""))
        cancelled = measured.pop("cancelled", False)
        # a run cut short by a crash is not identical, whatever it held so far; nor is
        # one stopped before its first token, which compared nothing
        identical = (
            fork_index is None
            and len(a) == len(b)
            and CRASHED not in stop_reasons
            and not (cancelled and not a and not b)
        )
        margins = None if fork_index is None else (a[fork_index].margin, b[fork_index].margin)
        near_tie = measured.pop("near_tie", DEFAULT_NEAR_TIE)
        verdict = run_fork_verdict(a, b, teacher_forced, near_tie)
        return cls(
            identical=identical,
            fork_index=fork_index,
            fork_margins=margins,
            generated=(len(a), len(b)),
            tokens_per_second=measured.pop("tokens_per_second", (0.0, 0.0)),
            output_sha256=(output_sha256(a), output_sha256(b)),
            stop_reasons=stop_reasons,
            errors=measured.pop("errors", (None, None)),
            cancelled=cancelled,
            fork_class=None if verdict is None else verdict.kind,
            near_tie=None if verdict is None else near_tie,
            **measured,
        )

    def to_json(self) -> dict[str, Any]:
        """The footer line; infinite margins (a one-candidate step) are written as null."""
        record: dict[str, Any] = {
            "type": "footer",
            "identical": self.identical,
            "fork_index": self.fork_index,
            "fork_margins": None
            if self.fork_margins is None
            else [finite_or_null(m) for m in self.fork_margins],
            "generated": list(self.generated),
            "tokens_per_second": list(self.tokens_per_second),
            "output_sha256": list(self.output_sha256),
            "stop_reasons": list(self.stop_reasons),
            "errors": list(self.errors),
            "cancelled": self.cancelled,
            "drafted": list(self.drafted),
            "accepted": list(self.accepted),
        }
        if self.stopped_before_first_token:
            # said outright for a reader of the file; a reader works it out again
            record["stopped_before_first_token"] = True
        if self.seconds is not None:
            record["seconds"] = list(self.seconds)
        if self.first_token_seconds is not None:
            record["first_token_seconds"] = list(self.first_token_seconds)
        if self.grades is not None:
            record["grades"] = [None if g is None else g.to_json() for g in self.grades]
        if self.fork_class is not None:
            record["fork_class"] = self.fork_class
        if self.near_tie is not None:
            record["near_tie"] = self.near_tie
        if self.serving is not None:
            record["serving"] = [None if s is None else s.to_json() for s in self.serving]
        if self.control is not None:
            # the label is written for readers of the JSON; a reader works it out again
            record["control"] = self.control.to_json() | {"label": self.control_label}
        return record

    @classmethod
    def from_json(cls, record: Mapping[str, Any]) -> RunSummary:
        """Raises ValueError naming the bad field, or KeyError naming a missing one."""
        return cls(
            identical=check_bool(record["identical"], "identical"),
            fork_index=_optional(record.get("fork_index"), _fork_index),
            fork_margins=_optional(record.get("fork_margins"), _margins),
            generated=_two(record["generated"], "generated", _count),
            tokens_per_second=_two(record["tokens_per_second"], "tokens_per_second", _speed),
            output_sha256=_two(record["output_sha256"], "output_sha256", check_text),
            stop_reasons=_two(record["stop_reasons"], "stop_reasons", check_text),
            errors=_two(record["errors"], "errors", _error),
            cancelled=check_bool(record.get("cancelled", False), "cancelled"),
            drafted=_two(record.get("drafted", [0, 0]), "drafted", _count),
            accepted=_two(record.get("accepted", [0, 0]), "accepted", _count),
            seconds=_optional_two(record, "seconds", _duration, legacy="generation_seconds"),
            first_token_seconds=_optional_two(record, "first_token_seconds", _duration),
            grades=_optional_two(record, "grades", _grade),
            fork_class=_optional(record.get("fork_class"), _fork_class),
            near_tie=_optional(record.get("near_tie"), _near_tie),
            serving=_optional_two(record, "serving", _serving),
            control=_optional(record.get("control"), ControlRun.from_json),
        )


def _optional(value: object, check: Any) -> Any:
    return None if value is None else check(value)


def _fork_class(value: object) -> str:
    if value not in FORK_CLASSES:
        known = ", ".join(FORK_CLASSES)
        raise ValueError(f"fork_class must be one of {known}, got {value!r:.60}")
    return check_text(value, "fork_class")


def _near_tie(value: object) -> float:
    threshold = check_float(value, "near_tie")
    if not 0 <= threshold <= MAX_NEAR_TIE:
        raise ValueError(f"near_tie must be from 0 to {MAX_NEAR_TIE:g}, got {threshold:g}")
    return threshold


def _fork_index(value: object) -> int:
    return check_int(value, "fork_index", 0, MAX_INDEX)


def _margins(value: object) -> tuple[float, float]:
    first, second = per_lane(value, "fork_margins")
    return (
        math.inf if first is None else check_float(first, "a fork margin"),
        math.inf if second is None else check_float(second, "a fork margin"),
    )


def _count(value: object, what: str) -> int:
    return check_int(value, what, 0, MAX_INDEX)


def _speed(value: object, what: str) -> float:
    number = check_float(value, what)
    if not 0 <= number < math.inf:
        raise ValueError(f"{what} must be a finite number >= 0, got {value!r:.60}")
    return number


_duration = _speed


def _grade(value: object, what: str) -> Grade | None:
    return None if value is None else Grade.from_json(value)


def _serving(value: object, what: str) -> Serving | None:
    return None if value is None else Serving.from_json(value)


def _error(value: object, what: str) -> str | None:
    return None if value is None else check_text(value, what)


def _two(value: object, what: str, check: Any) -> tuple[Any, Any]:
    first, second = per_lane(value, what)
    return check(first, what), check(second, what)


def _optional_two(
    record: Mapping[str, Any], key: str, check: Any, legacy: str | None = None
) -> tuple[Any, Any] | None:
    if record.get(key) is not None:
        return _two(record[key], key, check)
    if legacy is not None and record.get(legacy) is not None:
        # suites of the first schema-1 releases stored only the sum of both lanes' time:
        # kept in lane a's slot so that the sum, the only figure read from it, stays right
        return (check(record[legacy], legacy), 0.0)
    return None
