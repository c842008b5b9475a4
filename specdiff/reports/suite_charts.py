"""The suite report's charts as inline SVG: where each pair first forked, how many
prompts had forked by each generation length, and teacher-forced |Δlogit|.
"""

from __future__ import annotations

from specdiff.reports.suite_tables import bucket_label
from specdiff.reports.suite_words import runs_finished
from specdiff.reports.svg import LANE_COLORS, Rule, Series, histogram, line_chart
from specdiff.suite.outcome import PairReport, SuiteReport

PAIR_COLORS = ("#3b7dd8", "#e0761b", "#2e9e5b", "#a23bd8", "#d83b5e", "#6b6b6b")


def fork_histogram_svg(pair: PairReport, color: str) -> str:
    bins = pair["summary"]["fork_histogram"]
    return histogram(
        [b["count"] for b in bins],
        [f"{b['from']}–{b['to']}" for b in bins],
        title=f"First divergence index, {pair['label']}",
        x_label="token index of the first divergence",
        y_label="prompts",
        color=color,
        empty_note="no prompt forked",
    )


def forked_by_length_svg(data: SuiteReport) -> str:
    series = []
    for number, pair in enumerate(data["pairs"]):
        summary = pair["summary"]
        ran = runs_finished(summary)
        values = [100 * count / ran for count in summary["forked_by_token"]] if ran else []
        series.append(Series(pair["label"], values, PAIR_COLORS[number % len(PAIR_COLORS)]))
    return line_chart(
        series,
        title="Prompts forked by generation length",
        x_label="tokens generated",
        y_label="% of prompts forked",
        y_range=(0.0, 100.0),
        horizontal=(Rule(50.0, "half"),),
        empty_note="no prompts finished",
    )


def delta_histogram_svg(pair: PairReport) -> str:
    teacher = pair["summary"]["teacher_forced"]
    bins = teacher["delta_logit"]["histogram"]
    return histogram(
        [b["count"] for b in bins],
        [bucket_label(b["from"], b["to"]).replace("m", "|Δ|") for b in bins],
        title=f"|Δlogit| of the chosen token, teacher-forced, {pair['label']}",
        x_label="|logit in lane b − logit in lane a|",
        y_label="steps",
        color=LANE_COLORS["b"],
        empty_note="no steps compared",
    )
