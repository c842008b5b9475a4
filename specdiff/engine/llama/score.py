"""Teacher-forced scoring of one text through both lanes of a pair, in-process.

Each lane evaluates the text in chunks of n_ctx tokens, in decode calls of its own
n_batch with logits on every row of a call that holds a scored row (as
llama-perplexity does), so each lane keeps the batch widths, kernels and KV types
that make it the lane it is. The two lanes' rows are paired as both have them and
compared whole-vocabulary by `specdiff.scoring`; at most one decode call's rows per
lane are held at a time.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from specdiff.engine.base import Cancelled
from specdiff.engine.llama.context import Context, LoadedModel, ModelPool, Offload
from specdiff.engine.llama.probe import trusted_repack
from specdiff.engine.models import resolve_model
from specdiff.engine.runtime import llama
from specdiff.errors import PromptError
from specdiff.lanes import BOUNDS, Lane, LaneConfigError, LaneId, Pair
from specdiff.scoring import (
    ROWS_PER_BLOCK,
    Chunk,
    PositionScore,
    ScoreResult,
    check_scorable,
    plan_chunks,
    score_rows,
)

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    return None


class ScoringLane:
    """One lane's model and, once the text's length is known, a context of the chunk's
    size or the text's, whichever is smaller."""

    def __init__(
        self, lane: Lane, lane_id: LaneId, chunk: int, pool: ModelPool, cancel: threading.Event,
        progress: Progress,
    ) -> None:  # fmt: skip
        self.lane = replace(lane, n_ctx=chunk)
        self.lane_id = lane_id
        self.cancel = cancel
        path = resolve_model(lane.model, lane.quant, lane.threads, progress)
        # as the probe decided for the lane as given (its own n_ubatch, not the capped one)
        repack = trusted_repack(lane_id, lane, path, progress)
        self.model: LoadedModel = pool.get(path, repack.on, Offload.of(lane))
        self._context: Context | None = None

    def fit(self, longest: int) -> Context:
        """The context, made on first use for at most `longest` tokens: a --n-ctx far
        beyond the text must not reserve KV memory for tokens that never come."""
        if self._context is None:
            n_ctx = max(BOUNDS["n_ctx"][0], min(self.lane.n_ctx, longest))
            n_batch = min(self.lane.n_batch, n_ctx)
            self.lane = replace(
                self.lane, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=min(self.lane.n_ubatch, n_batch)
            )
            self._context = Context(self.model, self.lane, self.cancel)
        return self._context

    @property
    def context(self) -> Context:
        return self.fit(self.lane.n_ctx)

    def executed(self) -> dict[str, Any]:
        return {
            "model_path": str(self.model.path),
            "quantization": self.model.info.quantization,
            **self.context.executed,
        }

    def rows(self, tokens: Sequence[int], first_scored: int) -> Any:
        """Decode one chunk in calls of n_batch tokens; yield each scored row's logits (a
        float32 copy), in order."""
        self.context.clear()
        step = self.lane.n_batch
        for offset in range(0, len(tokens), step):
            piece = tokens[offset : offset + step]
            scored = range(max(first_scored - offset, 0), min(len(piece), len(tokens) - 1 - offset))
            self.context.decode(piece, offset, all_logits=len(scored) > 0)
            for row in scored:
                yield np.array(self.context.row(row), dtype=np.float32)

    def close(self) -> None:
        if self._context is not None:
            self._context.close()


def score_text(
    pair: Pair,
    text: str,
    chunk: int,
    convention: str,
    cancel: threading.Event,
    progress: Progress = _quiet,
) -> ScoreResult:
    """Force `text` through both lanes of `pair` in `chunk`-token evaluations and compare
    their distributions at every scored position (see `specdiff.scoring.plan_chunks`)."""
    with scoring_lanes(pair, chunk, cancel, progress) as (a, b):
        return _score(a, b, text, chunk, convention, progress)


@contextlib.contextmanager
def scoring_lanes(
    pair: Pair, chunk: int, cancel: threading.Event, progress: Progress
) -> Iterator[tuple[ScoringLane, ScoringLane]]:
    """Both lanes of an in-process pair loaded with `chunk`-token contexts, their kernels
    trusted; closed on leaving."""
    # deferred: the probe module starts processes of its own
    from specdiff.engine.llama.probe import trust_kernels
    from specdiff.engine.runtime import refuse_unsupported_offload

    check_scorable(pair)
    refuse_unsupported_offload((("a", pair.a), ("b", pair.b)))
    trust_kernels(pair, progress)
    pool = ModelPool()
    lanes: list[ScoringLane] = []
    order: tuple[tuple[LaneId, Lane], ...] = (("a", pair.a), ("b", pair.b))
    try:
        for lane_id, lane in order:
            lanes.append(ScoringLane(lane, lane_id, chunk, pool, cancel, progress))
        yield lanes[0], lanes[1]
    finally:
        for opened in lanes:
            opened.close()
        pool.close()


def text_tokens(
    a: ScoringLane, b: ScoringLane, text: str, chunk: int, convention: str
) -> list[int]:
    """The text's tokens, BOS first, once both lanes are known to read them alike."""
    tokens = a.model.tokenize(text)
    if b.model.tokenize(text) != tokens or a.model.n_vocab != b.model.n_vocab:
        raise LaneConfigError(
            "the lanes' models tokenize the text differently, so their distributions cannot "
            "be compared position by position; score two variants of one model"
        )
    if len(tokens) < 2:
        raise PromptError("the text is shorter than 2 tokens; give more text to score")
    if convention == "perplexity" and len(tokens) < chunk:
        raise PromptError(
            f"the text is {len(tokens)} tokens, shorter than one {chunk}-token chunk, which "
            "--like-perplexity scores whole; give more text or a smaller --n-ctx"
        )
    return tokens


def _score(
    a: ScoringLane, b: ScoringLane, text: str, chunk: int, convention: str, progress: Progress
) -> ScoreResult:
    tokens = text_tokens(a, b, text, chunk, convention)
    a.fit(len(tokens))
    b.fit(len(tokens))
    started = time.perf_counter()
    result = ScoreResult(len(tokens), chunk, convention)
    result.executed = {"a": a.executed(), "b": b.executed()}
    adds_bos = bool(llama().llama_vocab_get_add_bos(a.model.vocab))
    chunks = plan_chunks(len(tokens), chunk, convention)
    try:
        for number, piece in enumerate(chunks):
            progress(f"scoring chunk {number + 1}/{len(chunks)} ({piece.length} tokens)")
            forced = list(tokens[piece.start : piece.start + piece.length])
            if adds_bos:
                forced[0] = a.model.bos()
            result.scores += score_chunk(a, b, forced, piece)
    except Cancelled:
        result.cancelled = True
    result.seconds = time.perf_counter() - started
    for score in result.flips():
        for token in (score.token, score.top_a, score.top_b):
            result.pieces[token] = a.model.piece(token)
    return result


def score_chunk(
    a: ScoringLane, b: ScoringLane, forced: list[int], piece: Chunk
) -> list[PositionScore]:
    """Both lanes' scored rows of one chunk, paired a decode call at a time."""
    rows_a, rows_b = a.rows(forced, piece.first_scored), b.rows(forced, piece.first_scored)
    scores: list[PositionScore] = []
    row = piece.first_scored
    while row < len(forced) - 1:
        count = min(ROWS_PER_BLOCK, len(forced) - 1 - row)
        block_a = np.stack([next(rows_a) for _ in range(count)])
        block_b = np.stack([next(rows_b) for _ in range(count)])
        scores += score_rows(block_a, block_b, forced[row + 1 : row + 1 + count], piece.start + row)
        row += count
    return scores
