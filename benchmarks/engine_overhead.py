"""Plain lane with top-k capture vs a bare `Llama.generate` greedy loop.

Same model, same threads, same prompts, runs alternating in one process so both see
the same machine state. Prints the throughput ratio (target >= 0.97).

    python benchmarks/engine_overhead.py [--tokens 128] [--rounds 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import median, prompts  # noqa: E402
from llama_cpp import Llama  # noqa: E402

from specdiff.engine.llama.lane import LocalLane  # noqa: E402
from specdiff.engine.models import bundled_model_path  # noqa: E402
from specdiff.lanes import Lane  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    lane = Lane()
    local = LocalLane(lane, "a")
    llm = Llama(
        str(bundled_model_path()),
        n_ctx=lane.n_ctx,
        n_batch=lane.n_batch,
        n_ubatch=lane.n_ubatch,
        n_threads=lane.threads,
        n_threads_batch=lane.threads,
        verbose=False,
    )
    texts = prompts("open")[:6]
    ours: list[float] = []
    bare: list[float] = []
    for round_index in range(args.rounds):
        for text in texts:
            tokens = local.tokenize(text)
            order = ("ours", "bare") if round_index % 2 == 0 else ("bare", "ours")
            for which in order:
                began = time.perf_counter()
                if which == "ours":
                    count = sum(1 for _ in local.generate(tokens, args.tokens))
                    ours.append(count / (time.perf_counter() - began))
                else:
                    llm.reset()
                    count = 0
                    for _ in llm.generate(tokens, temp=0.0, reset=True):
                        count += 1
                        if count >= args.tokens:
                            break
                    bare.append(count / (time.perf_counter() - began))
    print(f"specdiff plain lane (top-{lane.top_k} captured): median {median(ours):.1f} tok/s")
    print(f"bare Llama.generate greedy loop:         median {median(bare):.1f} tok/s")
    print(f"throughput ratio specdiff/bare: {median(ours) / median(bare):.3f} (target >= 0.97)")


if __name__ == "__main__":
    main()
