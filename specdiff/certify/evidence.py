"""What a server says of itself, read into numbers: the requests it runs at once and the
prompt tokens it served from its cache.

Read from Prometheus text (/metrics of llama-server, vLLM and SGLang) and llama-server's
/slots. Each engine names its numbers its own way; the names below are the ones each
exports. A server's words are untrusted: a value that is not a finite number is skipped,
and a line past MAX_METRIC_LINE characters is not read. Beyond that, a reading is
evidence only where it could be true of what this client did: an answer that gives a
series twice, a counter that goes backwards, more requests running than were sent, more
drafts accepted than tokens generated, each makes the server's word no evidence at all.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from specdiff.certify.records import Proof

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


def repeated_series(text: str, names: Iterable[str]) -> str | None:
    """The first series of `names` (a name and its labels) that the text gives twice:
    Prometheus text holds each series once, so an answer that repeats one is no reading
    of it (summing the copies would count the same requests again)."""
    wanted = set(names)
    seen: set[str] = set()
    for line in text.splitlines():
        if not line or line.startswith("#") or len(line) > MAX_METRIC_LINE:
            continue
        series = line.rpartition(" ")[0].strip()
        if series.split("{", 1)[0].strip() not in wanted:
            continue
        if series in seen:
            return series
        seen.add(series)
    return None


def metric_reading(text: str, names: Sequence[str]) -> tuple[str, float] | str | None:
    """The first of `names` the text exports, with its value (summed over labels); None
    where it exports none of them; why it is no reading, where a series is given twice."""
    repeated = repeated_series(text, names)
    if repeated is not None:
        return f"its /metrics gave the series {repeated[:80]} more than once"
    return first_of(metric_values(text, names), names)


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


Reading = tuple[str, int]
"""A running-request count and where the server gave it (/slots, a /metrics name)."""


def running_proof(
    before: Sequence[Reading | str], during: Sequence[Reading | str], sent: int, reached: int
) -> Proof:
    """Whether the server showed requests sent together running at once: at least two
    more than it ran before they were sent, and no more than were sent from here. A
    reading that is no reading (the `str`s: why not) makes every count no evidence."""
    facts: dict[str, Any] = {"in_flight_from_client": reached}
    doubts = [reading for reading in (*before, *during) if isinstance(reading, str)]
    if doubts:
        how = (
            f"{doubts[0]}, so its counts are not evidence that the {reached} requests in "
            "flight shared a batch"
        )
        return Proof(False, how, facts)
    counts = [reading for reading in during if not isinstance(reading, str)]
    if not counts:
        how = (
            f"the server shows no running-request count (/slots or /metrics), so that the "
            f"{reached} requests in flight shared a batch cannot be shown"
        )
        return Proof(False, how, facts)
    source = counts[0][0]
    most = max(count for where, count in counts if where == source)
    idle = [r[1] for r in before if not isinstance(r, str) and r[0] == source]
    facts.update(server_running_most=most, source=source)
    if not idle:
        how = f"{source} gave no count before the requests were sent, to tell them from its load"
        return Proof(False, how, facts)
    baseline = min(idle)
    facts.update(server_running_before=baseline)
    if most > baseline + sent:
        how = (
            f"{source} showed {most} requests running, more than the {sent} sent from here "
            f"and the {baseline} running before them: its count is not evidence"
        )
        return Proof(False, how, facts)
    if most - baseline < 2:
        beyond = f" beyond the {baseline} running before" if baseline else ""
        how = (
            f"{source} never showed two requests running at once{beyond} ({reached} in "
            "flight from here)"
        )
        return Proof(False, how, facts)
    besides = f", {baseline} of them before the batch was sent" if baseline else ""
    how = (
        f"{source} showed {most} requests running at once{besides} ({reached} in flight from here)"
    )
    return Proof(True, how, facts)


def counter_readings(readings: Sequence[float | str | None]) -> list[float] | str:
    """A counter read before and after each request, as numbers; or why it is no
    evidence: it stopped answering, gave no reading, or went backwards (the server
    restarted and counts from zero again, so no difference of two readings is a count)."""
    numbers: list[float] = []
    for reading in readings:
        if reading is None:
            return "the hit counter stopped answering during the test"
        if isinstance(reading, str):
            return reading
        numbers.append(reading)
    for earlier, later in zip(numbers, numbers[1:]):
        if later < earlier:
            return (
                f"the hit counter went backwards ({earlier:g} to {later:g}) during the test: "
                "the server restarted, so its counts are not evidence"
            )
    return numbers


def draft_proof(requests: Sequence[tuple[int, int, int]], most_drafts: int | None) -> Proof:
    """Whether drafts were shown accepted, from each speculative request's (drafted,
    accepted, generated) counts: no request may have accepted more drafts than it
    generated tokens, nor drafted more than `most_drafts` (the server's own draft
    limit, where it says) for each token, or none of its counts is evidence."""
    drafted = sum(request[0] for request in requests)
    accepted = sum(request[1] for request in requests)
    facts: dict[str, Any] = {"drafted": drafted, "accepted": accepted}
    for number, (tried, taken, generated) in enumerate(requests, 1):
        beyond = taken > generated or (most_drafts is not None and tried > most_drafts * generated)
        if beyond:
            how = (
                f"the server claimed {taken} of {tried} drafted tokens accepted for a "
                f"{generated}-token completion (prompt {number}), more than it can have "
                "drafted or accepted: its draft counts are not evidence"
            )
            return Proof(False, how, facts)
    if not accepted:
        how = (
            "the server accepted no drafted token (its timings show none): it did not "
            "speculate on these prompts"
        )
        return Proof(False, how, facts)
    return Proof(True, f"the server accepted {accepted} of {drafted} drafted tokens", facts)
