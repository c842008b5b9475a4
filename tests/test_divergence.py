"""The measurement the project exists for, on the real bundled model.

Over the first 10 bundled divergence prompts x 96 tokens (forks measured on this
model came at tokens 4 to 45; the whole set at 200 tokens took four minutes of the
suite's twenty): ubatch 512-vs-2 and n-gram
speculation each fork on at least one prompt, and the Q8_0 variant forks under ubatch
on fewer prompts than Q4_K_M. Nothing here is tuned: the counts are printed as seen.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from specdiff.compare import compare
from specdiff.engine.llama.context import ModelPool
from specdiff.engine.llama.lane import LocalLane
from specdiff.lanes import presets
from tests.conftest import load_prompts

pytestmark = pytest.mark.model

MAX_TOKENS = 96
PROMPTS = 10


def run_lane(lane, prompts: list[str], pool: ModelPool) -> list[list]:
    local = LocalLane(lane, "a", pool)
    try:
        return [list(local.generate(local.tokenize(prompt), MAX_TOKENS)) for prompt in prompts]
    finally:
        local.close()


def forks(first: list[list], second: list[list]) -> list[int | None]:
    out = []
    for a, b in zip(first, second):
        fork = compare(a, b).fork
        out.append(None if fork is None else fork.index)
    return out


@pytest.fixture(scope="module")
def prompts() -> list[str]:
    entries = load_prompts("divergence")
    assert len(entries) >= 12
    return [entry["prompt"] for entry in entries][:PROMPTS]


def test_ubatch_and_speculation_fork_and_q8_forks_less(prompts: list[str]) -> None:
    pairs = presets()
    pool = ModelPool()
    try:
        plain = run_lane(pairs["ubatch"].a, prompts, pool)  # == spec-vs-plain's lane b
        assert pairs["ubatch"].a == pairs["spec-vs-plain"].b
        ubatch_forks = forks(plain, run_lane(pairs["ubatch"].b, prompts, pool))
        spec_forks = forks(run_lane(pairs["spec-vs-plain"].a, prompts, pool), plain)
        q8_forks = forks(
            run_lane(replace(pairs["ubatch"].a, quant="q8_0"), prompts, pool),
            run_lane(replace(pairs["ubatch"].b, quant="q8_0"), prompts, pool),
        )
    finally:
        pool.close()

    def count(found: list[int | None]) -> int:
        return sum(index is not None for index in found)

    n = len(prompts)
    print(f"\nubatch Q4_K_M: {count(ubatch_forks)} of {n} forked at {ubatch_forks}")
    print(f"spec-vs-plain Q4_K_M: {count(spec_forks)} of {n} forked at {spec_forks}")
    print(f"ubatch Q8_0: {count(q8_forks)} of {n} forked at {q8_forks}")
    assert count(ubatch_forks) >= 1
    assert count(spec_forks) >= 1
    assert count(q8_forks) < count(ubatch_forks)
