"""The measurement the project exists for, on the real bundled model.

Prompt by prompt over the bundled divergence prompts x 96 tokens, until ubatch
512-vs-2 and n-gram speculation have each forked on one (a batch of another width runs
other kernels on every CPU llama.cpp supports; where the forks land differs from CPU to
CPU, so only that they happen within the first 10 prompts is asserted), and on at least
the first 3: the plain lane run twice agrees with itself (in-process lanes are
deterministic), and each fork found is the first token id that differs, checked here
without specdiff's comparison. The forks are printed as seen.
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
AT_MOST = 10
AT_LEAST = 3


def fork_index(first: list, second: list) -> int | None:
    fork = compare(first, second).fork
    return None if fork is None else fork.index


@pytest.fixture(scope="module")
def prompts() -> list[str]:
    entries = load_prompts("divergence")
    assert len(entries) >= 12
    return [entry["prompt"] for entry in entries][:AT_MOST]


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
    assert pairs["ubatch"].a == pairs["spec-vs-plain"].b  # one plain lane serves both pairs
    pool = ModelPool()
    names = ("plain", "again", "ubatch", "spec")
    settings = (pairs["ubatch"].a, pairs["ubatch"].a, pairs["ubatch"].b, pairs["spec-vs-plain"].a)
    lanes = {name: LocalLane(lane, "a", pool) for name, lane in zip(names, settings)}
    ubatch_forks: list[int | None] = []
    spec_forks: list[int | None] = []
    try:
        for done, prompt in enumerate(prompts, 1):
            runs = {
                name: list(lane.generate(lane.tokenize(prompt), MAX_TOKENS))
                for name, lane in lanes.items()
            }
            assert fork_index(runs["plain"], runs["again"]) is None
            ubatch_forks.append(fork_index(runs["plain"], runs["ubatch"]))
            spec_forks.append(fork_index(runs["spec"], runs["plain"]))
            assert ubatch_forks[-1] == first_difference(runs["plain"], runs["ubatch"])
            assert spec_forks[-1] == first_difference(runs["spec"], runs["plain"])
            if done >= AT_LEAST and _forked(ubatch_forks) and _forked(spec_forks):
                break
    finally:
        for lane in lanes.values():
            lane.close()
        pool.close()
    print(f"\nubatch Q4_K_M forked at {ubatch_forks} over {len(ubatch_forks)} prompts")
    print(f"spec-vs-plain Q4_K_M forked at {spec_forks} over {len(spec_forks)} prompts")
    assert _forked(ubatch_forks), f"ubatch never forked in {AT_MOST} prompts"
    assert _forked(spec_forks), f"speculation never forked in {AT_MOST} prompts"


def _forked(found: list[int | None]) -> bool:
    return any(index is not None for index in found)
