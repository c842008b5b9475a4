"""The plain-words verdict of a fork: one line saying which picks, how far apart the
reference lane put them, how the other side moved each, and what that makes the fork.

Pure: steps built here over each class of input (every fork class, not-greedy lanes,
teacher-forced runs, missing logits, hostile and long pieces, huge logits).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specdiff.compare import (
    AMBIGUOUS,
    LARGE_MARGIN_SPLIT,
    NEAR_TIE,
    compare,
    fork_between,
    fork_verdict,
    run_fork,
    teacher_flips,
)
from specdiff.fork_words import fork_sentence, quoted_piece, run_fork_sentence
from specdiff.reports.text import format_result, result_json
from specdiff.results import LaneOutcome, PairResult
from specdiff.sessions.store import load_session
from specdiff.sessions.verify import Drift, drift_lines, first_drift
from specdiff.steps import Candidate, TokenStep
from tests.conftest import ForkingPrompt

PIECES = {1: b" and", 2: b" empire", 3: b" senate", 9: b" far"}


def _step(lane: str, token: int, logits: dict[int, float], pieces: dict[int, bytes] = PIECES):
    top = tuple(
        Candidate(t, v, pieces.get(t, b"?"))
        for t, v in sorted(logits.items(), key=lambda item: (-item[1], item[0]))
    )
    return TokenStep(lane, 0, token, pieces.get(token, b"?"), top, False, 1, 0.0)


def _sentence(a: TokenStep, b: TokenStep, teacher_forced: bool = False, names=None) -> str:
    sentence = run_fork_sentence([a], [b], teacher_forced, names=names or ("lane a", "lane b"))
    assert sentence is not None
    return sentence


@pytest.mark.parametrize(
    ("a_logits", "b_logits", "kind", "says"),
    [
        ({1: 10.0, 2: 9.95}, {2: 9.98, 1: 9.95}, NEAR_TIE, "near tie flipped"),
        ({1: 10.0, 2: 9.0}, {2: 9.98, 1: 9.95}, AMBIGUOUS, "ambiguous"),
        ({1: 10.0, 9: 9.0, 2: 6.0}, {2: 9.98, 1: 9.95}, LARGE_MARGIN_SPLIT, "large-margin split"),
        ({1: 10.0, 9: 9.0}, {2: 9.98, 1: 9.95}, LARGE_MARGIN_SPLIT, "outside lane a's top-k"),
    ],
    ids=["near-tie", "ambiguous", "split", "outside-top-k"],
)
def test_each_class_names_itself_and_both_picks(a_logits, b_logits, kind, says) -> None:
    a, b = _step("a", 1, a_logits), _step("b", 2, b_logits)
    assert fork_verdict(a, b).kind == kind
    sentence = _sentence(a, b)
    assert sentence.startswith(kind) and says in sentence
    assert "' empire'" in sentence
    assert "\n" not in sentence and len(sentence) <= 200


@pytest.mark.parametrize(("gap", "b_first"), [(0.05, 0.03), (0.3, 0.2), (1.2, 0.01)])
def test_a_close_call_gives_the_gap_and_each_picks_move(gap: float, b_first: float) -> None:
    """The moves are the other lane's logit minus the reference's, for each pick; the
    relative shift is their difference, and a greedy fork needs it above the gap."""
    a = _step("a", 1, {1: 10.0, 2: 10.0 - gap})
    b = _step("b", 2, {2: 10.0 + b_first, 1: 10.0 - 0.02})
    sentence = _sentence(a, b)
    assert f"were {gap:.2f} apart in lane a" in sentence
    moved_a, moved_b = -0.02, 10.0 + b_first - (10.0 - gap)
    assert f"moved them by {moved_a:+.2f} and {moved_b:+.2f}" in sentence
    assert f"a net {moved_b - moved_a:.2f} toward ' empire', more than that gap" in sentence


def test_a_pick_missing_from_the_other_lane_says_its_move_is_unknown() -> None:
    sentence = _sentence(_step("a", 1, {1: 10.0, 2: 9.9}), _step("b", 2, {2: 9.98, 9: 8.0}))
    assert sentence.startswith("near tie flipped")
    assert "lane a's pick was outside lane b's top-k" in sentence and "moved" not in sentence


@pytest.mark.parametrize(("lane_off", "a_token", "b_token"), [("a", 2, 1), ("b", 1, 2)])
def test_a_lane_below_its_argmax_is_called_not_greedy(lane_off, a_token, b_token) -> None:
    a = _step("a", a_token, {1: 10.0, 2: 9.9})
    b = _step("b", b_token, {1: 10.0, 2: 9.99})
    sentence = _sentence(a, b)
    assert sentence.startswith(LARGE_MARGIN_SPLIT)
    assert f"lane {lane_off} emitted" in sentence and "did not decode greedily" in sentence


def test_a_teacher_forced_flip_reads_the_forced_lanes_own_best() -> None:
    """Fed A's tokens, B emits A's token; the fork is at B's own argmax."""
    a = _step("a", 1, {1: 10.0, 2: 9.95})
    b = _step("b", 1, {2: 9.98, 1: 9.95})
    fork = run_fork([a], [b], teacher_forced=True)
    assert fork is not None and fork.token_b == 2 and fork.piece_b == b" empire"
    assert run_fork([a], [b]) is None
    sentence = _sentence(a, b, teacher_forced=True)
    assert sentence.startswith("near tie flipped") and "fed lane a's tokens" in sentence


def test_a_run_without_logits_says_so() -> None:
    a = TokenStep("a", 0, 1, b" and", (), False, 1, 0.0)
    b = TokenStep("b", 0, 2, b" empire", (), False, 1, 0.0)
    assert "no logits were recorded" in _sentence(a, b)
    fork = fork_between(0, a, b)
    assert "no logits were recorded" in fork_sentence(fork, None)


def _accepted_draft(lane: str, token: int) -> TokenStep:
    """A server's accepted draft reported without probabilities: its pick alone."""
    return TokenStep(
        lane, 0, token, PIECES[token], (Candidate(token, 0.0, PIECES[token]),), True, 3, 0.0
    )


# the scored side's logits: a near tie, a pick far below, the other pick outside top-k
SCORED_LOGITS = [{1: 10.0, 2: 9.95}, {1: 10.0, 9: 9.0, 2: 6.0}, {1: 10.0, 9: 9.0}]


@pytest.mark.parametrize("teacher_forced", [False, True], ids=["free", "forced"])
@pytest.mark.parametrize("logits", SCORED_LOGITS, ids=["tie", "far", "outside"])
@pytest.mark.parametrize("alone", ["a", "b", "ab"])
def test_an_unscored_step_is_never_called_a_split(alone: str, logits, teacher_forced) -> None:
    """An accepted draft without probabilities holds only its own pick: the sentence
    says which step had no logits, whatever the other lane's logits would suggest."""
    a = _accepted_draft("a", 1) if "a" in alone else _step("a", 1, logits)
    b = _accepted_draft("b", 2) if "b" in alone else _step("b", 2, {2: 10.0, 1: 9.0})
    sentence = _sentence(a, b, teacher_forced)
    named = " or ".join(f"lane {lane}'s step" for lane in alone)
    reason = named.replace("'s step", "'s step (an accepted draft without probabilities)")
    assert sentence.startswith("forked: lane a picked ' and', lane b ")
    assert sentence.endswith(f"no logits were recorded for {reason} to say why")
    assert "split" not in sentence and "near tie" not in sentence


def test_identical_runs_have_no_sentence() -> None:
    a = _step("a", 1, {1: 10.0, 2: 9.95})
    assert run_fork_sentence([a], [_step("b", 1, {1: 10.0, 2: 9.95})]) is None


def test_the_names_call_the_two_sides() -> None:
    a, b = _step("a", 1, {1: 10.0, 2: 9.95}), _step("b", 2, {2: 9.98, 1: 9.95})
    sentence = _sentence(a, b, names=("the recording", "the re-run"))
    assert "apart in the recording; the re-run moved them" in sentence
    assert "lane" not in sentence


HOSTILE = [
    b"\x1b]52;c;ZXZpbA==\x07",
    b"\x1b[2J",
    "\u202eevil".encode(),
    b"\xc2\x9b31m",
    b"\xff\xfe",
    b"a\nb\rc\td",
    b"|<script>",
]


@pytest.mark.parametrize("piece", HOSTILE)
@pytest.mark.parametrize("kind_logits", [{1: 10.0, 2: 9.95}, {1: 10.0, 9: 9.0}])
def test_hostile_pieces_reach_the_line_escaped(piece: bytes, kind_logits) -> None:
    pieces = PIECES | {2: piece}
    a, b = _step("a", 1, kind_logits, pieces), _step("b", 2, {2: 9.98, 1: 9.95}, pieces)
    sentence = _sentence(a, b)
    assert sentence.isprintable()


@given(st.binary(max_size=400))
def test_any_piece_is_quoted_on_one_short_printable_line(piece: bytes) -> None:
    shown = quoted_piece(piece)
    assert shown.isprintable()
    # 24 characters, each at most a 10-character escape, plus the quotes
    assert len(shown) <= 24 * 10 + 2


def test_a_long_piece_is_cut_so_the_reason_stays_on_the_line() -> None:
    pieces = PIECES | {2: b" " * 500}
    a, b = _step("a", 1, {1: 10.0, 2: 9.95}, pieces), _step("b", 2, {2: 9.98, 1: 9.95}, pieces)
    sentence = _sentence(a, b)
    assert "…" in sentence and sentence.endswith("more than that gap") and len(sentence) < 200


@given(
    st.floats(-1e300, 1e300, allow_nan=False, allow_infinity=False),
    st.floats(0, 1e300, allow_nan=False, allow_infinity=False),
    st.floats(-1e300, 1e300, allow_nan=False, allow_infinity=False),
)
def test_huge_logits_stay_one_short_line(best: float, gap: float, b_best: float) -> None:
    a = _step("a", 1, {1: best, 2: best - gap})
    b = _step("b", 2, {2: b_best, 1: b_best - 1.0})
    sentence = _sentence(a, b)
    assert sentence.isprintable() and len(sentence) <= 240


DEMOS = sorted((Path(__file__).resolve().parent.parent / "sessions").glob("*.jsonl"))


@pytest.mark.parametrize("lane_id", ["a", "b"])
@pytest.mark.parametrize("path", DEMOS, ids=lambda p: p.name.split("-", 1)[1])
def test_a_drift_is_explained_between_the_recording_and_the_rerun(path: Path, lane_id: str):
    """A re-run that took the recording's #2 at a step reads as a fork between the
    recording and the re-run, in the same plain words."""
    session = load_session(path)
    steps = {lane: list(session.steps[lane]) for lane in ("a", "b")}
    index = len(steps[lane_id]) // 2
    old = steps[lane_id][index]
    swapped = (old.top[1], old.top[0], *old.top[2:])
    steps[lane_id][index] = dataclasses.replace(old, token_id=swapped[0].token_id, top=swapped)
    rerun = {lane: [step.token_id for step in steps[lane]] for lane in ("a", "b")}
    drift = Drift(index, lane_id, old.token_id, swapped[0].token_id)
    lines = drift_lines(session, drift, steps)
    why = next(line for line in lines if line.startswith("why: "))
    assert "the recording" in why and "lane" not in why.split(":", 1)[1]
    assert why.removeprefix("why: ").startswith(fork_verdict(old, steps[lane_id][index]).kind)
    assert first_drift(session, rerun) == drift


@pytest.mark.model
@pytest.mark.parametrize("forcing", [[], ["--teacher-forced"]], ids=["free", "teacher-forced"])
def test_run_prints_the_verdict_beside_the_fork(
    forcing: list[str], forking_prompt: Callable[[str, int], ForkingPrompt]
) -> None:
    """`specdiff run` in a real process, on a prompt that forks on this CPU: the text says
    why it forked under the fork, in plain words with the logits beneath (a teacher-forced
    run's fork is its first flip, the same token); the JSON carries the same explanation
    and its short form, the verdict, beside the fork record."""
    prompt = forking_prompt("ubatch", 40).prompt
    command = [sys.executable, "-m", "specdiff", "run", "--pair", "ubatch", "--prompt", prompt]
    command += ["--max-tokens", "40", *forcing]
    printed = subprocess.run([*command, "--json"], capture_output=True, text=True, timeout=300)
    assert printed.returncode == 1, printed.stderr
    data = json.loads(printed.stdout)
    verdict, fork = data["verdict"], data["fork"]
    assert verdict is not None and fork is not None
    assert verdict.startswith(data["fork_class"]) and verdict.isprintable()
    label, plain, detail = (data["explanation"][key] for key in ("label", "plain", "detail"))
    assert verdict == f"{label}: {plain if detail is None else detail}"
    text = subprocess.run(command, capture_output=True, text=True, timeout=300)
    lines = text.stdout.splitlines()
    why = [index for index, line in enumerate(lines) if line.startswith("why: ")]
    assert [lines[index] for index in why] == [f"why: {label}: {plain}"]
    if detail is not None:
        assert lines[why[0] + 1] == f"  in logits: {detail}"


@pytest.mark.model
def test_run_without_a_fork_prints_no_verdict() -> None:
    """Lane b made the same as lane a never forks at temperature 0: no verdict in the
    JSON, no `why:` line in the text, and the exit status says so."""
    prompt = "The history of the Roman Empire"
    command = [sys.executable, "-m", "specdiff", "run", "--pair", "ubatch", "--prompt", prompt]
    command += ["--lane-b", "n_batch=512", "--lane-b", "n_ubatch=512", "--max-tokens", "8"]
    printed = subprocess.run([*command, "--json"], capture_output=True, text=True, timeout=300)
    assert printed.returncode == 0, printed.stderr
    data = json.loads(printed.stdout)
    assert data["verdict"] is None and data["fork"] is None
    text = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert not [line for line in text.stdout.splitlines() if line.startswith("why: ")]


def result_of(path: Path) -> PairResult:
    """A recorded run as the pair runner hands it to the printers."""
    session = load_session(path)
    header = session.header
    return PairResult(
        pair=session.pair,
        prompt=session.prompt,
        prompt_tokens=list(header.prompt_token_ids),
        max_tokens=header.max_tokens,
        a=LaneOutcome("a", session.pair.a, list(session.steps["a"]), stop_reason="length"),
        b=LaneOutcome("b", session.pair.b, list(session.steps["b"]), stop_reason="length"),
        comparison=session.comparison(),
        build=dict(header.build),
        started=header.created,
    )


@pytest.mark.parametrize("path", DEMOS, ids=lambda p: p.name.split("-", 1)[1])
def test_the_run_printers_put_the_verdict_under_the_fork(path: Path) -> None:
    result = result_of(path)
    data = result_json(result)
    assert data["fork"] is not None, "the demo sessions fork"
    assert data["verdict"].startswith(data["fork_class"])
    parts = data["explanation"]
    lines = format_result(result).splitlines()
    why = lines.index(f"why: {parts['label']}: {parts['plain']}")
    assert lines[why + 1] == f"  in logits: {parts['detail']}"
    assert lines[why + 2].startswith("fork class: ") and lines[why - 1].startswith("  lane b:")


def teacher_forced_from(result: PairResult, flip: bool) -> PairResult:
    """The run as if lane b had been fed lane a's tokens: b emits a's token at each step
    and keeps its own candidates (where it flips, its own argmax is another token), or
    with `flip` False lane a's candidates too (no flip)."""
    a_steps, b_steps = result.a.steps, result.b.steps
    forced = [
        dataclasses.replace(
            a_step, lane="b", top=(b_step if flip else a_step).top, probes=(), logsumexp=None
        )
        for a_step, b_step in zip(a_steps, b_steps)
    ]
    b = dataclasses.replace(result.b, steps=forced)
    comparison = compare(a_steps[: len(forced)], forced)
    return dataclasses.replace(result, b=b, comparison=comparison, teacher_forced=True)


@pytest.mark.parametrize("flip", [True, False], ids=["flips", "no-flip"])
@pytest.mark.parametrize("path", DEMOS, ids=lambda p: p.name.split("-", 1)[1])
def test_a_teacher_forced_run_prints_why_its_first_flip_happened(path: Path, flip: bool) -> None:
    """The text printer says what the JSON's verdict says, under the first flip (the ids
    agree by construction, so the flip is the run's fork), and nothing where b never
    flipped."""
    result = teacher_forced_from(result_of(path), flip)
    data = result_json(result)
    lines = format_result(result).splitlines()
    why = [line for line in lines if line.startswith("why: ")]
    parts = data["explanation"]
    if not flip:
        assert data["verdict"] is None and why == []
        assert any(line.startswith("NO FLIP: fed lane a's") for line in lines)
        return
    index = run_fork(result.a.steps, result.b.steps, teacher_forced=True).index
    assert data["verdict"] is not None and why == [f"why: {parts['label']}: {parts['plain']}"]
    assert "fed lane a's tokens" in data["verdict"] and "fed lane a's tokens" in parts["plain"]
    head = next(line for line in lines if line.startswith("FLIPPED at token "))
    assert head.startswith(f"FLIPPED at token {index} of ")
    assert lines[lines.index(why[0]) + 1] == f"  in logits: {parts['detail']}"
    assert lines[lines.index(why[0]) + 2].startswith("fork class: ")
    assert not any(line.startswith(("IDENTICAL", "DIVERGED")) for line in lines)


@pytest.mark.parametrize("kept", [1, 2, 12, 13])
@pytest.mark.parametrize("flip", [True, False], ids=["flips", "no-flip"])
def test_a_teacher_forced_run_counts_in_words(kept: int, flip: bool) -> None:
    """'1 token', '1 flip', '2 flips': counts read as words in the text printer (the
    ubatch demo, forced, first flips at 11 and 12: 12 steps hold one, 13 two)."""
    result = result_of(next(path for path in DEMOS if "ubatch" in path.name))
    cut = dataclasses.replace(
        result,
        a=dataclasses.replace(result.a, steps=result.a.steps[:kept]),
        b=dataclasses.replace(result.b, steps=result.b.steps[:kept]),
    )
    forced = teacher_forced_from(cut, flip)
    flips = teacher_flips(forced.a.steps, forced.b.steps)
    lines = format_result(forced).splitlines()
    if not flips:
        noun = "token" if kept == 1 else "tokens"
        assert f"NO FLIP: fed lane a's {kept} {noun}, lane b's" in "\n".join(lines)
        return
    head = next(line for line in lines if line.startswith("FLIPPED at token "))
    noun = "flip" if len(flips) == 1 else "flips"
    assert f"; {len(flips)} {noun} in all (" in head and "(s)" not in head


@pytest.mark.parametrize("path", DEMOS, ids=lambda p: p.name.split("-", 1)[1])
def test_an_identical_run_says_where_to_look_for_a_fork(path: Path) -> None:
    """Lane b given lane a's own steps: the run is identical, and the text says how to
    see how often the pair forks (a suite) and how to look further in this text."""
    result = result_of(path)
    same = [dataclasses.replace(step, lane="b") for step in result.a.steps]
    identical = dataclasses.replace(
        result,
        b=dataclasses.replace(result.b, steps=same),
        comparison=compare(result.a.steps, same),
    )
    lines = format_result(identical).splitlines()
    assert any(line.startswith("IDENTICAL: ") for line in lines)
    (hint,) = [line for line in lines if line.startswith("no fork: ")]
    assert f"specdiff suite open --pair {result.pair.name};" in hint
    assert hint.endswith(f"--max-tokens {2 * result.max_tokens}")
    # a run that forked has no such line
    assert not any(line.startswith("no fork: ") for line in format_result(result).splitlines())
