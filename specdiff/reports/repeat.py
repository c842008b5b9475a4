"""The chart of a repeat sweep: unique completions and the first split token against
the swept value (companions in the batch, or a server's concurrency)."""

from __future__ import annotations

import math

from specdiff.repeat_summary import SweepSummary
from specdiff.reports.svg import LANE_COLORS, Series, line_chart

SWEPT = {"companions": "other sequences in each batch", "concurrency": "requests in flight"}


def sweep_chart(data: SweepSummary) -> str:
    """`repeat.sweep_summary`'s points as a standalone SVG; a value whose runs never
    split leaves a gap in the split line."""
    points = data["points"]
    unique = Series("unique completions", [float(point["unique"]) for point in points])
    split = Series(
        "first split (token index)",
        [math.nan if p["first_split"] is None else float(p["first_split"]) for p in points],
        color=LANE_COLORS["b"],
        dash="6 3",
    )
    return line_chart(
        [unique, split],
        title=f"{data['runs_per_value']} runs per value: unique completions and first split",
        x_label=SWEPT[data["sweep"]],
        y_label="completions / token index",
        x_labels=[str(point["value"]) for point in points],
        empty_note="no run finished",
    )
