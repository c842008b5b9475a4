"""The certificate's verdicts, reduced from token steps alone.

A property holds only where every compared pair of runs gave the same tokens (and, for
the properties a batch-invariant engine promises bitwise, the same log-probabilities to
the last bit) *and* the condition it is about was shown to have happened: requests that
were meant to share a batch did share one, a cache that was meant to be hit was hit. A
test whose condition cannot be shown proves nothing either way and is "not tested";
a difference is "broken" whatever else is known, since it is itself the evidence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from specdiff.errors import SpecdiffError
from specdiff.json_numbers import finite_or_null
from specdiff.steps import TokenStep

RUN_TO_RUN = "run-to-run"
BATCH = "batch-invariance"
NEEDLE = "needle"
PREFIX_CACHE = "prefix-cache"
DECODE_PREFILL = "decode-vs-prefill"
SPECULATION = "speculation"
PROPERTIES = (RUN_TO_RUN, BATCH, NEEDLE, PREFIX_CACHE, DECODE_PREFILL, SPECULATION)
TITLES = {
    RUN_TO_RUN: "run to run: the same request, one at a time",
    BATCH: "batch size 1 vs N: prompts alone, then together",
    NEEDLE: "needle under ragged load: one prompt among fillers of mixed lengths",
    PREFIX_CACHE: "prefix cache cold vs warm",
    DECODE_PREFILL: "decode vs prefill: each decoded token against the same position forced",
    SPECULATION: "speculation on vs off",
}
BITWISE = frozenset({RUN_TO_RUN, BATCH, NEEDLE, PREFIX_CACHE, DECODE_PREFILL})
"""Properties whose claim is bitwise (a batch-invariant engine promises the same
log-probabilities, not only the same picks). Speculation's claim is the text: a verify
batch scores drafts in a wider call by design."""

HOLDS = "holds"
BROKEN = "broken"
NOT_TESTED = "not tested"
VERDICTS = (HOLDS, BROKEN, NOT_TESTED)

PIECE_CHARS = 40
"""How much of a token's text a fork record keeps."""


class UnknownProperty(SpecdiffError):
    """A property name the battery does not know."""


def check_properties(names: Sequence[str]) -> tuple[str, ...]:
    """The properties to run, in battery order; all of them for an empty list."""
    for name in names:
        if name not in PROPERTIES:
            raise UnknownProperty(
                f"no property named {name!r}; choose from {', '.join(PROPERTIES)}"
            )
    return tuple(p for p in PROPERTIES if not names or p in names)


@dataclass(frozen=True)
class Proof:
    """Whether the condition a property is about was shown to have happened (a shared
    batch, a cache hit, accepted drafts), in words, with the numbers read."""

    shown: bool
    how: str
    facts: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Compared:
    """One pair of runs a property compares: the reference (alone, cold, plain, decoded)
    and the run under the condition; `label` says which prompt and condition."""

    label: str
    reference: Sequence[TokenStep]
    other: Sequence[TokenStep]


@dataclass
class PropertyResult:
    name: str
    verdict: str
    why: str
    identical: int = 0
    """Pairs whose tokens were the same."""
    compared: int = 0
    fork: dict[str, Any] | None = None
    largest_difference: float | None = None
    """The largest |difference| of one candidate's log-probability (logit) between the
    two runs of a pair, at positions before any fork; 0.0 is bitwise equal."""
    proof: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"title": TITLES[self.name], **asdict(self)}


def not_tested(name: str, why: str, **details: Any) -> PropertyResult:
    return PropertyResult(name, NOT_TESTED, why, details=dict(details))


def _piece(step: TokenStep) -> str:
    return step.piece.decode("utf-8", "replace")[:PIECE_CHARS]


def fork_record(pair: Compared) -> dict[str, Any] | None:
    """Where a pair first differs: both picks and both margins, and how each run scored
    the other's pick; a run that ended early differs where it ended."""
    # deferred: the command line imports this module for its property names at start-up
    from specdiff.compare import fork_at

    fork = fork_at(pair.reference, pair.other)
    if fork is not None:
        reference, other = pair.reference[fork.index], pair.other[fork.index]
        return {
            "pair": pair.label,
            "index": fork.index,
            "reference_pick": _piece(reference),
            "other_pick": _piece(other),
            "reference_margin": finite_or_null(reference.margin),
            "other_margin": finite_or_null(other.margin),
            "reference_logit_of_other_pick": fork.a.other.logit,
            "other_logit_of_reference_pick": fork.b.other.logit,
        }
    if len(pair.reference) != len(pair.other):
        index = min(len(pair.reference), len(pair.other))
        return {
            "pair": pair.label,
            "index": index,
            "reference_pick": _piece_at(pair.reference, index),
            "other_pick": _piece_at(pair.other, index),
            "reference_margin": None,
            "other_margin": None,
            "reference_logit_of_other_pick": None,
            "other_logit_of_reference_pick": None,
        }
    return None


def _piece_at(steps: Sequence[TokenStep], index: int) -> str:
    return _piece(steps[index]) if index < len(steps) else "(ended)"


def largest_difference(pair: Compared) -> tuple[float | None, bool]:
    """The largest |logit difference| of a candidate both runs scored, at the positions
    before their fork, and whether the candidate lists themselves matched (the same ids in
    the same order). None where no position had a candidate in common."""
    from specdiff.compare import fork_at  # deferred, as in fork_record

    fork = fork_at(pair.reference, pair.other)
    end = min(len(pair.reference), len(pair.other))
    end = end if fork is None else fork.index
    largest: float | None = None
    same_lists = True
    for reference, other in zip(pair.reference[:end], pair.other[:end]):
        if [c.token_id for c in reference.top] != [c.token_id for c in other.top]:
            same_lists = False
        theirs = {c.token_id: c.logit for c in other.top}
        for candidate in reference.top:
            if candidate.token_id in theirs:
                gap = abs(candidate.logit - theirs[candidate.token_id])
                largest = gap if largest is None or gap > largest else largest
    return largest, same_lists


def judge(name: str, pairs: Sequence[Compared], proof: Proof) -> PropertyResult:
    """The verdict on `pairs`: broken where any pair differs (in tokens, or bitwise where
    the property's claim is bitwise); holds where none does and `proof` shows the
    condition happened; not tested otherwise."""
    if not pairs:
        return not_tested(name, "nothing was compared", proof=asdict(proof))
    identical = sum(
        [s.token_id for s in p.reference] == [s.token_id for s in p.other] for p in pairs
    )
    fork = next((record for record in map(fork_record, pairs) if record is not None), None)
    differences = [largest_difference(pair) for pair in pairs]
    known = [gap for gap, _ in differences if gap is not None]
    largest = max(known) if known else None
    lists_match = all(same for _, same in differences)
    result = PropertyResult(
        name,
        NOT_TESTED,
        "",
        identical=identical,
        compared=len(pairs),
        fork=fork,
        largest_difference=largest,
        proof=asdict(proof),
    )
    if identical < len(pairs):
        assert fork is not None  # a pair whose ids differ has a first difference
        result.verdict = BROKEN
        result.why = (
            f"{len(pairs) - identical} of {len(pairs)} pairs differ; the first at token "
            f"{fork['index']} ({fork['pair']})"
        )
    elif name in BITWISE and (largest is None or largest > 0.0 or not lists_match):
        result.verdict = BROKEN
        if largest is None:
            result.why = "the same tokens, but no candidate's log-probability to compare"
        elif largest > 0.0:
            result.why = (
                f"the same tokens in all {len(pairs)} pairs, but log-probabilities differ by "
                f"up to {largest:.3g} (not bitwise equal)"
            )
        else:
            result.why = "the same tokens, but the top candidates came in another order"
    elif not proof.shown:
        result.why = f"no difference, but {proof.how}: the condition was not shown to happen"
    else:
        result.verdict = HOLDS
        same = "bitwise the same" if name in BITWISE else "the same tokens"
        result.why = f"all {len(pairs)} pairs {same}; {proof.how}"
    return result


@dataclass
class Certificate:
    """The battery's outcome: one result per property run, what was certified, and what
    it cost."""

    subject: dict[str, Any]
    settings: dict[str, Any]
    results: list[PropertyResult]
    cost: dict[str, Any] = field(default_factory=dict)
    control: dict[str, Any] | None = None
    """The inverse control: the same battery where the named switch is off."""
    notes: list[str] = field(default_factory=list)

    @property
    def broken(self) -> list[str]:
        return [r.name for r in self.results if r.verdict == BROKEN]

    @property
    def held(self) -> list[str]:
        return [r.name for r in self.results if r.verdict == HOLDS]

    def outcome(self) -> str:
        """One line that claims no more than was shown."""
        if self.broken:
            return f"broken: {', '.join(self.broken)}"
        if not self.held:
            return "nothing was shown: every property is not tested"
        untested = [r.name for r in self.results if r.verdict == NOT_TESTED]
        rest = f"; not tested: {', '.join(untested)}" if untested else ""
        return f"every tested property holds ({', '.join(self.held)}){rest}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome(),
            "subject": self.subject,
            "settings": self.settings,
            "properties": [r.as_dict() for r in self.results],
            "cost": self.cost,
            "control": self.control,
            "notes": [TEMPERATURE_NOTE, *self.notes],
        }


TEMPERATURE_NOTE = (
    "temperature 0 alone does not make a server repeat itself: batch size, cache hits and "
    "speculation change the arithmetic; only a property marked holds was shown to repeat, "
    "for these prompts, under the load this battery made"
)
