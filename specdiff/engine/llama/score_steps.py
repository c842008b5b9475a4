"""Full-distribution figures of teacher-forced runs (`suite --teacher-forced`), in-process.

A run's steps keep only the top candidates of each row, which is not enough for KL over
the whole vocabulary; so each run's prompt and lane a's tokens are forced through both
lanes again, as `specdiff score` forces a text: in calls of each lane's own n_batch, with
logits on every row after the prompt, one evaluation per run. Each row that predicts one
of lane a's tokens is compared whole-vocabulary by `specdiff.scoring`. The rows come from
batched evaluation, not from one decode call a token as the run made them: the figures
are `specdiff score`'s, and cost a small share of the run.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from specdiff.engine.base import Cancelled
from specdiff.engine.llama.score import Progress, score_chunk, scoring_lanes
from specdiff.lanes import Pair
from specdiff.scoring import Chunk, PositionScore

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
                forced = [*prompt, *tokens]
                scored.append(score_chunk(a, b, forced, Chunk(0, len(forced), len(prompt) - 1)))
            except Cancelled:
                break
    return scored
