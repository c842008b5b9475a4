"""A suite's figures: per pair (variant), how many prompts forked and where, of which
class, speeds, drafts, teacher-forced flips and, on a graded suite, paired pass@1 with
McNemar's test, gathered with the records into one JSON-able object."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from specdiff import __version__
from specdiff.compare import DEFAULT_SPLIT_THRESHOLD, FORK_CLASSES
from specdiff.sessions.format import RunSummary
from specdiff.suite.noise_floor import control_summary
from specdiff.suite.paired import PairedOutcomes, Rate
from specdiff.suite.records import MARGIN_BUCKETS, PromptRecord, TeacherStats, bucket_index
from specdiff.suite.runner import SuiteOutcome

CHECKPOINTS = (25, 50, 100, 200, 400, 800, 1600, 3200, 6400)
"""Generation lengths at which the report gives the fraction of prompts forked."""
DELTA_BINS = (0.0, 1e-4, 1e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0, math.inf)
"""Bins of |Δlogit| of the chosen token (teacher-forced), roughly logarithmic."""


def median(values: Sequence[float]) -> float | None:
    clean = [v for v in values if math.isfinite(v)]
    return statistics.median(clean) if clean else None


def quantile(values: Sequence[float], q: float) -> float | None:
    clean = sorted(v for v in values if math.isfinite(v))
    if not clean:
        return None
    position = min(len(clean) - 1, max(0, math.ceil(q * len(clean)) - 1))
    return clean[position]


def fork_bins(max_tokens: int) -> list[tuple[int, int]]:
    """Ten equal bins of first-divergence index over [0, max_tokens)."""
    width = max(1, math.ceil(max_tokens / 10))
    return [(start, min(start + width, max_tokens)) for start in range(0, max_tokens, width)]


def summarize(records: Sequence[PromptRecord], max_tokens: int, near_tie: float) -> dict[str, Any]:
    """The report's figures for one pair (variant) from its prompt records."""
    n = len(records)
    # a crashed run (its worker died) is counted apart from those that failed
    crashed = sum(1 for r in records if r.summary.crashed)
    ok = [r for r in records if not r.summary.failed and not r.summary.crashed]
    runs = [r.summary for r in ok]
    forks = [run.fork_index for run in runs if run.fork_index is not None]
    longest = max([max_tokens, *(max(r.summary.generated) for r in records)])
    margins = [min(run.fork_margins) for run in runs if run.fork_margins is not None]
    steps = [sum(run.generated[i] for run in runs) for i in (0, 1)]
    ties = [sum(r.near_ties[i] for r in ok) for i in (0, 1)]
    summary: dict[str, Any] = {
        "prompts": n,
        "failed": n - len(ok) - crashed,
        "crashed": crashed,
        "identical": sum(1 for run in runs if run.identical),
        "identical_rate": Rate(sum(1 for run in runs if run.identical), len(runs)).to_json(),
        "forked": len(forks),
        "lengths_differ": sum(1 for run in runs if not run.identical and run.fork_index is None),
        **_fork_places(forks, longest, len(ok)),
        "fork_margin_median": median(margins),
        "fork_margins": margins,
        "near_tie_threshold": near_tie,
        "near_ties_per_1000": [1000 * ties[i] / steps[i] if steps[i] else None for i in (0, 1)],
        **_speeds(runs),
        "generation_seconds": sum(r.summary.generation_seconds for r in records),
        "fork_classes": fork_class_counts(runs),
        "split_threshold": DEFAULT_SPLIT_THRESHOLD,
        "grades": graded_summary(records),
        "serving": serving_summary(records),
        "control": control_summary(runs),
    }
    teachers = [r.teacher for r in ok if r.teacher is not None]
    if teachers:
        summary["teacher_forced"] = teacher_summary(teachers)
    return summary


def serving_summary(records: Sequence[PromptRecord]) -> dict[str, Any] | None:
    """Per lane: the retries and back-off seconds of its server requests in total, and
    per endpoint the runs it served, their forks and failures (one replica that forks
    more than the others is a finding); None where no run recorded how it was served."""
    lanes = []
    for lane in (0, 1):
        endpoints: dict[str, dict[str, Any]] = {}
        for record in records:
            serving = record.summary.serving[lane] if record.summary.serving else None
            if serving is None:
                continue
            row = endpoints.setdefault(serving.endpoint, dict.fromkeys(ENDPOINT_COUNTS, 0))
            run = record.summary
            failed = run.failed or run.crashed
            row["prompts"] += 1
            row["failed"] += failed
            row["forked"] += not failed and run.fork_index is not None
            row["retries"] += serving.retries
            row["wait_seconds"] += serving.wait_seconds
        lanes.append(endpoints)
    if not any(lanes):
        return None
    return {
        "retries": [sum(row["retries"] for row in lane.values()) for lane in lanes],
        "wait_seconds": [sum(row["wait_seconds"] for row in lane.values()) for lane in lanes],
        "endpoints": [
            [
                {"endpoint": endpoint, **row, "fork_rate": _fork_rate(row)}
                for endpoint, row in sorted(lane.items())
            ]
            for lane in lanes
        ],
    }


ENDPOINT_COUNTS = ("prompts", "failed", "forked", "retries", "wait_seconds")
"""What the report counts per endpoint of a lane."""


def _fork_rate(row: dict[str, Any]) -> float | None:
    finished = row["prompts"] - row["failed"]
    return row["forked"] / finished if finished else None


def fork_class_counts(runs: Sequence[RunSummary]) -> dict[str, int]:
    """How many forks fell in each class; `unclassified` counts forks recorded before
    sessions carried a class."""
    counts = dict.fromkeys(FORK_CLASSES, 0)
    counts["unclassified"] = 0
    for run in runs:
        if run.fork_index is not None:
            counts[run.fork_class if run.fork_class in counts else "unclassified"] += 1
    return counts


def _paired_pass(record: PromptRecord) -> tuple[bool, bool] | str:
    """Whether each lane passed, or why the run is left out of pass@1: it failed,
    crashed, or a lane has no grade."""
    run = record.summary
    if run.crashed:
        return "crashed"
    if run.failed:
        return "failed: " + "; ".join(dict.fromkeys(e for e in run.errors if e))
    if run.grades is None or run.grades[0] is None or run.grades[1] is None:
        return "not graded"
    return run.grades[0].passed, run.grades[1].passed


def graded_summary(records: Sequence[PromptRecord]) -> dict[str, Any] | None:
    """Paired pass@1 over the runs where both lanes were graded, or None when no run of
    the pair carries a grade. Failed and crashed runs are left out of every denominator
    (a lane that never finished says nothing about its quality) and named instead."""
    if not any(r.summary.grades is not None for r in records):
        return None
    passes: list[tuple[bool, bool]] = []
    forked_passes: list[tuple[bool, bool]] = []
    excluded = []
    for record in records:
        outcome = _paired_pass(record)
        if isinstance(outcome, str):
            excluded.append({"prompt_id": record.prompt_id, "why": outcome})
            continue
        passes.append(outcome)
        if not record.summary.identical:
            forked_passes.append(outcome)
    table = PairedOutcomes.of(passes)
    forked = PairedOutcomes.of(forked_passes)
    return {
        "graded": table.total,
        "pass_at_1": [rate.to_json() for rate in table.solved],
        "both": table.both,
        "only_a": table.only_a,
        "only_b": table.only_b,
        "neither": table.neither,
        "mcnemar_p": table.mcnemar_p,
        "forked_pass_at_1": [rate.to_json() for rate in forked.solved],
        "excluded": excluded,
    }


def _fork_places(forks: Sequence[int], longest: int, runs: int) -> dict[str, Any]:
    """Where the `runs` finished runs forked: as indices, in ten bins, by checkpoint
    length, and as a running count at every token."""
    bins = fork_bins(longest)
    histogram = [sum(1 for f in forks if lo <= f < hi) for lo, hi in bins]
    checkpoints = [c for c in CHECKPOINTS if c < longest] + [longest]
    forked_at = [0] * (longest + 1)
    for index in forks:
        forked_at[index + 1] += 1
    by_token = []
    running = 0
    for count in forked_at:
        running += count
        by_token.append(running)
    return {
        "fork_indices": list(forks),
        "fork_histogram": [
            {"from": lo, "to": hi, "count": c} for (lo, hi), c in zip(bins, histogram)
        ],
        "forked_by_length": [
            {"tokens": c, "forked": sum(1 for f in forks if f < c), "of": runs} for c in checkpoints
        ],
        "forked_by_token": by_token,
    }


def _speeds(runs: Sequence[RunSummary]) -> dict[str, Any]:
    """Both lanes' speeds and draft acceptance over the finished runs."""
    speeds = [
        median([run.tokens_per_second[i] for run in runs if run.tokens_per_second[i] > 0])
        for i in (0, 1)
    ]
    ratios = [
        run.tokens_per_second[0] / run.tokens_per_second[1]
        for run in runs
        if run.tokens_per_second[0] > 0 and run.tokens_per_second[1] > 0
    ]
    drafted = [sum(run.drafted[i] for run in runs) for i in (0, 1)]
    accepted = [sum(run.accepted[i] for run in runs) for i in (0, 1)]
    return {
        "tokens_per_second_median": speeds,
        "speedup": speeds[0] / speeds[1] if speeds[0] and speeds[1] else None,
        "speedup_median_of_ratios": median(ratios),
        "acceptance": [accepted[i] / drafted[i] if drafted[i] else None for i in (0, 1)],
        "drafted": drafted,
        "accepted": accepted,
    }


def teacher_summary(stats: Sequence[TeacherStats]) -> dict[str, Any]:
    steps = sum(s.steps for s in stats)
    flips = sum(len(s.flips) for s in stats)
    deltas = [d for s in stats for d in s.deltas]
    bucket_steps = [sum(s.bucket_steps[i] for s in stats) for i in range(len(MARGIN_BUCKETS) - 1)]
    bucket_flips = [sum(s.bucket_flips[i] for s in stats) for i in range(len(MARGIN_BUCKETS) - 1)]
    delta_counts = [0] * (len(DELTA_BINS) - 1)
    for delta in deltas:
        delta_counts[bucket_index(delta, DELTA_BINS)] += 1
    return {
        "steps": steps,
        "flips": flips,
        "flip_rate": flips / steps if steps else None,
        "same_top1": 1 - flips / steps if steps else None,
        "prompts_with_a_flip": sum(1 for s in stats if s.flips),
        "delta_logit": {
            "mean": statistics.fmean(deltas) if deltas else None,
            "median": median(deltas),
            "p90": quantile(deltas, 0.9),
            "p99": quantile(deltas, 0.99),
            "max": max(deltas) if deltas else None,
            "histogram": [
                {"from": DELTA_BINS[i], "to": DELTA_BINS[i + 1], "count": delta_counts[i]}
                for i in range(len(delta_counts))
            ],
        },
        "by_margin": [
            {
                "from": MARGIN_BUCKETS[i],
                "to": MARGIN_BUCKETS[i + 1],
                "steps": bucket_steps[i],
                "flips": bucket_flips[i],
            }
            for i in range(len(bucket_steps))
        ],
    }


def outcome_json(outcome: SuiteOutcome) -> dict[str, Any]:
    """Everything the reports show, as one JSON-able object."""
    settings = outcome.settings
    by_label: dict[str, list[PromptRecord]] = {}
    for record in outcome.records:
        by_label.setdefault(record.pair, []).append(record)
    pairs = []
    for label, _pair, quant in settings.variants():
        records = by_label.get(label, [])
        pairs.append(
            {
                "label": label,
                "quant": quant,
                "summary": {
                    **summarize(records, settings.max_tokens, settings.near_tie),
                    # the load every figure was measured under, beside each of them
                    "concurrency": settings.concurrency,
                    "kld": outcome.kld.get(label),
                },
                "configuration": outcome.executed.get(label),
                "prompt_length": settings.prompt_length(label),
            }
        )
    jobs = len(settings.variants()) * len(outcome.prompts)
    return {
        "specdiff": __version__,
        "created": outcome.started,
        "complete": not outcome.cancelled and len(outcome.records) + outcome.skipped_runs == jobs,
        "jobs": jobs,
        "finished": len(outcome.records),
        "resumed": outcome.resumed,
        "wall_seconds": outcome.wall_seconds,
        "settings": settings.as_json(outcome.prompts),
        "skipped_prompts": outcome.skipped,
        "pairs": pairs,
        "prompts": [r.to_json() for r in outcome.records],
    }
