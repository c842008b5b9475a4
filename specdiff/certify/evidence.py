"""What a server says of itself, read into numbers: the requests it runs at once and the
prompt tokens it served from its cache.

Read from Prometheus text (/metrics of llama-server, vLLM and SGLang) and llama-server's
/slots. Each engine names its numbers its own way; the names below are the ones each
exports. A server's words are untrusted: a value that is not a finite number is skipped,
and a line past MAX_METRIC_LINE characters is not read.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

RUNNING = (
    "llamacpp:requests_processing",
    "vllm:num_requests_running",
    "sglang:num_running_reqs",
)
"""Gauges of the requests a server decodes at once (they share its batches)."""
CACHE_HITS = (
    "vllm:prefix_cache_hits_total",
    "vllm:prefix_cache_hits",
    "sglang:cached_tokens_total",
)
"""Counters of prompt tokens served from the prefix cache."""
MAX_METRIC_LINE = 4096


def metric_values(text: str, names: Iterable[str]) -> dict[str, float]:
    """The sum over labels of each named metric in Prometheus text (a counter split by
    model or engine adds up)."""
    wanted = set(names)
    found: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#") or len(line) > MAX_METRIC_LINE:
            continue
        head, _, value = line.rpartition(" ")
        name = head.split("{", 1)[0].strip()
        if name not in wanted:
            continue
        try:
            number = float(value)
        except ValueError:
            continue
        if math.isfinite(number):
            found[name] = found.get(name, 0.0) + number
    return found


def first_of(values: dict[str, float], names: Iterable[str]) -> tuple[str, float] | None:
    """The first of `names` the server exports, with its value."""
    for name in names:
        if name in values:
            return name, values[name]
    return None


def slots_processing(data: Any) -> int | None:
    """How many of llama-server's /slots are processing a request; None where the answer
    is not a slot list."""
    if not isinstance(data, list) or not all(isinstance(slot, dict) for slot in data):
        return None
    return sum(slot.get("is_processing") is True for slot in data)


def overlap(intervals: Iterable[tuple[float, float]]) -> int:
    """The most intervals open at one moment: the concurrency a client reached."""
    edges = sorted(
        [(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals],
        key=lambda edge: (edge[0], edge[1]),
    )
    open_now = most = 0
    for _, change in edges:
        open_now += change
        most = max(most, open_now)
    return most


def busy_time(intervals: Iterable[tuple[float, float]]) -> float:
    """Seconds during which at least one interval was open (their union's length)."""
    total = 0.0
    end = -math.inf
    for start, stop in sorted(intervals):
        if start > end:
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total
