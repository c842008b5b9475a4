"""lm-evaluation-harness `--log_samples` output read as an ImportedRun.

lm-eval writes, under `--output_path`, a folder per model holding `results_<time>.json`
and one `samples_<task>_<time>.jsonl` per task: a line per document and filter with
`doc_id`, `doc`, `arguments`, `resps`, `filtered_resps`, `filter`, `metrics` (the names)
and each metric's value under its own name, with hashes of the document and prompt. A
run given as a folder is searched for those files; a folder that holds a task twice (two
runs into one `--output_path`) is read at the newest and the report says so.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from specdiff.imports.reading import json_lines, read_json, text_of
from specdiff.imports.records import ImportedItem, ImportedRun, ImportInputError

SAMPLES_NAME = re.compile(r"^samples_(?P<task>.+)_(?P<time>\d{4}-\d{2}-\d{2}T[0-9.\-]+)\.jsonl$")
"""lm-eval's name for a task's samples file: the task, then the run's start time."""
NO_FILTER = "none"
"""The `filter` lm-eval writes where a task filters nothing."""


def read_lm_eval(path: Path) -> ImportedRun:
    """The run at `path`: an `--output_path` folder (or any folder above its samples
    files), or one samples file."""
    files, notes = samples_files(path)
    items: list[ImportedItem] = []
    for task, file in sorted(files.items()):
        items.extend(_task_items(task, file))
    return ImportedRun(
        tool="lm-eval",
        source=str(path),
        items=tuple(items),
        higher_is_better=_higher_is_better(files.values()),
        notes=tuple(notes),
    )


def samples_files(path: Path) -> tuple[dict[str, Path], list[str]]:
    """Task name to its samples file under `path`, the newest where a task has two;
    and a note for each task read at its newest."""
    if not path.exists():
        raise ImportInputError(f"{path} does not exist: give lm-eval's --output_path folder")
    found = [path] if path.is_file() else sorted(p for p in path.rglob("samples_*.jsonl"))
    by_task: dict[str, list[tuple[str, Path]]] = {}
    for file in found:
        match = SAMPLES_NAME.match(file.name)
        if match is None:
            raise ImportInputError(
                f"{file} is not named as lm-eval names a samples file "
                "(samples_<task>_<time>.jsonl): give lm-eval's --output_path folder"
            )
        by_task.setdefault(match["task"], []).append((match["time"], file))
    if not by_task:
        raise ImportInputError(
            f"{path} holds no samples_<task>_<time>.jsonl: run lm-eval with --log_samples "
            "and give its --output_path folder"
        )
    notes = [
        f"task {task}: {len(runs)} samples files, the newest read ({max(runs)[1].name})"
        for task, runs in sorted(by_task.items())
        if len(runs) > 1
    ]
    return {task: max(runs)[1] for task, runs in by_task.items()}, notes


def _task_items(task: str, file: Path) -> list[ImportedItem]:
    """One item per document: lm-eval writes a line per document and filter, and each
    filter's metrics are kept as `metric,filter` (its results file's naming) unless the
    task has the one filter `none`."""
    lines = list(json_lines(file, "lm-eval samples file"))
    filters = {str(line.get("filter", NO_FILTER)) for line in lines}
    by_doc: dict[str, ImportedItem] = {}
    for number, line in enumerate(lines, 1):
        try:
            item = _item(task, line, filters != {NO_FILTER})
        except (KeyError, TypeError, ValueError) as error:
            raise ImportInputError(
                f"{file} line {number} is not an lm-eval sample ({error}): "
                "give the samples files lm-eval --log_samples wrote"
            ) from None
        known = by_doc.get(item.item_id)
        if known is not None:
            item = ImportedItem(
                task, item.item_id, known.prompt, known.output,
                {**known.grades, **item.grades}, known.prompt_hash,
            )  # fmt: skip
        by_doc[item.item_id] = item
    return list(by_doc.values())


def _item(task: str, line: Mapping[str, Any], name_filters: bool) -> ImportedItem:
    doc_id = line["doc_id"]
    if isinstance(doc_id, bool) or not isinstance(doc_id, (int, str)):
        raise TypeError(f"doc_id {doc_id!r}")
    suffix = f",{line.get('filter', NO_FILTER)}" if name_filters else ""
    grades = {f"{name}{suffix}": _number(name, line[name]) for name in line["metrics"]}
    prompt_hash = line.get("prompt_hash")
    return ImportedItem(
        group=task,
        item_id=str(doc_id),
        prompt=_prompt(line["arguments"]),
        output=_output(line["resps"]),
        grades=grades,
        prompt_hash=prompt_hash if isinstance(prompt_hash, str) else None,
    )


def _prompt(arguments: object) -> str:
    """The first request's context: 0.4.x writes {"gen_args_0": {"arg_0": text, ...}},
    earlier versions [[text, kwargs], ...]."""
    if isinstance(arguments, Mapping):
        first = next(iter(arguments.values()))
        return text_of(first["arg_0"] if isinstance(first, Mapping) else first)
    if isinstance(arguments, list) and arguments:
        first = arguments[0]
        return text_of(first[0] if isinstance(first, list) and first else first)
    raise ValueError(f"arguments {str(arguments)[:40]!r}")


def _output(resps: object) -> str:
    """The answer of a generation task ([[text]]) as its text, any other (log-likelihoods)
    as JSON."""
    if (
        isinstance(resps, list)
        and len(resps) == 1
        and isinstance(resps[0], list)
        and len(resps[0]) == 1
        and isinstance(resps[0][0], str)
    ):
        return resps[0][0]
    if not isinstance(resps, list):
        raise ValueError(f"resps {str(resps)[:40]!r}")
    return json.dumps(resps, sort_keys=True)


def _number(name: str, value: object) -> float:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    raise ValueError(f"metric {name} is {str(value)[:40]!r}, not a number")


def _higher_is_better(files: Iterable[Path]) -> dict[str, bool]:
    """Each metric's direction from the results files beside the samples, where there
    are any; a results file that cannot be read adds nothing."""
    found: dict[str, bool] = {}
    for folder in {file.parent for file in files}:
        for results in sorted(folder.glob("results_*.json")):
            data = read_json(results, "lm-eval results file", strict=False)
            table = data.get("higher_is_better") if isinstance(data, dict) else None
            for metrics in (table or {}).values():
                if isinstance(metrics, dict):
                    found.update({k: v for k, v in metrics.items() if isinstance(v, bool)})
    return found
