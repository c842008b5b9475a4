"""The teacher-forced suite's KL divergence in its report (`specdiff.suite.kld`): the
pair's figures over every scored step, each prompt's own, and why figures are missing
(server lanes give no whole row)."""

from __future__ import annotations

from typing import Any

KLD_PROMPT_HEADER = (
    "prompt", "steps", "mean KLD", "median", "p90", "p99", "max", "same top-1", "flips",
)  # fmt: skip
_SPREAD = ("mean_kld", "median_kld", "p90_kld", "p99_kld", "max_kld")


def _kld(value: float) -> str:
    return f"{value:.6f}"


def kld_line(kld: dict[str, Any] | None) -> str:
    """One line for the pair: `KL(a||b) mean … · same top-1 …`, or why it is missing;
    empty when the suite measured none."""
    if not kld:
        return ""
    summary = kld.get("summary")
    figures = ""
    if summary:
        figures = (
            f"KL(a||b) over the whole vocabulary, {summary['positions']} steps: mean "
            f"{_kld(summary['mean_kld'])} · median {_kld(summary['median_kld'])} · p90 "
            f"{_kld(summary['p90_kld'])} · p99 {_kld(summary['p99_kld'])} · max "
            f"{_kld(summary['max_kld'])} · same top-1 {summary['same_top_percent']:.2f}%"
        )
    missing = kld.get("missing")
    if missing:
        figures = f"{figures}; KL(a||b) {missing}" if figures else f"KL(a||b) {missing}"
    return figures


def kld_prompt_rows(kld: dict[str, Any] | None) -> list[list[str]]:
    """A row per scored prompt: its steps, KLD spread, same top-1 and flips."""
    return [
        [
            prompt["prompt_id"],
            str(prompt["positions"]),
            *(_kld(prompt[key]) for key in _SPREAD),
            f"{prompt['same_top_percent']:.2f}%",
            str(prompt["flips"]),
        ]
        for prompt in (kld or {}).get("prompts", [])
    ]
