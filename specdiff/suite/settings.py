"""What a suite runs: its pairs, weight types and limits, as kept in the report folder's
suite.json, and the check that a resumed suite runs what the stopped one did."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from specdiff import __version__
from specdiff.compare import DEFAULT_NEAR_TIE
from specdiff.errors import did_you_mean
from specdiff.grading import DEFAULT_TIMEOUT
from specdiff.grading import MAX_TIMEOUT as MAX_GRADE_TIMEOUT
from specdiff.lanes import QUANT_TYPES, Pair, lane_from_dict
from specdiff.suite import MAX_CONCURRENCY, SuiteError
from specdiff.suite.lengths import length_label
from specdiff.suite.prompts import SuitePrompt, prompts_digest

BASE_QUANT = "base"
"""In --quants: the model as it is, not requantized."""
RESUMED_KEYS = (
    "prompts_sha256",
    "pairs",
    "max_tokens",
    "teacher_forced",
    "quants",
    "stop",
    "near_tie",
    "grade",
    "no_exec",
    "grade_timeout",
    "limit",
    "ids",
    "concurrency",
    "control",
    "prompt_lengths",
)
"""The settings a resumed suite must share with the stopped one, as suite.json names them
(those of grading and picking prompts only where they were given)."""
RESUMED_DEFAULTS: dict[str, Any] = {"concurrency": 1, "control": False, "prompt_lengths": []}
"""What a suite.json written before a setting was recorded ran with."""


@dataclass(frozen=True)
class SuiteSettings:
    source: str
    pairs: tuple[Pair, ...]
    max_tokens: int
    near_tie: float = DEFAULT_NEAR_TIE
    teacher_forced: bool = False
    quants: tuple[str, ...] = ()
    """Run every pair once per weight type (BASE_QUANT = the model as it is)."""
    stop: tuple[str, ...] = ()
    grade: bool = False
    """Grade each lane's text with its prompt's grader."""
    no_exec: bool = False
    """Grade without running code: prompts whose grader is tests stay ungraded."""
    grade_timeout: float = DEFAULT_TIMEOUT
    limit: int | None = None
    """Run the first N prompts (of those --ids names)."""
    ids: tuple[str, ...] = ()
    concurrency: int = 1
    """Prompts in flight at once per pair, each lane's requests independent (server
    lanes only: an in-process lane runs one prompt at a time)."""
    control: bool = False
    """Run lane a again, cold, after each prompt (the noise-floor control)."""
    prompt_lengths: tuple[int, ...] = ()
    """Run every pair once per length, each prompt padded to it (suite.lengths)."""

    def in_process_pair(self) -> Pair | None:
        """The first pair with a lane run in process, which cannot run prompts side by
        side; None when every lane is a server's."""
        return next((p for p in self.pairs if "local" in (p.a.backend, p.b.backend)), None)

    def executes_code(self, prompts: Sequence[SuitePrompt]) -> bool:
        """Whether the suite runs model-written programs."""
        return (
            self.grade
            and not self.no_exec
            and any(p.grader is not None and p.grader.executes for p in prompts)
        )

    def grading_json(self, prompts: Sequence[SuitePrompt]) -> dict[str, Any]:
        """suite.json's grading and selection fields: only those given, so a suite that
        used none reads as before."""
        data: dict[str, Any] = {}
        if self.grade:
            data.update(grade=True, no_exec=self.no_exec, grade_timeout=self.grade_timeout)
            data["executed_code"] = self.executes_code(prompts)
        if data.get("executed_code"):
            # deferred: the sandbox loads only where programs run
            from specdiff.grading.sandbox import current_confinement

            data["confinement"] = current_confinement().describe()
        if self.limit is not None:
            data["limit"] = self.limit
        if self.ids:
            data["ids"] = list(self.ids)
        return data

    def variants(self) -> list[tuple[str, Pair, str]]:
        """(label, pair as run, quant) for every pair, weight type and prompt length, in
        run order."""
        out = self.base_variants()
        return [
            (length_label(label, length), pair, quant)
            for label, pair, quant in out
            for length in self.prompt_lengths
        ] or out

    def base_variants(self) -> list[tuple[str, Pair, str]]:
        """(label, pair as run, quant) for every pair and weight type."""
        if not self.quants:
            return [(pair.name, pair, "") for pair in self.pairs]
        out = []
        for pair in self.pairs:
            for quant in self.quants:
                value = "" if quant == BASE_QUANT else quant
                variant = replace(
                    pair, a=replace(pair.a, quant=value), b=replace(pair.b, quant=value)
                )
                out.append((f"{pair.name}@{quant}", variant, quant))
        return out

    def budget_range(self, prompts: Sequence[SuitePrompt]) -> list[int]:
        """The fewest and most tokens per lane the prompts ran with: a prompt's own
        max_tokens (a prompt file's field, a proxied request's) wins over --max-tokens."""
        budgets = [prompt.max_tokens or self.max_tokens for prompt in prompts]
        return [min(budgets), max(budgets)] if budgets else [self.max_tokens] * 2

    def prompt_length(self, label: str) -> int | None:
        """The token length a variant's prompts are padded to; None without a sweep."""
        lengths = {
            length_label(variant, length): length
            for variant, _, _ in self.base_variants()
            for length in self.prompt_lengths
        }
        return lengths.get(label)

    def as_json(self, prompts: Sequence[SuitePrompt]) -> dict[str, Any]:
        return {
            "specdiff": __version__,
            "source": self.source,
            "prompts_sha256": prompts_digest(prompts),
            "prompt_ids": [p.id for p in prompts],
            "pairs": [
                {
                    "name": p.name,
                    "description": p.description,
                    "a": p.a.as_dict(),
                    "b": p.b.as_dict(),
                }
                for p in self.pairs
            ],
            "max_tokens": self.max_tokens,
            "prompt_budgets": self.budget_range(prompts),
            "near_tie": self.near_tie,
            "teacher_forced": self.teacher_forced,
            "quants": list(self.quants),
            "stop": list(self.stop),
            "concurrency": self.concurrency,
            "control": self.control,
            "prompt_lengths": list(self.prompt_lengths),
            **self.grading_json(prompts),
        }


def budget_words(budgets: Sequence[int]) -> str:
    """A budget range as a report says it: one number, or "FEWEST-MOST"."""
    fewest, most = budgets
    return str(most) if fewest == most else f"{fewest}-{most}"


def check_quants(quants: Iterable[str]) -> tuple[str, ...]:
    known = (BASE_QUANT, *[q for q in QUANT_TYPES if q])
    out = []
    for quant in quants:
        quant = quant.strip().lower()
        if quant not in known:
            raise SuiteError(
                f"unknown weight type {quant!r} in --quants; {did_you_mean(quant, known)}"
                f"known: {', '.join(known)}"
            )
        if quant not in out:
            out.append(quant)
    return tuple(out)


def settings_from_json(data: dict[str, Any]) -> SuiteSettings:
    """The settings a suite.json holds; ValueError names the first field of the wrong
    type or out of range (the file may have been edited, or written by hand)."""
    pairs = _typed(data, "pairs", list)
    if not all(isinstance(p, dict) for p in pairs):
        raise ValueError("pairs must be a list of pair objects")
    max_tokens = _typed(data, "max_tokens", int)
    near_tie = _typed(data, "near_tie", (int, float))
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, not {max_tokens}")
    if not math.isfinite(near_tie) or near_tie < 0:
        raise ValueError(f"near_tie must be a finite number >= 0, not {near_tie}")
    return SuiteSettings(
        source=_typed(data, "source", str),
        pairs=tuple(
            Pair(
                str(p["name"]),
                lane_from_dict(p["a"]),
                lane_from_dict(p["b"]),
                str(p.get("description", "")),
            )
            for p in pairs
        ),
        max_tokens=max_tokens,
        near_tie=float(near_tie),
        teacher_forced=_typed(data, "teacher_forced", bool),
        quants=check_quants(_strings(data, "quants")),
        stop=tuple(_strings(data, "stop")),
        concurrency=_concurrency(data),
        control=_typed(data, "control", bool) if "control" in data else False,
        prompt_lengths=_prompt_lengths(data),
        **_grading_from_json(data),
    )


def _grading_from_json(data: dict[str, Any]) -> dict[str, Any]:
    """The grading and selection fields of a suite.json, where present."""
    out: dict[str, Any] = {"ids": tuple(_strings(data, "ids"))}
    if "grade" in data:
        out["grade"] = _typed(data, "grade", bool)
        out["no_exec"] = _typed(data, "no_exec", bool)
        timeout = _typed(data, "grade_timeout", (int, float))
        if not math.isfinite(timeout) or not 0 < timeout <= MAX_GRADE_TIMEOUT:
            raise ValueError(f"grade_timeout must be above 0 and at most {MAX_GRADE_TIMEOUT}")
        out["grade_timeout"] = float(timeout)
    if "limit" in data:
        limit = _typed(data, "limit", int)
        if limit < 1:
            raise ValueError(f"limit must be at least 1, not {limit}")
        out["limit"] = limit
    return out


def _prompt_lengths(data: dict[str, Any]) -> tuple[int, ...]:
    """suite.json's prompt lengths; none in a file written before they were recorded."""
    value = data.get("prompt_lengths", [])
    if not isinstance(value, list) or not all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in value
    ):
        raise ValueError("prompt_lengths must be a list of whole numbers >= 1")
    return tuple(value)


def _concurrency(data: dict[str, Any]) -> int:
    """suite.json's concurrency; 1 in a file written before it was recorded."""
    if "concurrency" not in data:
        return 1
    value: int = _typed(data, "concurrency", int)
    if not 1 <= value <= MAX_CONCURRENCY:
        raise ValueError(f"concurrency must be from 1 to {MAX_CONCURRENCY}, not {value}")
    return value


def check_concurrency(settings: SuiteSettings) -> None:
    """Refuse prompts side by side on a lane that runs in process, before anything runs."""
    pair = settings.in_process_pair() if settings.concurrency > 1 else None
    if pair is not None:
        raise SuiteError(
            f"--concurrency {settings.concurrency} needs server lanes, and pair {pair.name} "
            "runs a lane in process, one prompt at a time; drop --concurrency"
        )


def check_same_concurrency(stored: dict[str, Any], given: int, report_dir: Path) -> None:
    """Refuse to resume at another concurrency: the split rate depends on the load, so
    one suite's runs must all have run under the same one."""
    before = stored.get("concurrency", RESUMED_DEFAULTS["concurrency"])
    if given != before:
        raise SuiteError(
            f"--concurrency {given} differs from the {before} the stopped suite in "
            f"{report_dir} ran at (the split rate depends on the load); resume with "
            f"--concurrency {before}, or use a new --report dir"
        )


def _typed(data: dict[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    value = data[key]
    # JSON's true and false are ints to Python, and never a count or a threshold here
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise ValueError(f"{key} has the wrong type ({type(value).__name__})")
    return value


def _strings(data: dict[str, Any], key: str) -> list[str]:
    value = data.get(key, [])
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ValueError(f"{key} must be a list of strings")
    return value


def check_resume(
    stored: dict[str, Any],
    given: SuiteSettings | None,
    prompts: Sequence[SuitePrompt],
    report_dir: Path,
) -> None:
    """Refuse to continue the stopped suite in `report_dir` (`stored`: its suite.json)
    with other prompts or settings than it started with.

    `given` is what the command named; None when it named no prompts, and `prompts` were
    read again from the stored source: then only they can have changed since.
    """
    if given is None:
        if prompts_digest(prompts) != stored.get("prompts_sha256"):
            raise SuiteError(
                f"the prompts in {stored.get('source')} changed since the suite in "
                f"{report_dir} started; restore them or start a new report folder"
            )
        return
    given_json = given.as_json(prompts)
    check_same_concurrency(stored, given.concurrency, report_dir)
    for key in RESUMED_KEYS:
        if given_json.get(key) != stored.get(key, RESUMED_DEFAULTS.get(key)):
            raise SuiteError(
                f"the {key.replace('_', ' ')} given differ from the stopped suite's in "
                f"{report_dir}; resume with the same options, or use a new --report dir"
            )
