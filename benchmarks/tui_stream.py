"""Tokens/s of both lanes inside the running app vs the same lanes headless.

The app runs headless (`App.run_test`) on the bundled model; each lane's speed is its
own decode time, as the pair runner clocks it, so the ratio shows what the UI costs
generation (target >= 0.95). While the lanes stream, key presses are timed from
press to handled (target < 50 ms).

    python benchmarks/tui_stream.py [--pair spec-vs-plain] [--tokens 200] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from specdiff.lanes import presets  # noqa: E402
from specdiff.pairrun import PairRun  # noqa: E402
from specdiff.prompts import DEFAULT_PROMPT  # noqa: E402
from specdiff.tui.app import make_app  # noqa: E402


async def in_app(
    pair_name: str, tokens: int, key_times: list[float] | None = None
) -> tuple[float, float]:
    """One run in the headless app; with key_times, keys are pressed while it streams."""
    app = make_app(presets(), pair_name, DEFAULT_PROMPT, tokens)
    handled: list[float] = []
    original = app.action_move

    def timed_move(delta: int) -> None:
        original(delta)
        handled.append(time.perf_counter())

    app.action_move = timed_move  # type: ignore[method-assign]
    async with app.run_test(size=(120, 40)):
        while app.result is None:
            if key_times is not None and app.running and app.lanes["a"].steps:
                # from the key entering the app to the cursor having moved and redrawn
                began = time.perf_counter()
                app.simulate_key("right")
                while not handled or handled[-1] < began:
                    await asyncio.sleep(0.001)
                key_times.append(handled[-1] - began)
            await asyncio.sleep(0.3)
        result = app.result
    return result.a.tokens_per_second, result.b.tokens_per_second


def headless(pair_name: str, tokens: int) -> tuple[float, float]:
    with PairRun(presets()[pair_name]) as runner:
        result = runner.run(DEFAULT_PROMPT, tokens)
    return result.a.tokens_per_second, result.b.tokens_per_second


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pair", default="spec-vs-plain")
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    app_speeds: list[float] = []
    bare_speeds: list[float] = []
    key_times: list[float] = []
    for _ in range(args.rounds):
        a, b = asyncio.run(in_app(args.pair, args.tokens))
        app_speeds += [a, b]
        a, b = headless(args.pair, args.tokens)
        bare_speeds += [a, b]
    # a separate run for key latency: the cursor moves every 0.3 s while both lanes stream
    asyncio.run(in_app(args.pair, args.tokens, key_times))
    app_median, bare_median = statistics.median(app_speeds), statistics.median(bare_speeds)
    print(f"pair {args.pair}, {args.tokens} tokens, {args.rounds} rounds alternating")
    print(f"in the app: median {app_median:.1f} tok/s per lane")
    print(f"headless:   median {bare_median:.1f} tok/s per lane")
    print(f"ratio app/headless: {app_median / bare_median:.3f} (target >= 0.95)")
    if key_times:
        worst = max(key_times) * 1000
        print(
            f"key presses while streaming (separate run): {len(key_times)}, median "
            f"{statistics.median(key_times) * 1000:.1f} ms, worst {worst:.1f} ms (target < 50 ms)"
        )


if __name__ == "__main__":
    main()
