"""promptfoo's `eval -o out.json` read as an ImportedRun (the output of promptfoo 0.121:
`results.version` 3, `results.results[]` one row per test, prompt and provider).

Each row becomes an item of the group named by its provider, keyed by its test and
prompt index. Its grades are `pass` (the row's `success`) and each of the grading
result's `namedScores`. A row that failed to run (an error, no response) has an
empty output and does not pass.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from specdiff.imports.reading import read_json, text_of
from specdiff.imports.records import ImportedItem, ImportedRun, ImportInputError

WHAT = "JSON file promptfoo eval -o wrote"
PASS = "pass"


def read_promptfoo(path: Path) -> ImportedRun:
    data = read_json(path, WHAT)
    results = data.get("results") if isinstance(data, dict) else None
    rows = results.get("results") if isinstance(results, dict) else None
    if not isinstance(rows, list):
        raise ImportInputError(
            f"{path} has no results.results list, so it is not promptfoo eval output: "
            f"give the {WHAT} (promptfoo 0.121)"
        )
    items = []
    for number, row in enumerate(rows):
        try:
            items.append(_item(row))
        except (KeyError, TypeError, ValueError) as error:
            raise ImportInputError(
                f"{path} results.results[{number}] is not a promptfoo result ({error}): "
                f"give the {WHAT}"
            ) from None
    return ImportedRun(tool="promptfoo", source=str(path), items=tuple(items), higher_is_better={})


def _item(row: Mapping[str, Any]) -> ImportedItem:
    test, prompt_index = row["testIdx"], row["promptIdx"]
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in (test, prompt_index)):
        raise TypeError(f"testIdx {test!r}, promptIdx {prompt_index!r}")
    response = row.get("response") or {}
    output = response.get("output") if isinstance(response, Mapping) else None
    grades = {PASS: float(row["success"] is True)}
    grading = row.get("gradingResult")
    if isinstance(grading, Mapping):
        for name, value in (grading.get("namedScores") or {}).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                grades[str(name)] = float(value)
    prompt = row.get("prompt")
    return ImportedItem(
        group=provider_name(row.get("provider")),
        item_id=f"test {test}, prompt {prompt_index}",
        prompt=text_of(prompt.get("raw", "") if isinstance(prompt, Mapping) else prompt),
        output="" if output is None else text_of(output),
        grades=grades,
    )


def provider_name(provider: object) -> str:
    """A row's provider as promptfoo shows it: its label, else its id."""
    if isinstance(provider, Mapping):
        return str(provider.get("label") or provider.get("id") or "provider")
    if isinstance(provider, str):
        return provider
    return "provider"


def pair_providers(a: ImportedRun, b: ImportedRun) -> ImportedRun:
    """Run b with its provider named as run a's where each run has one provider and
    their names differ: two servers compared are often two providers (another model
    name, another label) that stand for the same place in the evaluation."""
    providers_a = {item.group for item in a.items}
    providers_b = {item.group for item in b.items}
    if len(providers_a) != 1 or len(providers_b) != 1 or providers_a == providers_b:
        return b
    (name_a,), (name_b,) = providers_a, providers_b
    items = tuple(replace(item, group=name_a) for item in b.items)
    note = f"provider {name_b} of {b.source} paired with provider {name_a} of {a.source}"
    return replace(b, items=items, notes=(*b.notes, note))
