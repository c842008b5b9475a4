"""Margins for the drafts a llama-server accepted: its stream gives them no probabilities,
and a llama-server lane scores them again, teacher-forced, on the same server. The
numbers must be the model's own: equal to an in-process lane's teacher-forced margins on
the same tokens within the numeric noise measured between the two on the steps the
server scored itself."""

from __future__ import annotations

import json
import statistics
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from specdiff.compare import MEASURED_NOISE_P99
from specdiff.engine.server.process import (
    LlamaServer,
    find_llama_server,
    spec_types,
    usable_option,
)
from specdiff.engine.server.rescore import RESCORED_BY, needs_rescoring
from specdiff.lanes import Lane, Pair
from specdiff.prompts import load as load_prompts
from specdiff.sessions.codec import step_from, step_record
from specdiff.steps import Candidate, TokenStep
from tests.in_process import specdiff_here
from tests.llama_server_faults import DRAFTED, FIRST, RESCORING_FAULTS, llama_server_faults

PROMPTS = [entry["prompt"] for entry in load_prompts("repetitive")[:2]]
MAX_TOKENS = 24


def export(path: Path, fmt: str) -> subprocess.CompletedProcess[str]:
    """`specdiff export PATH --format FMT`, its report on stdout."""
    return specdiff_here("export", str(path), "--format", fmt)


def _step(top: tuple[Candidate, ...], drafted: bool, source: str = "") -> TokenStep:
    return TokenStep("a", 0, top[0].token_id, b"x", top, drafted, 1, 0.0, source=source)


ONE = (Candidate(5, 0.0, b"x"),)
TWO = (Candidate(5, -0.1, b"x"), Candidate(6, -2.0, b"y"))


@pytest.mark.parametrize(
    ("top", "drafted", "source", "expected"),
    [
        (ONE, True, "", True),  # an accepted draft the server gave no probabilities
        (ONE, False, "", False),  # the server's own step (top-1 only: top_k 1 is refused)
        (TWO, True, "", False),  # a draft that came with its probabilities
        (ONE, True, RESCORED_BY, False),  # rescored already
    ],
)
def test_only_unscored_drafts_need_rescoring(
    top: tuple[Candidate, ...], drafted: bool, source: str, expected: bool
) -> None:
    assert needs_rescoring(_step(top, drafted, source)) is expected


@pytest.mark.parametrize("source", ["", RESCORED_BY, "rescored by \\x1b]52 escaped"])
def test_a_steps_source_survives_the_session_codec(source: str) -> None:
    step = _step(TWO, True, source)
    record = step_record(step)
    assert ("source" in record) is bool(source)  # old readers see no new field on old steps
    assert step_from(record) == step


@pytest.mark.parametrize("value", [5, ["x"], None, "x" * 201])
def test_a_bad_source_is_refused_naming_the_field(value: object) -> None:
    record = step_record(_step(TWO, True)) | {"source": value}
    with pytest.raises(ValueError, match="source"):
        step_from(record)


@pytest.fixture(scope="module")
def draft_server(model_path: Path, q8_model_path: Path) -> Iterator[str]:
    """One llama-server on the bundled model with its Q8_0 variant drafting for it."""
    binary = find_llama_server()
    model_flag = usable_option(binary, "--spec-draft-model", "--model-draft")
    kind = "draft-simple" if "draft-simple" in spec_types(binary) else "draft"
    arguments = ["--threads", "2", "--parallel", "1", "--spec-type", kind]
    assert model_flag is not None
    with LlamaServer(binary, model_path, [*arguments, model_flag, str(q8_model_path)]) as server:
        yield server.url


def _server_steps(url: str, rescore: str) -> list[list[TokenStep]]:
    from specdiff.engine.server.lane import ServerLane  # deferred: it loads llama_cpp

    lane = ServerLane(
        Lane(backend="server", api="llama-server", endpoint=url, rescore=rescore, top_k=8), "a"
    )
    try:
        return [list(lane.generate(prompt, MAX_TOKENS)) for prompt in PROMPTS]
    finally:
        lane.close()


@pytest.fixture(scope="module")
def rescored_runs(draft_server: str) -> list[list[TokenStep]]:
    """The server lane's steps on PROMPTS with rescore=auto (made once: each rescored
    draft is a request)."""
    return _server_steps(draft_server, "auto")


@pytest.mark.model
@pytest.mark.server
@pytest.mark.parametrize("rescore", ["auto", "off"])
def test_accepted_drafts_are_rescored_only_when_asked(
    draft_server: str, rescored_runs: list[list[TokenStep]], rescore: str
) -> None:
    runs = rescored_runs if rescore == "auto" else _server_steps(draft_server, rescore)
    drafted = [step for steps in runs for step in steps if step.drafted]
    assert drafted, "the Q8_0 variant drafting for its own base model had no draft accepted"
    if rescore == "off":
        assert all(len(step.top) == 1 and not step.source for step in drafted)
    else:
        assert all(step.source == RESCORED_BY and len(step.top) >= 2 for step in drafted)
    assert not any(step.source for steps in runs for step in steps if not step.drafted)


def _local_logits(steps: list[TokenStep], prompt: str, local: Any) -> list[dict[int, float]]:
    """The in-process lane's top-k logits at each step, teacher-forced on `steps`."""
    forced = [step.token_id for step in steps]
    local_steps = list(local.generate(local.tokenize(prompt), len(forced), forced=forced))
    return [{c.token_id: c.logit for c in step.top} for step in local_steps]


def _gap(top: tuple[Candidate, ...], logits: dict[int, float]) -> float | None:
    """|Δ| between the server's and the local lane's top-1 minus top-2 gap, over the
    server's top two tokens (a log-probability difference is a logit difference)."""
    first, second = top[0], top[1]
    if first.token_id not in logits or second.token_id not in logits:
        return None
    local = logits[first.token_id] - logits[second.token_id]
    return abs((first.logit - second.logit) - local)


@pytest.mark.model
@pytest.mark.server
def test_rescored_margins_equal_an_in_process_lanes_within_the_measured_noise(
    rescored_runs: list[list[TokenStep]],
) -> None:
    from specdiff.engine.llama.lane import LocalLane  # deferred: it loads llama_cpp

    runs = rescored_runs
    local = LocalLane(Lane(threads=2), "b")
    rescored, scored = [], []
    try:
        for prompt, steps in zip(PROMPTS, runs):
            for step, logits in zip(steps, _local_logits(steps, prompt, local)):
                gap = _gap(step.top, logits)
                if gap is not None:
                    (rescored if step.source else scored).append(gap)
    finally:
        local.close()
    assert rescored and scored
    # the noise between this server and the engine where the server scored the step
    # itself; rescored steps must sit within it (or the ubatch noise, if larger)
    noise = max(max(scored), MEASURED_NOISE_P99)
    print(
        f"|Δmargin| server vs engine: own steps median {statistics.median(scored):.4f} max "
        f"{max(scored):.4f}; rescored drafts median {statistics.median(rescored):.4f} max "
        f"{max(rescored):.4f} (n={len(rescored)})"
    )
    assert max(rescored) <= noise
    assert statistics.median(rescored) <= 2 * statistics.median(scored) + 0.05


@pytest.mark.parametrize("fmt", ["md", "html", "json"])
def test_reports_say_where_a_forks_numbers_came_from_and_each_servers_setup(
    fmt: str, tmp_path: Path
) -> None:
    """A session whose fork falls on rescored drafts, both lanes on servers (one with its
    launch flags stated): the export names the rescoring at the fork and never takes
    greedy requests for determinism."""
    import copy

    from tests.hostile_corpus import FOOTER, HEADER, STEPS, dump

    header = copy.deepcopy(HEADER)
    server = {"backend": "server", "api": "llama-server", "endpoint": "http://127.0.0.1:9"}
    header["lanes"]["a"] |= server | {"server_flags": "--spec-type draft-simple"}
    header["lanes"]["b"] |= server
    steps = copy.deepcopy(STEPS)
    for step in steps:
        step["drafted"], step["source"] = True, RESCORED_BY
    path = tmp_path / "rescored.jsonl"
    path.write_bytes(dump([header, *steps, FOOTER]))
    done = export(path, fmt)
    assert done.returncode == 0, done.stderr
    if fmt == "json":
        lanes = json.loads(done.stdout)["lanes"]
        assert lanes["a"]["rescored_steps"] == [s["index"] for s in steps if s["lane"] == "a"]
        return
    assert f"Lane a at the fork: an accepted draft · {RESCORED_BY}" in done.stdout
    assert "server launched with: --spec-type draft-simple" in done.stdout
    assert "temperature 0 alone does not make a server deterministic" in done.stdout


@pytest.mark.model
@pytest.mark.server
@pytest.mark.parametrize("mode", ["ok", *RESCORING_FAULTS])
def test_hostile_rescoring_answers_leave_the_drafts_as_the_stream_sent_them(mode: str) -> None:
    """A server whose stream is good but whose rescoring answers are NaN, of the wrong
    types, out of the vocabulary, another pick, giant, silent or trickling: the lane ends
    with every step, the drafts as streamed (no margin, no source) and the reason kept,
    in bounded time. `ok` rescores both drafts: the faults are what leave them."""
    from specdiff.engine.server.lane import ServerLane  # deferred: it loads llama_cpp

    lane_timeout = 2
    with llama_server_faults(mode) as url:
        lane = ServerLane(
            Lane(
                backend="server",
                api="llama-server",
                endpoint=url,
                top_k=2,
                timeout=lane_timeout,
                retries=0,
            ),
            "a",
        )
        try:
            began = time.monotonic()
            steps = list(lane.generate("Name a colour.", 3))
            took = time.monotonic() - began
        finally:
            lane.close()
    assert [step.token_id for step in steps] == [FIRST, *DRAFTED]
    drafts = steps[1:]
    assert all(step.drafted for step in drafts)
    if mode == "ok":
        assert all(step.source == RESCORED_BY and len(step.top) == 2 for step in drafts)
        assert lane.rescoring.steps == 2 and not lane.rescoring.skipped
    else:
        assert all(not step.source and len(step.top) == 1 for step in drafts)
        assert (lane.rescoring.steps, lane.rescoring.skipped) == (0, 2)
        reasons = lane.rescoring.reasons
        assert reasons and all(reason.isprintable() for reason in reasons), reasons
    # one silent request is one lane timeout, then the drafts are left as they are
    assert took < 4 * lane_timeout + 5


@pytest.mark.model
@pytest.mark.server
def test_lanes_on_one_server_rescore_only_once_both_streams_have_ended(draft_server: str) -> None:
    """Both lanes on one server: no rescoring request is sent before the other lane's
    last token has arrived, and each lane's executed table counts what it rescored."""
    from specdiff.engine.pairrun import PairRun  # deferred: it loads llama_cpp

    lane = Lane(backend="server", api="llama-server", endpoint=draft_server, top_k=4)
    with PairRun(Pair("one-server", lane, lane)) as runner:
        list(runner.stream(PROMPTS[0], MAX_TOKENS))
        costs = {lane_id: runner.lanes[lane_id].rescoring for lane_id in ("a", "b")}
        result = runner.result
    assert result is not None
    outcomes = {"a": result.a, "b": result.b}
    assert any(cost.steps for cost in costs.values()), "no accepted draft was rescored"
    for lane_id, other in (("a", "b"), ("b", "a")):
        cost = costs[lane_id]
        # a lane whose drafts all came with probabilities sends no request (nothing is
        # skipped here, so one that sent any rescored something): then there is no time
        assert (cost.began is not None) == bool(cost.steps), (lane_id, cost)
        if cost.began is not None:
            assert cost.began >= max(step.timestamp for step in outcomes[other].steps)
        record = outcomes[lane_id].executed.get("rescoring", {})
        assert record.get("rescored", 0) == cost.steps
        assert record.get("skipped", 0) == cost.skipped == 0


@pytest.mark.parametrize("fmt", ["md", "html"])
@pytest.mark.parametrize(
    ("rescoring", "note"),
    [
        ({"rescored": 1, "skipped": 2, "reasons": ["HTTP 500: \x1b]0;busy\x07"]}, "2 of 3"),
        ({"rescored": 0, "skipped": 1}, "1 of 1"),
        ({"rescored": 3, "skipped": 0}, None),
        (None, None),
    ],
    ids=["some-skipped", "skipped-without-reason", "all-rescored", "not-recorded"],
)
def test_an_export_says_when_accepted_drafts_were_left_unrescored(
    fmt: str, rescoring: dict | None, note: str | None, tmp_path: Path
) -> None:
    import copy

    from tests.hostile_corpus import FOOTER, HEADER, STEPS, dump

    header = copy.deepcopy(HEADER)
    header["lanes"]["a"] |= {"backend": "server", "endpoint": "http://127.0.0.1:9"}
    if rescoring is not None:
        header["executed"]["a"]["rescoring"] = rescoring
    path = tmp_path / "session.jsonl"
    path.write_bytes(dump([header, *STEPS, FOOTER]))
    done = export(path, fmt)
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout
    said = [line for line in done.stdout.splitlines() if "accepted drafts not rescored" in line]
    if note is None:
        assert not said
    else:
        assert len(said) == 1 and note in said[0] and "Lane a" in said[0]
