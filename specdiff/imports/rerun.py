"""The items whose outputs differ, sent again through a pair: which prompts to run, and
each run's fork and margins written back beside its item. The running is a suite's
(the command line starts it); this module only maps items to prompts and back."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from typing import Any


def rerun_id(group: str, item: str) -> str:
    """The suite prompt id of one imported item."""
    return f"{group}-{item}"


def differing_prompts(data: Mapping[str, Any]) -> dict[str, str]:
    """Prompt id to prompt text of every item whose outputs differ, in report order."""
    return {
        rerun_id(group["group"], pair["item"]): pair["prompt"]
        for group in data["groups"]
        for pair in group["pairs"]
        if pair["differs"]
    }


def mark_reruns(data: dict[str, Any], records: Iterable[Mapping[str, Any]], pair: str) -> str:
    """Each differing item of `data` given its rerun (`rerun`: the pair, whether the
    lanes agreed, the fork and both margins, the session file); the line that says how
    many forked."""
    runs = {record["prompt_id"]: record for record in records}
    forked, identical, margins = 0, 0, []
    for group in data["groups"]:
        for item in group["pairs"]:
            record = runs.get(rerun_id(group["group"], item["item"]))
            if not item["differs"] or record is None:
                continue
            item["rerun"] = {
                "pair": pair,
                "identical": record.get("identical"),
                "fork_index": record.get("fork_index"),
                "fork_margins": record.get("fork_margins"),
                "session": record.get("session"),
            }
            if record.get("fork_index") is not None:
                forked += 1
                margins.append(min(record["fork_margins"] or [float("nan")]))
            elif record.get("identical"):
                identical += 1
    data["rerun"] = {"pair": pair, "runs": len(runs), "forked": forked, "identical": identical}
    median = f", median fork margin {statistics.median(margins):.3g}" if margins else ""
    return (
        f"rerun through {pair}: {forked} of {len(runs)} differing items fork{median}; "
        f"{identical} identical"
    )
