"""Pure comparison of two lanes' token steps.

Where the texts fork, how close each lane was to the other's pick, where near ties
lie before the fork, and how alike the texts stay after it. No I/O, no model: these
functions take TokenSteps and return frozen records, so the CLI, sessions, suites
and the TUI all read the same numbers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from rapidfuzz.distance import Indel

from specdiff.safe_text import visible
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

    def unscored_reason(self, names: tuple[str, str] = ("lane a", "lane b")) -> str:
        """Which steps had no logits to read, and why they could have none."""
        steps = []
        for lane, drafted in self.unscored:
            what = "an accepted draft without probabilities" if drafted else "its pick alone"
            steps.append(f"{names[0] if lane == 'a' else names[1]}'s step ({what})")
        return f"no logits were recorded for {' or '.join(steps)}"

    def describe(self, names: tuple[str, str] = ("lane a", "lane b")) -> str:
        """One line; `names` calls the two sides (two lanes, or a recording and a re-run)."""
        if self.unscored:
            return f"{self.kind} ({self.unscored_reason(names)} to class the fork)"
        reference = names[0] if self.reference == "a" else names[1]
        rank = (
            "outside its top-k"
            if self.other_rank is None or self.other_gap is None
            else f"#{self.other_rank} ({self.other_gap:.3f} below its best)"
        )
        rule = f"a split is a pick {self.split:g} or more below the best"
        if self.not_greedy is not None:
            side = names[0] if self.not_greedy == "a" else names[1]
            rule = f"{side} emitted a token below its own argmax: not greedy decoding"
        return (
            f"{self.kind} ({reference} is the reference: margin {self.margin:.3f}, "
            f"the other pick {rank} there; {rule})"
        )


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


PIECE_SHOWN = 24
"""Characters of a token piece a verdict sentence shows before cutting it: a piece is
normally a word, and a long one (a run of spaces, a hostile blob) must not push the
reason off the line."""


def quoted_piece(piece: bytes, limit: int = PIECE_SHOWN) -> str:
    """A token piece as a quoted literal (spaces and newlines stay visible), cut to
    `limit` characters, every control character escaped."""
    text = piece.decode("utf-8", "replace")
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return visible(repr(text))


def counted(number: int, noun: str) -> str:
    """'1 token', '2 tokens': a count with its noun in the right number."""
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def _number(value: float, signed: bool = False) -> str:
    """Two decimals for logits (their differences run 0.01..20), the exponent form for
    the huge values only a damaged file holds, so the sentence stays one short line."""
    sign = "+" if signed else ""
    if math.isinf(value) or abs(value) < 1000:
        return f"{value:{sign}.2f}"
    return f"{value:{sign}.2e}"


def _difference(high: float | None, low: float | None) -> float | None:
    return None if high is None or low is None else high - low


@dataclass(frozen=True)
class ForkExplanation:
    """Why two lanes forked, twice: in plain words led by probabilities, for a reader
    who has never met a logit, and with the exact numbers (logits) behind them."""

    label: str
    """What the fork was: its class ("near tie flipped", "ambiguous", "large-margin
    split"), or "forked" where nothing was recorded to class it."""
    plain: str
    """Probabilities and everyday words: 'lane a was nearly 50/50 between ...'."""
    detail: str | None = None
    """The same reading in logits, exact to two decimals; None where no number adds to
    the plain words."""

    @property
    def sentence(self) -> str:
        """Both on one line: the label, the plain words, then the logits."""
        numbers = "" if self.detail is None else f"; in logits: {self.detail}"
        return f"{self.label}: {self.plain}{numbers}"

    @property
    def terse(self) -> str:
        """The label and the numbers alone, on one short line (a panel's, a table
        cell's, a JSON verdict's): the plain words where there are no numbers."""
        return f"{self.label}: {self.plain if self.detail is None else self.detail}"


def fork_sentence(
    fork: Fork,
    verdict: ForkVerdict | None,
    names: tuple[str, str] = ("lane a", "lane b"),
    teacher_forced: bool = False,
) -> str:
    """Why the lanes forked, on one short line of numbers: `fork_explanation`'s terse
    form (its plain words lead where there is room for two lines)."""
    return fork_explanation(fork, verdict, names, teacher_forced).terse


def fork_explanation(
    fork: Fork,
    verdict: ForkVerdict | None,
    names: tuple[str, str] = ("lane a", "lane b"),
    teacher_forced: bool = False,
) -> ForkExplanation:
    """Why the lanes forked: which picks, how likely the reference lane thought each,
    how far the other side's arithmetic moved them, and what that makes the fork.

    `names` calls the two sides (two lanes, or a recording and its re-run). Token
    pieces come from sessions and servers, so they are quoted and escaped."""
    no_logits = fork.a.own.logit is None and fork.b.own.logit is None
    if verdict is None or no_logits or verdict.unscored:
        missing = (
            verdict.unscored_reason(names)
            if verdict is not None and verdict.unscored
            else "no logits were recorded"
        )
        return ForkExplanation(
            "forked",
            f"{names[0]} picked {quoted_piece(fork.piece_a)}, {names[1]} "
            f"{quoted_piece(fork.piece_b)}; {missing} to say why",
        )
    if verdict.not_greedy is not None:
        return _not_greedy_explanation(fork, verdict.not_greedy, names)
    side = _Sides(fork, verdict, names, teacher_forced)
    if verdict.kind == LARGE_MARGIN_SPLIT:
        return side.split_explanation()
    return side.close_call_explanation()


def _not_greedy_explanation(fork: Fork, lane: str, names: tuple[str, str]) -> ForkExplanation:
    """A fork where `lane` emitted a token below its own argmax."""
    name, view, piece = (
        (names[0], fork.a, fork.piece_a) if lane == "a" else (names[1], fork.b, fork.piece_b)
    )
    rank = f"its #{view.own.rank}" if view.own.rank is not None else "a token"
    return ForkExplanation(
        LARGE_MARGIN_SPLIT,
        f"{name} emitted {quoted_piece(piece)}, {rank}, below its own argmax: it did not "
        "decode greedily here, which no rounding explains",
    )


def percent(probability: float) -> str:
    """A probability as a reader says it: 39%, 0.4%, <0.1%."""
    if probability >= 0.995:
        return f"{probability:.1%}" if probability < 1 else "100%"
    if probability >= 0.1:
        return f"{probability:.0%}"
    return f"{probability:.1%}" if probability >= 0.001 else "<0.1%"


def times_as_likely(logit_gap: float) -> str:
    """How many times as likely a logit gap makes one token than another (e^gap)."""
    if logit_gap > 700:
        return "vastly more"
    odds = math.exp(logit_gap)
    return f"{odds:.2f}" if odds < 10 else f"{odds:,.0f}"


NEARLY_EVEN = 0.25
"""A logit gap under which two picks read as 'nearly 50/50' between them: e^0.25 is
1.28 times as likely, 56% against 44% of their two shares."""


@dataclass(frozen=True)
class _Sides:
    """A fork between two greedy lanes, read from lane a, the reference (a verdict names
    lane b the reference only where lane a did not decode greedily, and that fork is told
    by `_not_greedy_explanation`)."""

    fork: Fork
    verdict: ForkVerdict
    names: tuple[str, str]
    teacher_forced: bool

    @property
    def picked(self) -> str:
        """What lane b's pick is called: its emitted token, or, fed lane a's tokens, its
        own best."""
        return "own best" if self.teacher_forced else "pick"

    @property
    def forced(self) -> str:
        return f"fed {self.names[0]}'s tokens, " if self.teacher_forced else ""

    @property
    def pieces(self) -> tuple[str, str]:
        return quoted_piece(self.fork.piece_a), quoted_piece(self.fork.piece_b)

    def _odds(self) -> str:
        """The reference lane's view of both picks: probabilities where its normalizer
        is known, else how many times as likely it held its own pick."""
        ref_name = self.names[0]
        own, other = self.fork.a.own, self.fork.a.other
        first, second = self.pieces
        gap = _difference(own.logit, other.logit)
        if own.probability is not None and other.probability is not None:
            shares = f"{first} ({percent(own.probability)}) and {second} " + (
                f"({percent(other.probability)})"
            )
            if gap is not None and gap < NEARLY_EVEN:
                if own.probability + other.probability >= 0.6:
                    return f"{ref_name} was nearly 50/50 between {shares}"
                # two of many candidates: a 50/50 they were not, but nothing told them apart
                return f"{ref_name} could hardly tell apart {shares}"
            odds = "" if gap is None else f", {times_as_likely(gap)} times as likely"
            return f"{ref_name} preferred {shares.replace(' and ', ' to ', 1)}{odds}"
        if gap is None:
            return f"{ref_name} picked {first}"
        only = "only " if gap < self.verdict.split / 2 else ""
        return f"{ref_name} held {first} {only}{times_as_likely(gap)} times as likely as {second}"

    def split_explanation(self) -> ForkExplanation:
        ref_name, other_name = self.names
        first, second = self.pieces
        gap = self.verdict.other_gap
        own = self.fork.a.own
        if gap is None:
            sure = f"{ref_name} picked {first} and did not rank {second} among its candidates"
        elif own.probability is not None and self.fork.a.other.probability is not None:
            sure = (
                f"{ref_name} gave {first} {percent(own.probability)} and {second} only "
                f"{percent(self.fork.a.other.probability)}"
            )
        else:
            odds = times_as_likely(gap)
            sure = f"{ref_name} held {second} {odds} times less likely than its best"
        plain = (
            f"{sure}; rounding moves a score by well under {DEFAULT_SPLIT_THRESHOLD:g} "
            f"logits, so {other_name} changed the computation"
        )
        where = (
            f"outside {ref_name}'s top-k"
            if gap is None
            else f"{_number(gap)} below {ref_name}'s best"
        )
        detail = (
            f"{self.forced}{other_name}'s {self.picked} {second} was {where}: not a "
            f"rounding effect, {other_name} changed the computation"
        )
        return ForkExplanation(LARGE_MARGIN_SPLIT, plain, detail)

    def close_call_explanation(self) -> ForkExplanation:
        ref_name, other_name = self.names
        ref, other = self.fork.a, self.fork.b
        first, second = self.pieces
        label = "near tie flipped" if self.verdict.kind == NEAR_TIE else "ambiguous"
        gap = _difference(ref.own.logit, ref.other.logit)
        apart = "" if gap is None else f" were {_number(gap)} apart in {ref_name}"
        head = f"{first} vs {second}{apart}"
        if self.verdict.kind == AMBIGUOUS:
            head += f" (beyond a near tie, under the {self.verdict.split:g} split)"
        move_ref = _difference(other.other.logit, ref.own.logit)
        move_other = _difference(other.own.logit, ref.other.logit)
        if move_ref is None or move_other is None:
            outside = "its pick" if move_other is None else f"{ref_name}'s pick"
            plain = (
                f"{self._odds()}; {self.forced}{other_name} picked {second}, but one of the "
                f"two was not among its candidates, so how far its arithmetic shifted them "
                "is unknown"
            )
            detail = f"{head}; {outside} was outside {other_name}'s top-k, so its move is unknown"
            return ForkExplanation(label, plain, detail)
        shift = move_other - move_ref
        swapped = gap is None or shift > gap
        amount = f"{_number(shift)} logits"
        if swapped:
            moved = f"{other_name}'s arithmetic moved the scores by {amount}, enough to swap them"
        else:
            moved = (
                f"{other_name}'s arithmetic moved the scores by only {amount} toward "
                f"{second}, too little to swap them: the pick did not follow the scores"
            )
        compared = (
            "more than that gap"
            if swapped
            else "no more than that gap: the pick did not follow the logits"
        )
        detail = (
            f"{head}; {self.forced}{other_name} moved them by {_number(move_ref, True)} "
            f"and {_number(move_other, True)}: a net {_number(shift)} toward "
            f"{second}, {compared}"
        )
        return ForkExplanation(label, f"{self._odds()}; {self.forced}{moved}", detail)


def run_fork_explanation(
    a: Sequence[TokenStep],
    b: Sequence[TokenStep],
    teacher_forced: bool = False,
    near_tie: float = DEFAULT_NEAR_TIE,
    names: tuple[str, str] = ("lane a", "lane b"),
) -> ForkExplanation | None:
    """The explanation of a run's fork, None where it has none."""
    fork = run_fork(a, b, teacher_forced)
    if fork is None:
        return None
    verdict = fork_verdict(a[fork.index], b[fork.index], teacher_forced, near_tie)
    return fork_explanation(fork, verdict, names, teacher_forced)


def run_fork_account(
    a: Sequence[TokenStep],
    b: Sequence[TokenStep],
    teacher_forced: bool = False,
    near_tie: float = DEFAULT_NEAR_TIE,
    names: tuple[str, str] = ("lane a", "lane b"),
) -> str | None:
    """The whole explanation of a run's fork on one line (label, probabilities, then
    logits), for a report or an export, which have room for it; None without a fork."""
    explanation = run_fork_explanation(a, b, teacher_forced, near_tie, names)
    return None if explanation is None else explanation.sentence


def run_fork_sentence(
    a: Sequence[TokenStep],
    b: Sequence[TokenStep],
    teacher_forced: bool = False,
    near_tie: float = DEFAULT_NEAR_TIE,
    names: tuple[str, str] = ("lane a", "lane b"),
) -> str | None:
    """The terse verdict of a run's fork (`fork_sentence`), None where it has none."""
    explanation = run_fork_explanation(a, b, teacher_forced, near_tie, names)
    return None if explanation is None else explanation.terse
