"""Hostile session files: each a one-line SessionError naming file and line, never another
exception type."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdiff.sessions.store import MAX_LINE_BYTES, SessionError, load_session

FIXTURE = Path(__file__).parent / "data" / "ubatch-roman-empire.jsonl"
LINES = FIXTURE.read_bytes().splitlines(keepends=True)


def write(tmp_path: Path, lines: list[bytes]) -> Path:
    path = tmp_path / "hostile.jsonl"
    path.write_bytes(b"".join(lines))
    return path


def step(index: int = 0) -> dict:
    return json.loads(LINES[1 + index])


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda lines: [lines[0], lines[1][:30] + b"\n"], ":2: "),
        (lambda lines: [lines[0], b"{not json\n"], ":2: "),
        (lambda lines: [lines[0].replace(b'"schema":1', b'"schema":99')], "schema version 99"),
        (lambda lines: [lines[1]], "the first line must be the header"),
        (
            lambda lines: [lines[0], json.dumps({**step(), "index": -3}).encode() + b"\n"],
            "index must be a whole number",
        ),
        (
            lambda lines: [lines[0], json.dumps({**step(), "index": 10**12}).encode() + b"\n"],
            "index must be a whole number",
        ),
        (
            lambda lines: [lines[0], json.dumps({**step(), "token_id": "7"}).encode() + b"\n"],
            "token_id must be a whole number",
        ),
        (
            lambda lines: [
                lines[0],
                json.dumps({k: v for k, v in step().items() if k != "top"}).encode() + b"\n",
            ],
            "missing field 'top'",
        ),
        (
            lambda lines: [lines[0], json.dumps({**step(), "drafted": "no"}).encode() + b"\n"],
            "drafted must be true or false",
        ),
        (lambda lines: [lines[0], b"\xff\xfe garbage\n"], "not UTF-8"),
        (lambda lines: [lines[0], b"[1, 2]\n"], "must hold a JSON object"),
        (lambda lines: [lines[0], lines[3]], "out of order"),  # lane a step 1 first
    ],
)
def test_hostile_lines(tmp_path: Path, mutate, message: str) -> None:
    path = write(tmp_path, mutate(LINES))
    with pytest.raises(SessionError, match=message) as caught:
        load_session(path)
    assert str(path) in str(caught.value) and "\n" not in str(caught.value)


def test_a_huge_line_is_refused_without_reading_it_whole(tmp_path: Path) -> None:
    path = write(tmp_path, [LINES[0], b'{"type": "step", "x": "' + b"a" * (MAX_LINE_BYTES + 10)])
    with pytest.raises(SessionError, match=":2: line longer than"):
        load_session(path)


def test_every_schema_version_written_still_loads() -> None:
    """One fixture per schema version ever written (schema 1 so far)."""
    fixtures = sorted((Path(__file__).parent / "data").glob("*.jsonl"))
    assert fixtures
    for path in fixtures:
        assert load_session(path).steps["a"]


@settings(
    max_examples=2000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(st.data())
def test_random_mutations_never_escape_as_other_errors(tmp_path: Path, data) -> None:
    lines = list(LINES[:12])
    for _ in range(data.draw(st.integers(1, 3))):
        row = data.draw(st.integers(0, len(lines) - 1))
        raw = bytearray(lines[row])
        action = data.draw(st.sampled_from(["flip", "cut", "insert", "drop", "swap"]))
        if action == "flip" and raw:
            position = data.draw(st.integers(0, len(raw) - 1))
            raw[position] = data.draw(st.integers(0, 255))
        elif action == "cut":
            raw = raw[: data.draw(st.integers(0, len(raw)))]
        elif action == "insert":
            position = data.draw(st.integers(0, len(raw)))
            raw[position:position] = data.draw(st.binary(max_size=8))
        elif action == "drop":
            raw = bytearray()
        else:
            other = data.draw(st.integers(0, len(lines) - 1))
            lines[row], lines[other] = lines[other], lines[row]
            continue
        lines[row] = bytes(raw)
    path = write(tmp_path, lines)
    try:
        load_session(path)
    except SessionError as error:
        assert "\n" not in str(error)
