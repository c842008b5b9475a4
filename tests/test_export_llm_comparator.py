"""`specdiff export --format llm-comparator`: a suite folder as LLM Comparator's JSON,
checked against the example file PAIR-code/llm-comparator ships
(tests/data/llm_comparator_example_tiny.json, docs/data/example_tiny.json at commit
60edc1eaf96e09f4b9791dbc9bb0fb7bcc82c69c, Apache-2.0) and against the session file read
with plain json. The llm-comparator package on PyPI (0.1) only writes this format, from
an LLM judge (it needs vertexai), so its example is the reader used here."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from specdiff.cli import main

DATA = Path(__file__).parent / "data"
EXAMPLE = json.loads((DATA / "llm_comparator_example_tiny.json").read_text())
SESSION = DATA / "ubatch-roman-empire.jsonl"
FIELD_TYPES = {
    "number", "string", "category", "text", "url", "image_path", "image_byte",
    "per_model_boolean", "per_model_number", "per_model_category", "per_model_text",
}  # fmt: skip
"""LLM Comparator's FieldType values a custom field may take (client/lib/types.ts)."""


def suite_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "suite"
    (folder / "sessions" / "ubatch").mkdir(parents=True)
    shutil.copy(SESSION, folder / "sessions" / "ubatch" / "roman.jsonl")
    return folder


def exported(capsys, *arguments: str) -> dict[str, Any]:
    assert main(["export", "--format", "llm-comparator", *arguments]) == 0
    return json.loads(capsys.readouterr().out)


def session_lines() -> list[dict[str, Any]]:
    return [json.loads(line) for line in SESSION.read_text().splitlines()]


def test_the_file_has_the_keys_llm_comparator_reads(capsys, tmp_path) -> None:
    data = exported(capsys, str(suite_folder(tmp_path)), "-o", "-")
    assert set(data) == set(EXAMPLE)
    assert set(data["metadata"]) == set(EXAMPLE["metadata"])
    assert [set(model) for model in data["models"]] == [set(m) for m in EXAMPLE["models"]]
    schema = {field["name"]: field["type"] for field in data["metadata"]["custom_fields_schema"]}
    assert set(schema.values()) <= FIELD_TYPES
    (example,) = data["examples"]
    for wanted in EXAMPLE["examples"]:
        assert set(example) >= set(wanted)
    assert set(example["custom_fields"]) == set(schema)
    for name, kind in schema.items():
        value = example["custom_fields"][name]
        if kind.startswith("per_model_"):
            assert isinstance(value, list) and len(value) == 2, name
        assert isinstance(example["score"], float)


def test_texts_fork_token_and_margins_match_the_session(capsys, tmp_path) -> None:
    (example,) = exported(capsys, str(suite_folder(tmp_path)), "-o", "-")["examples"]
    lines = session_lines()
    header, footer = lines[0], lines[-1]
    steps = {lane: [s for s in lines if s.get("lane") == lane] for lane in "ab"}
    assert example["input_text"] == header["prompt"]
    assert example["output_text_a"] == "".join(s["piece"] for s in steps["a"])
    assert example["output_text_b"] == "".join(s["piece"] for s in steps["b"])
    fork = next(
        i for i, (x, y) in enumerate(zip(steps["a"], steps["b"])) if x["token_id"] != y["token_id"]
    )
    fields = example["custom_fields"]
    assert fields["fork_index"] == fork == footer["fork_index"]
    assert fields["fork_token"] == [steps[lane][fork]["piece"] for lane in "ab"]
    margins = [steps[lane][fork]["top"][0][1] - steps[lane][fork]["top"][1][1] for lane in "ab"]
    assert fields["fork_margin"] == margins
    assert example["tags"] == [header["pair"]] and fields["prompt_id"] == "roman"


def test_output_file_is_written(capsys, tmp_path) -> None:
    target = tmp_path / "out.json"
    assert main(["export", "--format", "llm-comparator", str(suite_folder(tmp_path)),
                 "-o", str(target)]) == 0  # fmt: skip
    assert json.loads(target.read_text())["models"][0]["name"].startswith("a: ")


def test_a_folder_that_is_not_a_suite_is_refused(capsys, tmp_path) -> None:
    assert main(["export", "--format", "llm-comparator", str(tmp_path), "-o", "-"]) == 2
    err = capsys.readouterr().err
    assert "is not a suite folder" in err and err.count("\n") == 1
