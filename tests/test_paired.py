"""The paired statistics against independent implementations: Wilson intervals against
statsmodels' proportion_confint, exact McNemar against scipy's binomtest."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from scipy.stats import binomtest
from statsmodels.stats.proportion import proportion_confint

from specdiff.suite.paired import (
    EXACT_LIMIT,
    PairedOutcomes,
    Rate,
    _exact_lower_tail,
    _log_lower_tail,
    mcnemar_exact,
    wilson_interval,
)

WILSON_GRID = [
    (0, 1),
    (1, 1),
    (0, 50),
    (50, 50),
    (7, 50),
    (34, 50),
    (1, 2),
    (229, 282),
    (0, 1000),
    (1, 1000),
    (500, 1000),
    (999, 1000),
    (1000, 1000),
    (164, 164),
    (3, 164),
]


def _statsmodels_wilson(successes: int, trials: int) -> tuple[float, float]:
    low, high = proportion_confint(successes, trials, alpha=0.05, method="wilson")
    return float(low), float(high)


@pytest.mark.parametrize(("successes", "trials"), WILSON_GRID)
def test_wilson_matches_statsmodels_on_the_edges_and_field_sizes(successes, trials):
    ours = wilson_interval(successes, trials)
    assert ours is not None
    assert ours == pytest.approx(_statsmodels_wilson(successes, trials), abs=1e-12)
    assert 0.0 <= ours[0] <= successes / trials <= ours[1] <= 1.0


@given(st.integers(1, 5000).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))))
def test_wilson_matches_statsmodels_on_generated_counts(counts):
    successes, trials = counts
    ours = wilson_interval(successes, trials)
    assert ours == pytest.approx(_statsmodels_wilson(successes, trials), abs=1e-12)


@pytest.mark.parametrize(("successes", "trials"), [(0, 0), (-1, 3), (4, 3)])
def test_wilson_has_no_interval_without_trials_and_refuses_impossible_counts(successes, trials):
    if trials == 0:
        assert wilson_interval(successes, trials) is None
        assert Rate(0, 0).to_json() == {"count": 0, "of": 0, "rate": None, "interval": None}
    else:
        with pytest.raises(ValueError):
            wilson_interval(successes, trials)


MCNEMAR_GRID = [
    (1, 0),
    (0, 1),
    (1, 1),
    (5, 4),
    (4, 5),
    (0, 10),
    (10, 0),
    (3, 12),
    (25, 25),
    (0, 1000),
    (400, 600),
    (480, 520),
    (1000, 0),
    (EXACT_LIMIT // 2, EXACT_LIMIT // 2 + 1),
    # above EXACT_LIMIT: the log-space tail
    (EXACT_LIMIT // 2 - 100, EXACT_LIMIT // 2 + 200),
    (EXACT_LIMIT // 2 - 300, EXACT_LIMIT // 2 + 400),
    (EXACT_LIMIT, 40),
]


SCIPY_UNDERFLOW = 1e-280
"""Below this scipy's binomtest loses the tail to underflow (0.0 for 10 of 1,075, whose
p is 2.7e-300): there the expected value is the tail summed exactly, in fractions."""


def _scipy_mcnemar(only_a: int, only_b: int) -> float:
    expected = float(binomtest(only_a, only_a + only_b, 0.5, alternative="two-sided").pvalue)
    if expected > SCIPY_UNDERFLOW:
        return expected
    n, k = only_a + only_b, min(only_a, only_b)
    tail = Fraction(sum(math.comb(n, i) for i in range(k + 1)), 2**n)
    return float(min(Fraction(1), 2 * tail))


@pytest.mark.parametrize(("only_a", "only_b"), MCNEMAR_GRID)
def test_mcnemar_matches_scipys_exact_binomial_test(only_a, only_b):
    expected = _scipy_mcnemar(only_a, only_b)
    # subnormal results (below 2.2e-308) keep few digits, hence the absolute tolerance
    assert mcnemar_exact(only_a, only_b) == pytest.approx(expected, rel=1e-9, abs=1e-305)


@given(st.integers(0, 1500), st.integers(0, 1500))
@example(10, 1065)  # scipy's tail underflows to 0.0 here
def test_mcnemar_matches_scipy_on_generated_counts(only_a, only_b):
    ours = mcnemar_exact(only_a, only_b)
    if only_a + only_b == 0:
        # scipy refuses n = 0; no discordant prompt is no evidence either way
        assert ours == 1.0
        return
    assert ours == pytest.approx(_scipy_mcnemar(only_a, only_b), rel=1e-9, abs=1e-305)
    assert ours == mcnemar_exact(only_b, only_a)


@pytest.mark.parametrize("n", [1, 2, 7, 40, 999, 5000])
def test_the_log_space_tail_agrees_with_the_exact_one(n):
    for k in sorted({0, 1, n // 3, n // 2, n}):
        exact = _exact_lower_tail(n, k)
        assert math.exp(_log_lower_tail(n, k)) == pytest.approx(exact, rel=1e-9, abs=1e-300)


def test_mcnemar_refuses_negative_counts():
    with pytest.raises(ValueError):
        mcnemar_exact(-1, 2)


@given(st.lists(st.tuples(st.booleans(), st.booleans()), max_size=200))
def test_paired_table_partitions_the_prompts_and_its_rates_are_the_lanes_pass_at_1(passes):
    table = PairedOutcomes.of(passes)
    assert table.total == len(passes)
    solved_a, solved_b = table.solved
    assert solved_a.count == sum(a for a, _ in passes)
    assert solved_b.count == sum(b for _, b in passes)
    assert solved_a.of == solved_b.of == len(passes)
    assert solved_a.count - solved_b.count == table.only_a - table.only_b
    assert math.isclose(table.mcnemar_p, mcnemar_exact(table.only_a, table.only_b))
