"""A suite's report: report.json, report.md, report.html (inline SVG), results.csv.

Everything is rendered from the one JSON object `specdiff.suite.outcome.outcome_json`
builds, so the four files cannot disagree. Prompt ids, pair names, labels, model ids and
errors come from files and servers specdiff does not control: every Markdown cell goes
through `markdown_cell` (no HTML, link or table break survives) and every CSV cell
through `csv_cell` (no formula runs when a spreadsheet opens it).
"""

from __future__ import annotations

import csv
import html
import io
import itertools
import json
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from specdiff.compare import (
    DEFAULT_SPLIT_THRESHOLD,
    FORK_CLASSES,
    MEASURED_NOISE_P99,
    UNSCORED,
)
from specdiff.files import write_chunks_atomic
from specdiff.json_numbers import finite_everywhere
from specdiff.reports._markup import html_table, md_table, md_table_lines, page_head
from specdiff.reports.suite_kld import KLD_PROMPT_HEADER, kld_line, kld_prompt_rows
from specdiff.reports.suite_lengths import (
    LENGTH_HEADER,
    fork_rate_by_prompt_length_svg,
    length_rows,
)
from specdiff.reports.svg import LANE_COLORS, Rule, Series, histogram, line_chart
from specdiff.safe_text import csv_cell, json_text, markdown_cell, visible
from specdiff.sessions.format import CRASHED
from specdiff.suite.noise_floor import control_part, control_rows

PAIR_COLORS = ("#3b7dd8", "#e0761b", "#2e9e5b", "#a23bd8", "#d83b5e", "#6b6b6b")
CSV_COLUMNS = (
    "pair",
    "quant",
    "prompt_id",
    "identical",
    "fork_index",
    "fork_margin_a",
    "fork_margin_b",
    "fork_class",
    "fork_verdict",
    "tokens_a",
    "tokens_b",
    "tokens_per_second_a",
    "tokens_per_second_b",
    "drafted_a",
    "accepted_a",
    "drafted_b",
    "accepted_b",
    "near_ties_a",
    "near_ties_b",
    "stop_reason_a",
    "stop_reason_b",
    "error",
    "grade_a",
    "grade_b",
    "teacher_flips",
    "sha256_a",
    "sha256_b",
    "session",
    "concurrency",
    "served_by_a",
    "served_by_b",
    "retries_a",
    "retries_b",
    "wait_seconds_a",
    "wait_seconds_b",
)


def _html_text(text: str, quote: bool = True) -> str:
    """Text from prompts, servers and sessions in the HTML report: control characters
    shown as escapes (a `cat report.html` must not run them), then HTML-escaped."""
    return html.escape(visible(text), quote=quote)


def write_reports(report_dir: Path, data: dict[str, Any]) -> list[Path]:
    """Write the four report files, each whole or not at all; their paths. Each is
    written as it is rendered, a run's row at a time: over thousands of prompts each
    text is megabytes, and none of it need be held."""
    outputs: dict[str, Callable[[dict[str, Any]], Iterable[str]]] = {
        "report.json": report_json_chunks,
        "report.md": markdown_chunks,
        "report.html": html_chunks,
        "results.csv": results_csv_chunks,
    }
    written = []
    for name, render in outputs.items():
        path = report_dir / name
        write_chunks_atomic(path, render(data))
        written.append(path)
    return written


JSON_BLOCK = 1 << 16
"""Characters of report.json written at a time."""


def report_json_chunks(data: dict[str, Any]) -> Iterator[str]:
    """`data` as indented JSON, its `prompts` (last, and read as they are iterated)
    written a record at a time: the text `json.dumps(data, indent=1)` would give, with
    the controls it leaves raw escaped (`json_text`, as an exported session's JSON), so
    `cat report.json` runs nothing a prompt id or a server's text held."""
    for chunk in _report_json_text(data):
        yield json_text(chunk)


def _report_json_text(data: dict[str, Any]) -> Iterator[str]:
    encoder = json.JSONEncoder(indent=1, ensure_ascii=False)
    head = encoder.iterencode(finite_everywhere({k: v for k, v in data.items() if k != "prompts"}))
    # the encoder's pieces are a few characters each: written in blocks, the last few
    # characters held back, for the head's closing "\n}" gives way to the prompts
    block = ""
    for piece in head:
        block += piece
        if len(block) > JSON_BLOCK:
            yield block[:-2]
            block = block[-2:]
    yield block[: -len("\n}")] + ',\n "prompts": ['
    separator = "\n"
    for record in data["prompts"]:
        # JSON escapes every newline inside a string, so each "\n" starts a line; not
        # splitlines, which also breaks at U+2028 and U+0085, left raw in strings
        text = json.dumps(finite_everywhere(record), indent=1, ensure_ascii=False)
        yield separator + "  " + text.replace("\n", "\n  ")
        separator = ",\n"
    yield "]\n}\n" if separator == "\n" else "\n ]\n}\n"


# -- shared wording ------------------------------------------------------------------
def _number(value: float | None, digits: int = 2, suffix: str = "") -> str:
    if value is None or not math.isfinite(value):
        return "–"
    return f"{value:.{digits}f}{suffix}"


def _percent(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{100 * value:.{digits}f}%"


def _status(data: dict[str, Any]) -> str:
    if data["complete"]:
        return f"complete: {data['finished']} runs"
    return (
        f"stopped after {data['finished']} of {data['jobs']} runs; "
        "`specdiff suite --resume --report DIR` continues it"
    )


def _overview(data: dict[str, Any]) -> str:
    """The line under the title: state, size, settings, when and how long."""
    settings = data["settings"]
    teacher = " · teacher-forced (lane b fed lane a's tokens)" if settings["teacher_forced"] else ""
    return (
        f"{_status(data)} · {len(settings['prompt_ids'])} prompts · up to "
        f"{settings['max_tokens']} tokens per lane · near tie: margin < {settings['near_tie']}"
        f"{teacher}{_grading_text(settings)} · {_load_text(settings)} · created "
        f"{data['created']} · "
        f"specdiff {data['specdiff']} · {data['wall_seconds']:.0f} s"
    )


def _load_text(settings: dict[str, Any]) -> str:
    """The load the figures were measured under: splits grow with it."""
    return f"concurrency {settings.get('concurrency', 1)} (prompts in flight per lane)"


def _grading_text(settings: dict[str, Any]) -> str:
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


def _ran(summary: dict[str, Any]) -> int:
    """The runs that finished: neither failed nor crashed."""
    return int(summary["prompts"] - summary["failed"] - summary["crashed"])


def _identical_text(summary: dict[str, Any]) -> str:
    return f"{summary['identical']} of {_ran(summary)}"


def _pair_line(summary: dict[str, Any]) -> str:
    return (
        f"At concurrency {summary.get('concurrency', 1)}: identical "
        f"{_identical_text(summary)}; forked {summary['forked']}; lengths "
        f"differ {summary['lengths_differ']}; failed {summary['failed']}; crashed "
        f"{summary['crashed']}."
    )


def _interval_text(rate: dict[str, Any]) -> str:
    interval = rate["interval"]
    return "–" if interval is None else f"[{interval[0]:.2f}, {interval[1]:.2f}]"


def _rate_text(rate: dict[str, Any]) -> str:
    """`7/50 [0.07, 0.26]`: a count, its denominator and its Wilson 95% interval."""
    text = f"{rate['count']}/{rate['of']}"
    return text if rate["interval"] is None else f"{text} {_interval_text(rate)}"


def _p_text(p: float) -> str:
    return f"{p:.2f}" if p >= 0.01 else f"{p:.1e}"


def _class_counts_text(summary: dict[str, Any]) -> str:
    """`near tie 3, ambiguous 1, large-margin split 0`; empty when nothing forked."""
    shown = _shown_classes(summary)
    if not any(count for _name, count in shown):
        return ""
    return ", ".join(f"{name} {count}" for name, count in shown)


def _shown_classes(summary: dict[str, Any]) -> list[tuple[str, int]]:
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
            f"McNemar p {_p_text(grades['mcnemar_p'])}",
        ]
    classes = _class_counts_text(summary)
    if classes:
        parts.append(f"forks: {classes}")
    parts += [part for part in [control_part(summary)] if part]
    return " · ".join(parts)


def _rate_row(name: str, rate: dict[str, Any]) -> list[str]:
    return [name, f"{rate['count']}/{rate['of']}", _interval_text(rate)]


def _paired_rows(summary: dict[str, Any]) -> list[list[str]]:
    """The pair's figures with their intervals: identical runs, then, when graded,
    pass@1 per lane, the 2×2 table, McNemar and pass@1 among the forked prompts."""
    rows = [_rate_row("identical", summary["identical_rate"])]
    grades = summary.get("grades")
    if grades:
        rows += [_rate_row(f"pass@1 {lane}", r) for lane, r in zip("ab", grades["pass_at_1"])]
        for key in ("both", "only_a", "only_b", "neither"):
            rows.append([PAIRED_CELLS[key], str(grades[key]), ""])
        discordant = grades["only_a"] + grades["only_b"]
        p_value = _p_text(grades["mcnemar_p"])
        rows.append([f"McNemar p (exact, {discordant} discordant)", p_value, ""])
        rows += [
            _rate_row(f"pass@1 {lane}, forked only", r)
            for lane, r in zip("ab", grades["forked_pass_at_1"])
        ]
        rows.append(["left out of pass@1", str(len(grades["excluded"])), ""])
    classes = [[f"forks: {name}", str(count), ""] for name, count in _shown_classes(summary)]
    return rows + classes + control_rows(summary, _rate_row)


PAIRED_CELLS = {"both": "both pass", "only_a": "only a", "only_b": "only b", "neither": "neither"}
PAIRED_HEADER = ("figure", "value", "95% interval (Wilson)")
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


def _grade_words(record: dict[str, Any]) -> list[str]:
    """Each lane's grade as `pass`, `fail`, or blank where the lane was not graded."""
    grades = record.get("grades") or (None, None)
    return ["" if g is None else ("pass" if g["passed"] else "fail") for g in grades]


def _summary_rows(data: dict[str, Any]) -> list[list[str]]:
    rows = []
    for pair in data["pairs"]:
        s = pair["summary"]
        rows.append(
            [
                pair["label"],
                _identical_text(s),
                str(s["forked"]),
                _number(_median_int(s["fork_indices"]), 0),
                _number(s["fork_margin_median"], 3),
                " / ".join(_number(v, 1) for v in s["near_ties_per_1000"]),
                " / ".join(_number(v, 1) for v in s["tokens_per_second_median"]),
                _number(s["speedup"], 2, "x"),
                " / ".join(_percent(v, 0) for v in s["acceptance"]),
                str(s["failed"]),
                str(s["crashed"]),
                _solved_cell(s),
                _p_text(s["grades"]["mcnemar_p"]) if s.get("grades") else "–",
                _class_counts_cell(s),
                str(s.get("concurrency", 1)),
            ]
        )
    return rows


EMPTY_CELLS = ("–", "", "– / –", "–x")
"""What a summary cell holds where a figure does not apply (no drafts, no grades)."""


def summary_table(data: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
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


def _by_length_header(data: dict[str, Any]) -> list[int]:
    lengths: list[int] = []
    for pair in data["pairs"]:
        for point in pair["summary"]["forked_by_length"]:
            if point["tokens"] not in lengths:
                lengths.append(point["tokens"])
    return sorted(lengths)


def _by_length_table(data: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
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


def _quant_matrix(data: dict[str, Any]) -> tuple[list[str], list[list[str]]] | None:
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
            row.append("–" if summary is None else f"{_identical_text(summary)} identical")
        rows.append(row)
    return ["weights", *names], rows


def _teacher_rows(teacher: dict[str, Any]) -> list[list[str]]:
    delta = teacher["delta_logit"]
    return [
        ["steps compared", str(teacher["steps"])],
        [
            "flips (B's argmax ≠ A's pick)",
            f"{teacher['flips']} ({_percent(teacher['flip_rate'], 2)})",
        ],
        ["same top-1", _percent(teacher["same_top1"], 2)],
        ["prompts with a flip", str(teacher["prompts_with_a_flip"])],
        [
            "|Δlogit| of the chosen token: mean / median / p90 / p99 / max",
            " / ".join(_number(delta[key], 4) for key in ("mean", "median", "p90", "p99", "max")),
        ],
    ]


def _bucket_label(low: float, high: float) -> str:
    return f"{low:g} ≤ m < {high:g}" if math.isfinite(high) else f"m ≥ {low:g}"


def _margin_rows(teacher: dict[str, Any]) -> list[list[str]]:
    return [
        [
            _bucket_label(b["from"], b["to"]),
            str(b["steps"]),
            str(b["flips"]),
            _percent(b["flips"] / b["steps"], 2) if b["steps"] else "–",
        ]
        for b in teacher["by_margin"]
    ]


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
            _percent(row["fork_rate"]),
            str(row["failed"]),
            str(row["retries"]),
            _number(row["wait_seconds"], 1),
        ]
        for lane, rows in zip("ab", serving["endpoints"])
        for row in rows
    ]


def _lane_rows(configuration: dict[str, Any] | None) -> list[list[str]]:
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


def _build_rows(data: dict[str, Any]) -> list[list[str]]:
    for pair in data["pairs"]:
        configuration = pair.get("configuration")
        if configuration:
            return [[key, _value(v)] for key, v in sorted(configuration.get("build", {}).items())]
    return []


PROMPT_SHOWN = 70
"""Characters of a prompt's text a results row shows beside its id."""


def prompt_label(data: dict[str, Any], prompt_id: str) -> str:
    """A prompt as a reader knows it: its id and the start of its text on one line
    (a report written before the texts were kept shows the id alone)."""
    text = (data.get("prompt_texts") or {}).get(prompt_id)
    if not isinstance(text, str) or not text.strip():
        return prompt_id
    return f"{prompt_id}: {visible(' '.join(text.split()), PROMPT_SHOWN)}"


def _prompt_rows(data: dict[str, Any]) -> Iterator[list[str]]:
    for record in data["prompts"]:
        margins = record["fork_margins"]
        yield [
            record["pair"],
            prompt_label(data, record["prompt_id"]),
            _fork_cell(record),
            "–" if margins is None else " / ".join(_number(m, 3) for m in margins),
            " / ".join(str(n) for n in record["generated"]),
            " / ".join(h[:12] for h in record["output_sha256"]),
            " / ".join(word or "–" for word in _grade_words(record)),
            _errors_text(record),
            record["session"],
        ]


def _errors_text(record: dict[str, Any]) -> str:
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


SUMMARY_NOTE = (
    "Identical: both lanes produced the same token ids. Speed: median tokens/s of each "
    "lane over its own decode time; speed a/b is their ratio. Crashed: the process "
    "running the lanes died (a native crash in llama.cpp); its session keeps the steps "
    "before the crash, and `--resume` runs it again."
)
MARGIN_HEADER = ("margin", "steps", "flips", "rate")
LANE_HEADER = ("key", "lane a", "lane b")
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


# -- charts --------------------------------------------------------------------------
def fork_histogram_svg(pair: dict[str, Any], color: str) -> str:
    bins = pair["summary"]["fork_histogram"]
    return histogram(
        [b["count"] for b in bins],
        [f"{b['from']}–{b['to']}" for b in bins],
        title=f"First divergence index, {pair['label']}",
        x_label="token index of the first divergence",
        y_label="prompts",
        color=color,
        empty_note="no prompt forked",
    )


def forked_by_length_svg(data: dict[str, Any]) -> str:
    series = []
    for number, pair in enumerate(data["pairs"]):
        summary = pair["summary"]
        ran = _ran(summary)
        values = [100 * count / ran for count in summary["forked_by_token"]] if ran else []
        series.append(Series(pair["label"], values, PAIR_COLORS[number % len(PAIR_COLORS)]))
    return line_chart(
        series,
        title="Prompts forked by generation length",
        x_label="tokens generated",
        y_label="% of prompts forked",
        y_range=(0.0, 100.0),
        horizontal=(Rule(50.0, "half"),),
        empty_note="no prompts finished",
    )


def delta_histogram_svg(pair: dict[str, Any]) -> str:
    teacher = pair["summary"]["teacher_forced"]
    bins = teacher["delta_logit"]["histogram"]
    return histogram(
        [b["count"] for b in bins],
        [_bucket_label(b["from"], b["to"]).replace("m", "|Δ|") for b in bins],
        title=f"|Δlogit| of the chosen token, teacher-forced, {pair['label']}",
        x_label="|logit in lane b − logit in lane a|",
        y_label="steps",
        color=LANE_COLORS["b"],
        empty_note="no steps compared",
    )


# -- Markdown ------------------------------------------------------------------------
def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return md_table(header, rows, markdown_cell)


def _text_bars(bins: Sequence[dict[str, Any]], width: int = 30) -> list[str]:
    top = max((b["count"] for b in bins), default=0)
    lines = []
    for b in bins:
        bar = "█" * (round(width * b["count"] / top) if top else 0)
        lines.append(f"{b['from']:>5}–{b['to']:<5} {bar} {b['count']}")
    return lines


TableSection = Callable[[str, Sequence[str], Iterable[Sequence[str]]], Iterable[str]]
"""How a format writes a titled table: its lines, reading the rows as it goes."""


def _document(
    data: dict[str, Any],
    overview: Callable[[dict[str, Any]], list[str]],
    pair_section: Callable[[dict[str, Any]], list[str]],
    table_section: TableSection,
) -> Iterator[str]:
    """The report's lines in the order every format shows them: the overview, each
    pair, the build, every run. The runs' tables are read from `data["prompts"]` as the
    lines are, a run at a time."""
    yield from overview(data)
    for pair in data["pairs"]:
        yield from pair_section(pair)
    build = _build_rows(data)
    if build:
        yield from table_section("Build", ["", ""], build)
    yield from table_section("Prompts", PROMPT_HEADER, _prompt_rows(data))
    verdicts = _verdict_rows(data)
    first = next(verdicts, None)
    if first is not None:
        rows = itertools.chain([first], verdicts)
        yield from table_section("Why each run forked", VERDICT_HEADER, rows)


VERDICT_HEADER = ("pair", "prompt", "fork at", "why")


def _verdict_rows(data: dict[str, Any]) -> Iterator[list[str]]:
    """Each forked run's plain-words verdict: its picks, their gap, how each moved."""
    for record in data["prompts"]:
        if record.get("verdict"):
            label = prompt_label(data, record["prompt_id"])
            yield [record["pair"], label, _fork_cell(record), record["verdict"]]


def markdown(data: dict[str, Any]) -> str:
    return "".join(markdown_chunks(data))


def markdown_chunks(data: dict[str, Any]) -> Iterator[str]:
    for line in _document(data, _md_overview, _md_pair, _md_section_lines):
        yield line + "\n"


def _md_section(title: str, header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    return list(_md_section_lines(title, header, rows))


def _md_section_lines(
    title: str, header: Sequence[str], rows: Iterable[Sequence[str]]
) -> Iterator[str]:
    """_md_section a line at a time."""
    yield from ("", f"## {title}", "")
    yield from md_table_lines(header, rows, markdown_cell)


def _md_overview(data: dict[str, Any]) -> list[str]:
    lines = [f"# specdiff suite: {markdown_cell(data['settings']['source'])}", "", _overview(data)]
    lines += _md_section("Summary", *summary_table(data))
    lines += ["", SUMMARY_NOTE]
    lines += _md_section("Forked by generation length", *_by_length_table(data))
    if length_rows(data):
        lines += _md_section("Fork rate by prompt length", LENGTH_HEADER, length_rows(data))
    matrix = _quant_matrix(data)
    if matrix is not None:
        lines += _md_section("By weight type", *matrix)
    if data["skipped_prompts"]:
        lines += ["", "## Skipped", ""]
        lines += [f"- {markdown_cell(problem)}" for problem in data["skipped_prompts"]]
    return lines


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


def _md_pair(pair: dict[str, Any]) -> list[str]:
    summary = pair["summary"]
    lines = [
        "",
        f"## {markdown_cell(pair['label'])}",
        "",
        _pair_line(summary),
        "",
        paired_line(summary),
        "",
        classes_note(summary),
        "",
        *_md_table(PAIRED_HEADER, _paired_rows(summary)),
        *_md_paired_notes(summary),
        "",
        "First divergence index:",
        "",
        "```text",
        *_text_bars(summary["fork_histogram"]),
        "```",
    ]
    backoff, by_endpoint = backoff_text(summary), serving_rows(summary)
    if backoff:
        lines += ["", markdown_cell(backoff)]
    if by_endpoint:
        lines += ["", "By endpoint:", "", *_md_table(SERVING_HEADER, by_endpoint)]
    teacher = summary.get("teacher_forced")
    if teacher:
        lines += ["", "Teacher-forced:", "", *_md_table(["", ""], _teacher_rows(teacher))]
        lines += [
            "",
            "Flips by lane a's margin m:",
            "",
            *_md_table(MARGIN_HEADER, _margin_rows(teacher)),
        ]
    if kld_line(summary.get("kld")):
        lines += ["", markdown_cell(kld_line(summary["kld"]))]
        lines += ["", *_md_table(KLD_PROMPT_HEADER, kld_prompt_rows(summary["kld"]))]
    rows = _lane_rows(pair.get("configuration"))
    if rows:
        lines += [
            "",
            "Configuration (* where the lanes differ):",
            "",
            *_md_table(LANE_HEADER, rows),
        ]
    return lines


def _md_paired_notes(summary: dict[str, Any]) -> list[str]:
    if not summary.get("grades"):
        return []
    left_out = left_out_text(summary)
    return ["", PAIRED_NOTE, *(["", markdown_cell(left_out)] if left_out else [])]


# -- HTML ----------------------------------------------------------------------------
SUITE_STYLE = """
body{max-width:1200px;margin:2rem auto;padding:0 1rem}
h1{font-size:1.6rem}
table{margin:.6rem 0 1rem;font-size:.9rem}
.wide{overflow-x:auto}
details{margin:.6rem 0}summary{cursor:pointer;color:var(--muted)}
table.config td{overflow-wrap:anywhere}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.charts{display:flex;flex-wrap:wrap;gap:1rem}
code{font-size:.85em}
"""
"""What the suite report adds to the base stylesheet: its page width and chart row."""


def _html_table(header: Sequence[str], rows: Sequence[Sequence[str]], css_class: str = "") -> str:
    return html_table(header, (_html_row(row) for row in rows), _html_text, css_class)


def _html_row(cells: Sequence[str]) -> str:
    return "<tr>" + "".join(f"<td>{_html_text(cell)}</td>" for cell in cells) + "</tr>"


def html_report(data: dict[str, Any]) -> str:
    return "".join(html_chunks(data))


def html_chunks(data: dict[str, Any]) -> Iterator[str]:
    for line in _document(data, _html_overview, _html_pair, _html_section_lines):
        yield line + "\n"
    yield "</body></html>\n"


def _html_section(title: str, header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    return [f"<h2>{title}</h2>", _html_table(header, list(rows))]


def _html_section_lines(
    title: str, header: Sequence[str], rows: Iterable[Sequence[str]]
) -> Iterator[str]:
    """_html_section with a line per row, each written as it is read; the build folded
    away (what ran, for tracing a number, not for reading first)."""
    folded = title in FOLDED_SECTIONS
    yield f"<details><summary>{title}</summary>" if folded else f"<h2>{title}</h2>"
    opening, closing = _html_table(header, []).split("<tbody></tbody>")
    yield opening + "<tbody>"
    yield from (_html_row(row) for row in rows)
    yield "</tbody>" + closing + ("</details>" if folded else "")


FOLDED_SECTIONS = ("Build",)


def _html_overview(data: dict[str, Any]) -> list[str]:
    source = _html_text(data["settings"]["source"])
    parts = [
        page_head(f"specdiff suite: {source}", SUITE_STYLE) + "<body>",
        f"<h1>specdiff suite: {source}</h1>",
        # quotes need no escaping in text, and the wording has an apostrophe
        f'<p class="muted">{_html_text(_overview(data), quote=False)}</p>',
        "<h2>Summary</h2>",
        '<div class="wide">' + _html_table(*summary_table(data)) + "</div>",
        '<div class="charts">',
        f'<figure class="plot" id="forked-by-length">{forked_by_length_svg(data)}</figure>',
    ]
    for number, pair in enumerate(data["pairs"]):
        color = PAIR_COLORS[number % len(PAIR_COLORS)]
        parts.append(f'<figure class="plot">{fork_histogram_svg(pair, color)}</figure>')
    parts.append("</div>")
    parts += _html_section("Forked by generation length", *_by_length_table(data))
    if length_rows(data):
        parts += _html_section("Fork rate by prompt length", LENGTH_HEADER, length_rows(data))
        parts.append(f'<figure class="plot">{fork_rate_by_prompt_length_svg(data)}</figure>')
    matrix = _quant_matrix(data)
    if matrix is not None:
        parts += _html_section("By weight type", *matrix)
    if data["skipped_prompts"]:
        items = "".join(f"<li>{_html_text(p)}</li>" for p in data["skipped_prompts"])
        parts += ["<h2>Skipped</h2>", f"<ul>{items}</ul>"]
    return parts


def _html_pair(pair: dict[str, Any]) -> list[str]:
    summary = pair["summary"]
    parts = [
        f"<h2>{_html_text(pair['label'])}</h2>",
        f"<p>{_html_text(_pair_line(summary))}</p>",
        f'<p class="paired">{_html_text(paired_line(summary))}</p>',
        f'<p class="muted">{_html_text(classes_note(summary))}</p>',
        _html_table(PAIRED_HEADER, _paired_rows(summary), "paired"),
    ]
    if summary.get("grades"):
        parts.append(f'<p class="muted">{_html_text(PAIRED_NOTE)}</p>')
        left_out = left_out_text(summary)
        if left_out:
            parts.append(f"<p>{_html_text(left_out)}</p>")
    backoff, by_endpoint = backoff_text(summary), serving_rows(summary)
    if backoff:
        parts.append(f"<p>{_html_text(backoff)}</p>")
    if by_endpoint:
        parts += ["<h3>By endpoint</h3>", _html_table(SERVING_HEADER, by_endpoint)]
    teacher = summary.get("teacher_forced")
    if teacher:
        parts += [
            "<h3>Teacher-forced</h3>",
            _html_table(["", ""], _teacher_rows(teacher)),
            f'<figure class="plot">{delta_histogram_svg(pair)}</figure>',
            "<p>Flips by lane a's margin m:</p>",
            _html_table(MARGIN_HEADER, _margin_rows(teacher)),
        ]
    if kld_line(summary.get("kld")):
        parts.append(f"<p>{_html_text(kld_line(summary['kld']))}</p>")
        parts.append(_html_table(KLD_PROMPT_HEADER, kld_prompt_rows(summary["kld"])))
    rows = _lane_rows(pair.get("configuration"))
    if rows:
        differ = [row[0].removesuffix(" *") for row in rows if row[0].endswith(" *")]
        named = f": the lanes differ in {', '.join(differ)}" if differ else ""
        parts += [
            f"<details><summary>Configuration, {len(rows)} settings{_html_text(named)} "
            "(* where the lanes differ)</summary>",
            _html_table(LANE_HEADER, rows, "config"),
            "</details>",
        ]
    return parts


# -- CSV -----------------------------------------------------------------------------
def results_csv(data: dict[str, Any]) -> str:
    return "".join(results_csv_chunks(data))


def results_csv_chunks(data: dict[str, Any]) -> Iterator[str]:
    """The CSV a row at a time: its header, then a run's row as each is read."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")

    def row(cells: Iterable[Any]) -> str:
        buffer.seek(0)
        buffer.truncate()
        writer.writerow(cells)
        return buffer.getvalue()

    yield row(CSV_COLUMNS)
    load = data["settings"].get("concurrency", 1)
    for record in data["prompts"]:
        cells = [*_csv_row(record), load, *_serving_cells(record)]
        yield row(csv_cell(cell) for cell in cells)


def _csv_row(r: dict[str, Any]) -> list[Any]:
    """One run in CSV_COLUMNS order, up to its session (the suite's load and how each
    lane was served follow)."""
    margins = r["fork_margins"] or (None, None)
    teacher = r.get("teacher")
    return [
        r["pair"],
        r["quant"],
        r["prompt_id"],
        int(r["identical"]),
        "" if r["fork_index"] is None else r["fork_index"],
        _csv_number(margins[0]),
        _csv_number(margins[1]),
        r.get("fork_class") or "",
        r.get("verdict") or "",
        r["generated"][0],
        r["generated"][1],
        _csv_number(r["tokens_per_second"][0]),
        _csv_number(r["tokens_per_second"][1]),
        r["drafted"][0],
        r["accepted"][0],
        r["drafted"][1],
        r["accepted"][1],
        r["near_ties"][0],
        r["near_ties"][1],
        r["stop_reasons"][0],
        r["stop_reasons"][1],
        _errors_text(r),
        *_grade_words(r),
        "" if teacher is None else len(teacher["flips"]),
        r["output_sha256"][0],
        r["output_sha256"][1],
        r["session"],
    ]


def _serving_cells(record: dict[str, Any]) -> list[Any]:
    """Each lane's endpoint, retries and back-off seconds; blank for a lane not served
    over HTTP or a run that did not record it."""
    lanes = record.get("serving") or (None, None)
    cells: list[Any] = []
    for field in ("endpoint", "retries", "wait_seconds"):
        cells += ["" if lane is None else lane[field] for lane in lanes]
    return cells


def _csv_number(value: float | None) -> str:
    return "" if value is None or not math.isfinite(value) else f"{value:.6g}"
