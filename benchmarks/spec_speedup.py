"""Speculative (n-gram prompt lookup) lane vs plain lane, tokens per second.

On the bundled repetitive prompts (rewrite / extract / repeat tasks, where n-gram
drafts hit) and on open-ended ones. Prints both medians of the per-prompt speedup
(targets: >= 1.5x repetitive, >= 0.9x open).

    python benchmarks/spec_speedup.py [--tokens 200] [--lane-a spec_drafts=8 ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import median, prompts  # noqa: E402

from specdiff.engine.pairrun import PairRun  # noqa: E402
from specdiff.lanes import apply_overrides, parse_overrides, presets  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--lane-a", action="append", default=[])
    args = parser.parse_args()
    pair = presets()["spec-vs-plain"]
    pair = type(pair)(pair.name, apply_overrides(pair.a, parse_overrides(args.lane_a)), pair.b)
    with PairRun(pair) as runner:
        for name in ("repetitive", "open"):
            speedups = []
            accept = []
            for text in prompts(name):
                result = runner.run(text, args.tokens)
                if result.speedup is not None:
                    speedups.append(result.speedup)
                if result.a.acceptance is not None:
                    accept.append(result.a.acceptance)
                print(
                    f"  {name:<10} spec {result.a.tokens_per_second:6.1f} tok/s  plain "
                    f"{result.b.tokens_per_second:6.1f} tok/s  x{result.speedup or 0:.2f}  "
                    f"acceptance {result.a.acceptance or 0:.0%}",
                    flush=True,
                )
            target = 1.5 if name == "repetitive" else 0.9
            print(
                f"{name}: median speedup {median(speedups):.2f}x over {len(speedups)} prompts "
                f"(target >= {target}x), median acceptance {median(accept):.0%}",
                flush=True,
            )


if __name__ == "__main__":
    main()
