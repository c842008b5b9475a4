"""A suite's noise-floor figures (suite --control): beside the rate at which a and b
fork, the rate at which lane a forks from itself run again cold (a vs a'), and how many
of the a-vs-b forks that control labels the noise floor (specdiff.control)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from specdiff.sessions.records import EFFECT, NOISE_FLOOR, RunSummary
from specdiff.suite.paired import Rate

RateCells = Callable[[str, dict[str, Any]], list[str]]
"""How a report turns a named rate into a table row."""


class ControlTally:
    """The figures over the runs whose control ran to the end, counted a run at a time
    (finished runs only)."""

    def __init__(self) -> None:
        self.any_control = False
        self.controlled = 0
        self.failed = 0
        self.forked = 0
        self.control_forked = 0
        self.labels = dict.fromkeys((NOISE_FLOOR, EFFECT), 0)

    def add(self, run: RunSummary) -> None:
        if run.control is None:
            return
        self.any_control = True
        if run.control.error:
            self.failed += 1
            return
        self.controlled += 1
        self.forked += run.fork_index is not None
        self.control_forked += run.control.fork_index is not None
        label = run.control_label
        if label in self.labels:
            self.labels[label] += 1

    def summary(self) -> dict[str, Any] | None:
        """None for a suite run without --control."""
        if not self.any_control:
            return None
        return {
            "runs": self.controlled,
            "failed": self.failed,
            "fork_rate": Rate(self.forked, self.controlled).to_json(),
            "noise_floor_rate": Rate(self.control_forked, self.controlled).to_json(),
            "noise_floor_forks": self.labels[NOISE_FLOOR],
            "effect_forks": self.labels[EFFECT],
        }


def control_rows(summary: dict[str, Any], rate_row: RateCells) -> list[list[str]]:
    """The paired table's rows for the control: both rates, then the forks by label."""
    control = summary.get("control")
    if not control:
        return []
    rows = [
        rate_row("a vs b forked (controlled runs)", control["fork_rate"]),
        rate_row("a vs a' forked (noise floor rate)", control["noise_floor_rate"]),
        ["forks: the noise floor", str(control["noise_floor_forks"]), ""],
        ["forks: an effect", str(control["effect_forks"]), ""],
    ]
    if control["failed"]:
        rows.append(["control failed", str(control["failed"]), ""])
    return rows


def control_part(summary: dict[str, Any]) -> str:
    """The control in the pair's one line: `noise floor 1/5 · 2 of 3 forks the noise
    floor`; "" without it."""
    control = summary.get("control")
    if not control:
        return ""
    rate = control["noise_floor_rate"]
    forks = control["noise_floor_forks"] + control["effect_forks"]
    return (
        f"a vs a' {rate['count']}/{rate['of']} (noise floor) · "
        f"{control['noise_floor_forks']} of {forks} forks the noise floor"
    )
