"""TokenStep: the one record everything speaks.

A backend yields one TokenStep per generated token; compare.py reduces them, the
CLI prints them, sessions store them, the TUI renders them. There is no second
representation of the same fact.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:  # annotations only: a step names its lane, the lanes module need not load
    from specdiff.lanes import LaneId


class Candidate(NamedTuple):
    """One entry of a step's top-k: a token and its logit (or log-probability, for
    servers: the difference of two log-probabilities equals the difference of the
    logits, so margins mean the same thing).

    A named tuple rather than a frozen dataclass: a long session holds millions of
    them, and a tuple is built three times faster (loading a session is bound by it)."""

    token_id: int
    logit: float
    piece: bytes = b""
    """The candidate token's bytes, so a reader can show the alternatives as text."""


@dataclass(frozen=True, slots=True)
class Probe:
    """A token looked up outside the top-k: its logit and its rank (1 = argmax) in the
    full distribution of that step. Filled in at a fork for the other lane's pick."""

    token_id: int
    logit: float
    rank: int


@dataclass(frozen=True, slots=True)
class TokenStep:
    """One generated token and the distribution it was picked from."""

    lane: LaneId
    """Which lane produced it: "a" or "b"."""
    index: int
    """Position in the generated text, 0-based."""
    token_id: int
    piece: bytes
    """The token's exact bytes (a token may hold part of a UTF-8 character)."""
    top: tuple[Candidate, ...]
    """Highest logits first (ties by lower token id); always holds the chosen token."""
    drafted: bool
    """True when the token was proposed by a draft and accepted by verification."""
    verify_width: int
    """How many tokens the decode call that produced these logits held."""
    timestamp: float
    """time.perf_counter() when the step was produced."""
    probes: tuple[Probe, ...] = field(default=())
    logsumexp: float | None = None
    """log of the sum of exp(logit) over the whole vocabulary, where it was computed (at
    the fork): turns a logit into a log-probability. Summing 262,144 exponentials costs
    about 2% of a decode step, so it is not done on every step."""
    source: str = ""
    """Where `top` came from when not from the step that picked the token: e.g.
    "rescored by llama-server /completion" for an accepted draft that a server reported
    without probabilities and specdiff scored again, teacher-forced. "" = the step itself."""

    @property
    def margin(self) -> float:
        """Top-1 minus top-2 logit: how close the step was to picking another token."""
        if len(self.top) < 2:
            return float("inf")
        return self.top[0].logit - self.top[1].logit

    def probability(self, logit: float) -> float | None:
        """exp(logit - logsumexp): the token's probability, where the normalizer is known."""
        if self.logsumexp is None:
            return None
        # a logit above the normalizer (only in a damaged file) reads as certain, not as
        # an overflow
        return math.exp(min(logit - self.logsumexp, 0.0))

    def rank_of(self, token_id: int) -> int | None:
        """1-based rank of a token at this step, or None if it was neither in the top-k
        nor probed."""
        for position, candidate in enumerate(self.top):
            if candidate.token_id == token_id:
                return position + 1
        for probe in self.probes:
            if probe.token_id == token_id:
                return probe.rank
        return None

    def logit_of(self, token_id: int) -> float | None:
        for candidate in self.top:
            if candidate.token_id == token_id:
                return candidate.logit
        for probe in self.probes:
            if probe.token_id == token_id:
                return probe.logit
        return None


def text_of(steps: Sequence[TokenStep]) -> str:
    """The generated text; bytes that are not valid UTF-8 become U+FFFD."""
    return b"".join(step.piece for step in steps).decode("utf-8", "replace")
