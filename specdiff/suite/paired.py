"""Paired statistics for two lanes run on the same prompts: a Wilson score interval for a
proportion and the exact McNemar test on the prompts only one lane solved.

A suite's prompts are few (tens to hundreds), so a plain "34 vs 33 solved" says little on
its own: the interval says how far the rate could move with other prompts, and McNemar
asks whether the prompts on which the lanes disagree lean to one lane more than chance.
Both are computed here with the standard library alone, exactly where it is cheap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

Z_95 = 1.959963984540054
"""The standard normal quantile at 0.975: a two-sided 95% interval."""
EXACT_LIMIT = 20_000
"""Up to this many discordant pairs the binomial tail is summed in exact integers; above
it in log space, where the integers would grow too slow to sum."""


def wilson_interval(successes: int, trials: int, z: float = Z_95) -> tuple[float, float] | None:
    """The Wilson score interval for `successes` of `trials`; None when there are no
    trials. Unlike the normal approximation it stays inside [0, 1] and is not empty at
    0 of N or N of N."""
    if trials <= 0:
        return None
    if not 0 <= successes <= trials:
        raise ValueError(f"{successes} successes of {trials} trials")
    rate = successes / trials
    z2 = z * z
    denominator = 1 + z2 / trials
    centre = (rate + z2 / (2 * trials)) / denominator
    half = z * math.sqrt(rate * (1 - rate) / trials + z2 / (4 * trials * trials)) / denominator
    # at 0 of N and N of N the bound is exactly the edge; rounding would move it off
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == trials else min(1.0, centre + half)
    return low, high


def mcnemar_exact(only_a: int, only_b: int) -> float:
    """The exact two-sided McNemar p-value: a binomial test of `only_a` against `only_b`
    at p = 1/2, twice the smaller tail, at most 1; 1 when no prompt is discordant."""
    if only_a < 0 or only_b < 0:
        raise ValueError(f"negative counts {only_a}, {only_b}")
    discordant = only_a + only_b
    if discordant == 0:
        return 1.0
    smaller = min(only_a, only_b)
    if discordant <= EXACT_LIMIT:
        tail = _exact_lower_tail(discordant, smaller)
    else:
        tail = math.exp(_log_lower_tail(discordant, smaller))
    return min(1.0, 2 * tail)


def _exact_lower_tail(n: int, k: int) -> float:
    """P(X <= k) for X ~ Binomial(n, 1/2), from exact integers (Python divides big
    integers with correct rounding)."""
    total = 0
    term = 1  # C(n, 0)
    for i in range(k + 1):
        total += term
        term = term * (n - i) // (i + 1)
    return total / (1 << n)


def _log_lower_tail(n: int, k: int) -> float:
    """log P(X <= k) for X ~ Binomial(n, 1/2), summed in log space around its largest term."""
    log_half = n * math.log(0.5)
    logs = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) for i in range(k + 1)]
    top = max(logs)
    return top + math.log(math.fsum(math.exp(v - top) for v in logs)) + log_half


@dataclass(frozen=True)
class Rate:
    """`count` of `of`, with its Wilson 95% interval (None when `of` is 0)."""

    count: int
    of: int

    @property
    def value(self) -> float | None:
        return self.count / self.of if self.of else None

    @property
    def interval(self) -> tuple[float, float] | None:
        return wilson_interval(self.count, self.of)

    def to_json(self) -> dict[str, object]:
        interval = self.interval
        return {
            "count": self.count,
            "of": self.of,
            "rate": self.value,
            "interval": None if interval is None else list(interval),
        }


@dataclass(frozen=True)
class PairedOutcomes:
    """Pass/fail of both lanes on the same prompts, as McNemar's 2×2 table."""

    both: int
    only_a: int
    only_b: int
    neither: int

    @classmethod
    def of(cls, passes: list[tuple[bool, bool]]) -> PairedOutcomes:
        return cls(
            both=sum(1 for a, b in passes if a and b),
            only_a=sum(1 for a, b in passes if a and not b),
            only_b=sum(1 for a, b in passes if b and not a),
            neither=sum(1 for a, b in passes if not a and not b),
        )

    @property
    def total(self) -> int:
        return self.both + self.only_a + self.only_b + self.neither

    @property
    def solved(self) -> tuple[Rate, Rate]:
        """pass@1 of lane a and lane b over the same prompts."""
        return Rate(self.both + self.only_a, self.total), Rate(self.both + self.only_b, self.total)

    @property
    def mcnemar_p(self) -> float:
        return mcnemar_exact(self.only_a, self.only_b)
