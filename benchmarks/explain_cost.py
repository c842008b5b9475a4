"""What `specdiff explain`'s layer comparison (part 2) costs next to one decode of the
prefix, measured side by side.

One decode of the prefix: a lane's own greedy loop from the prompt up to the fork
step, as `specdiff run` decodes it (the prompt in one batch, then token by token or
in verify batches). Part 2: the same lane tapped at the fork step, which replays that
loop twice (once to find the decode call, once with the eval callback armed) and
copies every named tensor's column. The target is at most 2 decodes of the prefix per
lane, plus the copying. Rounds alternate the two, so a busy machine slows both alike.

    python3 benchmarks/explain_cost.py --rounds 3
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from specdiff.engine.llama.context import ModelPool
from specdiff.engine.llama.lane import LocalLane
from specdiff.engine.llama.taps import tap_step
from specdiff.engine.pairrun import PairRun
from specdiff.lanes import presets
from specdiff.prompts import DEFAULT_PROMPT

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import median  # noqa: E402 - this folder is no package


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--pair", default="spec-vs-plain")
    args = parser.parse_args()
    pair = presets()[args.pair]
    pool = ModelPool()
    try:
        with PairRun(pair, pool=pool) as run:
            result = run.run(DEFAULT_PROMPT, args.max_tokens)
        fork = result.comparison.fork
        step = fork.index if fork is not None else args.max_tokens - 1
        print(f"{args.pair}, default prompt: step {step} ({'fork' if fork else 'no fork'})")
        for lane_id, lane in (("a", pair.a), ("b", pair.b)):
            plain, tapped, ratios, passes = [], [], [], []
            local = LocalLane(lane, lane_id, pool)
            try:
                for _ in range(args.rounds):
                    plain.append(prefix_seconds(local, DEFAULT_PROMPT, args.max_tokens, step))
                    began = time.perf_counter()
                    taps = tap_step(lane, lane_id, DEFAULT_PROMPT, args.max_tokens, step, pool)
                    tapped.append(time.perf_counter() - began)
                    ratios.append(tapped[-1] / plain[-1])
                    passes.append(taps.seconds)
            finally:
                local.close()
            first = median([p[0] for p in passes])
            second = median([p[1] for p in passes])
            print(
                f"lane {lane_id}: one decode of the prefix {median(plain):6.3f} s, "
                f"part 2 {median(tapped):6.3f} s (finding pass {first:.3f} s, tapped pass "
                f"{second:.3f} s), ratio of medians {median(tapped) / median(plain):5.2f}, "
                f"median of per-round ratios {median(ratios):5.2f} (target <= 2 + copying)"
            )
    finally:
        pool.close()


if __name__ == "__main__":
    main()
