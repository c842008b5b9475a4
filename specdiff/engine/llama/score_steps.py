"""Full-distribution figures of teacher-forced runs (`suite --teacher-forced`), in-process.

A run's steps keep only the top candidates of each row, which is not enough for KL over
the whole vocabulary; so each run's prompt and lane a's tokens are forced through both
lanes again: the prompt decoded as a lane decodes it (n_batch pieces, logits on the last
row), then lane a's tokens one decode call each, as greedy generation decodes them. At
every step both lanes' whole rows are compared by `specdiff.scoring`. The lanes run plain:
speculation and prefix caching, which change how a lane decodes and not what its
weights and kernels compute, are not replayed.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

import numpy as np

from specdiff.engine.base import Cancelled
from specdiff.engine.llama.score import Progress, ScoringLane, scoring_lanes
from specdiff.lanes import Pair
from specdiff.scoring import ROWS_PER_BLOCK, PositionScore, score_rows

SMALLEST_CONTEXT = 32


def _quiet(_: str) -> None:
    return None


def score_runs(
    pair: Pair,
    runs: Sequence[tuple[Sequence[int], Sequence[int]]],
    cancel: threading.Event,
    progress: Progress = _quiet,
) -> list[list[PositionScore]]:
    """Per run (prompt tokens, lane a's tokens), the PositionScores of every step of lane
    a's tokens; a run with no token scores nothing. Stopped on `cancel`: the runs scored
    before come back."""
    longest = max((len(prompt) + len(tokens) for prompt, tokens in runs), default=0)
    scored: list[list[PositionScore]] = []
    with scoring_lanes(pair, max(longest, SMALLEST_CONTEXT), cancel, progress) as (a, b):
        for number, (prompt, tokens) in enumerate(runs):
            progress(f"scoring run {number + 1}/{len(runs)} over the whole vocabulary")
            try:
                scored.append(_score_run(a, b, list(prompt), list(tokens)))
            except Cancelled:
                break
    return scored


def _score_run(
    a: ScoringLane, b: ScoringLane, prompt: list[int], tokens: list[int]
) -> list[PositionScore]:
    scores: list[PositionScore] = []
    rows = zip(_step_rows(a, prompt, tokens), _step_rows(b, prompt, tokens), strict=True)
    block_a: list[np.ndarray] = []
    block_b: list[np.ndarray] = []
    for step, (row_a, row_b) in enumerate(rows):
        block_a.append(row_a)
        block_b.append(row_b)
        if len(block_a) == ROWS_PER_BLOCK or step == len(tokens) - 1:
            first = step + 1 - len(block_a)
            scores += score_rows(
                np.stack(block_a),
                np.stack(block_b),
                tokens[first : step + 1],
                len(prompt) - 1 + first,
            )
            block_a, block_b = [], []
    return scores


def _step_rows(lane: ScoringLane, prompt: list[int], tokens: list[int]) -> Iterator[np.ndarray]:
    """The lane's logits row before each of `tokens` (a float32 copy), decoded as a
    greedy run decodes: the prompt in n_batch pieces, then one token a call."""
    if not tokens:
        return
    context = lane.context
    context.clear()
    step = lane.lane.n_batch
    for offset in range(0, len(prompt), step):
        context.decode(prompt[offset : offset + step], offset, all_logits=False)
    yield np.array(context.row(-1), dtype=np.float32)
    for index, token in enumerate(tokens[:-1]):
        context.decode([token], len(prompt) + index, all_logits=False)
        yield np.array(context.row(-1), dtype=np.float32)
