"""A suite's noise-floor figures (suite --control): beside the rate at which a and b
fork, the rate at which lane a forks from itself run again cold (a vs a'), and how many
of the a-vs-b forks that control labels the noise floor (specdiff.control)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from specdiff.control import EFFECT, NOISE_FLOOR
from specdiff.sessions.format import RunSummary
from specdiff.suite.paired import Rate

RateCells = Callable[[str, dict[str, Any]], list[str]]
"""How a report turns a named rate into a table row."""


def control_summary(runs: Sequence[RunSummary]) -> dict[str, Any] | None:
    """The figures over the runs whose control ran to the end; None for a suite run
    without --control."""
    if all(run.control is None for run in runs):
        return None
    controlled = [run for run in runs if run.control is not None and not run.control.error]
    labels = [run.control_label for run in controlled]
    return {
        "runs": len(controlled),
        "failed": sum(1 for run in runs if run.control is not None and run.control.error),
        "fork_rate": Rate(
            sum(run.fork_index is not None for run in controlled), len(controlled)
        ).to_json(),
        "noise_floor_rate": Rate(
            sum(run.control.fork_index is not None for run in controlled if run.control),
            len(controlled),
        ).to_json(),
        "noise_floor_forks": labels.count(NOISE_FLOOR),
        "effect_forks": labels.count(EFFECT),
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
