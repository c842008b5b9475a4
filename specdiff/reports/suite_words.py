"""The suite report's sentences: its state and settings in one line, each pair's counts
and paired figures in a line, and the notes that say what the figures mean. Every
format says them in the same words, from the same summary fields.
"""

from __future__ import annotations

import math
from typing import Any

from specdiff.compare import DEFAULT_SPLIT_THRESHOLD, MEASURED_NOISE_P99, UNSCORED
from specdiff.safe_text import visible
from specdiff.suite.noise_floor import control_part
from specdiff.suite.outcome import SuiteReport
from specdiff.suite.settings import budget_words


def number_text(value: float | None, digits: int = 2, suffix: str = "") -> str:
    if value is None or not math.isfinite(value):
        return "–"
    return f"{value:.{digits}f}{suffix}"


def percent_text(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{100 * value:.{digits}f}%"


def _status(data: SuiteReport) -> str:
    if data["complete"]:
        return f"complete: {data['finished']} runs"
    return (
        f"stopped after {data['finished']} of {data['jobs']} runs; "
        "`specdiff suite --resume --report DIR` continues it"
    )


def overview(data: SuiteReport) -> str:
    """The line under the title: state, size, settings, when and how long."""
    settings = data["settings"]
    teacher = " · teacher-forced (lane b fed lane a's tokens)" if settings["teacher_forced"] else ""
    return (
        f"{_status(data)} · {len(settings['prompt_ids'])} prompts · {_budget_text(settings)}"
        f" · near tie: margin < {settings['near_tie']}"
        f"{teacher}{grading_text(settings)} · {_load_text(settings)} · created "
        f"{data['created']} · "
        f"specdiff {data['specdiff']} · {data['wall_seconds']:.0f} s"
    )


def _budget_text(settings: dict[str, Any]) -> str:
    """How many tokens a lane could generate: prompts that name their own budget (a
    proxied request's max_tokens) make it a range, not --max-tokens."""
    budgets = settings.get("prompt_budgets") or [settings["max_tokens"]] * 2
    words = f"up to {budget_words(budgets)} tokens per lane"
    return words if budgets[0] == budgets[1] else f"{words} (each prompt's own budget)"


def _load_text(settings: dict[str, Any]) -> str:
    """The load the figures were measured under: splits grow with it."""
    return f"concurrency {settings.get('concurrency', 1)} (prompts in flight per lane)"


def grading_text(settings: dict[str, Any]) -> str:
    """Whether the suite graded, and whether grading executed model-written code: a
    reader of the report must know that it did."""
    if not settings.get("grade"):
        return ""
    if settings.get("executed_code"):
        confinement = settings.get("confinement")
        where = (
            f", each program run {visible(confinement, 300)}"
            if isinstance(confinement, str) and confinement
            else ""
        )
        return f" · graded: model-written code was executed{where}"
    return " · graded by matching answers (no code executed)"


def runs_finished(summary: dict[str, Any]) -> int:
    """The runs that finished: neither failed nor crashed."""
    return int(summary["prompts"] - summary["failed"] - summary["crashed"])


def identical_text(summary: dict[str, Any]) -> str:
    return f"{summary['identical']} of {runs_finished(summary)}"


def pair_line(summary: dict[str, Any]) -> str:
    return (
        f"At concurrency {summary.get('concurrency', 1)}: identical "
        f"{identical_text(summary)}; forked {summary['forked']}; lengths "
        f"differ {summary['lengths_differ']}; failed {summary['failed']}; crashed "
        f"{summary['crashed']}."
    )


def interval_text(rate: dict[str, Any]) -> str:
    interval = rate["interval"]
    return "–" if interval is None else f"[{interval[0]:.2f}, {interval[1]:.2f}]"


def _rate_text(rate: dict[str, Any]) -> str:
    """`7/50 [0.07, 0.26]`: a count, its denominator and its Wilson 95% interval."""
    text = f"{rate['count']}/{rate['of']}"
    return text if rate["interval"] is None else f"{text} {interval_text(rate)}"


def p_text(p: float) -> str:
    return f"{p:.2f}" if p >= 0.01 else f"{p:.1e}"


def _class_counts_text(summary: dict[str, Any]) -> str:
    """`near tie 3, ambiguous 1, large-margin split 0`; empty when nothing forked."""
    shown = shown_classes(summary)
    if not any(count for _name, count in shown):
        return ""
    return ", ".join(f"{name} {count}" for name, count in shown)


def shown_classes(summary: dict[str, Any]) -> list[tuple[str, int]]:
    """Each fork class and its count; `unclassified` only when some fork has no class,
    `unscored` only when some fork had no logits to class it by."""
    counts = summary.get("fork_classes") or {}
    return [(name, n) for name, n in counts.items() if n or name not in ("unclassified", UNSCORED)]


def paired_line(summary: dict[str, Any]) -> str:
    """The pair in one line, as the field's tables read: `identical 7/50 [0.07, 0.26] ·
    solved a 34 b 33 · only a 5 · only b 4 · McNemar p 1.00`, then the fork classes."""
    parts = [f"identical {_rate_text(summary['identical_rate'])}"]
    grades = summary.get("grades")
    if grades:
        solved = [rate["count"] for rate in grades["pass_at_1"]]
        parts += [
            f"solved a {solved[0]} b {solved[1]}",
            f"only a {grades['only_a']}",
            f"only b {grades['only_b']}",
            f"McNemar p {p_text(grades['mcnemar_p'])}",
        ]
    classes = _class_counts_text(summary)
    if classes:
        parts.append(f"forks: {classes}")
    parts += [part for part in [control_part(summary)] if part]
    return " · ".join(parts)


PAIRED_NOTE = (
    "pass@1 counts the runs in which both lanes were graded; a run that failed or crashed "
    "says nothing of its text's quality and is left out and named. McNemar's exact test "
    "asks whether the prompts only one lane solved lean to one lane more than chance would."
)


def left_out_text(summary: dict[str, Any]) -> str:
    """The runs left out of pass@1 and why, or empty when none was."""
    grades = summary.get("grades")
    if not grades or not grades["excluded"]:
        return ""
    named = "; ".join(f"{e['prompt_id']} ({e['why']})" for e in grades["excluded"])
    return f"Left out of pass@1: {named}."


def classes_note(summary: dict[str, Any]) -> str:
    """What the fork classes mean, with the split threshold beside the noise scale it is
    set against: this pair's own where it ran teacher-forced, else the measured one."""
    split = summary.get("split_threshold", DEFAULT_SPLIT_THRESHOLD)
    teacher = summary.get("teacher_forced") or {}
    p99 = (teacher.get("delta_logit") or {}).get("p99")
    scale = (
        f"this pair's own teacher-forced |Δlogit| p99 is {p99:.3g}"
        if p99 is not None
        else f"numeric noise moves a logit by |Δlogit| p99 {MEASURED_NOISE_P99:.2f} "
        "(teacher-forced ubatch on the bundled model; `specdiff suite questions --pair "
        "ubatch --teacher-forced` measures this machine)"
    )
    return (
        "Fork classes: a near tie is the other lane's pick within the near-tie threshold "
        "of the reference lane's best; a large-margin split is a pick "
        f"{split:g} logits or more below it, outside its candidates, or a lane that left "
        f"its own argmax (not rounding); ambiguous is in between. For scale, {scale}."
    )


def backoff_text(summary: dict[str, Any]) -> str:
    """Each server lane's retries and seconds spent backing off (429/503, a failed
    endpoint), at the suite's concurrency; empty where no run recorded them."""
    serving = summary.get("serving")
    if not serving:
        return ""
    lanes = ", ".join(
        f"lane {lane} {serving['retries'][i]} retries, {serving['wait_seconds'][i]:.1f} s"
        for i, lane in enumerate("ab")
        if serving["endpoints"][i]
    )
    return f"Back-off at concurrency {summary.get('concurrency', 1)}: {lanes}."


SUMMARY_NOTE = (
    "Identical: both lanes produced the same token ids. Speed: median tokens/s of each "
    "lane over its own decode time; speed a/b is their ratio. Crashed: the process "
    "running the lanes died (a native crash in llama.cpp); its session keeps the steps "
    "before the crash, and `--resume` runs it again."
)
