"""Exact top-k of one logits row, cheaply.

Gemma 3 has 262,144 logits per step. ``np.argpartition`` over all of them costs
about 1.5 ms here, 8% of a 270M model's decode step. Instead: find the maximum,
keep the entries within a window below it, and sort only those survivors. The
window starts from the previous step's spread and doubles until at least k entries
survive, so the result is exact: if k entries are >= max - w, the k-th largest is
>= max - w, and every top-k entry is among the survivors. A test checks this
against a full sort.
"""

from __future__ import annotations

import numpy as np


class TopK:
    """Reusable top-k extractor that remembers how wide a window the last row needed."""

    def __init__(self, k: int) -> None:
        if k < 1:
            raise ValueError("k must be at least 1")
        self.k = k
        self.window = 4.0

    def __call__(self, row: np.ndarray) -> tuple[list[int], list[float]]:
        """Token ids and logits of the k largest entries, largest first, ties by lower id."""
        k = min(self.k, row.shape[0])
        best = int(row.argmax())
        top = float(row[best])
        if not np.isfinite(top):
            return self._full_sort(row, k)
        window = self.window
        while True:
            survivors = np.flatnonzero(row >= top - window)
            if survivors.shape[0] >= k:
                break
            if window > 1e30:
                return self._full_sort(row, k)
            window *= 2.0
        values = row[survivors]
        order = np.lexsort((survivors, -values))[:k]
        ids = survivors[order]
        logits = values[order]
        # Neighbouring steps have similar spreads: start the next row from this one's
        # k-th gap with some slack, so most rows need a single pass.
        self.window = max((top - float(logits[-1])) * 1.5, 1e-3)
        return [int(i) for i in ids], [float(v) for v in logits]

    @staticmethod
    def _full_sort(row: np.ndarray, k: int) -> tuple[list[int], list[float]]:
        order = np.lexsort((np.arange(row.shape[0]), -row))[:k]
        return [int(i) for i in order], [float(row[i]) for i in order]


def rank_of(row: np.ndarray, token_id: int) -> tuple[float, int]:
    """A token's logit and 1-based rank in the order TopK uses (ties by lower id)."""
    logit = row[token_id]
    larger = int(np.count_nonzero(row > logit))
    tied_before = int(np.count_nonzero(row[:token_id] == logit))
    return float(logit), larger + tied_before + 1


def logsumexp(row: np.ndarray) -> float:
    """log(sum(exp(row))), computed stably in float64."""
    top = float(row.max())
    return top + float(np.log(np.exp(row.astype(np.float64) - top).sum()))
