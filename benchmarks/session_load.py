"""Loading a 20,000-step session and painting the replay screen's first frame.

The session is made from the real recorded steps in tests/data (repeated, re-indexed),
so its lines have real sizes. Prints the load time (target < 1 s), the time from
`specdiff replay`'s start (imports included) to the first frame the replay screen
paints (target < 1 s), for the default replay at the recorded pace, which opens after
its first steps and reads the rest while it plays, and for --instant, which reads and
lays out all 20,000 steps first; and the bytes per step on disk. Each replay is timed
in a fresh interpreter, as a user's command runs.

    python benchmarks/session_load.py [--steps 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

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


async def first_frame(path: Path, speed: float | None, began: float) -> float:
    from specdiff.cli.replay import open_for_replay
    from specdiff.lanes import presets
    from specdiff.tui.app import make_app

    session, stream = open_for_replay(path)  # what `specdiff replay` does
    app = make_app(
        presets(),
        "ubatch",
        session.prompt,
        60,
        session=session,
        replay_speed=speed,
        session_stream=stream,
    )
    painted: list[float] = []
    display = app._display

    def first_display(screen: Any, renderable: Any) -> None:
        # the compositor hands over a frame: what a terminal would show next
        if renderable is not None and not painted:
            painted.append(time.perf_counter())
        display(screen, renderable)

    app._display = first_display  # type: ignore[method-assign]
    async with app.run_test(size=(120, 40)) as pilot:
        while not painted:
            await pilot.pause(0.01)
    return painted[0] - began


def measure_in_child(path: Path, mode: str) -> float:
    completed = subprocess.run(
        [sys.executable, __file__, "--measure", mode, str(path)],
        capture_output=True,
        text=True,
        check=True,
    )
    return float(completed.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--measure", choices=("paced", "instant"), help=argparse.SUPPRESS)
    parser.add_argument("file", nargs="?", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        began = time.perf_counter()
        speed = None if args.measure == "instant" else 1.0
        print(asyncio.run(first_frame(Path(args.file), speed, began)))
        return
    from specdiff.sessions.store import load_session

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "big.jsonl"
        make_session(path, args.steps)
        began = time.perf_counter()
        session = load_session(path)
        load_seconds = time.perf_counter() - began
        assert len(session.steps["a"]) + len(session.steps["b"]) == args.steps
        paced = [measure_in_child(path, "paced") for _ in range(3)]
        instant = [measure_in_child(path, "instant") for _ in range(3)]
        size = path.stat().st_size
    print(f"{args.steps} steps, {size / 1e6:.1f} MB on disk, {size / args.steps:.0f} bytes/step")
    print(f"load: {load_seconds:.3f} s (target < 1 s)")
    print(
        f"replay (recorded pace), start to first frame: median {sorted(paced)[1]:.3f} s "
        f"of 3 (target < 1 s)"
    )
    print(f"replay --instant, start to first frame: median {sorted(instant)[1]:.3f} s of 3")


if __name__ == "__main__":
    main()
