"""What `specdiff explain`'s layer comparison (part 2) costs next to one decode of the
prefix, measured side by side.

One decode of the prefix: a lane's own greedy loop from the prompt up to the fork
step, as `specdiff run` decodes it (the prompt in one batch, then token by token or
in verify batches). Part 2: the same lane tapped at the fork step, which replays that
loop twice (once to find the decode call, once with the eval callback armed) and
copies the step's column of every node of its graph, and the KV cells it reads. The
target is at most 2 decodes of the prefix per lane, plus the copying. For scale, each
round also taps only the named per-token activations (the narrower tap), so the cost
of reading every node shows beside it. Rounds alternate the three, so a busy machine
slows all alike.

    python3 benchmarks/explain_cost.py --rounds 3
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from specdiff.engine.llama.context import ModelPool
from specdiff.engine.llama.lane import LocalLane
from specdiff.engine.llama.taps import TAPPED, tap_step
from specdiff.engine.pairrun import PairRun
from specdiff.lanes import Lane, LaneId, presets
from specdiff.prompts import DEFAULT_PROMPT

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import median  # noqa: E402 - this folder is no package

Names = frozenset[str] | None


def prefix_seconds(local: LocalLane, prompt: str, max_tokens: int, step: int) -> float:
    """One decode of the prefix: the lane's loop from the prompt to `step`."""
    began = time.perf_counter()
    generator = local.generate(local.tokenize(prompt), max_tokens)
    try:
        for produced in generator:
            if produced.index == step:
                break
    finally:
        generator.close()
    return time.perf_counter() - began


def timed_taps(
    lane: Lane, lane_id: LaneId, step: int, max_tokens: int, pool: ModelPool, names: Names
) -> tuple[float, tuple[float, float]]:
    """Part 2 for one lane: its wall time, and its finding and tapped passes'."""
    began = time.perf_counter()
    taps = tap_step(lane, lane_id, DEFAULT_PROMPT, max_tokens, step, pool, names=names)
    return time.perf_counter() - began, taps.seconds


def measure(lane: Lane, lane_id: LaneId, step: int, rounds: int, max_tokens: int) -> str:
    """One lane's line: the prefix, part 2 tapping every node, and the narrower tap."""
    pool = ModelPool()
    local = LocalLane(lane, lane_id, pool)
    plain: list[float] = []
    every: list[tuple[float, tuple[float, float]]] = []
    named: list[float] = []
    try:
        for _ in range(rounds):
            plain.append(prefix_seconds(local, DEFAULT_PROMPT, max_tokens, step))
            every.append(timed_taps(lane, lane_id, step, max_tokens, pool, None))
            named.append(timed_taps(lane, lane_id, step, max_tokens, pool, TAPPED)[0])
            # each round as it ends: on a loaded machine one slow round shows as such
            print(
                f"  lane {lane_id} round: prefix {plain[-1]:.3f} s, every node {every[-1][0]:.3f}"
                f" s (passes {every[-1][1][0]:.3f} + {every[-1][1][1]:.3f} s), named only "
                f"{named[-1]:.3f} s",
                flush=True,
            )
    finally:
        local.close()
        pool.close()
    prefix, whole = median(plain), median([e[0] for e in every])
    first, second = median([e[1][0] for e in every]), median([e[1][1] for e in every])
    ratios = [e[0] / p for e, p in zip(every, plain)]
    return (
        f"lane {lane_id}: one decode of the prefix {prefix:6.3f} s, part 2 {whole:6.3f} s "
        f"(finding pass {first:.3f} s, tapped pass {second:.3f} s), ratio of medians "
        f"{whole / prefix:5.2f}, median of per-round ratios {median(ratios):5.2f} (target "
        f"<= 2 + copying); named activations only {median(named):6.3f} s, ratio "
        f"{median(named) / prefix:5.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--pair", default="spec-vs-plain")
    args = parser.parse_args()
    pair = presets()[args.pair]
    with PairRun(pair) as run:
        result = run.run(DEFAULT_PROMPT, args.max_tokens)
    fork = result.comparison.fork
    step = fork.index if fork is not None else args.max_tokens - 1
    print(f"{args.pair}, default prompt: step {step} ({'fork' if fork else 'no fork'})")
    lanes: tuple[tuple[LaneId, Lane], ...] = (("a", pair.a), ("b", pair.b))
    for lane_id, lane in lanes:
        print(measure(lane, lane_id, step, args.rounds, args.max_tokens), flush=True)


if __name__ == "__main__":
    main()
