"""Pure comparison of two lanes' token steps.

Where the texts fork, how close each lane was to the other's pick, where near ties
lie before the fork, and how alike the texts stay after it. No I/O, no model: these
functions take TokenSteps and return frozen records, so the CLI, sessions, suites
and the TUI all read the same numbers. The same records told in words are in
`fork_words.py`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rapidfuzz.distance import Indel

from specdiff.steps import TokenStep, text_of

DEFAULT_NEAR_TIE = 0.5

DEFAULT_SPLIT_THRESHOLD = 2.0
"""A reference margin (logits) at or above which a fork is not a rounding effect: the
teacher-forced |delta logit| of the ubatch pair (the measured numeric noise scale) has a
p99 of about 0.6 and a maximum under 1 on the bundled model."""

MEASURED_NOISE_P99 = 0.60
"""The teacher-forced |delta logit| p99 of the ubatch pair on the bundled model (8
`questions` prompts x 64 tokens, a 2-core AVX-512 EPYC): the numeric noise scale the
split threshold is set against, shown beside it where a suite measured none itself."""

NEAR_TIE = "near tie"
AMBIGUOUS = "ambiguous"
LARGE_MARGIN_SPLIT = "large-margin split"
UNSCORED = "unscored"
"""A fork where a lane's step holds its own pick alone (an accepted draft a server
reported without probabilities, never rescored): with no second candidate there is no
margin to read, so the fork is no kind of split, tie or otherwise."""
FORK_CLASSES = (NEAR_TIE, AMBIGUOUS, LARGE_MARGIN_SPLIT, UNSCORED)
"""What a fork is, from the reference lane's margin and the other pick's rank there."""

MARGIN_DISPLAY_CAP = 4.0
"""Where drawn margins stop (the TUI's margin strip, the reports' plots): one confident step
(margins reach 10+ logits) would otherwise squash every near tie into the axis."""


@dataclass(frozen=True)
class PickView:
    """How one lane saw one token at the fork step."""

    token_id: int
    logit: float | None
    """None when the token was outside the lane's top-k and not probed."""
    rank: int | None
    probability: float | None = None
    """Known where the step's normalizer was computed (the fork step of a pair run)."""


@dataclass(frozen=True)
class LaneAtFork:
    margin: float
    """This lane's top-1 minus top-2 logit at the fork."""
    own: PickView
    """The token this lane picked."""
    other: PickView
    """The token the other lane picked, as this lane scored it."""


@dataclass(frozen=True)
class Fork:
    """The first step at which the lanes picked different tokens."""

    index: int
    token_a: int
    token_b: int
    piece_a: bytes
    piece_b: bytes
    a: LaneAtFork
    b: LaneAtFork


@dataclass(frozen=True)
class Alignment:
    """How alike the two continuations after the fork are."""

    similarity: float
    """Normalized Indel similarity of the two texts after the fork, 0..1."""
    opcodes: tuple[tuple[str, int, int, int, int], ...]
    """Edit operations turning lane A's tokens after the fork into lane B's
    (tag, a_start, a_end, b_start, b_end), indices relative to the fork."""


@dataclass(frozen=True)
class Comparison:
    length_a: int
    length_b: int
    fork: Fork | None
    near_ties_a: tuple[int, ...]
    """Indices before the fork (or overall, without one) where lane A's margin < threshold."""
    near_ties_b: tuple[int, ...]
    near_tie_threshold: float
    after_fork: Alignment | None

    @property
    def identical(self) -> bool:
        return self.fork is None and self.length_a == self.length_b


def first_divergence(a: Sequence[TokenStep], b: Sequence[TokenStep]) -> int | None:
    """Index of the first step whose token ids differ, or None if one lane's tokens are a
    prefix of the other's (identical or cut short)."""
    for index, (step_a, step_b) in enumerate(zip(a, b)):
        if step_a.token_id != step_b.token_id:
            return index
    return None


def _view(step: TokenStep, token_id: int) -> PickView:
    logit = step.logit_of(token_id)
    probability = step.probability(logit) if logit is not None else None
    return PickView(token_id, logit, step.rank_of(token_id), probability)


def fork_between(
    index: int, step_a: TokenStep, step_b: TokenStep, teacher_forced: bool = False
) -> Fork:
    """The fork record of two steps at the same index: both picks, each lane's logit and
    rank for both, each margin. In a teacher-forced run B emitted A's token by
    construction, so B's pick is its own argmax."""
    token_b, piece_b = step_b.token_id, step_b.piece
    if teacher_forced and step_b.top:
        token_b, piece_b = step_b.top[0].token_id, step_b.top[0].piece
    return Fork(
        index=index,
        token_a=step_a.token_id,
        token_b=token_b,
        piece_a=step_a.piece,
        piece_b=piece_b,
        a=LaneAtFork(step_a.margin, _view(step_a, step_a.token_id), _view(step_a, token_b)),
        b=LaneAtFork(step_b.margin, _view(step_b, token_b), _view(step_b, step_a.token_id)),
    )


def fork_at(a: Sequence[TokenStep], b: Sequence[TokenStep]) -> Fork | None:
    """The fork record at the first differing token, None where there is none."""
    index = first_divergence(a, b)
    return None if index is None else fork_between(index, a[index], b[index])


def near_ties(
    steps: Sequence[TokenStep], threshold: float = DEFAULT_NEAR_TIE, before: int | None = None
) -> tuple[int, ...]:
    """Indices of steps whose margin is below the threshold, only those before `before`."""
    end = len(steps) if before is None else min(before, len(steps))
    return tuple(i for i in range(end) if steps[i].margin < threshold)


def align_after(a: Sequence[TokenStep], b: Sequence[TokenStep], start: int) -> Alignment:
    """Similarity of the texts from `start` on, and a token-level opcode alignment."""
    rest_a, rest_b = a[start:], b[start:]
    similarity = Indel.normalized_similarity(text_of(rest_a), text_of(rest_b))
    opcodes = Indel.opcodes([s.token_id for s in rest_a], [s.token_id for s in rest_b])
    return Alignment(
        similarity=float(similarity),
        opcodes=tuple(
            (op.tag, op.src_start, op.src_end, op.dest_start, op.dest_end) for op in opcodes
        ),
    )


def compare(
    a: Sequence[TokenStep], b: Sequence[TokenStep], threshold: float = DEFAULT_NEAR_TIE
) -> Comparison:
    fork = fork_at(a, b)
    before = fork.index if fork is not None else None
    return Comparison(
        length_a=len(a),
        length_b=len(b),
        fork=fork,
        near_ties_a=near_ties(a, threshold, before),
        near_ties_b=near_ties(b, threshold, before),
        near_tie_threshold=threshold,
        after_fork=align_after(a, b, fork.index) if fork is not None else None,
    )


def teacher_flips(a: Sequence[TokenStep], b: Sequence[TokenStep]) -> list[int]:
    """Steps where lane B, fed lane A's tokens, would itself have picked another token:
    B's own argmax differs from A's pick on the same text."""
    return [
        index
        for index, (reference, forced) in enumerate(zip(a, b))
        if forced.top[0].token_id != reference.token_id
    ]


def classify_fork(
    other_gap: float | None,
    near_tie: float = DEFAULT_NEAR_TIE,
    split: float = DEFAULT_SPLIT_THRESHOLD,
) -> str:
    """The class of a fork, given how far below its own best the reference lane put the
    other lane's pick (its top-1 minus top-2 margin when that pick is its #2), None when
    the pick was outside its candidates.

    Rounding reorders logits that lie close together, however many of them: a pick
    within `near_tie` of the best is a near tie, even as the #4 of a four-way tie (seen
    on HumanEval: four candidates within 0.22 logits). A pick `split` or more below it,
    or outside the candidates, cannot come from reordering close logits: the other lane
    changed the computation. The rest is ambiguous."""
    if other_gap is None or other_gap >= split:
        return LARGE_MARGIN_SPLIT
    if other_gap < near_tie:
        return NEAR_TIE
    return AMBIGUOUS


def _below_its_argmax(step: TokenStep, pick: int) -> bool:
    """The lane emitted a token its own logits put strictly below its best: it did not
    decode greedily here (a tie, taken either way, still is greedy)."""
    logit = step.logit_of(pick)
    return bool(step.top) and logit is not None and logit < step.top[0].logit


@dataclass(frozen=True)
class ForkVerdict:
    """A fork's class and what it was read from."""

    kind: str
    """One of FORK_CLASSES."""
    reference: str
    """The lane whose margin and candidates were read: "a" or "b"."""
    margin: float
    """The reference lane's top-1 minus top-2 logit at the fork."""
    other_rank: int | None
    """The rank the reference lane gave the other lane's pick; None outside its top-k."""
    other_gap: float | None
    """How far below its best the reference lane put the other pick (logits); None
    outside its top-k."""
    split: float
    """The split threshold the class was read against."""
    not_greedy: str | None = None
    """The lane ("a" or "b") that emitted a token below its own argmax, if one did."""
    unscored: tuple[tuple[str, bool], ...] = ()
    """(lane, drafted) for each lane whose step held fewer than two candidates: the
    class is then UNSCORED."""


def fork_verdict(
    step_a: TokenStep,
    step_b: TokenStep,
    teacher_forced: bool = False,
    near_tie: float = DEFAULT_NEAR_TIE,
    split: float = DEFAULT_SPLIT_THRESHOLD,
) -> ForkVerdict:
    """Classify the fork between two steps at the same index.

    Lane A is the reference, unless A's pick is below its own argmax while B's is not
    (a lane that accepts drafts leniently emits tokens its own logits did not rank
    first, so its margin says nothing about the token it took): then B is. A lane that
    emitted a token below its own argmax did not decode greedily, which no rounding
    explains: that fork is a large-margin split whatever the margin. In a teacher-forced
    run B's token is A's by construction, and B's pick is its own argmax. A step with
    fewer than two candidates has no margin: that fork is UNSCORED."""
    unscored = tuple(
        (lane, step.drafted) for lane, step in (("a", step_a), ("b", step_b)) if len(step.top) < 2
    )
    if unscored:
        return ForkVerdict(UNSCORED, "a", step_a.margin, None, None, split, unscored=unscored)
    pick_a = step_a.token_id
    pick_b = step_b.top[0].token_id if teacher_forced and step_b.top else step_b.token_id
    off_a, off_b = _below_its_argmax(step_a, pick_a), _below_its_argmax(step_b, pick_b)
    if off_a and not off_b:
        reference, lane, other_pick = step_b, "b", pick_a
    else:
        reference, lane, other_pick = step_a, "a", pick_b
    rank = reference.rank_of(other_pick)
    other_logit = reference.logit_of(other_pick)
    gap = None if other_logit is None or not reference.top else reference.top[0].logit - other_logit
    not_greedy = "a" if off_a else "b" if off_b else None
    kind = LARGE_MARGIN_SPLIT if not_greedy is not None else classify_fork(gap, near_tie, split)
    return ForkVerdict(kind, lane, reference.margin, rank, gap, split, not_greedy)


def fork_class_at(
    step_a: TokenStep,
    step_b: TokenStep,
    teacher_forced: bool = False,
    near_tie: float = DEFAULT_NEAR_TIE,
    split: float = DEFAULT_SPLIT_THRESHOLD,
) -> str:
    """The class alone of `fork_verdict`."""
    return fork_verdict(step_a, step_b, teacher_forced, near_tie, split).kind


def run_fork_index(
    a: Sequence[TokenStep], b: Sequence[TokenStep], teacher_forced: bool = False
) -> int | None:
    """Where a run forks: the first differing token, or in a teacher-forced run (B fed
    A's tokens, so their ids agree by construction) the first flip."""
    if teacher_forced:
        return next(iter(teacher_flips(a, b)), None)
    return first_divergence(a, b)


def run_fork_verdict(
    a: Sequence[TokenStep],
    b: Sequence[TokenStep],
    teacher_forced: bool = False,
    near_tie: float = DEFAULT_NEAR_TIE,
    split: float = DEFAULT_SPLIT_THRESHOLD,
) -> ForkVerdict | None:
    """The class of a run's fork, None where it has none."""
    index = run_fork_index(a, b, teacher_forced)
    if index is None:
        return None
    return fork_verdict(a[index], b[index], teacher_forced, near_tie, split)


def run_fork(
    a: Sequence[TokenStep], b: Sequence[TokenStep], teacher_forced: bool = False
) -> Fork | None:
    """A run's fork record: at the first differing token, or in a teacher-forced run at
    the first flip, with B's own argmax as its pick."""
    index = run_fork_index(a, b, teacher_forced)
    return None if index is None else fork_between(index, a[index], b[index], teacher_forced)
