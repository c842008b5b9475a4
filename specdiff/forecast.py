"""Fork forecast: from one lane's margins, the steps where the other lane is most likely
to pick another token, each with a predicted probability.

Two lanes that share a context compute logits that differ by numeric noise (another
summation order, another kernel). A step flips when that noise moves the top-2 candidate
above the top-1, so its chance falls with the margin (top-1 minus top-2 logit) at a rate
set by the size of the noise between the two lanes. The chance is a logistic in the
margin, fitted on measured forks by maximum likelihood (`fit_flip_model`); the fitted
parameters live in POOLED_MODEL (and per pair in MEASURED_MODELS), made by
benchmarks/forecast_validation.py.

A run forks at its *first* differing token: after it the lanes' contexts differ and
later steps no longer compare. So the steps are ranked by the chance that the first fork
lands there, the flip chance times the chance that no earlier step flipped, which puts
an early near tie ahead of a later one of the same margin.

Pure: TokenSteps in, frozen records out; the CLI, the TUI and the validation read it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from specdiff.compare import first_divergence
from specdiff.fork_words import counted, quoted_piece
from specdiff.safe_text import visible
from specdiff.steps import TokenStep

MARGIN_CAP = 60.0
"""Margins above this read as this: the chance is already nil, and exp() stays finite."""


@dataclass(frozen=True)
class FlipModel:
    """P(flip | margin) = 1 / (1 + exp(intercept + slope * margin)), slope > 0: monotone
    falling in the margin, strictly between 0 and 1."""

    intercept: float
    slope: float
    source: str = ""
    """What the parameters were fitted on, for the reports."""

    def probability(self, margin: float) -> float:
        """The chance that a step with this margin flips; 0 for a step without a margin
        (a single candidate) or with an unreadable one."""
        if math.isnan(margin) or margin == math.inf:
            return 0.0
        z = self.intercept + self.slope * min(max(margin, 0.0), MARGIN_CAP)
        # the two forms keep exp() from overflowing at either end
        if z >= 0:
            return math.exp(-z) / (1.0 + math.exp(-z))
        return 1.0 / (1.0 + math.exp(z))


MEASURED_MODELS: dict[str, FlipModel] = {}
"""Flip models fitted on one pair alone, for pairs measured with enough forks to hold
one. None yet: fitted alone on 6-11 forks each, the ubatch, spec-vs-plain and
cache-vs-fresh slopes ran from 7.3 to 10.3, within what so few forks can tell apart, so
every pair reads the pooled fit."""

POOLED_MODEL = FlipModel(
    0.927,
    9.050,
    "pooled fit: ubatch, spec-vs-plain, cache-vs-fresh; 25 forks, one AVX-512 CPU",
)
"""Fitted by benchmarks/forecast_validation.py on all five bundled sets, 4 prompts each,
48 tokens (forks land elsewhere on other CPUs, so the figures are that machine's)."""


def model_for(pair_name: str) -> FlipModel:
    """The flip model measured for a pair, or the pooled one."""
    return MEASURED_MODELS.get(pair_name, POOLED_MODEL)


@dataclass(frozen=True)
class ForecastStep:
    index: int
    margin: float
    flip: float
    """The chance this step flips, when both lanes reach it with the same context."""
    first: float
    """The chance that the run's first fork lands on this step."""


@dataclass(frozen=True)
class Forecast:
    lane: str
    """The lane whose margins were read."""
    steps: tuple[ForecastStep, ...]
    """The most likely first-fork steps, most likely first."""
    fork_chance: float
    """The chance that the run forks anywhere within the steps read."""
    length: int
    """How many steps were read."""
    model: FlipModel

    @property
    def indices(self) -> frozenset[int]:
        return frozenset(step.index for step in self.steps)


def flip_chances(steps: Sequence[TokenStep], model: FlipModel) -> list[float]:
    """Each step's chance to flip."""
    return [model.probability(step.margin) for step in steps]


def first_fork_chances(chances: Sequence[float]) -> list[float]:
    """The chance that the first flip lands on each step: its own chance times the chance
    that every earlier step held."""
    held = 1.0
    firsts = []
    for chance in chances:
        firsts.append(held * chance)
        held *= 1.0 - chance
    return firsts


def forecast(steps: Sequence[TokenStep], top: int, model: FlipModel, start: int = 0) -> Forecast:
    """The `top` steps most likely to be the run's first fork; ties go to the earlier.
    With `start`, the steps before it are known to have held (the other lane agreed on
    them), so the forecast reads from there on."""
    chances = flip_chances(steps[start:], model)
    firsts = first_fork_chances(chances)
    ranked = sorted(range(len(chances)), key=lambda i: (-firsts[i], i))[: max(top, 0)]
    held = math.prod(1.0 - chance for chance in chances)
    return Forecast(
        lane=steps[0].lane if steps else "a",
        steps=tuple(
            ForecastStep(start + i, steps[start + i].margin, chances[i], firsts[i])
            for i in ranked
            if chances[i] > 0.0
        ),
        fork_chance=1.0 - held,
        length=len(chances),
        model=model,
    )


def observed_flips(a: Sequence[TokenStep], b: Sequence[TokenStep]) -> list[tuple[float, bool]]:
    """(lane a's margin, flipped) for each step both lanes reached with the same context:
    every step up to the first fork, which is the one that flipped. Steps after the fork
    had different contexts and say nothing about the noise. A step with one candidate
    has an infinite margin, which the fit leaves out."""
    fork = first_divergence(a, b)
    end = min(len(a), len(b)) if fork is None else fork + 1
    return [(a[i].margin, i == fork) for i in range(end)]


def fit_flip_model(
    observations: Iterable[tuple[float, bool]], source: str = "", ridge: float = 1e-3
) -> FlipModel:
    """The logistic flip model of largest likelihood for these (margin, flipped)
    observations, by Newton's method. A small ridge keeps it finite when the flips and
    holds separate perfectly; a fit that does not fall with the margin (too few flips)
    is refused with ValueError, since it would rank the confident steps first."""
    data = [(min(max(m, 0.0), MARGIN_CAP), bool(f)) for m, f in observations if math.isfinite(m)]
    if not any(flipped for _, flipped in data) or all(flipped for _, flipped in data):
        raise ValueError("a flip model needs both flipped and held steps")
    intercept, slope = 0.0, 1.0
    loss = _penalised_loss(data, intercept, slope, ridge)
    for _ in range(100):
        gradient, hessian = _newton_terms(data, intercept, slope, ridge)
        det = hessian[0] * hessian[2] - hessian[1] ** 2
        step_i = (hessian[2] * gradient[0] - hessian[1] * gradient[1]) / det
        step_s = (hessian[0] * gradient[1] - hessian[1] * gradient[0]) / det
        # a full Newton step can overshoot far from the optimum: halve it until it helps
        for _ in range(40):
            trial = _penalised_loss(data, intercept - step_i, slope - step_s, ridge)
            if trial <= loss:
                break
            step_i, step_s = step_i / 2, step_s / 2
        intercept, slope, loss = intercept - step_i, slope - step_s, min(trial, loss)
        if abs(step_i) + abs(step_s) < 1e-10:
            break
    if not slope > 0:
        raise ValueError("the flips do not fall with the margin: too few to fit")
    return FlipModel(intercept, slope, source)


def _penalised_loss(
    data: list[tuple[float, bool]], intercept: float, slope: float, ridge: float
) -> float:
    """Negative log-likelihood of the flips under the model, plus the ridge penalty."""
    model = FlipModel(intercept, slope)
    loss = 0.5 * ridge * (intercept * intercept + slope * slope)
    for margin, flipped in data:
        chance = model.probability(margin)
        loss -= math.log(max(chance if flipped else 1.0 - chance, 1e-300))
    return loss


def _newton_terms(
    data: list[tuple[float, bool]], intercept: float, slope: float, ridge: float
) -> tuple[tuple[float, float], tuple[float, float, float]]:
    """Gradient and Hessian (as its three distinct entries) of the penalised negative
    log-likelihood of the logistic flip model."""
    model = FlipModel(intercept, slope)
    g0 = g1 = h00 = h01 = h11 = 0.0
    for margin, flipped in data:
        p = model.probability(margin)
        # P(flip) = sigmoid(-z), so d(-log L)/dz = [flipped] - p
        residual = float(flipped) - p
        weight = p * (1.0 - p)
        g0 += residual
        g1 += residual * margin
        h00 += weight
        h01 += weight * margin
        h11 += weight * margin * margin
    return (g0 + ridge * intercept, g1 + ridge * slope), (h00 + ridge, h01, h11 + ridge)


@dataclass(frozen=True)
class CalibrationBin:
    low: float
    high: float
    steps: int
    predicted: float
    """Mean predicted flip chance of the steps in the bin."""
    observed: float
    """Share of those steps that flipped."""


CALIBRATION_EDGES = (0.0, 0.01, 0.05, 0.1, 0.2, 0.4, 1.0)


def calibration(
    predictions: Iterable[tuple[float, bool]], edges: Sequence[float] = CALIBRATION_EDGES
) -> list[CalibrationBin]:
    """Predicted flip chance against the observed flip rate, per bin of prediction;
    empty bins are left out."""
    bins: list[list[tuple[float, bool]]] = [[] for _ in edges[1:]]
    for chance, flipped in predictions:
        for slot, high in enumerate(edges[1:]):
            if chance < high or slot == len(bins) - 1:
                bins[slot].append((chance, flipped))
                break
    return [
        CalibrationBin(
            edges[slot],
            edges[slot + 1],
            len(members),
            sum(chance for chance, _ in members) / len(members),
            sum(flipped for _, flipped in members) / len(members),
        )
        for slot, members in enumerate(bins)
        if members
    ]


def forecast_lines(
    result: Forecast, steps: Sequence[TokenStep], fork_index: int | None
) -> list[str]:
    """The forecast as text lines for `specdiff run`: the run-level chance, then one line
    per forecast step with its token, margin and both chances; the real fork is marked
    where it fell on one."""
    head = (
        f"forecast from lane {result.lane}'s margins: {result.fork_chance:.0%} chance of a "
        f"fork within {counted(result.length, 'token')}"
    )
    lines = [head, f"  flip model: {visible(result.model.source or 'given')}"]
    for rank, step in enumerate(result.steps, 1):
        mark = "   <- the fork" if step.index == fork_index else ""
        lines.append(
            f"  #{rank:<2} token {step.index:<4} margin {step.margin:.3f}  flip {step.flip:5.1%}"
            f"  first fork {step.first:5.1%}  {quoted_piece(steps[step.index].piece)}{mark}"
        )
    if not result.steps:
        lines.append("  no step has a second candidate to flip to")
    elif fork_index is not None and fork_index not in result.indices:
        lines.append(f"  the fork (token {fork_index}) fell on no forecast step")
    return lines


def forecast_json(result: Forecast, fork_index: int | None) -> dict[str, object]:
    """The forecast as JSON-ready data."""
    return {
        "lane": result.lane,
        "fork_chance": result.fork_chance,
        "steps_read": result.length,
        "model": {
            "intercept": result.model.intercept,
            "slope": result.model.slope,
            "source": result.model.source,
        },
        "steps": [
            {"index": s.index, "margin": s.margin, "flip": s.flip, "first_fork": s.first}
            for s in result.steps
        ],
        "fork_on_forecast_step": None if fork_index is None else fork_index in result.indices,
    }
