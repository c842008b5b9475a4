"""Teacher-forced comparison of two lanes' full distributions, position by position.

One text is forced through both lanes; at every scored position each lane gives a
logits row over the whole vocabulary. From the two rows come the figures
llama-perplexity's ``--kl-divergence`` mode reports, in its units:

- KL(a||b) = sum_i p_a(i) (log p_a(i) - log p_b(i)), over every token of the vocabulary,
  each sum accumulated in float64. Lane a is the reference, as llama-perplexity's base model is.
- same top-1: whether both lanes' argmax agree ("same top p" summed over positions);
- |Δlogit| of the text's next token, and each lane's top-1 - top-2 margin, so a flip
  comes with how near a tie it was.

The KLD is computed without materialising either softmax: with x = a - max(a),
y = b - max(b), S_a = sum exp(x) and S_b = sum exp(y),
KL = sum(exp(x) (x - y)) / S_a - log S_a + log S_b.
That is one exp per logit per lane and one weighted sum, vectorised over a block of rows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from specdiff.lanes import LaneConfigError, Pair

ROWS_PER_BLOCK = 16
"""Rows converted to float64 at once: 16 x 262,144 x 8 bytes = 32 MiB per lane."""


@dataclass(frozen=True)
class PositionScore:
    """Both lanes' distributions at one position of the forced text."""

    position: int
    """Index in the scored text's tokens of the row (its next token is `token`)."""
    token: int
    """The text's token at position + 1: what the row predicts."""
    kld: float
    top_a: int
    top_b: int
    margin_a: float
    """Lane a's top-1 minus top-2 logit."""
    margin_b: float
    logit_delta: float
    """|logit_a - logit_b| of `token`."""
    logprob_a: float
    """log p_a(token): what perplexity is made of."""
    logprob_b: float

    @property
    def same_top(self) -> bool:
        return self.top_a == self.top_b


def score_rows(
    logits_a: np.ndarray, logits_b: np.ndarray, next_tokens: Sequence[int], first_position: int
) -> list[PositionScore]:
    """PositionScores of aligned float32 logits rows (n x vocabulary each, writable: a
    row's top is set aside and put back while its second is found): row k predicts
    next_tokens[k] and sits at position first_position + k."""
    if logits_a.shape != logits_b.shape or logits_a.shape[0] != len(next_tokens):
        raise ValueError(
            f"rows do not align: {logits_a.shape}, {logits_b.shape}, {len(next_tokens)} tokens"
        )
    scores: list[PositionScore] = []
    for start in range(0, len(next_tokens), ROWS_PER_BLOCK):
        stop = start + ROWS_PER_BLOCK
        scores += _score_block(
            logits_a[start:stop],
            logits_b[start:stop],
            next_tokens[start:stop],
            first_position + start,
        )
    return scores


def _score_block(
    a: np.ndarray, b: np.ndarray, tokens: Sequence[int], first_position: int
) -> list[PositionScore]:
    rows = np.arange(a.shape[0])
    wanted = np.asarray(tokens, dtype=np.int64)
    top_a, best_a, margin_a = _top_two(a)
    top_b, best_b, margin_b = _top_two(b)
    # elementwise in float32, as llama.cpp gives the logits; every sum in float64, so that
    # KL's small difference of sums keeps its digits (float64 elementwise would cost
    # several times more: the rows do not fit the cache)
    x = a - best_a[:, None]
    y = b - best_b[:, None]
    exp_x = np.exp(x)
    log_sum_a = np.log(exp_x.sum(axis=1, dtype=np.float64))
    log_sum_b = np.log(np.exp(y).sum(axis=1, dtype=np.float64))
    logprob_a = x[rows, wanted].astype(np.float64) - log_sum_a
    logprob_b = y[rows, wanted].astype(np.float64) - log_sum_b
    np.subtract(x, y, out=y)  # log p_a - log p_b, up to the two log-sums
    np.multiply(exp_x, y, out=y)
    expected = y.sum(axis=1, dtype=np.float64) / np.exp(log_sum_a)
    # rounding can leave a tiny negative where the rows are equal; KL is never below 0
    kld = np.maximum(expected - log_sum_a + log_sum_b, 0.0)
    logit_delta = np.abs(a[rows, wanted].astype(np.float64) - b[rows, wanted])
    return [
        PositionScore(
            position=first_position + k,
            token=int(wanted[k]),
            kld=float(kld[k]),
            top_a=int(top_a[k]),
            top_b=int(top_b[k]),
            margin_a=float(margin_a[k]),
            margin_b=float(margin_b[k]),
            logit_delta=float(logit_delta[k]),
            logprob_a=float(logprob_a[k]),
            logprob_b=float(logprob_b[k]),
        )
        for k in range(len(wanted))
    ]


def _top_two(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each row's argmax (ties: the lowest id), its logit, and its top-1 - top-2 margin.
    The top is set aside in place for the second maximum, and put back: no copy."""
    index = np.arange(rows.shape[0])
    top = rows.argmax(axis=1)
    best = rows[index, top]
    rows[index, top] = -np.inf
    second = rows.max(axis=1)
    rows[index, top] = best
    return top, best, best.astype(np.float64) - second


@dataclass(frozen=True)
class ScoreSummary:
    """The figures over every scored position, in llama-perplexity's units."""

    positions: int
    mean_kld: float
    median_kld: float
    p90_kld: float
    p99_kld: float
    max_kld: float
    same_top_percent: float
    flips: int
    perplexity_a: float
    perplexity_b: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def percentile(sorted_values: Sequence[float], share: float) -> float:
    """The `share` (0..1) percentile of sorted values, interpolated linearly as numpy's
    default does."""
    if not sorted_values:
        return math.nan
    place = share * (len(sorted_values) - 1)
    low = math.floor(place)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (place - low)


def summarise(scores: Sequence[PositionScore]) -> ScoreSummary:
    """Mean, median, p90, p99 and max KLD, the same-top-1 share, flips, and each lane's
    perplexity of the text, over `scores` (at least one)."""
    if not scores:
        raise ValueError("no positions were scored")
    values = sorted(score.kld for score in scores)
    count = len(scores)
    same = sum(score.same_top for score in scores)
    return ScoreSummary(
        positions=count,
        mean_kld=math.fsum(values) / count,
        median_kld=percentile(values, 0.5),
        p90_kld=percentile(values, 0.9),
        p99_kld=percentile(values, 0.99),
        max_kld=values[-1],
        same_top_percent=100.0 * same / count,
        flips=count - same,
        perplexity_a=math.exp(-math.fsum(s.logprob_a for s in scores) / count),
        perplexity_b=math.exp(-math.fsum(s.logprob_b for s in scores) / count),
    )


@dataclass
class ScoreResult:
    """What `specdiff score` measured: every scored position, and how it was scored."""

    tokens: int
    """Tokens of the text, the BOS token included."""
    chunk: int
    """Tokens per evaluated chunk (the lanes' n_ctx)."""
    convention: str
    """"all": every position of every chunk; "perplexity": llama-perplexity's (full
    chunks only, the second half of each scored)."""
    scores: list[PositionScore] = field(default_factory=list)
    executed: dict[str, dict[str, Any]] = field(default_factory=dict)
    pieces: dict[int, bytes] = field(default_factory=dict)
    """Token id -> its bytes, for the tokens a report names (flips)."""
    seconds: float = 0.0
    cancelled: bool = False
    """Stopped on request: `scores` holds the positions scored before."""

    def summary(self) -> ScoreSummary:
        return summarise(self.scores)

    def flips(self) -> list[PositionScore]:
        return [score for score in self.scores if not score.same_top]


CONVENTIONS = ("all", "perplexity")


@dataclass(frozen=True)
class Chunk:
    """One evaluation of `length` tokens from `start` of the text's tokens (the first
    replaced by BOS, so that each chunk reads as a document of its own); rows from
    `first_scored` to length - 2 are scored, each predicting the token after it."""

    start: int
    length: int
    first_scored: int


def plan_chunks(token_count: int, chunk: int, convention: str) -> list[Chunk]:
    """The chunks that score a text of `token_count` tokens (BOS first) in `chunk`-token
    evaluations.

    - "all": consecutive chunks that share their boundary token, so every text token
      is predicted once; the last chunk may be shorter.
    - "perplexity": llama-perplexity's KL-divergence convention: only whole chunks, not
      overlapping, the second half of each scored (its first half is context)."""
    if convention == "perplexity":
        return [Chunk(i * chunk, chunk, chunk // 2) for i in range(token_count // chunk)]
    if convention != "all":
        raise ValueError(f"unknown convention {convention!r}")
    return [
        Chunk(start, min(chunk, token_count - start), 0)
        for start in range(0, max(token_count - 1, 0), chunk - 1)
    ]


def check_scorable(pair: Pair) -> None:
    """Scoring reads full logits rows, which only in-process lanes give."""
    for lane_id, lane in (("a", pair.a), ("b", pair.b)):
        if lane.backend != "local":
            raise LaneConfigError(
                f"score runs in-process lanes only, and lane {lane_id} is a server lane; "
                "pick an in-process pair (e.g. --pair quant)"
            )
