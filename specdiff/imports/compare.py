"""Two imported runs of one evaluation, paired item by item: which items' outputs differ,
which grades flipped, and McNemar's exact test on each pass/fail metric's paired grades
(specdiff.suite.paired, the test a suite applies to its two lanes' grades).

Runs pair only when they hold the same groups (tasks, providers) and, in each, the same
item ids with the same prompts; anything else is refused in one line naming the first
difference, since a comparison over different items would measure the items.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from specdiff.imports.records import ImportedItem, ImportedRun, ImportInputError
from specdiff.suite.paired import PairedOutcomes

NAMED = 5
"""Missing ids a refusal names before it gives the count of the rest."""


@dataclass(frozen=True)
class ItemPair:
    """One item as run a and run b answered and graded it."""

    a: ImportedItem
    b: ImportedItem

    @property
    def differs(self) -> bool:
        return self.a.output != self.b.output

    @property
    def parted_at(self) -> int | None:
        """The first character at which the two outputs differ; None where they agree."""
        if not self.differs:
            return None
        for index, (x, y) in enumerate(zip(self.a.output, self.b.output)):
            if x != y:
                return index
        return min(len(self.a.output), len(self.b.output))

    def to_json(self) -> dict[str, Any]:
        return {
            "item": self.a.item_id,
            "prompt": self.a.prompt,
            "differs": self.differs,
            "parted_at": self.parted_at,
            "output": [self.a.output, self.b.output],
            "grades": [dict(self.a.grades), dict(self.b.grades)],
        }


@dataclass(frozen=True)
class MetricFlips:
    """One metric over paired items: its pass/fail table where it only takes 0 and 1,
    else how many items' values changed; the items that got worse and better."""

    metric: str
    higher_is_better: bool
    binary: bool
    outcomes: PairedOutcomes
    """Pass/fail of both runs (for a metric that is not pass/fail: both "pass" where the
    value did not change, only_a / only_b where it went down / up)."""
    worse: tuple[str, ...]
    better: tuple[str, ...]
    means: tuple[float, float]

    @property
    def flipped(self) -> int:
        return len(self.worse) + len(self.better)

    @property
    def mcnemar_p(self) -> float | None:
        return self.outcomes.mcnemar_p if self.binary else None

    def to_json(self) -> dict[str, Any]:
        solved = self.outcomes.solved
        return {
            "metric": self.metric,
            "higher_is_better": self.higher_is_better,
            "pass_fail": self.binary,
            "items": self.outcomes.total,
            "flipped": self.flipped,
            "worse": list(self.worse),
            "better": list(self.better),
            "mean": list(self.means),
            "passed": [rate.to_json() for rate in solved] if self.binary else None,
            "paired": vars(self.outcomes) if self.binary else None,
            "mcnemar_p": self.mcnemar_p,
        }


def metric_flips(
    metric: str, pairs: Sequence[ItemPair], higher_is_better: bool, label: bool = False
) -> MetricFlips:
    """`metric` over `pairs`; with `label`, items are named with their group."""
    values = [(pair.a.grades[metric], pair.b.grades[metric]) for pair in pairs]
    binary = all(v in (0.0, 1.0) for both in values for v in both)
    sign = 1 if higher_is_better else -1
    names = [f"{p.a.group} {p.a.item_id}" if label else p.a.item_id for p in pairs]
    worse = tuple(name for name, (a, b) in zip(names, values) if sign * (b - a) < 0)
    better = tuple(name for name, (a, b) in zip(names, values) if sign * (b - a) > 0)
    if binary:
        passes = [(_passed(a, higher_is_better), _passed(b, higher_is_better)) for a, b in values]
    else:
        passes = [(sign * (b - a) <= 0, sign * (b - a) >= 0) for a, b in values]
    count = len(values) or 1
    means = (sum(a for a, _ in values) / count, sum(b for _, b in values) / count)
    return MetricFlips(
        metric, higher_is_better, binary, PairedOutcomes.of(passes), worse, better, means
    )


def _passed(value: float, higher_is_better: bool) -> bool:
    return value == (1.0 if higher_is_better else 0.0)


@dataclass(frozen=True)
class GroupComparison:
    """One task (provider) of the two runs."""

    group: str
    pairs: tuple[ItemPair, ...]
    metrics: tuple[MetricFlips, ...]

    @property
    def differing(self) -> tuple[ItemPair, ...]:
        return tuple(pair for pair in self.pairs if pair.differs)

    def to_json(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "items": len(self.pairs),
            "differing": len(self.differing),
            "metrics": [flips.to_json() for flips in self.metrics],
            "pairs": [pair.to_json() for pair in self.pairs],
        }


@dataclass(frozen=True)
class ImportComparison:
    """Two runs of one evaluation, paired: per group and over all groups together."""

    tool: str
    sources: tuple[str, str]
    groups: tuple[GroupComparison, ...]
    metrics: tuple[MetricFlips, ...]
    """Each metric over every group's items."""
    notes: tuple[str, ...]

    @property
    def items(self) -> int:
        return sum(len(group.pairs) for group in self.groups)

    @property
    def differing(self) -> int:
        return sum(len(group.differing) for group in self.groups)

    def to_json(self) -> dict[str, Any]:
        """The comparison as report.json holds it: every item's pair, its outputs and
        grades, the differing ones marked with where they part."""
        return {
            "tool": self.tool,
            "runs": list(self.sources),
            "summary": self.summary_line(),
            "items": self.items,
            "differing": self.differing,
            "notes": list(self.notes),
            "metrics": [flips.to_json() for flips in self.metrics],
            "groups": [group.to_json() for group in self.groups],
        }

    def summary_line(self) -> str:
        """The line on stdout: "5 of 12 items differ; contains flipped 1 (1 worse,
        0 better), McNemar p=1"."""
        parts = [f"{self.differing} of {self.items} items differ"]
        for flips in self.metrics:
            text = (
                f"{flips.metric} flipped {flips.flipped}"
                if flips.binary
                else (f"{flips.metric} changed on {flips.flipped}")
            )
            text += f" ({len(flips.worse)} worse, {len(flips.better)} better)"
            if flips.binary:
                text += f", McNemar p={flips.outcomes.mcnemar_p:.3g}"
            else:
                text += f", mean {flips.means[0]:.4g} -> {flips.means[1]:.4g}"
            parts.append(text)
        return "; ".join(parts)


def compare_runs(a: ImportedRun, b: ImportedRun) -> ImportComparison:
    """The two runs paired by (group, item id); ImportInputError where they do not pair."""
    groups_a, groups_b = _by_group(a.items), _by_group(b.items)
    _check_same("task" if a.tool == "lm-eval" else "group", set(groups_a), set(groups_b), a, b)
    directions = {**b.higher_is_better, **a.higher_is_better}
    groups = []
    for name, items_a in groups_a.items():
        pairs = _pairs(name, items_a, groups_b[name], a, b)
        metrics = _shared_metrics(pairs)
        groups.append(
            GroupComparison(
                name,
                pairs,
                tuple(metric_flips(m, pairs, _direction(m, directions)) for m in metrics),
            )
        )
    every = [pair for group in groups for pair in group.pairs]
    overall = tuple(
        metric_flips(m, [p for p in every if m in p.a.grades and m in p.b.grades],
                     _direction(m, directions), label=len(groups) > 1)
        for m in _ordered(m.metric for group in groups for m in group.metrics)
    )  # fmt: skip
    return ImportComparison(
        a.tool, (a.source, b.source), tuple(groups), overall, (*a.notes, *b.notes)
    )


def _direction(metric: str, directions: dict[str, bool]) -> bool:
    # lm-eval's results name a filtered metric `metric,filter`; its direction is the metric's
    return directions.get(metric, directions.get(metric.split(",")[0], True))


def _ordered(names: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(names))


def _by_group(items: Iterable[ImportedItem]) -> dict[str, dict[str, ImportedItem]]:
    groups: dict[str, dict[str, ImportedItem]] = {}
    for item in items:
        groups.setdefault(item.group, {})[item.item_id] = item
    return groups


def _shared_metrics(pairs: Sequence[ItemPair]) -> list[str]:
    """The metrics every item of both runs carries."""
    if not pairs:
        return []
    shared = set.intersection(*(set(p.a.grades) & set(p.b.grades) for p in pairs))
    return [m for m in _ordered(m for p in pairs for m in p.a.grades) if m in shared]


def _check_same(
    kind: str, a: set[str], b: set[str], run_a: ImportedRun, run_b: ImportedRun
) -> None:
    if a == b:
        return
    parts = []
    if a - b:
        parts.append(f"{run_a.source} has {kind} {_names(a - b)} that {run_b.source} lacks")
    if b - a:
        parts.append(f"{run_b.source} has {kind} {_names(b - a)} that {run_a.source} lacks")
    raise ImportInputError(
        f"the runs hold different {kind}s: {'; '.join(parts)}: compare runs of the same {kind}s"
    )


def _names(names: Iterable[str]) -> str:
    ordered = sorted(names, key=lambda n: (len(n), n))
    shown = ", ".join(ordered[:NAMED])
    return shown + (f" (and {len(ordered) - NAMED} more)" if len(ordered) > NAMED else "")


def _pairs(
    group: str,
    items_a: dict[str, ImportedItem],
    items_b: dict[str, ImportedItem],
    run_a: ImportedRun,
    run_b: ImportedRun,
) -> tuple[ItemPair, ...]:
    ids = "doc ids" if run_a.tool == "lm-eval" else "items"
    for have, lack, other in ((items_a, items_b, run_b), (items_b, items_a, run_a)):
        missing = set(have) - set(lack)
        if missing:
            raise ImportInputError(
                f"{group}: {ids} {_names(missing)} are missing from {other.source}: "
                "compare two runs over the same items (the same --limit and dataset)"
            )
    pairs = tuple(ItemPair(items_a[i], items_b[i]) for i in items_a)
    for pair in pairs:
        hashes = (pair.a.prompt_hash, pair.b.prompt_hash)
        # lm-eval hashes each prompt; where a run has no hash, the prompts themselves
        differ = hashes[0] != hashes[1] if None not in hashes else pair.a.prompt != pair.b.prompt
        if differ:
            raise ImportInputError(
                f"{group}: item {pair.a.item_id} has a different prompt in each run: "
                "compare two runs of the same evaluation (same task version and few-shot)"
            )
    return pairs
