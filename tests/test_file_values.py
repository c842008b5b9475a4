"""Every number read back from a file is checked finite and in range where it is read:
a session's step logits and fork margins, a saved autopsy's every number, a prompt
file's budget. Python's json reads NaN, Infinity, -Infinity and 1e999 (as infinity);
each is one line naming the file, the field and what to write instead."""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from specdiff.autopsy import AutopsyError, load_saved
from specdiff.cli import main
from specdiff.file_values import (
    MAX_TOKENS,
    BadValue,
    Fields,
    finite_number,
    flag,
    json_list,
    text,
    whole_number,
)
from specdiff.reports.autopsy import format_autopsy, growth_svg
from specdiff.sessions.store import SessionError, load_session
from specdiff.suite import SuiteError
from specdiff.suite.prompts import load_suite_prompts

DATA = Path(__file__).resolve().parent / "data"
SESSION = DATA / "ubatch-roman-empire.jsonl"
AUTOPSY = DATA / "ubatch-roman-empire.autopsy.json"
HOLE = "@@value@@"
"""Where a literal goes in a record before it is written: json.dumps cannot write 1e999."""
NON_FINITE = {
    "NaN": "got NaN",
    "Infinity": "got Infinity",
    "-Infinity": "got -Infinity",
    "1e999": "got Infinity (or a number beyond 1.8e308)",
    "-1e999": "got -Infinity (or a number beyond -1.8e308)",
}
"""Each literal a file may hold, and how the error line quotes it."""
FIX = "write a finite number there"


def with_literal(record: Any, literal: str) -> str:
    """The record as JSON text, the HOLE in it replaced by the literal as written."""
    return json.dumps(record, ensure_ascii=False).replace(json.dumps(HOLE), literal)


def one_line(message: str, *parts: str) -> None:
    assert "\n" not in message, message
    for part in parts:
        assert part in message, (part, message)


# --- the reader itself ------------------------------------------------------------------


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 10**400, -(10**400)])
def test_a_number_that_is_not_finite_is_refused_with_the_fix(value: object) -> None:
    with pytest.raises(BadValue) as caught:
        finite_number(value, "speed")
    one_line(str(caught.value), "speed must be a finite number, got ", FIX)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (True, "p must be a number, got True"),
        ("0.5", "p must be a number, got '0.5'"),
        (None, "p must be a number, got None"),
        (1.5, "p must be a number from 0 to 1, got 1.5"),
        (-0.25, "p must be a number from 0 to 1, got -0.25"),
    ],
)
def test_a_number_of_the_wrong_type_or_range_is_refused(value: object, message: str) -> None:
    with pytest.raises(BadValue, match=f"^{message}$".replace("(", r"\(").replace(")", r"\)")):
        finite_number(value, "p", 0, 1)


def test_finite_numbers_pass_as_floats() -> None:
    assert finite_number(3, "n") == 3.0 and type(finite_number(3, "n")) is float
    assert finite_number(-1e300, "n") == -1e300
    assert finite_number(0.5, "p", 0, 1) == 0.5


@pytest.mark.parametrize("value", [math.inf, math.nan, 2.0, True, MAX_TOKENS + 1, -1, 10**400])
def test_a_whole_number_must_be_an_int_in_range(value: object) -> None:
    with pytest.raises(BadValue, match="^n must be a whole number from 0 to "):
        whole_number(value, "n", 0, MAX_TOKENS)


def test_text_flags_and_lists_name_their_field() -> None:
    with pytest.raises(BadValue, match="^name must be text, got 3$"):
        text(3, "name")
    with pytest.raises(BadValue, match="^name must be at most 4 characters, got 5$"):
        text("abcde", "name", 4)
    with pytest.raises(BadValue, match="^on must be true or false, got 1$"):
        flag(1, "on")
    with pytest.raises(BadValue, match="^xs must be a list of at most 2 entries, got 3$"):
        json_list([1, 2, 3], "xs", 2)


def test_a_huge_value_is_quoted_short() -> None:
    with pytest.raises(BadValue) as caught:
        finite_number("x" * 100_000, "name")
    assert len(str(caught.value)) < 120


def test_fields_name_each_field_by_its_path_from_the_top() -> None:
    record = Fields({"a": {"b": [{"c": math.inf}]}, "n": None}, "f.json")
    inner = record.optional_record("a")
    assert inner is not None and record.optional_record("n") is None
    (item,) = inner.records("b", 8)
    with pytest.raises(BadValue, match=r"^f\.json: field 'a\.b\[0\]\.c' must be a finite"):
        item.number("c")
    with pytest.raises(BadValue, match=r"^f\.json: missing field 'a\.b\[0\]\.d'$"):
        item.number("d")
    with pytest.raises(BadValue, match=r"^f\.json: field 'a\.b\[0\]' must be an object"):
        Fields({"b": [3]}, "f.json", "a").records("b", 8)
    assert Fields({"x": None}, "f.json").unbounded("x") == math.inf


# --- session files ----------------------------------------------------------------------


def session_with(
    tmp_path: Path, edit: Callable[[list[dict[str, Any]]], None], literal: str
) -> Path:
    lines = [json.loads(line) for line in SESSION.read_text(encoding="utf-8").splitlines()]
    edit(lines)
    path = tmp_path / "edited.jsonl"
    path.write_text("".join(with_literal(line, literal) + "\n" for line in lines), "utf-8")
    return path


def first_logit(lines: list[dict[str, Any]]) -> None:
    next(line for line in lines if line["type"] == "step")["top"][0][1] = HOLE


def first_probe_logit(lines: list[dict[str, Any]]) -> None:
    step = next(line for line in lines if line["type"] == "step")
    step["probes"] = [[1, HOLE, 2]]


def fork_margin(lines: list[dict[str, Any]]) -> None:
    lines[-1]["fork_margins"][0] = HOLE


@pytest.mark.parametrize("literal", list(NON_FINITE))
@pytest.mark.parametrize(
    ("edit", "line", "field"),
    [
        (first_logit, 2, "a logit"),
        (first_probe_logit, 2, "a probe logit"),
        (fork_margin, -1, "a fork margin"),
    ],
    ids=["step logit", "probe logit", "footer fork margin"],
)
def test_a_session_number_that_is_not_finite_is_one_line(
    tmp_path: Path,
    edit: Callable[[list[dict[str, Any]]], None],
    line: int,
    field: str,
    literal: str,
) -> None:
    path = session_with(tmp_path, edit, literal)
    number = line if line > 0 else len(path.read_text("utf-8").splitlines())
    with pytest.raises(SessionError) as caught:
        load_session(path)
    one_line(str(caught.value), f"{path}:{number}: ", f"{field} must be a finite number")
    one_line(str(caught.value), NON_FINITE[literal], FIX)


@pytest.mark.parametrize("fmt", ["md", "html", "json"])
def test_export_of_a_session_with_an_infinite_logit_exits_2_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fmt: str
) -> None:
    path = session_with(tmp_path, first_logit, "1e999")
    output = tmp_path / f"out.{fmt}"
    code = main(["export", str(path), "--format", fmt, "-o", str(output)])
    err = capsys.readouterr().err
    assert code == 2 and not output.exists()
    assert err.startswith("specdiff: error: ") and err.count("\n") == 1, err
    one_line(err.strip(), "a logit must be a finite number", FIX)


# --- saved autopsies --------------------------------------------------------------------


def autopsy_with(tmp_path: Path, path: tuple[str | int, ...], literal: str) -> Path:
    record = json.loads(AUTOPSY.read_text(encoding="utf-8"))
    inner = record
    for key in path[:-1]:
        inner = inner[key]
    inner[path[-1]] = HOLE
    saved = tmp_path / AUTOPSY.name
    saved.write_text(with_literal(record, literal), encoding="utf-8")
    return saved


AUTOPSY_NUMBERS = [
    ("margin", "margin"),
    ("margin", "shift"),
    ("margin", "logits_max_abs"),
    ("margin", "probability_a", 1),
    ("layers", 3, "max_abs"),
    ("layers", 3, "rel_l2"),
    ("settings", 0, "speed_a"),
    ("tensors", 0, "max_abs"),
    ("tensors", 0, "rel_l2"),
    ("seconds",),
]


def field_path(path: tuple[str | int, ...]) -> str:
    return "".join(f"[{key}]" if isinstance(key, int) else f".{key}" for key in path)[1:]


@pytest.mark.parametrize("literal", list(NON_FINITE))
@pytest.mark.parametrize("path", AUTOPSY_NUMBERS, ids=field_path)
def test_an_autopsy_number_that_is_not_finite_is_one_line(
    tmp_path: Path, path: tuple[str | int, ...], literal: str
) -> None:
    saved = autopsy_with(tmp_path, path, literal)
    with pytest.raises(AutopsyError) as caught:
        load_saved(saved)
    one_line(
        str(caught.value),
        f"{saved.name}: field '{field_path(path)}' must be a finite number",
        NON_FINITE[literal],
        FIX,
    )


@pytest.mark.parametrize(
    ("path", "literal", "wanted"),
    [
        (("margin", "probability_b", 0), "1.5", "must be a number from 0 to 1, got 1.5"),
        (("settings", 1, "speed_b"), "-2", "must be a number from 0 to inf, got -2"),
        (("settings", 1, "tokens_a"), str(10**30), "must be a whole number from 0 to"),
        (("layers", 0, "max_abs"), "-1e-3", "must be a number from 0 to inf"),
        (("margin", "margin"), "1" + "0" * 400, "must be a finite number, got Infinity (or"),
        (("margin", "margin"), "null", "must be a number, got None"),
        (("fork",), "1e999", "must be a whole number from 0 to 16777216, got Infinity"),
    ],
    ids=["probability", "speed", "tokens", "max_abs", "huge int", "null", "fork"],
)
def test_an_autopsy_number_out_of_range_is_one_line(
    tmp_path: Path, path: tuple[str | int, ...], literal: str, wanted: str
) -> None:
    saved = autopsy_with(tmp_path, path, literal)
    with pytest.raises(AutopsyError) as caught:
        load_saved(saved)
    one_line(str(caught.value), f"{saved.name}: field '{field_path(path)}' {wanted}")


def test_a_null_difference_still_reads_as_one_beyond_any_scale(tmp_path: Path) -> None:
    # finite_or_null writes an infinite relative L2 as null: that, not Infinity, reads back
    autopsy = load_saved(autopsy_with(tmp_path, ("layers", 3, "rel_l2"), "null"))
    assert autopsy.layers[3].rel_l2 == math.inf


def test_the_growth_chart_leaves_out_a_margin_it_cannot_place() -> None:
    # an autopsy made in memory never reaches a file's checks: the chart itself holds
    autopsy = load_saved(AUTOPSY)
    assert autopsy.margin is not None
    for margin in (math.inf, math.nan, 0.0, -1.0):
        odd = replace(autopsy, margin=replace(autopsy.margin, margin=margin))
        svg = growth_svg(odd)
        assert svg.startswith("<svg") and "margin at the fork" not in svg
        assert format_autopsy(odd)
    assert "margin at the fork" in growth_svg(autopsy)


@pytest.mark.parametrize("fmt", ["md", "html", "json"])
@pytest.mark.parametrize("literal", ["Infinity", "NaN", "1e999"])
def test_export_beside_a_non_finite_autopsy_exits_2_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fmt: str, literal: str
) -> None:
    session = tmp_path / SESSION.name
    shutil.copy(SESSION, session)
    autopsy_with(tmp_path, ("layers", 5, "max_abs"), literal)
    before = {path: path.read_bytes() for path in tmp_path.iterdir()}
    code = main(["export", str(session), "--format", fmt, "-o", str(tmp_path / f"out.{fmt}")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("specdiff: error: ") and err.count("\n") == 1, err
    one_line(err.strip(), f"{AUTOPSY.name}: field 'layers[5].max_abs' must be a finite number", FIX)
    assert {path: path.read_bytes() for path in tmp_path.iterdir()} == before


# --- prompt files -----------------------------------------------------------------------


@pytest.mark.parametrize("literal", [*NON_FINITE, "0", "-3", "2.5", str(MAX_TOKENS + 1), "true"])
def test_a_prompt_files_budget_must_be_a_whole_number_in_range(
    tmp_path: Path, literal: str
) -> None:
    path = tmp_path / "p.jsonl"
    good = json.dumps({"id": "fine", "prompt": "y", "max_tokens": 8})
    bad = with_literal({"id": "a", "prompt": "x", "max_tokens": HOLE}, literal)
    path.write_text(f"{good}\n{bad}\n", encoding="utf-8")
    with pytest.raises(SuiteError) as caught:
        load_suite_prompts(str(path))
    one_line(
        str(caught.value),
        f'{path}:2: "max_tokens" must be a whole number from 1 to {MAX_TOKENS}',
        "--skip-bad",
    )
    if literal in NON_FINITE:
        assert NON_FINITE[literal] in str(caught.value)
    prompts, problems = load_suite_prompts(str(path), skip_bad=True)
    assert [(p.id, p.max_tokens) for p in prompts] == [("fine", 8)] and len(problems) == 1


def test_a_prompt_files_largest_budget_is_taken(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"id": "a", "prompt": "x", "max_tokens": MAX_TOKENS}) + "\n")
    prompts, _ = load_suite_prompts(str(path))
    assert prompts[0].max_tokens == MAX_TOKENS
