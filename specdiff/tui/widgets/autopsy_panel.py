"""The fork autopsy in the panel's place: the plain-words cause, the settings tried (one
line each), the first tensor that differs and a sparkline of how the difference grew
layer by layer.

It scrolls rather than cuts: the cause is a few sentences, and on an 80x24 terminal the
panel has about ten rows; every line is wrapped or ellipsised to the width, never cut.
"""

from __future__ import annotations

import math

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import ProgressBar, Sparkline, Static

from specdiff.autopsy import Autopsy, SettingTrial
from specdiff.autopsy.words import KV_HISTORY, op_meaning
from specdiff.safe_text import visible
from specdiff.tui.widgets.line import Line

SMALLEST_SHOWN = 1e-12
"""Growth is drawn on a log scale (it spans 1e-7 to whole logits); a bit-identical
layer (0) is drawn at this floor."""


def trial_speeds(trial: SettingTrial) -> str:
    if trial.error is not None:
        return ""
    return f"{trial.speed_a:.0f}/{trial.speed_b:.0f}"


def settings_table(autopsy: Autopsy) -> Table:
    """One row per run of the sweep: what was moved, whether the lanes still forked, and
    each lane's tokens per second."""
    table = Table(box=None, padding=(0, 1), show_edge=False, expand=True)
    table.add_column("setting tried", ratio=1, no_wrap=True, overflow="ellipsis")
    table.add_column("result", no_wrap=True)
    table.add_column("tok/s a/b", no_wrap=True, justify="right")
    for trial in autopsy.trials:
        table.add_row(visible(trial.setting, 80), trial.outcome, trial_speeds(trial))
    for left_out in autopsy.not_tried:
        table.add_row(Text(visible(left_out, 80), style="dim"), Text("not run", style="dim"), "")
    return table


def first_difference_text(autopsy: Autopsy) -> str:
    first = autopsy.first_difference
    if first is None:
        if autopsy.part2_note:
            return visible(autopsy.part2_note, 200)
        if autopsy.tensors:
            return "every tapped tensor was identical at the fork step"
        return "no tensors were compared"
    layer = f"layer {first.layer}, " if first.layer is not None else ""
    # the operation's name is llama.cpp's (CONT, MUL_MAT): said in words beside it
    meaning = op_meaning(first.op)
    return (
        f"first differing tensor: {visible(first.name, 40)} ({layer}{visible(first.op, 20)}) "
        f"max |Δ| {first.max_abs:.2g}, relative L2 {first.rel_l2:.2g}"
        + (f"; {KV_HISTORY}: written by earlier decode calls" if first.kv_history else "")
        + (f"; {visible(first.op, 20)} is {meaning}" if meaning else "")
    )


def growth_values(autopsy: Autopsy) -> list[float]:
    """growth_series() on a log10 scale, for the sparkline."""
    return [math.log10(max(value, SMALLEST_SHOWN)) for value in autopsy.growth_series()]


def growth_caption(autopsy: Autopsy) -> str:
    series = autopsy.growth_series()
    if not series:
        return "no per-layer growth (the layers were not traced)"
    logits = " then the logits" if autopsy.margin is not None else ""
    return (
        f"how the difference grows, layer 0 to {len(autopsy.layers) - 1}{logits} (log scale): "
        f"{series[0]:.2g} → {series[-1]:.2g}"
    )


class AutopsyPanel(VerticalScroll):
    """The autopsy of the fork on screen, or the progress of one being made."""

    DEFAULT_CSS = """
    AutopsyPanel {
        height: auto;
        max-height: 50%;
        border-top: hkey $panel;
        padding: 0 1;
        display: none;
    }
    AutopsyPanel > Static, AutopsyPanel > ProgressBar { height: auto; }
    AutopsyPanel #autopsy-title { text-style: bold; }
    AutopsyPanel #autopsy-cause { margin-bottom: 1; }
    AutopsyPanel #autopsy-growth { height: 1; margin-bottom: 1; }
    """

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.autopsy: Autopsy | None = None
        self.title_line = Line(id="autopsy-title")
        self.progress = ProgressBar(total=None, show_eta=False, id="autopsy-progress")
        self.cause = Static(id="autopsy-cause")
        self.settings = Static(id="autopsy-settings")
        self.first = Static(id="autopsy-first")
        self.growth_text = Static(id="autopsy-growth-caption")
        self.growth = Sparkline([], summary_function=max, id="autopsy-growth")

    def compose(self) -> ComposeResult:
        yield self.title_line
        yield self.progress
        yield self.cause
        yield self.settings
        yield self.first
        yield self.growth_text
        yield self.growth

    def _results_shown(self, shown: bool) -> None:
        for part in (self.settings, self.first, self.growth_text, self.growth):
            part.display = shown

    def show_progress(self, title: str, line: str, done: int, total: int) -> None:
        """An autopsy being made: what it is doing now, and how many of its runs are done."""
        self.autopsy = None
        self.title_line.set(title)
        self.progress.display = True
        self.progress.update(total=total, progress=done)
        self.cause.update(Text(visible(line, 200)))
        self._results_shown(False)

    def show_autopsy(self, title: str, autopsy: Autopsy) -> None:
        self.autopsy = autopsy
        self.title_line.set(title)
        self.progress.display = False
        self.cause.update(Text(visible(autopsy.cause(), 2000)))
        self._results_shown(not autopsy.nothing_to_explain)
        if autopsy.nothing_to_explain:
            return
        self.settings.update(settings_table(autopsy))
        self.first.update(Text(first_difference_text(autopsy)))
        self.growth_text.update(Text(growth_caption(autopsy)))
        values = growth_values(autopsy)
        self.growth.data = values
        self.growth.display = bool(values)
        self.scroll_home(animate=False)
