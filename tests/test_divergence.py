"""The measurement the project exists for, on the real bundled model.

Over the first 10 bundled divergence prompts x 96 tokens: the plain lane run twice
agrees with itself on every prompt (in-process lanes are deterministic), while ubatch
512-vs-2 and n-gram speculation each fork on at least one (a batch of another width runs
other kernels on every CPU llama.cpp supports; where the forks land differs from CPU to
CPU, so only that they happen is asserted). Each fork found is the first token id that
differs, checked here without specdiff's comparison. The counts are printed as seen.
"""

from __future__ import annotations

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


def first_difference(a: list, b: list) -> int | None:
    """Where two runs' token ids first differ, by hand; None where one run is the
    other's beginning (the same tokens, another length, is no fork)."""
    for index, (x, y) in enumerate(zip(a, b)):
        if x.token_id != y.token_id:
            return index
    return None


def test_ubatch_and_speculation_fork_and_the_plain_lane_agrees_with_itself(
    prompts: list[str],
) -> None:
    pairs = presets()
    pool = ModelPool()
    try:
        plain = run_lane(pairs["ubatch"].a, prompts, pool)  # == spec-vs-plain's lane b
        assert pairs["ubatch"].a == pairs["spec-vs-plain"].b
        again = run_lane(pairs["ubatch"].a, prompts, pool)
        ubatch = run_lane(pairs["ubatch"].b, prompts, pool)
        spec = run_lane(pairs["spec-vs-plain"].a, prompts, pool)
    finally:
        pool.close()
    ubatch_forks, spec_forks = forks(plain, ubatch), forks(spec, plain)

    def count(found: list[int | None]) -> int:
        return sum(index is not None for index in found)

    n = len(prompts)
    print(f"\nubatch Q4_K_M: {count(ubatch_forks)} of {n} forked at {ubatch_forks}")
    print(f"spec-vs-plain Q4_K_M: {count(spec_forks)} of {n} forked at {spec_forks}")
    assert forks(plain, again) == [None] * n
    assert ubatch_forks == [first_difference(a, b) for a, b in zip(plain, ubatch)]
    assert spec_forks == [first_difference(a, b) for a, b in zip(spec, plain)]
    assert count(ubatch_forks) >= 1
    assert count(spec_forks) >= 1
