"""How well the fork forecast (specdiff/forecast.py) predicts real forks.

Runs the ubatch, spec-vs-plain and cache-vs-fresh pairs over the first prompts of each
bundled set, then reads lane a's margins alone, as the forecast does before lane b
arrives, and reports:
- the share of real forks that fell on a forecast step (top 5 and top 10), ranked by the
  chance of the first fork (the forecast) and by the margin alone;
- a calibration table: predicted flip chance per bin against the observed flip rate over
  every step both lanes reached with the same context. Predictions are cross-validated:
  each run is scored with a model fitted on the pair's other runs (leave one out; on
  every pair's where its own hold too few forks);
- the flip model fitted on all of it, per pair and pooled, to paste into
  MEASURED_MODELS / POOLED_MODEL.

    python benchmarks/forecast_validation.py [--per-set 6] [--tokens 64] [--save runs.json]
    python benchmarks/forecast_validation.py --load runs.json   # report again, no model

Forks land differently on other CPUs: the figures are the machine's that ran it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import prompts  # noqa: E402

from specdiff.forecast import (  # noqa: E402
    FlipModel,
    calibration,
    first_fork_chances,
    fit_flip_model,
    observed_flips,
)
from specdiff.steps import TokenStep  # noqa: E402

PAIRS = ("ubatch", "spec-vs-plain", "cache-vs-fresh")
SETS = ("coding", "divergence", "open", "questions", "repetitive")


def measure(per_set: int, tokens: int, sets: list[str], save: Path | None) -> list[dict[str, Any]]:
    """One record per (pair, prompt): lane a's margins over the steps both lanes reached
    with one context, and where the run forked. Every pair runs each prompt before the
    next prompt starts, and each record is appended to `save` as it comes, so a
    measurement stopped halfway still covers every pair."""
    from contextlib import ExitStack

    from specdiff.engine.pairrun import PairRun
    from specdiff.lanes import presets

    runs = []
    started = time.perf_counter()
    with ExitStack() as stack:
        runners = {name: stack.enter_context(PairRun(presets()[name])) for name in PAIRS}
        for set_name in sets:
            for number, text in enumerate(prompts(set_name)[:per_set]):
                for pair_name, runner in runners.items():
                    result = runner.run(text, tokens)
                    record = _record(
                        pair_name, f"{set_name}/{number}", result.a.steps, result.b.steps
                    )
                    runs.append(record)
                    if save is not None:
                        with save.open("a") as lines:
                            lines.write(json.dumps(record) + "\n")
                print(
                    f"{set_name}/{number}: {time.perf_counter() - started:.0f} s", file=sys.stderr
                )
    return runs


def _record(pair: str, prompt: str, a: list[TokenStep], b: list[TokenStep]) -> dict[str, Any]:
    observed = observed_flips(a, b)
    return {
        "pair": pair,
        "prompt": prompt,
        "margins": [m if math.isfinite(m) else None for m, _ in observed],
        "all_margins": [s.margin if math.isfinite(s.margin) else None for s in a],
        "fork": next((i for i, (_, flipped) in enumerate(observed) if flipped), None),
    }


def _margins(values: list[float | None]) -> list[float]:
    return [math.inf if m is None else m for m in values]


def _observations(runs: list[dict[str, Any]]) -> list[tuple[float, bool]]:
    return [
        (margin, index == run["fork"])
        for run in runs
        for index, margin in enumerate(_margins(run["margins"]))
    ]


def _fit(runs: list[dict[str, Any]], source: str) -> FlipModel:
    return fit_flip_model(_observations(runs), source)


def _rank_first(margins: list[float], model: FlipModel) -> list[int]:
    firsts = first_fork_chances([model.probability(m) for m in margins])
    return sorted(range(len(margins)), key=lambda i: (-firsts[i], i))


def _rank_margin(margins: list[float], _: FlipModel) -> list[int]:
    return sorted(range(len(margins)), key=lambda i: (margins[i], i))


def hit_rates(runs: list[dict[str, Any]], models: dict[int, FlipModel]) -> dict[str, float]:
    """Share of forked runs whose fork is among the top 5 / 10 steps of lane a's whole
    run, under each ranking; `models` gives each run (by position) its held-out model."""
    forked = [(i, run) for i, run in enumerate(runs) if run["fork"] is not None]
    rates = {}
    for name, rank in (("first-fork chance", _rank_first), ("margin alone", _rank_margin)):
        for top in (5, 10):
            hits = sum(
                run["fork"] in rank(_margins(run["all_margins"]), models[i])[:top]
                for i, run in forked
            )
            rates[f"{name}, top {top}"] = hits / len(forked) if forked else math.nan
    return rates


def held_out_models(
    chosen: list[dict[str, Any]], everything: list[dict[str, Any]]
) -> dict[int, FlipModel]:
    """For each chosen run, a model fitted on the other chosen runs (leave one run out),
    or on every other run of every pair where the chosen ones hold too few forks."""
    models = {}
    for i, run in enumerate(chosen):
        try:
            models[i] = _fit([r for r in chosen if r is not run], "held out")
        except ValueError:
            models[i] = _fit([r for r in everything if r is not run], "held out, pooled")
    return models


def report(runs: list[dict[str, Any]]) -> None:
    for pair_name in (*PAIRS, "all"):
        chosen = runs if pair_name == "all" else [r for r in runs if r["pair"] == pair_name]
        forks = [r["fork"] for r in chosen if r["fork"] is not None]
        steps = sum(len(r["margins"]) for r in chosen)
        print(f"\n## {pair_name}: {len(chosen)} runs, {len(forks)} forked, {steps} steps compared")
        if not forks:
            continue
        try:
            models = held_out_models(chosen, runs)
        except ValueError as error:
            print(f"too few forks to validate: {error}")
            continue
        for name, rate in hit_rates(chosen, models).items():
            print(f"forks on a forecast step ({name}): {rate:.0%}")
        predictions = [
            (models[i].probability(margin), index == run["fork"])
            for i, run in enumerate(chosen)
            for index, margin in enumerate(_margins(run["margins"]))
        ]
        print("| predicted flip chance | steps | mean predicted | observed |")
        print("|---|---|---|---|")
        for row in calibration(predictions):
            print(
                f"| {row.low:g}-{row.high:g} | {row.steps} | {row.predicted:.3f} "
                f"| {row.observed:.3f} |"
            )
        try:
            model = _fit(chosen, f"{pair_name}: {len(chosen)} runs")
            print(f"fitted: FlipModel({model.intercept:.3f}, {model.slope:.3f})")
        except ValueError as error:
            print(f"no model of its own: {error}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--per-set", type=int, default=6, help="prompts from each set")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--sets", default=",".join(SETS), help="bundled sets, comma-separated")
    parser.add_argument("--save", help="append each measured run to this JSONL file")
    parser.add_argument("--load", help="report on runs saved before, without the model")
    args = parser.parse_args()
    if args.load:
        runs = [json.loads(line) for line in Path(args.load).read_text().splitlines()]
    else:
        runs = measure(
            args.per_set, args.tokens, args.sets.split(","), Path(args.save) if args.save else None
        )
    print(
        f"{len(runs)} runs: pairs {', '.join(PAIRS)}; sets {args.sets}; "
        f"up to {args.per_set} prompts each, {args.tokens} tokens"
    )
    report(runs)


if __name__ == "__main__":
    main()
