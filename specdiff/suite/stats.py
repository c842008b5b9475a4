"""A suite's figures: per pair (variant), how many prompts forked and where, of which
class, speeds, drafts, teacher-forced flips and, on a graded suite, paired pass@1 with
McNemar's test, gathered with the records into one JSON-able object."""

from __future__ import annotations

import math
import statistics
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from specdiff.compare import DEFAULT_SPLIT_THRESHOLD, FORK_CLASSES
from specdiff.sessions.records import RunSummary, Serving
from specdiff.suite.noise_floor import ControlTally
from specdiff.suite.paired import PairedOutcomes, Rate
from specdiff.suite.records import MARGIN_BUCKETS, PromptRecord, TeacherStats, bucket_index

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


class ExactSum:
    """A sum of floats that does not depend on the order of its terms: runs side by side
    end in any order, and a report must not change in its last digit with it. Kept as
    Shewchuk's non-overlapping partials (what math.fsum keeps), rounded once."""

    def __init__(self) -> None:
        self.partials: list[float] = []

    def add(self, value: float) -> None:
        kept = 0
        for partial in self.partials:
            if abs(value) < abs(partial):
                value, partial = partial, value
            high = value + partial
            low = partial - (high - value)
            if low:
                self.partials[kept] = low
                kept += 1
            value = high
        self.partials[kept:] = [value]

    @property
    def value(self) -> float:
        return math.fsum(self.partials)


class Placed:
    """Numbers kept in the order their runs end, each with its run's place in the suite,
    given back in suite order: the report lists forks as the prompts come."""

    def __init__(self, typecode: str) -> None:
        self.values = array(typecode)
        self.places = array("q")

    def append(self, place: int, value: float) -> None:
        self.values.append(value)  # type: ignore[arg-type]
        self.places.append(place)

    def __len__(self) -> int:
        return len(self.values)

    def in_suite_order(self) -> list[Any]:
        order = sorted(range(len(self.places)), key=self.places.__getitem__)
        return [self.values[index] for index in order]


class PairFigures:
    """The report's figures for one pair (variant), gathered a record at a time: counts,
    sums and the numbers medians and quantiles need (8 bytes each), never the records,
    so that a suite of any length holds the same few objects. Records may come in any
    order (runs side by side end in any order): the figures do not depend on it."""

    def __init__(self, graded: bool = True) -> None:
        self.prompts = 0
        self.crashed = 0
        self.finished = 0
        """Runs neither failed nor crashed: every figure below but `longest` and
        `generation_seconds` is over these."""
        self.identical = 0
        self.lengths_differ = 0
        self.forks = Placed("q")
        self.fork_margins = Placed("d")
        """The smaller of the two lanes' margins at each fork."""
        self.longest = 0
        self.steps = [0, 0]
        self.near_ties = [0, 0]
        self.speeds = (array("d"), array("d"))
        """Each lane's tokens per second, where it produced any."""
        self.speed_ratios = array("d")
        self.drafted = [0, 0]
        self.accepted = [0, 0]
        self.generation_seconds = ExactSum()
        self.fork_classes = dict.fromkeys(FORK_CLASSES, 0)
        self.fork_classes["unclassified"] = 0
        self.grades = GradedTally(graded)
        self.serving = ServingTally()
        self.control = ControlTally()
        self.teacher: TeacherTally | None = None

    @classmethod
    def of(cls, records: Iterable[PromptRecord]) -> PairFigures:
        """The figures of `records`, given in suite order."""
        figures = cls()
        for place, record in enumerate(records):
            figures.add(record, place)
        return figures

    def add(self, record: PromptRecord, place: int) -> None:
        """Count `record`, the run at `place` in the suite."""
        run = record.summary
        self.prompts += 1
        self.longest = max(self.longest, *run.generated)
        self.generation_seconds.add(run.generation_seconds)
        self.grades.add(record, place)
        self.serving.add(run)
        # a crashed run (its worker died) is counted apart from those that failed
        if run.crashed:
            self.crashed += 1
            return
        if run.failed:
            return
        self.finished += 1
        self.identical += run.identical
        if run.fork_index is not None:
            self.forks.append(place, run.fork_index)
            # a footer edited by hand may put the fork past the tokens it counts
            self.longest = max(self.longest, run.fork_index + 1)
            # forks recorded before sessions carried a class are `unclassified`
            kind = run.fork_class if run.fork_class in self.fork_classes else None
            self.fork_classes[kind or "unclassified"] += 1
        elif not run.identical:
            self.lengths_differ += 1
        if run.fork_margins is not None:
            self.fork_margins.append(place, min(run.fork_margins))
        for lane in (0, 1):
            self.steps[lane] += run.generated[lane]
            self.near_ties[lane] += record.near_ties[lane]
            self.drafted[lane] += run.drafted[lane]
            self.accepted[lane] += run.accepted[lane]
            if run.tokens_per_second[lane] > 0:
                self.speeds[lane].append(run.tokens_per_second[lane])
        if run.tokens_per_second[0] > 0 and run.tokens_per_second[1] > 0:
            self.speed_ratios.append(run.tokens_per_second[0] / run.tokens_per_second[1])
        self.control.add(run)
        if record.teacher is not None:
            self.teacher = self.teacher or TeacherTally()
            self.teacher.add(record.teacher)

    def summary(self, max_tokens: int, near_tie: float) -> dict[str, Any]:
        """The pair's figures as the report shows them."""
        steps, ties = self.steps, self.near_ties
        longest = max(max_tokens, self.longest)
        summary: dict[str, Any] = {
            "prompts": self.prompts,
            "failed": self.prompts - self.finished - self.crashed,
            "crashed": self.crashed,
            "identical": self.identical,
            "identical_rate": Rate(self.identical, self.finished).to_json(),
            "forked": len(self.forks),
            "lengths_differ": self.lengths_differ,
            **_fork_places(self.forks.in_suite_order(), longest, self.finished),
            "fork_margin_median": median(self.fork_margins.values),
            "fork_margins": self.fork_margins.in_suite_order(),
            "near_tie_threshold": near_tie,
            "near_ties_per_1000": [1000 * ties[i] / steps[i] if steps[i] else None for i in (0, 1)],
            **self._speeds(),
            "generation_seconds": self.generation_seconds.value,
            "fork_classes": dict(self.fork_classes),
            "split_threshold": DEFAULT_SPLIT_THRESHOLD,
            "grades": self.grades.summary(),
            "serving": self.serving.summary(),
            "control": self.control.summary(),
        }
        if self.teacher is not None:
            summary["teacher_forced"] = self.teacher.summary()
        return summary

    def _speeds(self) -> dict[str, Any]:
        """Both lanes' speeds and draft acceptance over the finished runs."""
        speeds = [median(self.speeds[i]) for i in (0, 1)]
        drafted, accepted = self.drafted, self.accepted
        return {
            "tokens_per_second_median": speeds,
            "speedup": speeds[0] / speeds[1] if speeds[0] and speeds[1] else None,
            "speedup_median_of_ratios": median(self.speed_ratios),
            "acceptance": [accepted[i] / drafted[i] if drafted[i] else None for i in (0, 1)],
            "drafted": list(drafted),
            "accepted": list(accepted),
        }


def summarize(records: Iterable[PromptRecord], max_tokens: int, near_tie: float) -> dict[str, Any]:
    """The report's figures for one pair (variant) from its prompt records."""
    return PairFigures.of(records).summary(max_tokens, near_tie)


class ServingTally:
    """Per lane: the retries and back-off seconds of its server requests, and per
    endpoint the runs it served, their forks and failures (one replica that forks more
    than the others is a finding)."""

    def __init__(self) -> None:
        self.lanes: tuple[dict[str, EndpointTally], dict[str, EndpointTally]] = ({}, {})

    def add(self, run: RunSummary) -> None:
        if not run.serving:
            return
        failed = run.failed or run.crashed
        for lane, serving in enumerate(run.serving):
            if serving is not None:
                endpoint = self.lanes[lane].setdefault(serving.endpoint, EndpointTally())
                endpoint.add(serving, failed, run.fork_index is not None)

    def summary(self) -> dict[str, Any] | None:
        """None where no run recorded how it was served."""
        if not any(self.lanes):
            return None
        lanes = [
            {endpoint: tally.to_json() for endpoint, tally in lane.items()} for lane in self.lanes
        ]
        return {
            "retries": [sum(row["retries"] for row in lane.values()) for lane in lanes],
            "wait_seconds": [
                math.fsum(row["wait_seconds"] for row in lane.values()) for lane in lanes
            ],
            "endpoints": [
                [
                    {"endpoint": endpoint, **row, "fork_rate": _fork_rate(row)}
                    for endpoint, row in sorted(lane.items())
                ]
                for lane in lanes
            ],
        }


@dataclass
class EndpointTally:
    """What the report counts per endpoint of a lane."""

    prompts: int = 0
    failed: int = 0
    forked: int = 0
    retries: int = 0
    wait_seconds: ExactSum = field(default_factory=ExactSum)

    def add(self, serving: Serving, failed: bool, forked: bool) -> None:
        self.prompts += 1
        self.failed += failed
        self.forked += not failed and forked
        self.retries += serving.retries
        self.wait_seconds.add(serving.wait_seconds)

    def to_json(self) -> dict[str, Any]:
        return {
            "prompts": self.prompts,
            "failed": self.failed,
            "forked": self.forked,
            "retries": self.retries,
            "wait_seconds": self.wait_seconds.value,
        }


def _fork_rate(row: dict[str, Any]) -> float | None:
    finished = row["prompts"] - row["failed"]
    return row["forked"] / finished if finished else None


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


class GradedTally:
    """Paired pass@1 over the runs where both lanes were graded. Failed and crashed runs
    are left out of every denominator (a lane that never finished says nothing about its
    quality) and named instead."""

    def __init__(self, graded: bool = True) -> None:
        self.graded = graded
        """The suite grades its runs: a run left out is named. Without grading no run
        carries a grade, and naming every run as "not graded" would hold one entry a
        prompt for a summary that is never shown."""
        self.any_graded = False
        self.all_runs = PairedCounts()
        self.forked_runs = PairedCounts()
        self.excluded: list[tuple[int, dict[str, str]]] = []
        """The runs left out, each with its place in the suite."""

    def add(self, record: PromptRecord, place: int) -> None:
        self.any_graded = self.any_graded or record.summary.grades is not None
        outcome = _paired_pass(record)
        if isinstance(outcome, str):
            if self.graded or record.summary.grades is not None:
                self.excluded.append((place, {"prompt_id": record.prompt_id, "why": outcome}))
            return
        self.all_runs.add(*outcome)
        if not record.summary.identical:
            self.forked_runs.add(*outcome)

    def summary(self) -> dict[str, Any] | None:
        """None when no run of the pair carries a grade."""
        if not self.any_graded:
            return None
        table, forked = self.all_runs.table(), self.forked_runs.table()
        return {
            "graded": table.total,
            "pass_at_1": [rate.to_json() for rate in table.solved],
            "both": table.both,
            "only_a": table.only_a,
            "only_b": table.only_b,
            "neither": table.neither,
            "mcnemar_p": table.mcnemar_p,
            "forked_pass_at_1": [rate.to_json() for rate in forked.solved],
            "excluded": [entry for _, entry in sorted(self.excluded, key=lambda e: e[0])],
        }


class PairedCounts:
    """McNemar's 2×2 table, counted a prompt at a time."""

    def __init__(self) -> None:
        self.cells = [[0, 0], [0, 0]]
        """[a passed][b passed]"""

    def add(self, a_passed: bool, b_passed: bool) -> None:
        self.cells[a_passed][b_passed] += 1

    def table(self) -> PairedOutcomes:
        (neither, only_b), (only_a, both) = self.cells
        return PairedOutcomes(both=both, only_a=only_a, only_b=only_b, neither=neither)


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


class TeacherTally:
    """Lane b fed lane a's tokens, over every prompt: steps, flips, where they fell by
    lane a's margin, and each step's |Δlogit| of the chosen token (8 bytes a step, for
    its quantiles)."""

    def __init__(self) -> None:
        self.steps = 0
        self.flips = 0
        self.prompts_with_a_flip = 0
        self.deltas = array("d")
        self.bucket_steps = [0] * (len(MARGIN_BUCKETS) - 1)
        self.bucket_flips = [0] * (len(MARGIN_BUCKETS) - 1)

    def add(self, stats: TeacherStats) -> None:
        self.steps += stats.steps
        self.flips += len(stats.flips)
        self.prompts_with_a_flip += bool(stats.flips)
        self.deltas.extend(stats.deltas)
        for bucket, count in enumerate(stats.bucket_steps):
            self.bucket_steps[bucket] += count
        for bucket, count in enumerate(stats.bucket_flips):
            self.bucket_flips[bucket] += count

    def summary(self) -> dict[str, Any]:
        steps, flips, deltas = self.steps, self.flips, self.deltas
        delta_counts = [0] * (len(DELTA_BINS) - 1)
        for delta in deltas:
            delta_counts[bucket_index(delta, DELTA_BINS)] += 1
        return {
            "steps": steps,
            "flips": flips,
            "flip_rate": flips / steps if steps else None,
            "same_top1": 1 - flips / steps if steps else None,
            "prompts_with_a_flip": self.prompts_with_a_flip,
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
                    "steps": self.bucket_steps[i],
                    "flips": self.bucket_flips[i],
                }
                for i in range(len(self.bucket_steps))
            ],
        }
