"""Tokens/s of both lanes inside the running app vs the same lanes headless.

The app runs headless (`App.run_test`) on the bundled model; each lane's speed is its
own decode time, as the pair runner clocks it, so the ratio shows what the UI costs
generation (target >= 0.95). Every measurement runs in a fresh process, alternating app
and headless, as a user runs one or the other: llama.cpp's OpenMP thread team belongs
to the thread that first decoded, so decoding on the main thread and then on the app's
worker thread in one process is a state no user is in, and it measures slower.

A last app run times key presses while both lanes stream, from the key entering the
app to the cursor having moved (target < 50 ms).

    python benchmarks/tui_stream.py [--pair spec-vs-plain] [--tokens 200] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time

from specdiff.engine.pairrun import PairRun
from specdiff.lanes import presets
from specdiff.prompts import DEFAULT_PROMPT


async def in_app(pair_name: str, tokens: int, press_keys: bool) -> dict[str, object]:
    from specdiff.tui.app import make_app

    app = make_app(presets(), pair_name, DEFAULT_PROMPT, tokens)
    handled: list[float] = []
    key_times: list[float] = []
    screen = app.compare  # the screen whose keys move the cursor
    original = screen.action_move

    def timed_move(delta: int) -> None:
        original(delta)
        handled.append(time.perf_counter())

    screen.action_move = timed_move  # type: ignore[method-assign]
    view = screen.view  # what the screen shows: the run, its lanes' steps
    async with app.run_test(size=(120, 40)):
        while view.result is None:
            if press_keys and view.running and view.lanes["a"].steps:
                began = time.perf_counter()
                app.simulate_key("right")
                while not handled or handled[-1] < began:
                    await asyncio.sleep(0.001)
                key_times.append(handled[-1] - began)
            await asyncio.sleep(0.3)
        result = view.result
    return {
        "speeds": [result.a.tokens_per_second, result.b.tokens_per_second],
        "keys": key_times,
    }


def headless(pair_name: str, tokens: int) -> dict[str, object]:
    with PairRun(presets()[pair_name]) as runner:
        result = runner.run(DEFAULT_PROMPT, tokens)
    return {"speeds": [result.a.tokens_per_second, result.b.tokens_per_second], "keys": []}


def measure(mode: str, pair: str, tokens: int) -> dict[str, object]:
    command = [sys.executable, __file__, "--one", mode, "--pair", pair, "--tokens", str(tokens)]
    completed = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(completed.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pair", default="spec-vs-plain")
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--one", choices=("app", "keys", "headless"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        if args.one == "headless":
            outcome = headless(args.pair, args.tokens)
        else:
            outcome = asyncio.run(in_app(args.pair, args.tokens, args.one == "keys"))
        print(json.dumps(outcome))
        return
    app_speeds: list[float] = []
    bare_speeds: list[float] = []
    for _ in range(args.rounds):
        app = measure("app", args.pair, args.tokens)["speeds"]
        bare = measure("headless", args.pair, args.tokens)["speeds"]
        app_speeds += app  # lane a, lane b, lane a, ...
        bare_speeds += bare
        print(
            f"  app a {app[0]:.1f} b {app[1]:.1f} tok/s · headless a {bare[0]:.1f} "
            f"b {bare[1]:.1f} tok/s",
            flush=True,
        )
    key_times = measure("keys", args.pair, args.tokens)["keys"]
    print(f"pair {args.pair}, {args.tokens} tokens, {args.rounds} rounds alternating")
    # each lane against itself: the lanes decode at different speeds, so a median pooled
    # over both would sit near whichever lane's values fall in the middle
    for lane, start in (("a", 0), ("b", 1)):
        app_median = statistics.median(app_speeds[start::2])
        bare_median = statistics.median(bare_speeds[start::2])
        print(
            f"lane {lane}: app {app_median:.1f} tok/s, headless {bare_median:.1f} tok/s, "
            f"ratio {app_median / bare_median:.3f} (target >= 0.95)"
        )
    if key_times:
        print(
            f"key presses while streaming: {len(key_times)}, median "
            f"{statistics.median(key_times) * 1000:.1f} ms, worst "
            f"{max(key_times) * 1000:.1f} ms (target < 50 ms)"
        )


if __name__ == "__main__":
    main()
