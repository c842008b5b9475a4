"""A fork autopsy for the terminal and as a chart: the settings table, the first tensor
that differs, the growth layer by layer, and the cause in words.

Kept beside the other reports (not in the command) so that every front end that shows
an autopsy, the TUI's fork panel and the exports included, reads it from one place.
"""

from __future__ import annotations

import math
import textwrap

from specdiff.autopsy import Autopsy, TensorDifference
from specdiff.reports.svg import LANE_COLORS, Rule, Series, line_chart
from specdiff.safe_text import visible

BARS = "▁▂▃▄▅▆▇█"


def format_autopsy(autopsy: Autopsy) -> str:
    """The autopsy as lines of text for a terminal."""
    if autopsy.nothing_to_explain:
        line = f"explain {visible(autopsy.pair, 60)}: {autopsy.cause()}"
        if len(autopsy.trials) < 2:
            return line
        # a server sweep runs every draft length: a fork may come at one the pair was not given
        not_tried = [f"   not tried: {visible(item, 80)}" for item in autopsy.not_tried]
        return "\n".join([line, "", *_settings_table(autopsy), *not_tried])
    lines = [
        f"explain {visible(autopsy.pair, 60)}: the lanes fork at token {autopsy.fork} "
        f"(of at most {autopsy.max_tokens} per lane)",
        "",
        f"1. Which setting ({len(autopsy.trials)} runs, --max-runs {autopsy.max_runs})",
        *_settings_table(autopsy),
    ]
    lines += [f"   not tried: {visible(item, 80)}" for item in autopsy.not_tried]
    cause = textwrap.wrap(autopsy.cause(), 92, initial_indent="   ", subsequent_indent="   ")
    lines += ["", *_layers_part(autopsy), "", "3. Cause", *cause]
    lines += [f"   note: {visible(note, 200)}" for note in autopsy.notes]
    return "\n".join(lines)


def _settings_table(autopsy: Autopsy) -> list[str]:
    rows = [("setting", "outcome", "lane a tok/s", "lane b tok/s")]
    for trial in autopsy.trials:
        outcome = trial.outcome + (" (cached)" if trial.cached else "")
        if trial.error is not None:
            outcome = f"failed: {visible(trial.error, 60)}"
        rows.append(
            (
                visible(trial.setting, 44),
                outcome,
                f"{trial.speed_a:.1f}",
                f"{trial.speed_b:.1f}",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    return [
        "   "
        + "  ".join(
            cell.ljust(widths[i]) if i < 2 else cell.rjust(widths[i]) for i, cell in enumerate(row)
        ).rstrip()
        for row in rows
    ]


def _layers_part(autopsy: Autopsy) -> list[str]:
    width_a, width_b = autopsy.verify_width
    unit = "token" if width_a == 1 else "tokens"
    head = (
        f"2. Which layer and operation (token {autopsy.fork}: computed {width_a} {unit} "
        f"wide in lane a, {width_b} in lane b)"
    )
    if autopsy.part2_note:
        return ["2. Which layer and operation", f"   {visible(autopsy.part2_note, 200)}"]
    first = autopsy.first_difference
    lines = [head]
    if not autopsy.tapping_neutral:
        lines.append("   warning: tapping changed the logits; the comparison below is suspect")
    if first is None:
        lines.append(f"   all {len(autopsy.tensors)} tapped tensors are bit-identical")
    else:
        same = sum(1 for t in autopsy.tensors if t.identical)
        lines.append(f"   first differing tensor: {_tensor_line(first)}")
        lines.append(f"   bit-identical: {same} of {len(autopsy.tensors)} tapped tensors")
    attention = autopsy.attention_identical()
    if attention is not None:
        lines.append(
            "   attention outputs (kqv_out): "
            + ("identical in every layer" if attention else "differ")
        )
    if autopsy.layers:
        lines.append("   each layer's output (l_out), largest difference:")
        bars = sparkline(autopsy.growth_series())
        lines.append(f"   {bars}  (layers 0..{autopsy.layers[-1].layer}, then the logits)")
        for growth in autopsy.layers:
            lines.append(
                f"     layer {growth.layer:>3}  max |Δ| {growth.max_abs:9.2e}  "
                f"rel L2 {growth.rel_l2:9.2e}"
            )
    margin = autopsy.margin
    if margin is not None:
        lines.append(f"   logits: largest difference {margin.logits_max_abs:.3g}")
        lines.append(
            f"   between the two picks the gap moved by {margin.shift:.3f}, against lane a's "
            f"margin {margin.margin:.3f} ({_share(margin.margin_used)} of it)"
        )
    return lines


def _share(value: float) -> str:
    return "all" if not math.isfinite(value) else f"{value:.0%}"


def _tensor_line(tensor: TensorDifference) -> str:
    layer = "no layer" if tensor.layer is None else f"layer {tensor.layer}"
    shape_a = "x".join(str(n) for n in tensor.shape_a)
    shape_b = "x".join(str(n) for n in tensor.shape_b)
    return (
        f"{visible(tensor.name, 60)} ({visible(tensor.op, 30)}, {layer}), shapes {shape_a} "
        f"and {shape_b},\n     max |Δ| {tensor.max_abs:.2e}, relative L2 {tensor.rel_l2:.2e}"
    )


def sparkline(values: list[float]) -> str:
    """One character per value on a log scale; a zero is a space."""
    logs = [math.log10(v) for v in values if v > 0 and math.isfinite(v)]
    if not logs:
        return " " * len(values)
    low, high = min(logs), max(logs)
    span = high - low or 1.0
    out = []
    for value in values:
        if not (value > 0 and math.isfinite(value)):
            out.append(" ")
            continue
        level = int((math.log10(value) - low) / span * (len(BARS) - 1))
        out.append(BARS[level])
    return "".join(out)


def growth_svg(autopsy: Autopsy) -> str:
    """The difference between the lanes at each layer's output, then at the logits, on
    a log scale, with lane a's margin at the fork as a rule."""
    values = autopsy.growth_series()
    logs = [math.log10(v) if v > 0 and math.isfinite(v) else math.nan for v in values]
    labels = [str(growth.layer) for growth in autopsy.layers]
    if autopsy.margin is not None:
        labels.append("logits")
    rules = []
    margin = None if autopsy.margin is None else autopsy.margin.margin
    # a margin the chart cannot place (none, zero, infinite) is left out, never drawn
    if margin is not None and 0 < margin < math.inf:
        rules.append(Rule(math.log10(margin), "margin at the fork"))
    finite = [v for v in logs if math.isfinite(v)] + [r.value for r in rules]
    y_range = None
    if finite:
        low, high = math.floor(min(finite)), math.ceil(max(finite))
        y_range = (float(low), float(high if high > low else low + 1))
    return line_chart(
        [Series("largest difference, log10", logs, LANE_COLORS["a"])],
        title=f"How the difference grows, token {autopsy.fork} ({autopsy.pair})",
        x_label="layer",
        y_label="log10 of the largest difference",
        y_range=y_range,
        horizontal=rules,
        empty_note="no layer differs",
        x_labels=labels,
    )
