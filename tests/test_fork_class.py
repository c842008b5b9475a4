"""Fork classes: near tie, ambiguous, large-margin split.

The classifier is a pure function of the reference lane's margin and the rank it gave
the other lane's pick; these tests hold it to its definition over the whole input
space, check which lane is the reference, and that the class travels through session
files (written, validated on read, derived for files written before it existed).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specdiff.compare import (
    AMBIGUOUS,
    DEFAULT_NEAR_TIE,
    DEFAULT_SPLIT_THRESHOLD,
    FORK_CLASSES,
    LARGE_MARGIN_SPLIT,
    NEAR_TIE,
    UNSCORED,
    classify_fork,
    fork_class_at,
    fork_verdict,
)
from specdiff.fork_words import verdict_description
from specdiff.sessions.records import RunSummary
from specdiff.sessions.store import SessionError, load_session
from specdiff.steps import Candidate, TokenStep

FIXTURE = Path(__file__).parent / "data" / "ubatch-roman-empire.jsonl"

gaps = st.none() | st.floats(0, 50, allow_nan=False)


@given(gaps, st.floats(0.01, 1.0), st.floats(1.0, 5.0))
def test_the_class_follows_its_definition(gap: float | None, near_tie: float, split: float) -> None:
    kind = classify_fork(gap, near_tie, split)
    not_rounding = gap is None or gap >= split
    assert (kind == LARGE_MARGIN_SPLIT) == not_rounding
    assert (kind == NEAR_TIE) == (gap is not None and gap < near_tie)
    assert kind in FORK_CLASSES


@given(st.floats(0, 50, allow_nan=False), st.floats(0, 10))
def test_a_wider_gap_never_reads_as_a_closer_call(gap: float, wider_by: float) -> None:
    order = {NEAR_TIE: 0, AMBIGUOUS: 1, LARGE_MARGIN_SPLIT: 2}
    narrow, wide = classify_fork(gap), classify_fork(gap + wider_by)
    assert order[narrow] <= order[wide]


@pytest.mark.parametrize(
    ("gap", "expected"),
    [
        (0.0, NEAR_TIE),
        (DEFAULT_NEAR_TIE - 1e-9, NEAR_TIE),
        (DEFAULT_NEAR_TIE, AMBIGUOUS),
        (DEFAULT_SPLIT_THRESHOLD - 1e-9, AMBIGUOUS),
        (DEFAULT_SPLIT_THRESHOLD, LARGE_MARGIN_SPLIT),
        (None, LARGE_MARGIN_SPLIT),
    ],
)
def test_the_thresholds_bound_each_class(gap: float | None, expected: str) -> None:
    assert classify_fork(gap) == expected


@pytest.mark.parametrize(
    ("other_logit", "expected"),
    [(10.25, NEAR_TIE), (9.5, AMBIGUOUS), (8.0, LARGE_MARGIN_SPLIT)],
)
def test_a_pick_far_down_the_ranks_is_classed_by_how_far_below_the_best(
    other_logit: float, expected: str
) -> None:
    """A four-way near tie (a HumanEval fork: four candidates within 0.22 logits) is a
    near tie whatever the other pick's rank; a #4 two logits down is a split."""
    a = _step("a", 1, {1: 10.47, 2: 10.38, 3: 10.37, 4: other_logit})
    b = _step("b", 4, {4: 10.48, 1: 10.37, 2: 10.36, 3: 10.26})
    verdict = fork_verdict(a, b)
    assert verdict.other_rank == 4 and verdict.kind == expected
    assert verdict.other_gap == pytest.approx(10.47 - other_logit)


def _step(lane: str, token: int, logits: dict[int, float]) -> TokenStep:
    top = tuple(
        Candidate(t, v) for t, v in sorted(logits.items(), key=lambda item: (-item[1], item[0]))
    )
    return TokenStep(lane, 0, token, b"x", top, False, 1, 0.0)


# lane A's logits: 1 leads 2 by 0.1 and 3 by 3.0
CLOSE = {1: 5.0, 2: 4.9, 3: 2.0}


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        # both lanes greedy: A is the reference, B's pick is A's #2 at a 0.1 margin
        (_step("a", 1, CLOSE), _step("b", 2, {2: 5.0, 1: 4.95}), NEAR_TIE),
        # B's pick is A's #3
        (_step("a", 1, CLOSE), _step("b", 3, {3: 5.0, 1: 4.0}), LARGE_MARGIN_SPLIT),
        # B's pick is outside A's candidates
        (_step("a", 1, CLOSE), _step("b", 77, {77: 5.0, 1: 4.0}), LARGE_MARGIN_SPLIT),
        # a tie taken the other way is still greedy: A's 1 and 2 have the same logit
        (_step("a", 2, {1: 5.0, 2: 5.0}), _step("b", 1, {1: 5.0, 2: 4.9}), NEAR_TIE),
    ],
    ids=["near-tie", "rank-3", "absent", "tie-either-way"],
)
def test_greedy_lanes_are_classed_by_lane_a(a: TokenStep, b: TokenStep, expected: str) -> None:
    verdict = fork_verdict(a, b)
    assert (verdict.kind, verdict.reference, verdict.not_greedy) == (expected, "a", None)


@pytest.mark.parametrize(
    ("a", "b", "reference", "not_greedy"),
    [
        # A took a token its own logits ranked #3 (a lenient accept): B, greedy, is the
        # reference; however close B's logits were, A did not decode greedily
        (_step("a", 3, CLOSE), _step("b", 1, {1: 5.0, 3: 4.9}), "b", "a"),
        (_step("a", 2, CLOSE), _step("b", 1, {1: 5.0, 2: 4.8}), "b", "a"),
        # B took a token below its argmax: A is the reference
        (_step("a", 1, CLOSE), _step("b", 2, {1: 5.0, 2: 4.99}), "a", "b"),
        # neither lane took its argmax: A stays the reference
        (_step("a", 2, CLOSE), _step("b", 3, {1: 5.0, 3: 4.0}), "a", "a"),
    ],
    ids=["lenient-a-rank-3", "lenient-a-rank-2", "lenient-b", "neither-greedy"],
)
def test_a_lane_that_left_its_argmax_is_a_split(
    a: TokenStep, b: TokenStep, reference: str, not_greedy: str
) -> None:
    verdict = fork_verdict(a, b)
    assert verdict.kind == LARGE_MARGIN_SPLIT
    assert (verdict.reference, verdict.not_greedy) == (reference, not_greedy)
    assert "not greedy decoding" in verdict_description(verdict)


@pytest.mark.parametrize(
    ("b_logits", "expected"),
    [({2: 5.0, 1: 4.95}, NEAR_TIE), ({3: 5.0, 1: 4.0}, LARGE_MARGIN_SPLIT)],
    ids=["flip-to-2", "flip-to-3"],
)
def test_a_teacher_forced_flip_is_classed_by_b_s_own_pick(
    b_logits: dict[int, float], expected: str
) -> None:
    a = _step("a", 1, CLOSE)
    # B was fed A's token 1; its own argmax is the first key of b_logits
    b = _step("b", 1, b_logits)
    assert fork_class_at(a, b, teacher_forced=True) == expected
    summary = RunSummary.of_steps([a], [b], teacher_forced=True)
    assert summary.fork_class == expected
    assert RunSummary.of_steps([a], [b]).fork_class is None


def _alone(lane: str, token: int, drafted: bool) -> TokenStep:
    """A step holding its own pick alone: a server's accepted draft, never rescored."""
    return TokenStep(lane, 0, token, b"x", (Candidate(token, 0.0),), drafted, 2, 0.0)


# steps with a margin, each of another class against a scored partner: a near tie,
# a pick far below the best, a lane off its argmax
SCORED = [
    _step("a", 1, CLOSE),
    _step("a", 1, {1: 9.0, 2: 1.0}),
    _step("a", 2, CLOSE),
    _step("b", 2, {2: 5.0, 1: 4.95}),
    _step("b", 3, {3: 5.0, 1: 4.0}),
]


@pytest.mark.parametrize("teacher_forced", [False, True])
@pytest.mark.parametrize("drafted", [True, False], ids=["drafted", "not-drafted"])
@pytest.mark.parametrize(
    "scored", [*SCORED, None], ids=[*(f"{s.lane}{i}-scored" for i, s in enumerate(SCORED)), "none"]
)
def test_a_step_without_a_second_candidate_is_unscored(
    scored: TokenStep | None, drafted: bool, teacher_forced: bool
) -> None:
    """Whatever the other lane's logits say, a step with only its own pick has no
    margin: the fork is no class read from logits, and it travels as such through the
    run summary."""
    step_a = scored if scored is not None and scored.lane == "a" else _alone("a", 7, drafted)
    step_b = scored if scored is not None and scored.lane == "b" else _alone("b", 8, drafted)
    verdict = fork_verdict(step_a, step_b, teacher_forced)
    assert verdict.kind == UNSCORED and verdict.not_greedy is None
    unscored = tuple(lane for lane in "ab" if scored is None or scored.lane != lane)
    assert tuple(lane for lane, _ in verdict.unscored) == unscored
    described = verdict_description(verdict)
    assert described.startswith("unscored (no logits were recorded for lane")
    assert ("an accepted draft without probabilities" in described) == drafted
    summary = RunSummary.of_steps([step_a], [step_b], teacher_forced=teacher_forced)
    assert summary.fork_index == 0 and summary.fork_class == UNSCORED
    assert RunSummary.from_json(summary.to_json()).fork_class == UNSCORED


def _fixture_records() -> list[dict]:
    return [json.loads(line) for line in FIXTURE.read_text().splitlines() if line.strip()]


def _write(records: list[dict], path: Path) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def test_a_file_without_classes_gets_one_from_its_steps(tmp_path: Path) -> None:
    records = _fixture_records()
    records[-1].pop("fork_class", None)
    session = load_session(_write(records, tmp_path / "old.jsonl"))
    summary = session.summary()
    assert summary.fork_index is not None
    steps = session.steps
    index = summary.fork_index
    assert summary.fork_class == fork_class_at(steps["a"][index], steps["b"][index])


@pytest.mark.parametrize("kind", FORK_CLASSES)
def test_the_recorded_class_survives_a_round_trip(kind: str, tmp_path: Path) -> None:
    records = _fixture_records()
    records[-1]["fork_class"] = kind
    session = load_session(_write(records, tmp_path / "kind.jsonl"))
    assert session.footer is not None and session.footer.fork_class == kind
    # the class was computed with the run's own near-tie threshold: it is kept
    assert session.summary().fork_class == kind
    assert RunSummary.from_json(session.footer.to_json()).fork_class == kind


@pytest.mark.parametrize("fork_index", [0, 59, None])
def test_a_class_recorded_for_another_fork_is_derived_again(
    fork_index: int | None, tmp_path: Path
) -> None:
    """An edited footer that names another fork (or none) with a class keeps neither:
    the class is the one the steps' own fork has."""
    records = _fixture_records()
    records[-1]["fork_index"] = fork_index
    records[-1]["fork_class"] = "large-margin split"
    session = load_session(_write(records, tmp_path / "edited.jsonl"))
    summary = session.summary()
    index = summary.fork_index
    assert index is not None and index != fork_index
    steps = session.steps
    assert summary.fork_class == fork_class_at(steps["a"][index], steps["b"][index])


@pytest.mark.parametrize(
    "value", ["split", "NEAR TIE", "", 2.0, ["near tie"], {"x": 1}, True], ids=repr
)
def test_an_unknown_class_is_one_line_naming_file_and_line(value: object, tmp_path: Path) -> None:
    records = _fixture_records()
    records[-1]["fork_class"] = value
    path = _write(records, tmp_path / "bad.jsonl")
    with pytest.raises(SessionError) as raised:
        load_session(path)
    message = str(raised.value)
    assert message.startswith(f"{path}:{len(records)}: ") and "fork_class" in message
    assert "\n" not in message


# --- where the class is shown ---------------------------------------------------------


@pytest.mark.parametrize("fmt", ["md", "html", "json"])
@pytest.mark.parametrize("near_tie", [0.01, DEFAULT_NEAR_TIE, 5.0])
def test_an_export_shows_the_class_at_its_own_threshold(fmt: str, near_tie: float) -> None:
    from specdiff.reports.export import export_session

    session = load_session(FIXTURE)
    index = session.summary().fork_index
    assert index is not None
    expected = fork_class_at(
        session.steps["a"][index], session.steps["b"][index], near_tie=near_tie
    )
    document = export_session(session, fmt, near_tie)
    if fmt == "json":
        summary = json.loads(document)["summary"]
        assert summary["fork_class"] == expected
        assert summary["split_threshold"] == DEFAULT_SPLIT_THRESHOLD
    else:
        assert f"Fork class: {expected}" in document


def test_an_identical_session_exports_no_class(tmp_path: Path) -> None:
    from specdiff.reports.export import export_session

    records = _fixture_records()
    header, *steps, footer = records
    lane_a = [step for step in steps if step.get("lane") == "a"]
    twins = [dict(step, lane="b") for step in lane_a]
    footer.pop("fork_class", None)
    session = load_session(_write([header, *lane_a, *twins], tmp_path / "same.jsonl"))
    assert session.summary().fork_class is None
    assert json.loads(export_session(session, "json"))["summary"]["fork_class"] is None
    assert "Fork class" not in export_session(session, "md")


def _shifted(step: TokenStep, token: int) -> TokenStep:
    """The step as a greedy re-run whose logits moved `token` just above the rest would
    record it."""
    best = Candidate(token, step.top[0].logit + 0.01)
    rest = tuple(candidate for candidate in step.top if candidate.token_id != token)
    return TokenStep(step.lane, step.index, token, b"", (best, *rest), False, 1, 0.0)


@pytest.mark.parametrize("rank", [2, 3], ids=["runner-up", "third"])
def test_a_drift_is_classed_against_the_recorded_step(rank: int) -> None:
    from specdiff.sessions.verify import Drift, drift_lines

    session = load_session(FIXTURE)
    steps = session.steps["a"]
    index = next(i for i, step in enumerate(steps) if len(step.top) >= 3)
    recorded = steps[index]
    now_token = recorded.top[rank - 1].token_id
    rerun = {"a": [*steps[:index], _shifted(recorded, now_token)], "b": session.steps["b"]}
    lines = drift_lines(session, Drift(index, "a", recorded.token_id, now_token), rerun)
    expected = classify_fork(recorded.top[0].logit - recorded.top[rank - 1].logit)
    assert lines[-1].startswith(f"drift class: {expected} (the recording is the reference")
    assert all("\n" not in line for line in lines)


def test_a_drift_in_length_has_no_class() -> None:
    from specdiff.sessions.verify import Drift, drift_lines

    session = load_session(FIXTURE)
    lines = drift_lines(session, Drift(3, "a", None, None), session.steps)
    assert lines == ["DRIFT at step 3 of lane a: the lane stopped at another length"]


@pytest.mark.parametrize(
    ("b_logits", "badge"),
    [
        ({2: 5.0, 1: 4.95}, "near tie"),
        ({2: 5.0, 1: 4.0}, "ambiguous"),
        ({3: 5.0, 1: 1.0}, "SPLIT"),
        ({3: 5.0}, "unscored"),
    ],
)
def test_the_fork_panel_carries_a_class_badge(b_logits: dict[int, float], badge: str) -> None:
    from specdiff.compare import fork_at
    from specdiff.tui.widgets import render_panel

    a = _step("a", 1, {1: 5.0, 2: 4.9 if badge == "near tie" else 4.2, 3: 1.0})
    b = _step("b", next(iter(b_logits)), b_logits)
    fork = fork_at([a], [b])
    assert fork is not None
    header = render_panel(0, a, b, fork, None, 1).renderables[0].plain
    assert header.startswith("FORK at token 0") and f"  {badge}  " in header


@pytest.mark.parametrize("unscored", [0, 3])
def test_suite_tables_count_unscored_forks_only_where_there_are_some(unscored: int) -> None:
    from specdiff.reports.suite import paired_line
    from specdiff.reports.suite_tables import _class_counts_cell

    counts = {NEAR_TIE: 4, AMBIGUOUS: 1, LARGE_MARGIN_SPLIT: 2, UNSCORED: unscored}
    summary = {"identical_rate": {"count": 1, "of": 11, "interval": None}}
    line = paired_line(summary | {"fork_classes": counts | {"unclassified": 0}})
    shown = "near tie 4, ambiguous 1, large-margin split 2"
    assert line.endswith(f"forks: {shown}, unscored 3" if unscored else f"forks: {shown}")
    cell = _class_counts_cell({"fork_classes": counts})
    assert cell == ("4 / 1 / 2 (+3 unscored)" if unscored else "4 / 1 / 2")
