"""A fork told in words: the sentences every front end and report prints about one.

`compare.py` finds the fork and classes it as numbers; this module turns those records
into English (the verdict line, the plain and the exact explanation, quoted token
pieces, counts and percentages), so the CLI, the TUI, exports and suites all say the
same thing the same way, and the comparison stays free of wording.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from specdiff.compare import (
    AMBIGUOUS,
    DEFAULT_NEAR_TIE,
    DEFAULT_SPLIT_THRESHOLD,
    LARGE_MARGIN_SPLIT,
    NEAR_TIE,
    Fork,
    ForkVerdict,
    fork_verdict,
    run_fork,
)
from specdiff.safe_text import visible
from specdiff.steps import TokenStep


def unscored_reason(verdict: ForkVerdict, names: tuple[str, str] = ("lane a", "lane b")) -> str:
    """Which steps of an unscored fork had no logits to read, and why they could have
    none."""
    steps = []
    for lane, drafted in verdict.unscored:
        what = "an accepted draft without probabilities" if drafted else "its pick alone"
        steps.append(f"{names[0] if lane == 'a' else names[1]}'s step ({what})")
    return f"no logits were recorded for {' or '.join(steps)}"


def verdict_description(verdict: ForkVerdict, names: tuple[str, str] = ("lane a", "lane b")) -> str:
    """A fork's class and what it was read from, on one line; `names` calls the two
    sides (two lanes, or a recording and a re-run)."""
    if verdict.unscored:
        return f"{verdict.kind} ({unscored_reason(verdict, names)} to class the fork)"
    reference = names[0] if verdict.reference == "a" else names[1]
    rank = (
        "outside its top-k"
        if verdict.other_rank is None or verdict.other_gap is None
        else f"#{verdict.other_rank} ({verdict.other_gap:.3f} below its best)"
    )
    rule = f"a split is a pick {verdict.split:g} or more below the best"
    if verdict.not_greedy is not None:
        side = names[0] if verdict.not_greedy == "a" else names[1]
        rule = f"{side} emitted a token below its own argmax: not greedy decoding"
    return (
        f"{verdict.kind} ({reference} is the reference: margin {verdict.margin:.3f}, "
        f"the other pick {rank} there; {rule})"
    )


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
            unscored_reason(verdict, names)
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


def ordinal(rank: int) -> str:
    """1st, 2nd, 3rd, 4th, ... 11th, 12th, 13th, 21st."""
    if 10 <= rank % 100 <= 20:
        return f"{rank}th"
    return f"{rank}{({1: 'st', 2: 'nd', 3: 'rd'}).get(rank % 10, 'th')}"


def margins_words(fork: Fork) -> str:
    """Both lanes' margins at the fork with their unit, and where each lane ranked the
    other's pick: "margins a 0.061 · b 0.084 logits · each lane ranked the other's pick
    2nd"."""
    ranks = (fork.a.other.rank, fork.b.other.rank)
    if ranks[0] is not None and ranks[0] == ranks[1]:
        ranked = f"each lane ranked the other's pick {ordinal(ranks[0])}"
    else:
        seen = [
            f"{ordinal(rank)} in {lane}" if rank is not None else f"outside {lane}'s top-k"
            for rank, lane in zip(ranks, ("a", "b"))
        ]
        ranked = f"the other's pick ranked {seen[0]}, {seen[1]}"
    return f"margins a {fork.a.margin:.3f} · b {fork.b.margin:.3f} logits · {ranked}"


def held_tie_sentence(a: TokenStep, b: TokenStep) -> str | None:
    """Why a near tie did not fork the lanes, where both picked the same token: how far
    the pick led the runner-up in each lane, and how much lane b's arithmetic moved
    that lead, less than the lead itself. None where the lanes picked differently or
    lane b did not score lane a's runner-up."""
    if a.token_id != b.token_id or len(a.top) < 2:
        return None
    runner = a.top[1]
    runner_in_b = b.logit_of(runner.token_id)
    pick_in_b = b.logit_of(a.token_id)
    if runner_in_b is None or pick_in_b is None:
        return None
    lead_a, lead_b = a.margin, pick_in_b - runner_in_b
    moved = abs(lead_a - lead_b)
    return (
        f"why it held: {quoted_piece(a.piece)} led {quoted_piece(runner.piece)} by "
        f"{lead_a:.3f} logits in lane a, {lead_b:.3f} in lane b: lane b's arithmetic "
        f"moved the lead by {moved:.3f}, less than the lead itself"
    )
