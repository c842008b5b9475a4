"""Loading a 20,000-step session and painting the replay screen's first frame.

The session is made from the real recorded steps in tests/data (repeated, re-indexed),
so its lines have real sizes. Prints the load time (target < 1 s), the time from
loading to the first painted frame of the replay screen (target < 1 s; the default
replay at the recorded pace, then --instant, which lays out all 20,000 tokens at once)
and the bytes per step on disk.

    python benchmarks/session_load.py [--steps 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

from specdiff.lanes import presets
from specdiff.session import load_session

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "data" / "ubatch-roman-empire.jsonl"


def make_session(path: Path, steps: int) -> None:
    records = [json.loads(line) for line in FIXTURE.read_text(encoding="utf-8").splitlines()]
    header, body = records[0], [r for r in records if r["type"] == "step"]
    with path.open("w", encoding="utf-8") as handle:
        handle.write(json.dumps(header) + "\n")
        for number in range(steps):
            record = dict(body[number % len(body)])
            record["lane"] = "a" if number % 2 == 0 else "b"
            record["index"] = number // 2
            handle.write(json.dumps(record, separators=(",", ":")) + "\n")


async def first_frame(path: Path, speed: float | None) -> float:
    began = time.perf_counter()
    from specdiff.tui.app import make_app

    session = load_session(path)
    app = make_app(presets(), "ubatch", session.prompt, 60, session=session, replay_speed=speed)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "big.jsonl"
        make_session(path, args.steps)
        began = time.perf_counter()
        session = load_session(path)
        load_seconds = time.perf_counter() - began
        assert len(session.steps["a"]) + len(session.steps["b"]) == args.steps
        paced_seconds = asyncio.run(first_frame(path, 1.0))
        instant_seconds = asyncio.run(first_frame(path, None))
        size = path.stat().st_size
    print(f"{args.steps} steps, {size / 1e6:.1f} MB on disk, {size / args.steps:.0f} bytes/step")
    print(f"load: {load_seconds:.3f} s (target < 1 s)")
    print(f"replay (recorded pace), load to first frame: {paced_seconds:.3f} s (target < 1 s)")
    print(f"replay --instant, load to first frame: {instant_seconds:.3f} s")


if __name__ == "__main__":
    main()
