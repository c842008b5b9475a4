"""The prompt-length sweep's part of a suite report (`suite --prompt-lengths`): a row
per length variant and a plot of the fork rate against the prompt's length."""

from __future__ import annotations

from specdiff.reports.svg import Series, line_chart
from specdiff.suite.lengths import LABEL_SUFFIX, TOO_LONG
from specdiff.suite.outcome import PairReport, SuiteReport

LENGTH_HEADER = ("variant", "prompt tokens", "runs", "skipped (too long)", "forked", "fork rate")
SERIES_COLORS = ("#3b7dd8", "#e0761b", "#2e9e5b", "#a23bd8", "#d83b5e", "#6b6b6b")


def _swept(data: SuiteReport) -> list[tuple[PairReport, int, float | None, int]]:
    """(pair entry, its length, fork rate in % of finished runs or None, prompts skipped
    as too long) for every length variant, in the suite's order."""
    out = []
    for pair in data["pairs"]:
        length = pair.get("prompt_length")
        if length is None:
            continue
        summary = pair["summary"]
        ran = summary["prompts"] - summary["failed"] - summary["crashed"]
        skipped = sum(
            1
            for entry in data.get("skipped_prompts", [])
            if entry.startswith(f"{pair['label']}: ") and TOO_LONG in entry
        )
        out.append((pair, length, 100 * summary["forked"] / ran if ran else None, skipped))
    return out


def length_rows(data: SuiteReport) -> list[list[str]]:
    """One row per length variant: its length, runs, prompts skipped as too long, forks
    and the fork rate."""
    return [
        [
            pair["label"],
            str(length),
            str(pair["summary"]["prompts"]),
            str(skipped),
            str(pair["summary"]["forked"]),
            "–" if rate is None else f"{rate:.1f}%",
        ]
        for pair, length, rate, skipped in _swept(data)
    ]


def fork_rate_by_prompt_length_svg(data: SuiteReport) -> str:
    """A line per pair (weight type): the fork rate at each swept length."""
    lengths = data["settings"].get("prompt_lengths", [])
    by_variant: dict[str, dict[int, float]] = {}
    for pair, length, rate, _ in _swept(data):
        variant = pair["label"].removesuffix(f"@{length}{LABEL_SUFFIX}")
        by_variant.setdefault(variant, {})[length] = float("nan") if rate is None else rate
    series = [
        Series(
            variant,
            [rates.get(length, float("nan")) for length in lengths],
            SERIES_COLORS[number % len(SERIES_COLORS)],
        )
        for number, (variant, rates) in enumerate(by_variant.items())
    ]
    return line_chart(
        series,
        title="Fork rate by prompt length",
        x_label="prompt tokens (padded)",
        y_label="% of runs forked",
        y_range=(0.0, 100.0),
        empty_note="no length ran",
        x_labels=[str(length) for length in lengths],
    )
