from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from specdiff.engine.topk import TopK, rank_of


def reference(row: np.ndarray, k: int) -> tuple[list[int], list[float]]:
    order = sorted(range(row.shape[0]), key=lambda i: (-float(row[i]), i))[:k]
    return order, [float(row[i]) for i in order]


finite = st.floats(-60, 60, allow_nan=False, width=32)
rows = hnp.arrays(np.float32, st.integers(1, 400), elements=finite)


@pytest.mark.fuzz
@settings(max_examples=400, deadline=None)
@given(rows, st.integers(1, 16), st.floats(1e-3, 100))
def test_topk_matches_full_sort(row: np.ndarray, k: int, start_window: float) -> None:
    topk = TopK(k)
    topk.window = start_window
    assert topk(row) == reference(row, min(k, row.shape[0]))


@pytest.mark.fuzz
@settings(max_examples=200, deadline=None)
@given(st.lists(rows, min_size=2, max_size=6), st.integers(1, 12))
def test_topk_stays_exact_across_rows(sequence: list[np.ndarray], k: int) -> None:
    """The window carried from one row to the next never makes a later row wrong."""
    topk = TopK(k)
    for row in sequence:
        assert topk(row) == reference(row, min(k, row.shape[0]))


def test_topk_on_ties_prefers_lower_ids() -> None:
    row = np.array([1.0, 5.0, 5.0, 3.0, 5.0], dtype=np.float32)
    assert TopK(3)(row) == ([1, 2, 4], [5.0, 5.0, 5.0])


def test_topk_with_minus_infinity_entries() -> None:
    row = np.full(1000, -np.inf, dtype=np.float32)
    row[[7, 500]] = [2.0, 1.0]
    ids, logits = TopK(4)(row)
    assert ids[:2] == [7, 500]
    assert logits[2:] == [float("-inf")] * 2


def test_topk_on_a_vocabulary_sized_row() -> None:
    rng = np.random.default_rng(3)
    row = (rng.standard_normal(262_144) * 4).astype(np.float32)
    assert TopK(8)(row) == reference_fast(row, 8)


def reference_fast(row: np.ndarray, k: int) -> tuple[list[int], list[float]]:
    order = np.lexsort((np.arange(row.shape[0]), -row))[:k]
    return [int(i) for i in order], [float(row[i]) for i in order]


@pytest.mark.fuzz
@settings(max_examples=200, deadline=None)
@given(rows, st.data())
def test_rank_of_agrees_with_topk_order(row: np.ndarray, data: st.DataObject) -> None:
    token = data.draw(st.integers(0, row.shape[0] - 1))
    ids, _ = reference(row, row.shape[0])
    logit, rank = rank_of(row, token)
    assert logit == float(row[token])
    assert rank == ids.index(token) + 1


def test_logsumexp_matches_the_definition() -> None:
    from specdiff.engine.topk import logsumexp

    rng = np.random.default_rng(5)
    row = (rng.standard_normal(5000) * 6).astype(np.float32)
    expected = float(np.log(np.sum(np.exp(row.astype(np.float64)))))
    assert abs(logsumexp(row) - expected) < 1e-9
    big = np.array([1000.0, 1000.0], dtype=np.float32)
    assert abs(logsumexp(big) - (1000.0 + np.log(2.0))) < 1e-9
