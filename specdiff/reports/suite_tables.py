"""The suite report's tables, each a header and rows of plain text: the summary, each
pair's paired figures, teacher-forced flips, endpoints, configuration and build, and a
row per run. The formats escape and lay out the cells; `report_lines` sets the order
they all show them in.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from specdiff.compare import FORK_CLASSES, UNSCORED
from specdiff.reports.suite_shards import CPU_HEADER, MACHINE_HEADER, cpu_rows, machine_rows
from specdiff.reports.suite_words import (
    identical_text,
    interval_text,
    number_text,
    p_text,
    percent_text,
    shown_classes,
)
from specdiff.safe_text import visible
from specdiff.sessions.format import CRASHED
from specdiff.suite.noise_floor import control_rows
from specdiff.suite.outcome import PairReport, SuiteReport
from specdiff.suite.records import Configuration


def _rate_row(name: str, rate: dict[str, Any]) -> list[str]:
    return [name, f"{rate['count']}/{rate['of']}", interval_text(rate)]


def paired_rows(summary: dict[str, Any]) -> list[list[str]]:
    """The pair's figures with their intervals: identical runs, then, when graded,
    pass@1 per lane, the 2×2 table, McNemar and pass@1 among the forked prompts."""
    rows = [_rate_row("identical", summary["identical_rate"])]
    grades = summary.get("grades")
    if grades:
        rows += [_rate_row(f"pass@1 {lane}", r) for lane, r in zip("ab", grades["pass_at_1"])]
        for key in ("both", "only_a", "only_b", "neither"):
            rows.append([PAIRED_CELLS[key], str(grades[key]), ""])
        discordant = grades["only_a"] + grades["only_b"]
        p_value = p_text(grades["mcnemar_p"])
        rows.append([f"McNemar p (exact, {discordant} discordant)", p_value, ""])
        rows += [
            _rate_row(f"pass@1 {lane}, forked only", r)
            for lane, r in zip("ab", grades["forked_pass_at_1"])
        ]
        rows.append(["left out of pass@1", str(len(grades["excluded"])), ""])
    classes = [[f"forks: {name}", str(count), ""] for name, count in shown_classes(summary)]
    return rows + classes + control_rows(summary, _rate_row)


PAIRED_CELLS = {"both": "both pass", "only_a": "only a", "only_b": "only b", "neither": "neither"}


PAIRED_HEADER = ("figure", "value", "95% interval (Wilson)")


def grade_words(record: dict[str, Any]) -> list[str]:
    """Each lane's grade as `pass`, `fail`, or blank where the lane was not graded."""
    grades = record.get("grades") or (None, None)
    return ["" if g is None else ("pass" if g["passed"] else "fail") for g in grades]


def _summary_rows(data: SuiteReport) -> list[list[str]]:
    rows = []
    for pair in data["pairs"]:
        s = pair["summary"]
        rows.append(
            [
                pair["label"],
                identical_text(s),
                str(s["forked"]),
                number_text(_median_int(s["fork_indices"]), 0),
                number_text(s["fork_margin_median"], 3),
                " / ".join(number_text(v, 1) for v in s["near_ties_per_1000"]),
                " / ".join(number_text(v, 1) for v in s["tokens_per_second_median"]),
                number_text(s["speedup"], 2, "x"),
                " / ".join(percent_text(v, 0) for v in s["acceptance"]),
                str(s["failed"]),
                str(s["crashed"]),
                _solved_cell(s),
                p_text(s["grades"]["mcnemar_p"]) if s.get("grades") else "–",
                _class_counts_cell(s),
                str(s.get("concurrency", 1)),
            ]
        )
    return rows


EMPTY_CELLS = ("–", "", "– / –", "–x")
"""What a summary cell holds where a figure does not apply (no drafts, no grades)."""


def summary_table(data: SuiteReport) -> tuple[list[str], list[list[str]]]:
    """The summary's header and rows without the columns no pair fills (draft
    acceptance without speculation, grades without grading) nor the concurrency where
    every pair ran at the suite's own, which the overview states: 15 columns do not fit
    a laptop's browser, and an empty one says nothing."""
    rows = _summary_rows(data)
    concurrency = str(data["settings"].get("concurrency", 1))
    keep = []
    for column, name in enumerate(SUMMARY_HEADER):
        cells = [row[column] for row in rows]
        if column and rows and all(cell in EMPTY_CELLS for cell in cells):
            continue
        if name == "concurrency" and all(cell == concurrency for cell in cells):
            continue
        keep.append(column)
    return [SUMMARY_HEADER[c] for c in keep], [[row[c] for c in keep] for row in rows]


def _solved_cell(summary: dict[str, Any]) -> str:
    grades = summary.get("grades")
    if not grades:
        return "–"
    # the intervals are in the pair's own table; the summary stays narrow enough to read
    solved_a, solved_b = grades["pass_at_1"]
    return f"{solved_a['count']} / {solved_b['count']} of {solved_a['of']}"


def _class_counts_cell(summary: dict[str, Any]) -> str:
    """The classes read from logits; forks with none to read are added only where some were."""
    counts = summary.get("fork_classes") or {}
    cell = " / ".join(str(counts.get(name, 0)) for name in FORK_CLASSES if name != UNSCORED)
    unscored = counts.get(UNSCORED, 0)
    return f"{cell} (+{unscored} unscored)" if unscored else cell


SUMMARY_HEADER = (
    "pair",
    "identical",
    "forked",
    "median fork index",
    "median margin at fork",
    "near ties per 1,000 steps a / b",
    "median tok/s a / b",
    "speed a/b",
    "draft acceptance a / b",
    "failed",
    "crashed",
    "solved a / b",
    "McNemar p",
    "forks: near tie / ambiguous / split",
    "concurrency",
)


def _median_int(values: Sequence[int]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    middle = len(ordered) // 2
    return (
        float(ordered[middle]) if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
    )


def _by_length_header(data: SuiteReport) -> list[int]:
    lengths: list[int] = []
    for pair in data["pairs"]:
        for point in pair["summary"]["forked_by_length"]:
            if point["tokens"] not in lengths:
                lengths.append(point["tokens"])
    return sorted(lengths)


def by_length_table(data: SuiteReport) -> tuple[list[str], list[list[str]]]:
    """Per pair, how many prompts had forked by each generation length."""
    lengths = _by_length_header(data)
    rows = []
    for pair in data["pairs"]:
        points = {p["tokens"]: p for p in pair["summary"]["forked_by_length"]}
        row = [pair["label"]]
        for length in lengths:
            point = points.get(length)
            row.append(
                "–"
                if point is None or not point["of"]
                else f"{point['forked']}/{point['of']} ({point['forked'] / point['of']:.0%})"
            )
        rows.append(row)
    return ["pair", *[f"by token {n}" for n in lengths]], rows


def quant_matrix(data: SuiteReport) -> tuple[list[str], list[list[str]]] | None:
    quants = data["settings"]["quants"]
    if not quants:
        return None
    names = [p["name"] for p in data["settings"]["pairs"]]
    by_label = {p["label"]: p["summary"] for p in data["pairs"]}
    rows = []
    for quant in quants:
        row = [quant]
        for name in names:
            summary = by_label.get(f"{name}@{quant}")
            row.append("–" if summary is None else f"{identical_text(summary)} identical")
        rows.append(row)
    return ["weights", *names], rows


def teacher_rows(teacher: dict[str, Any]) -> list[list[str]]:
    delta = teacher["delta_logit"]
    return [
        ["steps compared", str(teacher["steps"])],
        [
            "flips (B's argmax ≠ A's pick)",
            f"{teacher['flips']} ({percent_text(teacher['flip_rate'], 2)})",
        ],
        ["same top-1", percent_text(teacher["same_top1"], 2)],
        ["prompts with a flip", str(teacher["prompts_with_a_flip"])],
        [
            "|Δlogit| of the chosen token: mean / median / p90 / p99 / max",
            " / ".join(
                number_text(delta[key], 4) for key in ("mean", "median", "p90", "p99", "max")
            ),
        ],
    ]


def bucket_label(low: float, high: float) -> str:
    return f"{low:g} ≤ m < {high:g}" if math.isfinite(high) else f"m ≥ {low:g}"


def margin_rows(teacher: dict[str, Any]) -> list[list[str]]:
    return [
        [
            bucket_label(b["from"], b["to"]),
            str(b["steps"]),
            str(b["flips"]),
            percent_text(b["flips"] / b["steps"], 2) if b["steps"] else "–",
        ]
        for b in teacher["by_margin"]
    ]


MARGIN_HEADER = ("margin", "steps", "flips", "rate")


SERVING_HEADER = (
    "lane",
    "endpoint",
    "runs",
    "forked",
    "fork rate",
    "failed",
    "retries",
    "back-off s",
)


def serving_rows(summary: dict[str, Any]) -> list[list[str]]:
    """Per endpoint of each lane: the runs it served, their forks, failures and
    back-off; only where a lane used several endpoints."""
    serving = summary.get("serving")
    if not serving or all(len(lane) < 2 for lane in serving["endpoints"]):
        return []
    return [
        [
            lane,
            row["endpoint"],
            str(row["prompts"]),
            str(row["forked"]),
            percent_text(row["fork_rate"]),
            str(row["failed"]),
            str(row["retries"]),
            number_text(row["wait_seconds"], 1),
        ]
        for lane, rows in zip("ab", serving["endpoints"])
        for row in rows
    ]


def lane_rows(configuration: Configuration | None) -> list[list[str]]:
    """Every lane key and the main executed settings; a key that differs is starred."""
    if not configuration:
        return []
    lanes = configuration.get("lanes", {})
    executed = configuration.get("executed", {})
    a, b = lanes.get("a", {}), lanes.get("b", {})
    rows = [[key, _value(a.get(key)), _value(b.get(key))] for key in sorted(set(a) | set(b))]
    ran_a, ran_b = executed.get("a", {}), executed.get("b", {})
    for key in sorted(set(ran_a) | set(ran_b)):
        rows.append([f"executed {key}", _value(ran_a.get(key)), _value(ran_b.get(key))])
    return [[f"{key} *" if va != vb else key, va, vb] for key, va, vb in rows]


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None or value == "" or value == [] or value == {}:
        return "–"
    if isinstance(value, dict):
        if "name" in value or "description" in value:
            return _device_text(value)
        return ", ".join(f"{key} {_value(item)}" for key, item in value.items())
    if isinstance(value, list):
        return "; ".join(_value(item) for item in value)
    return str(value)


def _device_text(device: dict[str, Any]) -> str:
    """A device llama.cpp registered, as a reader names it: `AMD EPYC 7B13 (cpu)`."""
    name = device.get("description") or device.get("name")
    kind = device.get("type")
    return f"{name} ({kind})" if kind else str(name)


LANE_HEADER = ("key", "lane a", "lane b")


def _build_rows(data: SuiteReport) -> list[list[str]]:
    for pair in data["pairs"]:
        configuration = pair.get("configuration")
        if configuration:
            return [[key, _value(v)] for key, v in sorted(configuration.get("build", {}).items())]
    return []


PROMPT_SHOWN = 70
"""Characters of a prompt's text a results row shows beside its id."""


def prompt_label(data: SuiteReport, prompt_id: str) -> str:
    """A prompt as a reader knows it: its id and the start of its text on one line
    (a report written before the texts were kept shows the id alone)."""
    text = (data.get("prompt_texts") or {}).get(prompt_id)
    if not isinstance(text, str) or not text.strip():
        return prompt_id
    return f"{prompt_id}: {visible(' '.join(text.split()), PROMPT_SHOWN)}"


PROMPT_HEADER = (
    "pair",
    "prompt",
    "fork at",
    "margins at fork a / b",
    "tokens a / b",
    "sha256 a / b (first 12)",
    "grade a / b",
    "error",
    "session",
)


def _prompt_rows(data: SuiteReport) -> Iterator[list[str]]:
    for record in data["prompts"]:
        margins = record["fork_margins"]
        yield [
            record["pair"],
            prompt_label(data, record["prompt_id"]),
            _fork_cell(record),
            "–" if margins is None else " / ".join(number_text(m, 3) for m in margins),
            " / ".join(str(n) for n in record["generated"]),
            " / ".join(h[:12] for h in record["output_sha256"]),
            " / ".join(word or "–" for word in grade_words(record)),
            errors_text(record),
            record["session"],
        ]


def errors_text(record: dict[str, Any]) -> str:
    """Both lanes' errors, each once: a crash is the same error in both."""
    return "; ".join(dict.fromkeys(e for e in record["errors"] if e))


def _fork_cell(record: dict[str, Any]) -> str:
    """Where the run forked; a crashed run says so, with any fork before the crash."""
    fork = record["fork_index"]
    if CRASHED in record["stop_reasons"]:
        return "crashed" if fork is None else f"{fork}, then crashed"
    if record["identical"]:
        return "identical"
    if fork is None:
        return "–"
    # the noise-floor control's label beside the class, where the suite ran it
    labels = [record.get("fork_class"), (record.get("control") or {}).get("label")]
    kind = "; ".join(label for label in labels if label)
    return f"{fork} ({kind})" if kind else str(fork)


TableSection = Callable[[str, Sequence[str], Iterable[Sequence[str]]], Iterable[str]]
"""How a format writes a titled table: its lines, reading the rows as it goes."""


def report_lines(
    data: SuiteReport,
    overview: Callable[[SuiteReport], list[str]],
    pair_section: Callable[[PairReport], list[str]],
    table_section: TableSection,
) -> Iterator[str]:
    """The report's lines in the order every format shows them: the overview, each
    pair, the build (and, merged from shards, their machines), every run. The runs'
    tables are read from `data["prompts"]` as the lines are, a run at a time."""
    yield from overview(data)
    for pair in data["pairs"]:
        yield from pair_section(pair)
    build = _build_rows(data)
    if build:
        yield from table_section("Build", ["", ""], build)
    machines = machine_rows(data)
    if machines:
        yield from table_section("Shards and their machines", MACHINE_HEADER, machines)
        yield from table_section("Forks by CPU kind", CPU_HEADER, cpu_rows(data))
    yield from table_section("Prompts", PROMPT_HEADER, _prompt_rows(data))
    verdicts = _verdict_rows(data)
    first = next(verdicts, None)
    if first is not None:
        rows = itertools.chain([first], verdicts)
        yield from table_section("Why each run forked", VERDICT_HEADER, rows)


VERDICT_HEADER = ("pair", "prompt", "fork at", "why")


def _verdict_rows(data: SuiteReport) -> Iterator[list[str]]:
    """Each forked run's plain-words verdict: its picks, their gap, how each moved."""
    for record in data["prompts"]:
        if record.get("verdict"):
            label = prompt_label(data, record["prompt_id"])
            yield [record["pair"], label, _fork_cell(record), record["verdict"]]
