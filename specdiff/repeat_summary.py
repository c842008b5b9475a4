"""A repeat's runs reduced to what is reported: the distinct completions (most runs
first), where they split, each run's group and speed, and for a sweep the same per
value; then that JSON as text.

Kept apart from the runs themselves (`repeat.py`, which loads the engine) so that the
summary, which is all the worker process hands back, reads without llama.cpp.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, TypedDict, final

from specdiff.lanes import Lane, without_credentials
from specdiff.steps import TokenStep, text_of


class BatchedRun(Protocol):
    """What the summary reads of one run the engine returned (its `BatchedRun`): the
    summary only reads records, so it names their fields rather than the engine's class."""

    companions: int
    steps: list[TokenStep]
    seconds: float

    @property
    def token_ids(self) -> list[int]: ...


@dataclass
class RepeatResult:
    """Every run of one repeat, as the engine returned them, with what they ran beside."""

    lane: Lane
    prompt: str
    max_tokens: int
    max_companions: int
    runs: list[BatchedRun]
    companion_ids: list[list[str]]
    concurrency: int | None = None
    """Requests in flight at once, for a repeat against a server; None for a local one."""
    cancelled: bool = False
    batch: int | None = None
    """Runs in flight at once, for a continuously batched repeat; None otherwise."""


class AtSplit(TypedDict):
    """A completion's pick at the first split: its token, margin and best candidates."""

    token_id: int
    piece: str
    margin: float
    top: list[list[object]]
    """[token id, piece, logit] of the four best candidates."""


class _GroupFields(TypedDict):
    runs: list[int]
    count: int
    companions: list[int]
    tokens: int
    text: str


class GroupJson(_GroupFields, total=False):
    """One distinct completion of a repeat."""

    departs_at: int
    """The token where it leaves the largest group's completion."""
    departs_at_char: int
    at_split: AtSplit


class RunJson(TypedDict):
    """One run of a repeat: what it ran beside, its group, its speed."""

    run: int
    companions: list[str]
    group: int
    tokens_per_second: float


class _SummaryFields(TypedDict):
    prompt: str
    lane: dict[str, Any]
    runs: int
    max_companions: int
    max_tokens: int
    cancelled: bool
    unique: int
    largest_share: float
    first_split: int | None
    groups: list[GroupJson]
    per_run: list[RunJson]


@final  # so that `"points" in data` tells a sweep from a repeat
class RepeatSummary(_SummaryFields, total=False):
    """A repeat as `specdiff repeat --json` writes it (`summary`)."""

    batch: int
    endpoint: str
    concurrency: int


class SweepPoint(TypedDict):
    """One value of a sweep: its repeat's figures, and the repeat itself."""

    value: int
    runs: int
    unique: int
    largest_share: float
    first_split: int | None
    departs_at: int | None
    summary: RepeatSummary


@final
class SweepSummary(TypedDict):
    """A sweep as `specdiff repeat --json` writes it (`sweep_summary`)."""

    sweep: str
    values: list[int]
    runs_per_value: int
    cancelled: bool
    points: list[SweepPoint]


def first_split(completions: list[list[int]]) -> int | None:
    """The first index at which any two completions differ (a shorter one that is a
    prefix of a longer one splits where it ends); None when all are equal."""
    if len({tuple(c) for c in completions}) <= 1:
        return None
    index = 0
    while True:
        tokens = {c[index] if index < len(c) else None for c in completions}
        if len(tokens) > 1:
            return index
        index += 1


def summary(result: RepeatResult) -> RepeatSummary:
    """The repeat as JSON: the distinct completions (most runs first), where they split,
    and each run's group and speed; a server repeat adds its endpoint and concurrency."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for number, run in enumerate(result.runs):
        groups.setdefault(tuple(run.token_ids), []).append(number)
    ordered = sorted(groups.items(), key=lambda item: (-len(item[1]), item[1][0]))
    split = first_split([list(tokens) for tokens in groups])
    largest = len(ordered[0][1]) if ordered else 0
    data: RepeatSummary = {
        "prompt": result.prompt,
        "lane": result.lane.as_dict(),
        "runs": len(result.runs),
        "max_companions": result.max_companions,
        "max_tokens": result.max_tokens,
        "cancelled": result.cancelled,
        "unique": len(groups),
        "largest_share": largest / len(result.runs) if result.runs else 0.0,
        "first_split": split,
        "groups": [
            _group_json(result, members, split, result.runs[ordered[0][1][0]])
            for _, members in ordered
        ],
        "per_run": [
            {
                "run": number,
                "companions": result.companion_ids[number],
                "group": next(i for i, (_, m) in enumerate(ordered) if number in m),
                "tokens_per_second": (
                    (len(run.steps) - 1) / run.seconds if run.seconds and run.steps else 0.0
                ),
            }
            for number, run in enumerate(result.runs)
        ],
    }
    if result.batch is not None:
        data["batch"] = result.batch
    if result.concurrency is not None:
        data["endpoint"] = without_credentials(result.lane.endpoint)
        data["concurrency"] = result.concurrency
    return data


def _group_json(
    result: RepeatResult, members: list[int], split: int | None, largest: BatchedRun
) -> GroupJson:
    """One distinct completion: its runs, its pick and margin at the split, and where it
    leaves the largest group's completion (token and character), so two completions
    that read alike for a while can be shown from where they differ."""
    first = result.runs[members[0]]
    entry: GroupJson = {
        "runs": members,
        "count": len(members),
        "companions": sorted({result.runs[m].companions for m in members}),
        "tokens": len(first.steps),
        "text": text_of(first.steps),
    }
    if first is not largest:
        departs = first_split([largest.token_ids, first.token_ids])
        if departs is not None:
            entry["departs_at"] = departs
            entry["departs_at_char"] = len(text_of(first.steps[:departs]))
    if split is not None and split < len(first.steps):
        step = first.steps[split]
        entry["at_split"] = {
            "token_id": step.token_id,
            "piece": step.piece.decode("utf-8", "replace"),
            "margin": step.margin,
            "top": [
                [c.token_id, c.piece.decode("utf-8", "replace"), c.logit] for c in step.top[:4]
            ],
        }
    return entry


def sweep_summary(results: list[RepeatResult], values: list[int], runs: int) -> SweepSummary:
    """A sweep as JSON: per value, the unique completions, the largest group's share,
    the first split among its runs, and where its runs first depart from the first
    value's most common completion (the reference: alone, or one request at a time)."""
    summaries = [summary(result) for result in results]
    served = bool(results) and results[0].concurrency is not None
    reference: list[int] | None = None
    points: list[SweepPoint] = []
    for value, result, data in zip(values, results, summaries):
        completions = [run.token_ids for run in result.runs]
        if reference is None and completions:
            reference = [int(t) for t in _most_common(completions)]
        departs = first_split([reference, *completions]) if reference is not None else None
        points.append(
            {
                "value": value,
                "runs": data["runs"],
                "unique": data["unique"],
                "largest_share": data["largest_share"],
                "first_split": data["first_split"],
                "departs_at": departs,
                "summary": data,
            }
        )
    return {
        "sweep": "concurrency" if served else "companions",
        "values": values,
        "runs_per_value": runs,
        "cancelled": any(result.cancelled for result in results) or len(results) < len(values),
        "points": points,
    }


def _most_common(completions: list[list[int]]) -> tuple[int, ...]:
    """The completion most runs gave (the earliest run's, on a tie)."""
    counts: dict[tuple[int, ...], int] = {}
    for tokens in completions:
        counts[tuple(tokens)] = counts.get(tuple(tokens), 0) + 1
    return max(counts, key=lambda tokens: counts[tokens])


def format_sweep(data: SweepSummary) -> str:
    """The sweep as a table: one line per value."""
    name = data["sweep"]
    lines = [
        f"sweep of --{name}: {data['runs_per_value']} runs per value",
        f"{name:>12}  {'unique':>6}  {'largest group':>13}  {'first split':>11}  departs from "
        f"{data['values'][0]} at",
    ]
    for point in data["points"]:
        share = f"{point['largest_share']:.0%}"
        split = "–" if point["first_split"] is None else str(point["first_split"])
        departs = "–" if point["departs_at"] is None else str(point["departs_at"])
        lines.append(
            f"{point['value']:>12}  {point['unique']:>6}  {share:>13}  {split:>11}  {departs}"
        )
    if data["cancelled"]:
        lines.append("stopped: the table covers the runs that finished")
    return "\n".join(lines)


GROUPS_SHOWN = 10
"""A thousand runs may give dozens of completions: the text lists the largest."""


def format_summary(data: RepeatSummary) -> str:
    """The repeat as text: how it ran, the unique completions, each group on a line,
    and the picks at the first split."""
    if "endpoint" in data:
        how = f"sent to {data['endpoint']}, {data['concurrency']} at a time"
    elif "batch" in data:
        how = f"up to {data['batch']} in flight at once"
    else:
        how = f"each decoded beside 0 to {data['max_companions']} other sequences"
    lines = [
        f"repeat: {data['runs']} runs of one prompt, {how}, up to {data['max_tokens']} tokens",
        f"unique completions: {data['unique']} of {data['runs']} runs; the largest group "
        f"holds {data['largest_share']:.1%}",
    ]
    shown = data["groups"][:GROUPS_SHOWN]
    lines += [_group_line(data, number, group) for number, group in enumerate(shown, 1)]
    if len(data["groups"]) > GROUPS_SHOWN:
        lines.append(f"  … {len(data['groups']) - GROUPS_SHOWN} more (--json lists them all)")
    split = data["first_split"]
    if split is None:
        lines.append("every run produced the same tokens")
    else:
        picks = []
        for number, group in enumerate(shown, 1):
            at = group.get("at_split")
            if at is None:
                picks.append(f"#{number} ended")
            else:
                picks.append(f"#{number} {at['piece']!r} (margin {at['margin']:.4f})")
        lines.append(f"first split at token {split}: " + ", ".join(picks))
    if data["cancelled"]:
        lines.append("stopped: the counts cover the runs that finished")
    return "\n".join(lines)


TEXT_SHOWN = 60
"""Characters of a completion a group line shows."""
CONTEXT_SHOWN = 20
"""Characters before the point where a completion leaves the largest group's that its
line shows, so the reader sees the words leading into the difference."""


def _group_line(data: RepeatSummary, number: int, group: GroupJson) -> str:
    text, where = group["text"], ""
    departs = group.get("departs_at_char")
    if departs is not None and departs > TEXT_SHOWN - CONTEXT_SHOWN:
        # the first TEXT_SHOWN characters are #1's too: show where this one differs
        text = "…" + text[departs - CONTEXT_SHOWN :]
    if departs is not None:
        where = f", differs from #1 at token {group['departs_at']}"
    text = " ".join(text.split())
    text = text if len(text) <= TEXT_SHOWN else text[: TEXT_SHOWN - 1] + "…"
    runs = ", ".join(str(r) for r in group["runs"][:8])
    more = "…" if len(group["runs"]) > 8 else ""
    if "endpoint" in data:
        beside = ""
    elif "batch" in data:
        beside = f"; beside up to {max(group['companions'])} other runs"
    else:
        beside = f"; companions {', '.join(str(c) for c in group['companions'])}"
    plural = "s" if group["count"] > 1 else ""
    return (
        f"  #{number}: {group['count']} run{plural} "
        f"(run{plural} {runs}{more}{beside}), {group['tokens']} tokens{where}: {text!r}"
    )
