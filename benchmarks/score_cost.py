"""What a scored position costs next to a plain decode step, measured side by side.

A plain decode step: one lane's greedy step (decode the last token, read its row).
A scored position: both lanes' logits rows for one position of a forced text (each lane
evaluates the text a chunk at a time, logits on every row), then KL(a||b) over the
whole vocabulary, same top-1, |Δlogit| and margins. The target is a ratio of at most
1.3. Rounds alternate the two, so a busy machine slows both alike; the statistics alone
(on full-vocabulary rows, no model) are timed too.

    python3 benchmarks/score_cost.py --rounds 3
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

import numpy as np

from specdiff.engine.llama.lane import LocalLane
from specdiff.engine.llama.score import score_text
from specdiff.lanes import Lane, Pair
from specdiff.scoring import score_rows

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import median, prompts  # noqa: E402 - this folder is no package


def decode_seconds_per_token(lane: LocalLane, prompt: str, tokens: int) -> float:
    """Seconds per generated token after the first (the prompt's decode left out)."""
    stamps = [step.timestamp for step in lane.generate(lane.tokenize(prompt), tokens)]
    return (stamps[-1] - stamps[0]) / max(len(stamps) - 1, 1)


def scored_seconds_per_position(pair: Pair, text: str, chunk: int) -> float:
    result = score_text(pair, text, chunk, "all", threading.Event())
    return result.seconds / len(result.scores)


def statistics_seconds_per_row(vocabulary: int, rows: int = 64) -> float:
    rng = np.random.default_rng(0)
    a = (rng.standard_normal((rows, vocabulary)) * 3).astype(np.float32)
    b = a + (rng.standard_normal((rows, vocabulary)) * 0.1).astype(np.float32)
    started = time.perf_counter()
    score_rows(a, b, [0] * rows, 0)
    return (time.perf_counter() - started) / rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64, help="decode steps per round")
    parser.add_argument("--chunk", type=int, default=256, help="scoring chunk (n_ctx)")
    parser.add_argument("--chars", type=int, default=1500, help="length of the scored text")
    args = parser.parse_args()
    lane = Lane()
    pair = Pair("cost", lane, lane)
    text = "\n\n".join(prompts("coding"))[: args.chars]
    decode, scored, statistics = [], [], []
    decoder = LocalLane(lane)
    try:
        vocabulary = decoder.model.n_vocab
        for _ in range(args.rounds):
            decode.append(decode_seconds_per_token(decoder, prompts("open")[0], args.tokens))
            scored.append(scored_seconds_per_position(pair, text, args.chunk))
            statistics.append(statistics_seconds_per_row(vocabulary))
    finally:
        decoder.close()
    step, position = median(decode), median(scored)
    print(f"plain decode step:        {1000 * step:8.2f} ms")
    print(f"scored position (a and b): {1000 * position:8.2f} ms")
    print(f"  of which the statistics: {1000 * median(statistics):8.2f} ms per row pair")
    print(f"ratio scored / decode:     {position / step:8.2f} (target <= 1.3)")


if __name__ == "__main__":
    main()
