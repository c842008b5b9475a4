"""certify's verdict logic, evidence readers, certificate rendering and bad input: pure
and quick (token steps made here, no model, no server)."""

from __future__ import annotations

import json

import pytest

from specdiff.certify.evidence import (
    CACHE_HITS,
    RUNNING,
    busy_time,
    counter_readings,
    draft_proof,
    first_of,
    metric_reading,
    metric_values,
    overlap,
    running_proof,
    slots_processing,
)
from specdiff.certify.records import (
    BATCH,
    BROKEN,
    HOLDS,
    NOT_TESTED,
    PROPERTIES,
    SPECULATION,
    Certificate,
    Compared,
    Proof,
    UnknownProperty,
    check_properties,
    judge,
    not_tested,
)
from specdiff.certify.server_side import BARE_ANSWER_BYTES, bare_answer_fault, cache_proof
from specdiff.certify.sides import Settings
from specdiff.cli import main
from specdiff.errors import PromptError
from specdiff.reports.certificate import certificate_html, certificate_text
from specdiff.steps import Candidate, TokenStep

SHOWN = Proof(True, "the server showed 4 requests running at once")
UNSHOWN = Proof(False, "the server shows no running-request count")


def step(index: int, token: int, logits: tuple[float, float] = (2.0, 1.0)) -> TokenStep:
    other = token + 1000
    return TokenStep(
        lane="a",
        index=index,
        token_id=token,
        piece=f"t{token}".encode(),
        top=(Candidate(token, logits[0], f"t{token}".encode()), Candidate(other, logits[1], b"o")),
        drafted=False,
        verify_width=1,
        timestamp=0.0,
    )


def run(tokens: list[int], shift: float = 0.0) -> list[TokenStep]:
    return [step(i, t, (2.0 + shift, 1.0)) for i, t in enumerate(tokens)]


def test_identical_runs_hold_only_where_the_condition_was_shown() -> None:
    pairs = [Compared("p1", run([1, 2, 3]), run([1, 2, 3]))]
    held = judge(BATCH, pairs, SHOWN)
    assert held.verdict == HOLDS and held.identical == 1 and held.largest_difference == 0.0
    vacuous = judge(BATCH, pairs, UNSHOWN)
    assert vacuous.verdict == NOT_TESTED
    assert "not shown" in vacuous.why


def test_a_fork_is_broken_with_both_picks_and_margins() -> None:
    reference = run([1, 2, 3, 4])
    other = [*run([1, 2]), step(2, 9, (1.5, 1.4)), step(3, 4)]
    result = judge(
        BATCH, [Compared("p1", reference, reference), Compared("p2", reference, other)], UNSHOWN
    )
    assert result.verdict == BROKEN  # a difference is evidence even where batching was not shown
    assert result.identical == 1 and result.compared == 2
    fork = result.fork
    assert fork is not None
    assert (fork["index"], fork["pair"]) == (2, "p2")
    assert (fork["reference_pick"], fork["other_pick"]) == ("t3", "t9")
    assert fork["reference_margin"] == pytest.approx(1.0)
    assert fork["other_margin"] == pytest.approx(0.1)


def test_a_run_that_ends_early_forks_where_it_ended() -> None:
    result = judge(BATCH, [Compared("p", run([1, 2, 3]), run([1, 2]))], SHOWN)
    assert result.verdict == BROKEN and result.fork is not None
    assert result.fork["index"] == 2 and result.fork["other_pick"] == "(ended)"


def test_equal_tokens_with_other_logprobs_break_a_bitwise_claim_only() -> None:
    pairs = [Compared("p", run([1, 2, 3]), run([1, 2, 3], shift=2**-20))]
    bitwise = judge(BATCH, pairs, SHOWN)
    assert bitwise.verdict == BROKEN and "not bitwise" in bitwise.why
    assert bitwise.largest_difference == pytest.approx(2**-20)
    text_only = judge(SPECULATION, pairs, SHOWN)
    assert text_only.verdict == HOLDS
    assert text_only.largest_difference == pytest.approx(2**-20)


def test_nothing_compared_is_not_tested() -> None:
    assert judge(BATCH, [], SHOWN).verdict == NOT_TESTED


def test_a_cache_hit_is_believed_only_from_an_honest_counter() -> None:
    assert cache_proof("counter", 0, 30, 40, "after a reset").shown
    liar = cache_proof("counter", 40, 40, 40, "after a reset")
    assert not liar.shown and "cannot have made" in liar.how
    assert not cache_proof("counter", 0, 400, 40, "after a reset").shown
    assert not cache_proof("counter", 0, 0, 40, "after a reset").shown
    assert not cache_proof("counter", None, 30, 40, "after a reset").shown
    assert not cache_proof("counter", -1000, 20, 40, "after a reset").shown


def test_a_counter_is_evidence_only_while_it_counts_forwards() -> None:
    assert counter_readings([1000.0, 1000.0, 1030.0, 1060.0]) == [1000.0, 1000.0, 1030.0, 1060.0]
    restarted = counter_readings([1000.0, 0.0, 20.0, 40.0])
    assert isinstance(restarted, str) and "went backwards (1000 to 0)" in restarted
    assert counter_readings([1.0, None, 2.0, 3.0]) == (
        "the hit counter stopped answering during the test"
    )
    assert counter_readings([1.0, "cut short", 2.0]) == "cut short"


def test_a_metrics_answer_that_repeats_a_series_is_no_reading() -> None:
    once = (
        'vllm:num_requests_running{model_name="a"} 3\nvllm:num_requests_running{model_name="b"} 1\n'
    )
    assert metric_reading(once, RUNNING) == ("vllm:num_requests_running", 4.0)
    twice = "# TYPE vllm:num_requests_running gauge\n" + "vllm:num_requests_running 3\n" * 5
    reading = metric_reading(twice, RUNNING)
    assert isinstance(reading, str) and "more than once" in reading
    assert metric_reading("other_metric 1\n", RUNNING) is None


def test_a_batch_is_shown_by_the_rise_over_the_idle_count_and_no_more() -> None:
    slots = "/slots"
    held = running_proof([(slots, 0)], [(slots, 1), (slots, 3)], 3, 3)
    assert held.shown and held.facts["server_running_before"] == 0
    # another client's request running throughout: two more of ours still show a batch
    assert running_proof([(slots, 1)], [(slots, 3)], 3, 3).shown
    always = running_proof([(slots, 4)], [(slots, 4), (slots, 4)], 3, 3)
    assert not always.shown and "beyond the 4 running before" in always.how
    beyond = running_proof([(slots, 0)], [(slots, 449388)], 2, 2)
    assert not beyond.shown and "more than the 2 sent from here" in beyond.how
    cut = running_proof([(slots, 0)], [(slots, 3), "its /metrics was cut short"], 3, 3)
    assert not cut.shown and cut.how.startswith("its /metrics was cut short")
    assert not running_proof([], [(slots, 3)], 3, 3).shown  # no idle count to rise over
    assert "no running-request count" in running_proof([], [], 3, 3).how


def test_draft_counts_are_bounded_by_the_tokens_generated() -> None:
    assert draft_proof([(8, 5, 12), (4, 3, 12)], None).how == (
        "the server accepted 8 of 12 drafted tokens"
    )
    claimed = draft_proof([(100, 100, 6), (100, 100, 6)], None)
    assert not claimed.shown and "100 of 100 drafted tokens accepted for a 6-token" in claimed.how
    assert not draft_proof([(200, 5, 6)], 16).shown  # 16 drafts a step at most: 96 for 6
    assert draft_proof([(90, 5, 6)], 16).shown
    assert not draft_proof([(0, 0, 6)], None).shown


def test_a_bare_client_answer_is_a_timing_only_when_it_is_one_completion() -> None:
    answer = json.dumps({"choices": [{"text": " Hi"}], "usage": {"completion_tokens": 6}})
    assert bare_answer_fault(200, answer.encode(), 0.3, 60, 6) == ""
    slow = bare_answer_fault(200, b'data: {"choices": []}\n\n' * 10, 60.31, 60, 6)
    assert "still sending its answer to one 6-token request" in slow
    assert "4 MiB" in bare_answer_fault(200, b"x" * BARE_ANSWER_BYTES, 0.5, 60, 6)
    assert "not one JSON object" in bare_answer_fault(200, b"data: {}\n\n", 0.5, 60, 6)
    over = json.dumps({"choices": [], "usage": {"completion_tokens": 600}}).encode()
    assert "generated 600 tokens" in bare_answer_fault(200, over, 0.5, 60, 6)
    assert "HTTP 500" in bare_answer_fault(500, b"{}", 0.5, 60, 6)


def test_metrics_are_read_by_name_summed_over_labels() -> None:
    text = (
        "# HELP vllm:num_requests_running Number of requests\n"
        'vllm:num_requests_running{model_name="a"} 3.0\n'
        'vllm:num_requests_running{model_name="b"} 1\n'
        'vllm:prefix_cache_hits_total{model_name="a"} 120\n'
        "vllm:other 5\nbroken line\nvllm:num_requests_running nan\n"
    )
    assert first_of(metric_values(text, RUNNING), RUNNING) == ("vllm:num_requests_running", 4.0)
    assert first_of(metric_values(text, CACHE_HITS), CACHE_HITS) == (
        "vllm:prefix_cache_hits_total",
        120.0,
    )
    assert first_of(metric_values("", RUNNING), RUNNING) is None


def test_slots_overlap_and_busy_time() -> None:
    assert slots_processing([{"is_processing": True}, {"is_processing": False}, {}]) == 1
    assert slots_processing({"slots": 2}) is None
    spans = [(0.0, 2.0), (1.0, 3.0), (1.5, 1.6), (5.0, 6.0)]
    assert overlap(spans) == 3
    assert busy_time(spans) == pytest.approx(4.0)
    assert overlap([]) == 0 and busy_time([]) == 0.0


def test_property_names_are_checked() -> None:
    assert check_properties([]) == PROPERTIES
    assert check_properties(["speculation", "run-to-run"]) == ("run-to-run", "speculation")
    with pytest.raises(UnknownProperty, match="no property named 'batch'"):
        check_properties(["batch"])


def test_settings_refuse_nothing_to_run() -> None:
    with pytest.raises(PromptError, match="-n must be at least 1"):
        Settings(runs=0).check()
    with pytest.raises(PromptError, match="--batch-size"):
        Settings(batch=1).check()


def certificate(results: list) -> dict:
    subject = {"kind": "server", "engine": "vllm", "endpoint": "http://127.0.0.1:1"}
    cost = {"wall_seconds": 2.0, "requests": 3, "tokens": 30, "tokens_per_second": 15.0}
    return Certificate(subject, {}, results, cost).as_dict()


def test_the_certificate_claims_no_more_than_was_shown() -> None:
    pairs = [Compared("p", run([1, 2]), run([1, 2]))]
    held = judge(BATCH, pairs, SHOWN)
    untested = not_tested(SPECULATION, "no second endpoint")
    data = certificate([held, untested])
    assert data["outcome"] == (
        "every tested property holds (batch-invariance); not tested: speculation"
    )
    text = certificate_text(data)
    assert "HOLDS" in text and "NOT TESTED" in text and "no second endpoint" in text
    assert "deterministic" not in text.lower()
    assert "temperature 0 alone" in text
    assert certificate([untested])["outcome"].startswith("nothing was shown")
    broken = judge(BATCH, [Compared("p", run([1, 2]), run([1, 3]))], SHOWN)
    assert certificate([broken, held])["outcome"] == "broken: batch-invariance"


def test_the_html_escapes_what_servers_said() -> None:
    hostile = not_tested(SPECULATION, "<script>alert(1)</script>\x1b[31m")
    page = certificate_html(certificate([hostile]))
    assert "<script>alert" not in page and "&lt;script&gt;" in page
    assert 'data-verdict="not tested"' in page
    assert "\x1b" not in certificate_text(certificate([hostile]))


def test_the_json_is_plain_json() -> None:
    data = certificate([judge(BATCH, [Compared("p", run([1]), run([1]))], SHOWN)])
    assert json.loads(json.dumps(data, allow_nan=False))["properties"][0]["verdict"] == HOLDS


@pytest.mark.parametrize(
    ("arguments", "said"),
    [
        (["--property", "nope"], "no property named 'nope'"),
        # the ranges the options state are the ones they check: -1 and 0 read alike
        (["-n", "0"], "must be from 1 to 1000, got 0"),
        (["-n", "-1"], "must be from 1 to 1000, got -1"),
        (["--batch-size", "1"], "must be from 2 to 64, got 1"),
        (["--fillers", "0"], "must be from 1 to 127, got 0"),
        (["--endpoint", "a", "--endpoint", "b", "--endpoint", "c"], "--endpoint given 3 times"),
        (["--require", "nope"], "no property named 'nope'"),
        # a pairs file given without --pair is still read, as run and explain read it
        (
            ["--pairs", "/nonexistent/pairs.toml", "--endpoint", "http://127.0.0.1:9"],
            "pairs file not found: /nonexistent/pairs.toml",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(arguments: list[str], said: str, capsys) -> None:
    assert main(["certify", *arguments]) == 2
    captured = capsys.readouterr()
    assert said in captured.err
    assert captured.err.count("\n") == 1 and captured.out == ""


def test_a_malformed_pairs_file_is_refused_without_pair(tmp_path, capsys) -> None:
    pairs = tmp_path / "pairs.toml"
    pairs.write_text("[pairs.broken\n", encoding="utf-8")
    arguments = ["certify", "--pairs", str(pairs), "--endpoint", "http://127.0.0.1:9"]
    assert main(arguments) == 2
    captured = capsys.readouterr()
    assert str(pairs) in captured.err and "cannot connect" not in captured.err
    assert captured.err.count("\n") == 1 and captured.out == ""
