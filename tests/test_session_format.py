"""The typed session records: round trips, files written by earlier releases, and
every field of the wrong type refused with one line naming it."""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specdiff.compare import teacher_flips
from specdiff.lanes import presets
from specdiff.sessions.header import SessionHeader
from specdiff.sessions.records import RunSummary
from specdiff.sessions.store import SessionError, load_session
from specdiff.steps import Candidate, TokenStep

DATA = Path(__file__).parent / "data"
EARLY_FILE = DATA / "ubatch-roman-empire.jsonl"
"""Written by the first schema-1 release: its footer has no draft counts or timings."""


@functools.cache
def _lines(path: Path) -> tuple[str, ...]:
    return tuple(path.read_text(encoding="utf-8").splitlines())


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in _lines(path)]


def test_a_file_of_the_first_schema_1_release_loads_typed() -> None:
    session = load_session(EARLY_FILE)
    assert session.header.pair.name == "ubatch"
    assert session.header.max_tokens == 60
    assert session.header.prompt_token_ids[0] == 2
    assert session.footer is not None
    assert session.footer.fork_index == 11
    assert session.footer.drafted == (0, 0) and session.footer.seconds is None
    assert session.footer.fork_index == session.comparison().fork.index


def test_header_and_footer_serialise_back_to_what_was_read() -> None:
    header, *_, footer = _records(EARLY_FILE)
    rewritten = SessionHeader.from_json(header).to_json()
    # keys added since then are written with their defaults; nothing read is changed
    for key, value in header.items():
        if key == "lanes":
            for lane_id in ("a", "b"):
                lane = rewritten["lanes"][lane_id]
                expected = dict(value[lane_id])
                if isinstance(expected.get("repack"), bool):  # a bool before repack=auto
                    # true was llama.cpp's default, which auto now names
                    expected["repack"] = "auto" if expected["repack"] else "off"
                assert {k: lane[k] for k in value[lane_id]} == expected
        else:
            assert rewritten[key] == value
    assert rewritten["stop"] == []
    written = RunSummary.from_json(footer).to_json()
    assert {key: written[key] for key in footer} == footer
    assert written["drafted"] == [0, 0] and written["accepted"] == [0, 0]


def test_a_suite_footer_with_only_the_summed_time_keeps_the_sum() -> None:
    *_, footer = _records(EARLY_FILE)
    footer["generation_seconds"] = 3.5
    assert RunSummary.from_json(footer).generation_seconds == 3.5


WRONG_VALUES = [None, True, 7, -1, 2.5, math.nan, math.inf, "text", [], [1, 2, 3], {}, {"x": 1}]
HEADER_FIELDS = [
    "pair",
    "description",
    "prompt",
    "prompt_token_ids",
    "max_tokens",
    "stop",
    "lanes",
    "executed",
    "build",
    "created",
    "teacher_forced",
    "schema",
    "type",
]
FOOTER_FIELDS = [
    "identical",
    "fork_index",
    "fork_margins",
    "generated",
    "tokens_per_second",
    "output_sha256",
    "stop_reasons",
    "errors",
    "cancelled",
    "drafted",
    "accepted",
    "seconds",
]


def _accepts(record: dict, key: str, value: object) -> bool:
    """Values of the right type that the generic list happens to contain."""
    optional = {"fork_index", "fork_margins", "seconds", "description", "teacher_forced"}
    if value is None and key in optional - {"teacher_forced", "description"}:
        return True
    if key == "teacher_forced" and value is True:
        return True
    if key in ("identical", "cancelled") and value is True:
        return True
    if key in ("fork_index", "max_tokens") and value == 7:
        return True
    if key in ("description", "created", "pair", "prompt") and value == "text":
        return True
    if key in ("stop", "prompt_token_ids") and value in ([], [1, 2, 3]):
        return True
    return key == "build" and isinstance(value, dict)


FIELDS = [(0, key) for key in HEADER_FIELDS] + [(1, key) for key in FOOTER_FIELDS]
"""(line, key): line 0 is the header, line 1 the footer of a two-line session."""


@pytest.mark.parametrize(("line", "key"), FIELDS, ids=lambda item: str(item))
@pytest.mark.parametrize("value", WRONG_VALUES, ids=repr)
def test_a_field_of_the_wrong_type_is_one_line(
    line: int, key: str, value: object, tmp_path: Path
) -> None:
    header, *_, footer = _records(EARLY_FILE)
    records = [header, footer]
    if _accepts(records[line], key, value):
        return
    records[line][key] = value
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    with pytest.raises(SessionError) as raised:
        load_session(path)
    message = str(raised.value)
    assert message.startswith(f"{path}:{line + 1}: ") and "\n" not in message


def _step(lane: str, index: int, token: int, best: int) -> TokenStep:
    top = (Candidate(best, 2.0), Candidate(token if token != best else best + 1, 1.0))
    return TokenStep(lane, index, token, b"x", top, False, 1, 0.0)


def test_a_teacher_forced_summary_forks_at_the_first_flip() -> None:
    a = [_step("a", i, 10 + i, 10 + i) for i in range(5)]
    # B is fed A's tokens; at step 3 its own argmax was another token
    b = [_step("b", i, 10 + i, 99 if i == 3 else 10 + i) for i in range(5)]
    assert teacher_flips(a, b) == [3]
    forced = RunSummary.of_steps(a, b, teacher_forced=True)
    assert forced.fork_index == 3 and not forced.identical
    assert RunSummary.of_steps(a, b).identical


def test_a_run_stopped_before_its_first_token_is_not_identical() -> None:
    """Two empty texts compare equal, but a run stopped before either lane produced a
    token compared nothing: its footer says it stopped, not that the lanes agreed."""
    stopped = RunSummary.of_steps([], [], cancelled=True)
    assert stopped.stopped_before_first_token and not stopped.identical
    assert stopped.fork_index is None
    assert stopped.to_json()["stopped_before_first_token"] is True
    assert RunSummary.from_json(json.loads(json.dumps(stopped.to_json()))) == stopped
    # stopped after its first tokens, it agreed as far as it went
    later = RunSummary.of_steps([_step("a", 0, 10, 10)], [_step("b", 0, 10, 10)], cancelled=True)
    assert later.identical and not later.stopped_before_first_token
    assert "stopped_before_first_token" not in later.to_json()


@given(
    st.builds(
        RunSummary,
        identical=st.booleans(),
        fork_index=st.none() | st.integers(0, 1000),
        fork_margins=st.none() | st.tuples(st.floats(0, 50), st.floats(0, 50)),
        generated=st.tuples(st.integers(0, 9999), st.integers(0, 9999)),
        tokens_per_second=st.tuples(st.floats(0, 1e4), st.floats(0, 1e4)),
        output_sha256=st.tuples(st.text(max_size=8), st.text(max_size=8)),
        stop_reasons=st.tuples(st.sampled_from(["eos", "length"]), st.just("stop")),
        errors=st.tuples(st.none() | st.text(max_size=20), st.none()),
        cancelled=st.booleans(),
        drafted=st.tuples(st.integers(0, 99), st.integers(0, 99)),
        accepted=st.tuples(st.integers(0, 99), st.integers(0, 99)),
        seconds=st.none() | st.tuples(st.floats(0, 1e3), st.floats(0, 1e3)),
        first_token_seconds=st.none() | st.tuples(st.floats(0, 1e3), st.floats(0, 1e3)),
    )
)
def test_a_summary_round_trips_through_json(summary: RunSummary) -> None:
    assert RunSummary.from_json(json.loads(json.dumps(summary.to_json()))) == summary


def test_a_header_round_trips_through_json() -> None:
    pair = presets()["ubatch"]
    header = SessionHeader(
        pair=pair,
        prompt="p\x1b]0;t\x07",
        prompt_token_ids=(2, 5),
        max_tokens=3,
        stop=("\n",),
        executed={"a": {"n_ubatch": 512}, "b": {"n_ubatch": 2}},
        build={"cpu": "x"},
        created="2026-11-30T00:00:00+00:00",
        teacher_forced=True,
    )
    assert SessionHeader.from_json(json.loads(json.dumps(header.to_json()))) == header


DEMOS = sorted((Path(__file__).parent.parent / "sessions").glob("*.jsonl"))


@pytest.mark.parametrize("path", DEMOS, ids=lambda path: path.name)
def test_the_export_summary_is_the_footer_and_more(path: Path) -> None:
    from specdiff.json_numbers import finite_everywhere
    from specdiff.reports.export import export_session

    session = load_session(path)
    assert session.footer is not None
    footer = session.footer.to_json()
    del footer["type"]
    summary = json.loads(export_session(session, "json"))["summary"]
    assert {key: summary[key] for key in footer} == finite_everywhere(footer)
    assert set(summary) > set(footer)


@pytest.mark.parametrize(
    ("field", "value"),
    [("timestamp", math.inf), ("timestamp", -math.inf), ("logsumexp", math.inf)],
)
def test_a_step_with_an_infinite_number_is_one_line(
    field: str, value: float, tmp_path: Path
) -> None:
    header, first, *_ = _records(EARLY_FILE)
    first[field] = value
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(header) + "\n" + json.dumps(first) + "\n")
    with pytest.raises(SessionError, match="finite"):
        load_session(path)


def test_an_infinite_logit_is_one_line(tmp_path: Path) -> None:
    header, first, *_ = _records(EARLY_FILE)
    first["top"][0][1] = math.inf
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(header) + "\n" + json.dumps(first) + "\n")
    with pytest.raises(SessionError, match="finite"):
        load_session(path)


def test_a_normalizer_below_the_logits_exports_without_overflow(tmp_path: Path) -> None:
    """A damaged fork step whose logsumexp lies far below its logits: probabilities read
    as 1, never an OverflowError in the export or the TUI's panel."""
    from specdiff.reports.export import export_session

    records = _records(EARLY_FILE)
    for record in records:
        if record.get("type") == "step":
            record["logsumexp"] = -1000.0
    path = tmp_path / "odd.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    session = load_session(path)
    fork = session.comparison().fork
    assert fork is not None and fork.a.own.probability == 1.0
    for fmt in ("md", "html", "json"):
        assert export_session(session, fmt)
