"""The in-process engine against llama-cpp-python's own generate loop, on the real model."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from specdiff.engine.llama.lane import LocalLane
from specdiff.errors import ModelError, PromptError
from specdiff.lanes import Lane
from specdiff.steps import text_of
from tests.conftest import load_prompts, repacked

if TYPE_CHECKING:
    from llama_cpp import Llama

pytestmark = pytest.mark.model

TOKENS = 48


def llama_generate(llm: Llama, prompt: list[int], count: int) -> list[int]:
    llm.reset()  # no prefix reuse between prompts: that is a cache hit, another lane
    out: list[int] = []
    for token in llm.generate(prompt, temp=0.0, reset=True):
        out.append(token)
        if len(out) >= count or llm.token_eos() == token:
            break
    return out


def lane_tokens(local: LocalLane, prompt: list[int], count: int = TOKENS) -> list[int]:
    return [step.token_id for step in local.generate(prompt, count)]


@pytest.fixture(scope="module")
def plain_lane() -> LocalLane:
    local = LocalLane(Lane(), "a")
    yield local
    local.close()


def assert_lane_equals_llama(local: LocalLane, model_path: Path, prompts: list[str]) -> None:
    """`Llama` built with the lane's settings generates the lane's tokens."""
    # deferred: collecting the fast tier must not load llama.cpp
    from llama_cpp import Llama

    lane = local.lane
    with repacked(local.model.repack):  # the kernels the lane ran (the probe's choice)
        llm = Llama(
            str(model_path),
            n_ctx=lane.n_ctx,
            n_batch=lane.n_batch,
            n_ubatch=lane.n_ubatch,
            n_threads=lane.threads,
            n_threads_batch=lane.threads_batch or lane.threads,
            verbose=False,
        )
    try:
        for prompt in prompts:
            tokens = local.tokenize(prompt)
            ours = lane_tokens(local, tokens)
            assert ours == llama_generate(llm, tokens, len(ours)), prompt
    finally:
        llm.close()


def test_plain_lane_equals_llama_generate_on_ten_prompts(
    plain_lane: LocalLane, model_path: Path
) -> None:
    prompts = [p["prompt"] for p in load_prompts("divergence")][:6]
    prompts += [p["prompt"] for p in load_prompts("open")][:4]
    assert_lane_equals_llama(plain_lane, model_path, prompts)


def test_ubatch_two_lane_equals_llama_with_those_settings(model_path: Path) -> None:
    local = LocalLane(Lane(n_batch=2, n_ubatch=2), "b")
    try:
        prompts = [p["prompt"] for p in load_prompts("divergence")][:3]
        assert_lane_equals_llama(local, model_path, prompts)
    finally:
        local.close()


@pytest.mark.parametrize(
    "lane",
    [
        Lane(),
        Lane(speculation="ngram"),
        Lane(speculation="ngram", spec_adaptive=False, spec_drafts=6),
        Lane(speculation="draft"),
        Lane(prefix="cached"),
        Lane(n_batch=2, n_ubatch=2),
    ],
    ids=["plain", "ngram", "ngram-fixed", "draft", "cached", "ubatch2"],
)
def test_each_lane_is_deterministic(lane: Lane) -> None:
    local = LocalLane(lane, "a")
    try:
        for entry in load_prompts("repetitive")[:1] + load_prompts("divergence")[:1]:
            tokens = local.tokenize(entry["prompt"])
            first = list(local.generate(tokens, TOKENS))
            second = list(local.generate(tokens, TOKENS))
            assert [s.token_id for s in first] == [s.token_id for s in second]
            assert [s.top for s in first] == [s.top for s in second]
    finally:
        local.close()


def test_steps_carry_top_k_margin_and_bytes(plain_lane: LocalLane) -> None:
    tokens = plain_lane.tokenize("The capital of France is")
    steps = list(plain_lane.generate(tokens, 12))
    assert len(steps) == 12
    for index, step in enumerate(steps):
        assert step.index == index and step.lane == "a"
        assert len(step.top) == 8
        assert step.top[0].token_id == step.token_id
        logits = [c.logit for c in step.top]
        assert logits == sorted(logits, reverse=True)
        assert step.margin == logits[0] - logits[1] >= 0
        assert step.piece == plain_lane.model.piece(step.token_id)
        assert not step.drafted and step.verify_width == (len(tokens) if index == 0 else 1)
    assert steps[0].timestamp <= steps[-1].timestamp


def test_speculative_lane_drafts_accepts_and_rolls_back() -> None:
    local = LocalLane(Lane(speculation="ngram", spec_drafts=4), "a")
    try:
        entry = load_prompts("repetitive")[0]
        steps = list(local.generate(local.tokenize(entry["prompt"]), 80))
        generation = local.generation
        assert generation.drafted > 0 and 0 < generation.accepted <= generation.drafted
        assert sum(step.drafted for step in steps) == generation.accepted
        assert max(step.verify_width for step in steps) > 1
        # rejected drafts were removed from the KV memory: its next position is the length
        assert generation.stop_reason == "length"
        lib = __import__("specdiff.engine.runtime", fromlist=["llama"]).llama()
        highest = lib.llama_memory_seq_pos_max(local.context.memory, 0)
        prompt_length = generation.prompt_tokens
        # the last emitted token is never in the memory; all before it are, exactly once
        assert highest == prompt_length + len(steps) - 2
    finally:
        local.close()


def test_stop_on_eos_length_and_stop_string(plain_lane: LocalLane) -> None:
    tokens = plain_lane.tokenize("Count: one, two, three, four,")
    steps = list(plain_lane.generate(tokens, 30, stop=[b"six"]))
    assert plain_lane.generation.stop_reason == "stop"
    assert "six" in text_of(steps)
    steps = list(plain_lane.generate(tokens, 5))
    assert len(steps) == 5 and plain_lane.generation.stop_reason == "length"


def test_cached_prefix_mode_decodes_the_prefix_separately(plain_lane: LocalLane) -> None:
    local = LocalLane(Lane(prefix="cached", prefix_tokens=5), "a")
    try:
        tokens = local.tokenize("The main difference between TCP and UDP is")
        list(local.generate(tokens, 4))
        assert local.generation.prefix_tokens == 5
        with pytest.raises(PromptError, match="cached prefix of 50 tokens"):
            LocalLane(Lane(prefix="cached", prefix_tokens=50), "a").prefix_length(tokens)
    finally:
        local.close()


def test_prefix_text_must_be_a_token_prefix() -> None:
    local = LocalLane(Lane(prefix="cached", prefix_text="The main difference"), "a")
    try:
        tokens = local.tokenize("The main difference between TCP and UDP is")
        assert local.prefix_length(tokens) == len(local.tokenize("The main difference"))
        with pytest.raises(PromptError, match="prefix_text does not tokenize as a prefix"):
            local.prefix_length(local.tokenize("Something else entirely"))
    finally:
        local.close()


def test_prompt_longer_than_n_ctx() -> None:
    local = LocalLane(Lane(n_ctx=32), "a")
    try:
        tokens = local.tokenize("word " * 40)
        with pytest.raises(PromptError, match="longer than lane a's n_ctx"):
            list(local.generate(tokens, 4))
        with pytest.raises(PromptError, match="does not fit"):
            list(local.generate(local.tokenize("short prompt"), 30))
    finally:
        local.close()


def test_draft_model_with_another_vocabulary_is_refused(tmp_path: Path, model_path: Path) -> None:
    from tests.fixtures import model_with_changed_token

    other = model_with_changed_token(model_path, tmp_path / "other-vocab.gguf")
    with pytest.raises(ModelError, match=r"different vocabulary .*\(token \d+ is"):
        LocalLane(Lane(speculation="draft", draft_model=str(other)), "a")


def test_probe_gives_rank_and_logit_of_any_token(plain_lane: LocalLane) -> None:
    tokens = plain_lane.tokenize("The capital of France is")
    generator = plain_lane.generate(tokens, 3)
    step = next(generator)
    inside = step.top[3].token_id
    (probe_inside, probe_far) = plain_lane.probe(step.index, [inside, 5000])
    assert (probe_inside.rank, probe_inside.logit) == (4, step.top[3].logit)
    assert probe_far.rank > 8 and probe_far.logit <= step.top[-1].logit
    generator.close()
