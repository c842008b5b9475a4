"""Small charts as inline SVG strings, with no dependencies.

Every chart is a complete, well-formed XML document fragment: a <title> first (the
accessible name), a viewBox so it scales, axis labels, and only generic font families,
so a report that embeds it stays one self-contained file. Ink uses ``currentColor`` and
an embedded style picks it from ``prefers-color-scheme``, so the same SVG reads on a
light and a dark page, inline or as an <img>.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from specdiff.compare import DEFAULT_NEAR_TIE, MARGIN_DISPLAY_CAP
from specdiff.reports._markup import xml_text
from specdiff.safe_text import visible

SVG_NAMESPACE = "http://www.w3.org/2000/svg"

LANE_COLORS = {"a": "#3b7dd8", "b": "#e0761b"}
"""Mid-tone hues that keep their contrast on white and on near-black backgrounds."""

WIDTH, HEIGHT = 720, 280
MAX_POINTS = 600
"""Beyond this many values a series is drawn as a line only: the points would merge
anyway, and each one costs a tooltip's worth of bytes in the report."""
LEFT, RIGHT, TOP, BOTTOM = 64, 20, 40, 48

# The halo (a stroke in the page colour under the glyphs) keeps labels legible where
# they cross data lines.
_STYLE = (
    "svg.sdp-chart{color:#24292f}.sdp-halo{stroke:#ffffff}"
    ".sdp-rule{stroke:#d1242f}.sdp-rule-label{fill:#d1242f}"
    "@media (prefers-color-scheme: dark){svg.sdp-chart{color:#d0d7de}.sdp-halo{stroke:#0d1117}"
    ".sdp-rule{stroke:#ff7b72}.sdp-rule-label{fill:#ff7b72}}"
)
_HALO = 'class="sdp-halo" stroke-width="3" stroke-linejoin="round" paint-order="stroke"'


def _svg_text(text: str) -> str:
    """A title or label from prompts and sessions: one visible line (a chart opened in a
    terminal must not run a control character), then XML-escaped."""
    return xml_text(visible(text))


@dataclass(frozen=True)
class Series:
    """One line of a line chart: y values at x = 0, 1, 2, ..."""

    label: str
    values: Sequence[float]
    color: str = LANE_COLORS["a"]
    dash: str = ""
    """An SVG stroke-dasharray, so overlapping series stay distinguishable."""


@dataclass(frozen=True)
class Rule:
    """A labelled reference line across the plot at one x or y value."""

    value: float
    label: str
    dashed: bool = True


def _number(value: float) -> str:
    text = f"{value:.1f}"
    return text[:-2] if text.endswith(".0") else text


def _tick_label(value: float) -> str:
    return f"{value:.6g}"


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values (1, 2 or 5 times a power of ten) covering low..high."""
    if not (math.isfinite(low) and math.isfinite(high)) or high <= low:
        return [low] if math.isfinite(low) else [0.0]
    raw = (high - low) / max(count, 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.ceil(low / step - 1e-9) * step
    ticks = []
    value = first
    while value <= high + step * 1e-9:
        ticks.append(round(value, 12))
        value += step
    return ticks


def whole_ticks(high: float) -> list[float]:
    """nice_ticks from 0 to `high` for counts: whole numbers only (a step under 1 keeps
    0 and the whole ticks it holds)."""
    return [tick for tick in nice_ticks(0.0, high) if tick == int(tick)]


def _nice_ceiling(value: float) -> float:
    """The smallest 1-2-5 step at or above value, so an axis ends on a round number."""
    if value <= 0 or not math.isfinite(value):
        return 1.0
    # an int or a float, as the exponent's sign has it
    power: float = 10 ** math.floor(math.log10(value))
    return next(m * power for m in (1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10) if m * power >= value)


class _Canvas:
    """Maps data coordinates into the plot area of a WIDTH x HEIGHT viewBox."""

    def __init__(
        self, x_range: tuple[float, float], y_range: tuple[float, float], width: int, height: int
    ) -> None:
        self.x_low, self.x_high = x_range
        self.y_low, self.y_high = y_range
        self.left, self.right = LEFT, width - RIGHT
        self.top, self.bottom = TOP, height - BOTTOM

    def x(self, value: float) -> float:
        span = self.x_high - self.x_low or 1.0
        return self.left + (value - self.x_low) / span * (self.right - self.left)

    def y(self, value: float) -> float:
        span = self.y_high - self.y_low or 1.0
        return self.bottom - (value - self.y_low) / span * (self.bottom - self.top)


def _open(title: str, width: int, height: int) -> list[str]:
    return [
        f'<svg xmlns="{SVG_NAMESPACE}" viewBox="0 0 {width} {height}" width="{width}" '
        f'height="{height}" role="img" class="sdp-chart" '
        'font-family="system-ui, -apple-system, Segoe UI, sans-serif" font-size="12">',
        f"<title>{_svg_text(title)}</title>",
        f"<style>{_STYLE}</style>",
        f'<text x="{LEFT}" y="20" font-size="14" font-weight="600" fill="currentColor">'
        f"{_svg_text(title)}</text>",
    ]


def _axes(
    canvas: _Canvas,
    x_label: str,
    y_label: str,
    x_ticks: Sequence[tuple[float, str]],
    y_ticks: Sequence[float],
    height: int,
) -> list[str]:
    parts = []
    for tick in y_ticks:
        y = _number(canvas.y(tick))
        parts.append(
            f'<line x1="{canvas.left}" y1="{y}" x2="{canvas.right}" y2="{y}" '
            'stroke="currentColor" stroke-opacity="0.12"/>'
        )
        parts.append(
            f'<text x="{canvas.left - 6}" y="{y}" text-anchor="end" dominant-baseline="middle" '
            f'fill="currentColor">{_svg_text(_tick_label(tick))}</text>'
        )
    for position, label in x_ticks:
        x = _number(position)
        parts.append(
            f'<line x1="{x}" y1="{canvas.bottom}" x2="{x}" y2="{canvas.bottom + 4}" '
            'stroke="currentColor"/>'
        )
        parts.append(
            f'<text x="{x}" y="{canvas.bottom + 16}" text-anchor="middle" '
            f'fill="currentColor">{_svg_text(label)}</text>'
        )
    parts.append(
        f'<path d="M{canvas.left} {canvas.top}V{canvas.bottom}H{canvas.right}" fill="none" '
        'stroke="currentColor"/>'
    )
    middle_x = (canvas.left + canvas.right) / 2
    middle_y = (canvas.top + canvas.bottom) / 2
    parts.append(
        f'<text x="{_number(middle_x)}" y="{height - 8}" text-anchor="middle" '
        f'fill="currentColor">{_svg_text(x_label)}</text>'
    )
    parts.append(
        f'<text x="16" y="{_number(middle_y)}" text-anchor="middle" fill="currentColor" '
        f'transform="rotate(-90 16 {_number(middle_y)})">{_svg_text(y_label)}</text>'
    )
    return parts


def _note(canvas: _Canvas, text: str) -> str:
    return (
        f'<text x="{_number((canvas.left + canvas.right) / 2)}" '
        f'y="{_number((canvas.top + canvas.bottom) / 2)}" text-anchor="middle" '
        f'fill="currentColor" fill-opacity="0.7">{_svg_text(text)}</text>'
    )


def _legend(series: Sequence[Series], width: int) -> list[str]:
    parts = []
    x = width - RIGHT
    for item in reversed(series):
        label = _svg_text(item.label)
        x -= 14 + 7 * len(item.label) + 20
        dash = f' stroke-dasharray="{_svg_text(item.dash)}"' if item.dash else ""
        parts.append(
            f'<line x1="{x}" y1="16" x2="{x + 14}" y2="16" stroke="{_svg_text(item.color)}" '
            f'stroke-width="2"{dash}/>'
        )
        parts.append(
            f'<text x="{x + 18}" y="16" dominant-baseline="middle" fill="currentColor">'
            f"{label}</text>"
        )
    return parts


def _x_ticks(low: float, high: float) -> list[tuple[float, str]]:
    """Whole-number ticks: x is a position (a token index, a bin)."""
    ticks = [t for t in nice_ticks(low, high, 8) if float(t).is_integer()]
    return [(t, str(int(t))) for t in ticks] or [(low, str(int(low)))]


def line_chart(
    series: Sequence[Series],
    *,
    title: str,
    x_label: str,
    y_label: str,
    y_range: tuple[float, float] | None = None,
    horizontal: Sequence[Rule] = (),
    vertical: Sequence[Rule] = (),
    empty_note: str = "no data",
    width: int = WIDTH,
    height: int = HEIGHT,
    x_labels: Sequence[str] = (),
) -> str:
    """Lines with points, x = position in each series (labelled `x_labels[x]` when given,
    as for a sweep's values). Values outside y_range are drawn at its edge as open
    circles; NaN leaves a gap; +-inf counts as outside the range."""
    if y_range is None:
        y_range = _y_range(series, horizontal)
    length = max((len(s.values) for s in series), default=0)
    marks = [r.value for r in vertical if math.isfinite(r.value)]
    x_high = max([length - 1, *marks, 1])
    canvas = _Canvas((0.0, float(x_high)), y_range, width, height)
    parts = _open(title, width, height)
    ticks = list(enumerate(x_labels)) if x_labels else _x_ticks(0, x_high)
    x_ticks = [(canvas.x(t), label) for t, label in ticks]
    parts += _axes(canvas, x_label, y_label, x_ticks, nice_ticks(*y_range), height)
    low, high = y_range
    # a rule outside the plotted range (or not a number) is left out
    across = [_horizontal_rule(canvas, r) for r in horizontal if low <= r.value <= high]
    upright = [_vertical_rule(canvas, r) for r in vertical if 0 <= r.value <= x_high]
    parts += [line for line, _ in across]
    for item in series:
        parts += _series_marks(canvas, item)
    # drawn over the data: a fork line hidden behind 200 points would be no marker at all
    parts += [line for line, _ in upright]
    parts += [label for _, label in (*across, *upright)]
    if not length:
        parts.append(_note(canvas, empty_note))
    if series:
        parts += _legend(series, width)
    parts.append("</svg>")
    return "\n".join(parts)


def _y_range(series: Sequence[Series], horizontal: Sequence[Rule]) -> tuple[float, float]:
    """From zero (or the lowest value) to a round number above every value and rule."""
    finite = [v for s in series for v in s.values if math.isfinite(v)]
    low = min([0.0, *finite])
    high = max([*finite, *(r.value for r in horizontal if math.isfinite(r.value))], default=1)
    return (low, _nice_ceiling(high) if high > low else low + 1.0)


def _dash(rule: Rule) -> str:
    return ' stroke-dasharray="6 4"' if rule.dashed else ""


def _horizontal_rule(canvas: _Canvas, rule: Rule) -> tuple[str, str]:
    """A rule across the plot at y = rule.value: its line and its label."""
    y = _number(canvas.y(rule.value))
    line = (
        f'<line x1="{canvas.left}" y1="{y}" x2="{canvas.right}" y2="{y}" '
        f'stroke="currentColor" stroke-opacity="0.7"{_dash(rule)}/>'
    )
    label = (
        f'<text x="{canvas.right - 4}" y="{_number(canvas.y(rule.value) - 4)}" '
        f'text-anchor="end" fill="currentColor" {_HALO}>{_svg_text(rule.label)}</text>'
    )
    return line, label


def _vertical_rule(canvas: _Canvas, rule: Rule) -> tuple[str, str]:
    """A rule up the plot at x = rule.value, in the rule colour: its line and its label,
    which stays inside the plot on either half."""
    x = _number(canvas.x(rule.value))
    line = (
        f'<line x1="{x}" y1="{canvas.top}" x2="{x}" y2="{canvas.bottom}" '
        f'class="sdp-rule" stroke="#d1242f" stroke-width="1.5"{_dash(rule)}/>'
    )
    anchor = "end" if canvas.x(rule.value) > (canvas.left + canvas.right) / 2 else "start"
    offset = 4 if anchor == "start" else -4
    label = (
        f'<text x="{_number(canvas.x(rule.value) + offset)}" y="{canvas.top - 6}" '
        f'text-anchor="{anchor}" class="sdp-rule-label" fill="#d1242f">'
        f"{_svg_text(rule.label)}</text>"
    )
    return line, label


def _series_marks(canvas: _Canvas, series: Series) -> list[str]:
    low, high = canvas.y_low, canvas.y_high
    color = _svg_text(series.color)
    runs: list[list[str]] = [[]]
    points = []
    for index, value in enumerate(series.values):
        if math.isnan(value):
            runs.append([])
            continue
        clipped = not low <= value <= high
        shown = min(max(value, low), high)
        x, y = _number(canvas.x(index)), _number(canvas.y(shown))
        runs[-1].append(f"{x},{y}")
        if len(series.values) > MAX_POINTS:
            continue
        fill = "none" if clipped else color
        tip = f"{value:.3f}".replace("inf", "∞")
        points.append(
            f'<circle cx="{x}" cy="{y}" r="2.2" fill="{fill}" stroke="{color}">'
            f"<title>{_svg_text(f'{series.label} {index}: {tip}')}</title></circle>"
        )
    dash = f' stroke-dasharray="{_svg_text(series.dash)}"' if series.dash else ""
    lines = [
        f'<polyline points="{" ".join(run)}" fill="none" stroke="{color}" '
        f'stroke-width="1.5" stroke-linejoin="round"{dash}/>'
        for run in runs
        if len(run) > 1
    ]
    return [*lines, '<g class="points">', *points, "</g>"]


def histogram(
    counts: Sequence[float],
    labels: Sequence[str],
    *,
    title: str,
    x_label: str,
    y_label: str = "count",
    color: str = LANE_COLORS["a"],
    empty_note: str = "no data",
    width: int = WIDTH,
    height: int = HEIGHT,
) -> str:
    """One bar per bin, labelled below; labels thin out when bins are many. Counts that
    are negative or not finite are drawn as zero."""
    if len(counts) != len(labels):
        raise ValueError(f"{len(counts)} counts but {len(labels)} labels")
    heights = [c if math.isfinite(c) and c > 0 else 0.0 for c in counts]
    # counts: an axis in whole numbers (never 0.2 of a prompt)
    y_high = float(math.ceil(_nice_ceiling(max(heights, default=0.0))))
    canvas = _Canvas((0.0, float(max(len(heights), 1))), (0.0, y_high), width, height)
    slot = (canvas.right - canvas.left) / max(len(heights), 1)
    every = max(1, math.ceil(len(labels) * 7 * 6 / (canvas.right - canvas.left)))
    x_ticks = [
        (canvas.left + slot * (i + 0.5), label) for i, label in enumerate(labels) if i % every == 0
    ]
    parts = _open(title, width, height)
    parts += _axes(canvas, x_label, y_label, x_ticks, whole_ticks(y_high), height)
    fill = _svg_text(color)
    for index, (value, label) in enumerate(zip(heights, labels)):
        top = canvas.y(value)
        parts.append(
            f'<rect x="{_number(canvas.left + slot * index + slot * 0.1)}" y="{_number(top)}" '
            f'width="{_number(slot * 0.8)}" height="{_number(canvas.bottom - top)}" '
            f'fill="{fill}"><title>{_svg_text(f"{label}: {_tick_label(counts[index])}")}</title>'
            "</rect>"
        )
    if not heights:
        parts.append(_note(canvas, empty_note))
    parts.append("</svg>")
    return "\n".join(parts)


def margin_plot(
    margins_a: Sequence[float],
    margins_b: Sequence[float],
    *,
    fork_index: int | None = None,
    near_tie: float = DEFAULT_NEAR_TIE,
    cap: float = MARGIN_DISPLAY_CAP,
    title: str = "Logit margin per token",
    width: int = WIDTH,
    height: int = HEIGHT,
) -> str:
    """Both lanes' margins (top-1 minus top-2 logit; infinite when a step recorded one
    candidate) against token index, the near-tie threshold dashed, the fork marked."""
    finite = [m for m in (*margins_a, *margins_b) if math.isfinite(m)]
    clipped = any(m > cap for m in (*margins_a, *margins_b))
    top = cap if clipped else min(cap, _nice_ceiling(max([*finite, near_tie * 1.25], default=1)))
    return line_chart(
        [
            Series("lane a", margins_a, LANE_COLORS["a"]),
            Series("lane b", margins_b, LANE_COLORS["b"], dash="5 3"),
        ],
        title=title,
        x_label="token index",
        y_label=f"margin, logits (clipped at {_tick_label(cap)})",
        y_range=(0.0, top),
        horizontal=[Rule(near_tie, f"near tie < {_tick_label(near_tie)}")],
        vertical=[] if fork_index is None else [Rule(fork_index, f"fork at {fork_index}", False)],
        empty_note="no steps recorded",
        width=width,
        height=height,
    )
