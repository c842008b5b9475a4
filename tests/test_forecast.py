"""The fork forecast: flip chances from margins, the ranking, the fitted model, and
`specdiff run --forecast` as a user runs it."""

from __future__ import annotations

import json
import math
import random

import pytest

from specdiff.forecast import (
    MEASURED_MODELS,
    POOLED_MODEL,
    FlipModel,
    calibration,
    first_fork_chances,
    fit_flip_model,
    forecast,
    forecast_json,
    forecast_lines,
    model_for,
    observed_flips,
)
from specdiff.steps import Candidate, TokenStep
from tests.in_process import specdiff_here
from tests.test_cli import assert_one_line_error, specdiff

MODELS = [POOLED_MODEL, *MEASURED_MODELS.values(), FlipModel(-3.0, 0.5), FlipModel(4.0, 40.0)]
NARROW_NOISE = [POOLED_MODEL, *MEASURED_MODELS.values(), FlipModel(4.0, 40.0)]
"""Models under which a step with a margin of 1 rarely flips, as measured on real lanes."""
MARGINS = [0.0, 1e-9, 0.01, 0.1, 0.5, 1.0, 3.0, 20.0, 1e6, math.inf]


def step(
    index: int, margin: float, token: int = 1, piece: bytes = b"x", lane: str = "a"
) -> TokenStep:
    """A step whose top-2 lie `margin` apart; an infinite margin = one candidate."""
    top = (Candidate(token, 5.0, piece),)
    if math.isfinite(margin):
        top += (Candidate(token + 1, 5.0 - margin, b"y"),)
    return TokenStep(lane, index, token, piece, top, False, 1, 0.0)


def run_of(margins: list[float], token: int = 1) -> list[TokenStep]:
    return [step(i, m, token) for i, m in enumerate(margins)]


@pytest.mark.parametrize("model", MODELS, ids=lambda m: f"{m.intercept:g},{m.slope:g}")
def test_flip_chance_is_bounded_and_falls_with_the_margin(model: FlipModel) -> None:
    chances = [model.probability(m) for m in MARGINS]
    assert all(0.0 <= c < 1.0 for c in chances)
    assert chances == sorted(chances, reverse=True)
    assert chances[0] > chances[-2]  # not flat
    assert model.probability(math.inf) == 0.0
    assert model.probability(math.nan) == 0.0
    assert model.probability(-1.0) == model.probability(0.0)


def test_every_measured_model_falls_with_the_margin() -> None:
    for model in MODELS:
        assert model.slope > 0, model


@pytest.mark.parametrize("top", [1, 3, 10, 100])
@pytest.mark.parametrize("seed", range(4))
def test_forecast_ranks_by_first_fork_chance_and_stays_finite(top: int, seed: int) -> None:
    rng = random.Random(seed)
    margins = [
        rng.choice([rng.expovariate(3.0), rng.expovariate(0.2), math.inf]) for _ in range(60)
    ]
    made = forecast(run_of(margins), top, POOLED_MODEL)
    firsts = [s.first for s in made.steps]
    assert len(made.steps) <= top
    assert firsts == sorted(firsts, reverse=True)
    assert all(math.isfinite(v) and 0.0 <= v <= 1.0 for s in made.steps for v in (s.flip, s.first))
    assert all(math.isfinite(margins[s.index]) for s in made.steps)
    assert 0.0 <= made.fork_chance <= 1.0
    chances = [POOLED_MODEL.probability(m) for m in margins]
    assert math.isclose(sum(first_fork_chances(chances)), made.fork_chance, abs_tol=1e-12)


@pytest.mark.parametrize("margin", [0.0, 0.05, 0.4])
def test_of_two_equal_margins_the_earlier_step_ranks_first(margin: float) -> None:
    made = forecast(run_of([3.0, margin, 3.0, margin, 3.0]), 2, POOLED_MODEL)
    assert [s.index for s in made.steps] == [1, 3]
    assert made.steps[0].flip == made.steps[1].flip
    assert made.steps[0].first > made.steps[1].first


@pytest.mark.parametrize("model", NARROW_NOISE, ids=lambda m: f"{m.intercept:g},{m.slope:g}")
def test_a_smaller_margin_ranks_first_where_no_earlier_step_competes(model: FlipModel) -> None:
    made = forecast(run_of([5.0, 0.3, 0.02, 1.0]), 4, model)
    assert [s.index for s in made.steps][:3] == [2, 1, 3]


@pytest.mark.parametrize("margins", [[], [math.inf], [math.inf] * 5])
def test_a_run_with_nothing_to_flip_forecasts_no_step(margins: list[float]) -> None:
    made = forecast(run_of(margins), 5, POOLED_MODEL)
    assert made.steps == ()
    assert made.fork_chance == 0.0
    assert "no step has a second candidate" in "\n".join(
        forecast_lines(made, run_of(margins), None)
    )


@pytest.mark.parametrize("truth", [FlipModel(1.0, 8.0), FlipModel(3.0, 3.0), FlipModel(-0.5, 15.0)])
def test_the_fit_recovers_the_model_that_made_the_flips(truth: FlipModel) -> None:
    rng = random.Random(7)
    data = []
    for _ in range(3000):
        margin = rng.expovariate(0.7)
        data.append((margin, rng.random() < truth.probability(margin)))
    fitted = fit_flip_model(data, "synthetic")
    for margin in (0.0, 0.1, 0.3, 1.0):
        assert abs(fitted.probability(margin) - truth.probability(margin)) < 0.05


@pytest.mark.parametrize(
    "data", [[], [(0.1, False), (2.0, False)], [(0.1, True)], [(math.nan, True), (1.0, False)]]
)
def test_the_fit_refuses_data_without_both_outcomes(data: list[tuple[float, bool]]) -> None:
    with pytest.raises(ValueError):
        fit_flip_model(data)


def test_the_fit_refuses_flips_that_grow_with_the_margin() -> None:
    data = [(m / 10, m > 50) for m in range(100)]
    with pytest.raises(ValueError, match="margin"):
        fit_flip_model(data)


@pytest.mark.parametrize("fork", [0, 3, 7, None])
def test_observed_flips_stop_at_the_fork(fork: int | None) -> None:
    a = run_of([0.5] * 8)
    b = [step(i, 0.5, 9 if i == fork else 1, lane="b") for i in range(6 if fork is None else 8)]
    seen = observed_flips(a, b)
    assert len(seen) == (6 if fork is None else fork + 1)
    assert [flipped for _, flipped in seen] == [i == fork for i in range(len(seen))]


def test_calibration_counts_every_prediction_once() -> None:
    rng = random.Random(3)
    predictions = [(rng.random() ** 3, rng.random() < 0.2) for _ in range(500)]
    predictions += [(0.0, False), (1.0, True)]
    rows = calibration(predictions)
    assert sum(row.steps for row in rows) == len(predictions)
    for row in rows:
        assert row.low <= row.predicted <= row.high
        assert 0.0 <= row.observed <= 1.0


def test_calibration_of_nothing_is_empty() -> None:
    assert calibration([]) == []


@pytest.mark.parametrize("piece", [b"\x1b[31mred", b"\r\n\t", "\u202eevil".encode(), b"\xff\xfe"])
def test_forecast_lines_escape_hostile_pieces(piece: bytes) -> None:
    steps = [step(0, 0.01, piece=piece), step(1, 3.0)]
    lines = forecast_lines(forecast(steps, 2, POOLED_MODEL), steps, 0)
    text = "\n".join(lines)
    assert not any(ch in text for ch in "\x1b\r\t\u202e")
    assert "<- the fork" in lines[2]


@pytest.mark.parametrize("fork", [None, 0, 4])
def test_forecast_json_says_whether_the_fork_was_forecast(fork: int | None) -> None:
    steps = run_of([0.01, 2.0, 2.0, 2.0, 9.0])
    data = forecast_json(forecast(steps, 1, model_for("ubatch")), fork)
    json.dumps(data, allow_nan=False)
    assert data["fork_on_forecast_step"] == (None if fork is None else fork == 0)


@pytest.mark.parametrize("value", ["0", "x", "2.5", "1001"])
def test_run_refuses_a_bad_forecast_count(value: str) -> None:
    assert_one_line_error(specdiff_here("run", "--forecast", value), "--forecast")


@pytest.mark.model
def test_a_short_run_forecasts_its_forks() -> None:
    completed = specdiff(
        "run", "--pair", "ubatch", "--max-tokens", "16", "--forecast", "3", "--json", "--quiet"
    )
    assert completed.returncode in (0, 1), completed.stderr
    data = json.loads(completed.stdout)
    made = data["forecast"]
    assert made["steps_read"] == data["lanes"]["a"]["tokens"] > 0
    margins = data["lanes"]["a"]["margins"]
    assert all(abs(s["margin"] - margins[s["index"]]) < 1e-4 for s in made["steps"])
    assert 1 <= len(made["steps"]) <= 3
    assert all(
        0.0 <= s["flip"] <= 1.0 and 0.0 <= s["first_fork"] <= s["flip"] for s in made["steps"]
    )
    firsts = [s["first_fork"] for s in made["steps"]]
    assert firsts == sorted(firsts, reverse=True)
    fork = (data["fork"] or {}).get("index")
    assert made["fork_on_forecast_step"] == (
        None if fork is None else fork in {s["index"] for s in made["steps"]}
    )
