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


@pytest.mark.fuzz
@settings(
    max_examples=1000,
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


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**20), max_value=10**20)
    | st.floats()  # NaN and infinities included: written as bare NaN/Infinity literals
    | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
NESTED_TABLES = {"header": ("lanes", "executed", "build"), "footer": ()}


def field_paths(record: dict) -> list[tuple[str, ...]]:
    """Every key of a header or footer, and every key one and two levels into its tables
    (lanes.a.n_batch, executed.b.model_sha256, build.system_info)."""
    paths = [(key,) for key in record]
    for key, value in record.items():
        if isinstance(value, dict):
            for inner, item in value.items():
                paths.append((key, inner))
                if isinstance(item, dict):
                    paths.extend((key, inner, leaf) for leaf in item)
    return paths


def every_reader(path: Path) -> None:
    """What each command does with a file that loads: export it in every format, compare
    it as verify does, list it."""
    from specdiff.reports.export import export_session
    from specdiff.sessions.catalog import read_info
    from specdiff.sessions.verify import environment_changes, first_drift, likely_cause

    session = load_session(path)
    session.summary()
    for fmt in ("md", "html", "json"):
        json.loads(export_session(session, "json")) if fmt == "json" else export_session(
            session, fmt
        )
    first_drift(session, {"a": [0], "b": []})
    environment_changes(session.header, {"cpu": "x"}, {"a": {}, "b": {}})
    likely_cause(session.header.build, {"cpu": "x", "system_info": "AVX2 = 1"})
    assert read_info(path).problem is None


@pytest.mark.fuzz
@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(st.data())
def test_any_value_in_any_header_or_footer_field_is_read_or_refused(tmp_path: Path, data) -> None:
    """A header or footer field (or one inside the lanes, executed and build tables)
    replaced by any JSON value, or removed: the file loads and every reader can show it,
    or loading refuses it with one line naming the file and line."""
    records = [json.loads(line) for line in LINES]
    row = data.draw(st.sampled_from([0, len(records) - 1]))
    record = records[row]
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(field_paths(record)))
        target = record
        for key in path[:-1]:
            target = target[key]
        if data.draw(st.booleans()):
            target[path[-1]] = data.draw(JSON_VALUES)
        else:
            target.pop(path[-1], None)
    file = write(tmp_path, [json.dumps(r).encode() + b"\n" for r in records])
    try:
        every_reader(file)
    except SessionError as error:
        message = str(error)
        assert "\n" not in message and f"{file}:{row + 1}:" in message


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
# up to the footer's closing brace: the footer without its newline is a whole record
@given(st.integers(len(LINES[0]) + 1, sum(map(len, LINES)) - 2))
def test_a_file_cut_anywhere_after_its_header_loads_every_whole_line(
    tmp_path: Path, end: int
) -> None:
    data = b"".join(LINES)
    path = write(tmp_path, [data[:end]])
    session = load_session(path)
    whole_lines = data[:end].count(b"\n")
    if data[:end].endswith(b"}"):
        # cut just before a newline: the last line is a whole record, only unterminated
        # (in these lines a record is the only thing that ends with a brace)
        whole_lines += 1
        assert session.cut_line is None
    assert len(session.order) == min(whole_lines - 1, len(LINES) - 2)
    if data[end - 1 : end] not in (b"\n", b"}"):
        assert session.cut_line == whole_lines + 1 and session.partial
        assert (
            session.cut_note is not None
            and f"line {whole_lines + 1} is incomplete" in session.cut_note
        )
    else:
        assert session.cut_line is None
