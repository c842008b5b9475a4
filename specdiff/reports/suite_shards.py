"""The tables of a report merged from shards (`specdiff suite merge`): where each shard
ran, and each pair's forks by the CPU kind its runs ran on."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from specdiff.safe_text import visible
from specdiff.suite.outcome import SuiteReport

MACHINE_HEADER = ("shard", "runs", "host", "CPU", "CPU flags", "llama-cpp-python", "started")
CPU_HEADER = ("pair", "CPU kind", "runs", "forked", "rate", "note")
DIFFERS = (
    "fork rate differs between CPU kinds: each run ran once, on one kind, so the kinds "
    "saw different prompts; run the prompts on both to tell (specdiff verify)"
)


def machine_rows(data: SuiteReport) -> list[list[str]]:
    """A row per machine each shard ran on (a shard resumed elsewhere has two)."""
    section = data.get("shards")
    if not section:
        return []
    rows = []
    for shard in section.get("shards", []):
        for machine in shard.get("machines", []):
            rows.append(
                [
                    str(shard.get("shard")),
                    str(shard.get("units")),
                    *(_text(machine, key) for key in ("host", "cpu")),
                    " ".join(str(flag) for flag in machine.get("cpu_flags", [])),
                    *(_text(machine, key) for key in ("llama_cpp_python", "started")),
                ]
            )
    return rows


def cpu_rows(data: SuiteReport) -> Iterator[list[str]]:
    """Per pair and CPU kind: its runs, how many forked, and a note where the rate is
    not the same on every kind."""
    section = data.get("shards") or {}
    differs = set(section.get("fork_rate_differs", []))
    for label, kinds in section.get("forks_by_cpu", {}).items():
        for kind, counts in kinds.items():
            runs, forked = counts["runs"], counts["forked"]
            rate = f"{forked / runs:.0%}" if runs else "–"
            note = DIFFERS if label in differs else ""
            yield [visible(label, 80), visible(kind, 80), str(runs), str(forked), rate, note]


def _text(machine: dict[str, Any], key: str) -> str:
    value = machine.get(key)
    return "–" if value is None else visible(str(value), 80)
