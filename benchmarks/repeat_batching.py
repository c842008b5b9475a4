"""`repeat` runs one at a time vs continuously batched, side by side in one process.

The same N greedy runs of one prompt (the default prompt, --max-tokens each): first
each alone in its own decode calls (a batch of 1, as a plain lane decodes), then up to
--batch of them in flight in one KV memory, a new run entering as one ends and taking
the prompt's cells and first pick from one decode of the prompt. On 2 cores a batch of
16 or 32 stays under 3x: their rows still pay most of Gemma's 262k-row output projection
each. Rounds
alternate the two so both see the same machine state. Prints the wall time of each and
the speedup (target >= 3x), and the unique completions of each way.

    python benchmarks/repeat_batching.py [--runs 256] [--max-tokens 32] [--batch 64] [--rounds 1]
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import median  # noqa: E402

from specdiff.engine.llama.batched import BatchedLane, BatchedRun  # noqa: E402
from specdiff.engine.llama.context import ModelPool  # noqa: E402
from specdiff.lanes import Lane  # noqa: E402
from specdiff.prompts import DEFAULT_PROMPT  # noqa: E402


def timed(lane: BatchedLane, runs: int, max_tokens: int) -> tuple[float, int]:
    """Seconds for `runs` runs on `lane`, and how many distinct completions they gave."""
    ended: dict[int, BatchedRun] = {}
    began = time.perf_counter()
    lane.run_continuous(lane.tokenize(DEFAULT_PROMPT), runs, max_tokens, ended.__setitem__)
    seconds = time.perf_counter() - began
    return seconds, len({tuple(run.token_ids) for run in ended.values()})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    lane = Lane()
    pool = ModelPool()  # both ways share the loaded weights
    cancel = threading.Event()
    one_at_a_time = BatchedLane(lane, 0, pool, cancel=cancel)
    batched = BatchedLane(lane, args.batch - 1, pool, cancel=cancel)
    alone: list[float] = []
    together: list[float] = []
    try:
        for _ in range(args.rounds):
            seconds, unique_alone = timed(one_at_a_time, args.runs, args.max_tokens)
            alone.append(seconds)
            seconds, unique_batched = timed(batched, args.runs, args.max_tokens)
            together.append(seconds)
    finally:
        one_at_a_time.close()
        batched.close()
        pool.close()
    sequential, continuous = median(alone), median(together)
    print(f"{args.runs} runs x {args.max_tokens} tokens, median of {args.rounds} round(s)")
    print(f"  one at a time:        {sequential:8.1f} s  ({unique_alone} unique)")
    print(f"  up to {args.batch:>3} in flight: {continuous:8.1f} s  ({unique_batched} unique)")
    print(f"  speedup: {sequential / continuous:.2f}x (target >= 3x)")


if __name__ == "__main__":
    main()
