"""What `specdiff proxy` adds to a response: the same prompts through the proxy (a process
of its own, answering OpenAI clients over HTTP, saving each pair into its suite folder)
vs the same pair run directly by this process, side by side as the proxy runs it.

At concurrency 1 each prompt is sent, and answered, alone; at concurrency 4 four client
threads send them at once. Directly, an in-process pair runs its prompts one at a time
in a worker process (`PairWorker`), as the proxy does whatever the clients' concurrency;
with --server URL both lanes are that llama-server's, run by up to 4 `PairRun`s side by
side directly and by `--concurrency 4` in the proxy. Rounds alternate direct and
proxied runs, so a machine's load falls on both alike. Prints each side's wall time
(median over the rounds) and their ratio (target <= 1.05).

    python benchmarks/proxy_overhead.py [--prompts 6] [--max-tokens 32] [--rounds 3]
        [--pair spec-vs-plain] [--server http://127.0.0.1:8080]
"""

from __future__ import annotations

import argparse
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import httpx
from _common import median, prompts

from specdiff.lanes import Pair, presets
from specdiff.sessions.store import load_session

ROOT = Path(__file__).resolve().parent.parent


def chosen_pair(args: argparse.Namespace) -> tuple[Pair, list[str]]:
    """The pair, and the proxy options that name it."""
    if args.server is None:
        return presets()[args.pair], ["--pair", args.pair]
    base = presets()["servers"]

    def served(lane):  # noqa: ANN001, ANN202
        return replace(lane, endpoint=args.server, api="llama-server")

    options = ["--pair", "servers", "--both", f"endpoint={args.server}",
               "--both", "api=llama-server"]  # fmt: skip
    return replace(base, a=served(base.a), b=served(base.b)), options


def in_parallel(work: list[str], workers: int, run: Callable[[str], object]) -> float:
    """Wall time for `workers` threads to run every item of `work`."""
    items: queue.Queue[str] = queue.Queue()
    for item in work:
        items.put(item)

    def worker() -> None:
        while True:
            try:
                item = items.get_nowait()
            except queue.Empty:
                return
            run(item)

    began = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - began


class Direct:
    """The pair run by this process: one worker, or a PairRun per thread (servers)."""

    def __init__(self, pair: Pair, concurrency: int, max_tokens: int) -> None:
        from specdiff.engine.pairrun import PairRun
        from specdiff.engine.worker import PairWorker

        self.max_tokens = max_tokens
        self.lane_seconds = 0.0
        """Time inside the lanes' decode loops, summed over the runs."""
        self.server = pair.a.backend == "server"
        count = concurrency if self.server else 1
        self.runners = queue.Queue()
        for _ in range(count):
            self.runners.put(PairRun(pair) if self.server else PairWorker(pair))
        self.concurrency = count

    def run(self, prompt: str) -> None:
        runner = self.runners.get()
        try:
            result = runner.run(prompt, self.max_tokens)
            self.lane_seconds += result.a.seconds + result.b.seconds
        finally:
            self.runners.put(runner)

    def close(self) -> None:
        while not self.runners.empty():
            self.runners.get().close()


class Proxied:
    """`specdiff proxy` as a process of its own, asked over HTTP."""

    def __init__(self, options: list[str], concurrency: int, folder: Path, model: str) -> None:
        self.model = model
        extra = ["--concurrency", str(concurrency)] if "servers" in options else []
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "specdiff",
                "proxy",
                "--port",
                "0",
                "--quiet",
                "--report",
                str(folder / f"suite-{concurrency}"),
                *options,
                *extra,
            ],  # fmt: skip
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        match = re.search(r"http://127\.0\.0\.1:\d+/v1", line)
        if match is None:
            raise SystemExit(f"the proxy did not start: {line!r}")
        self.url = match.group(0)
        self.client = httpx.Client(timeout=600)

    def run_with(self, max_tokens: int) -> Callable[[str], None]:
        def run(prompt: str) -> None:
            body = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens}
            reply = self.client.post(f"{self.url}/completions", json=body)
            reply.raise_for_status()

        return run

    def close(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=300)

    def lane_seconds(self, folder: Path, concurrency: int) -> float:
        """Time inside the lanes' decode loops, from the sessions the proxy saved (the
        first request's, which loaded what a run needs, left out)."""
        sessions = sorted((folder / f"suite-{concurrency}" / "sessions").glob("*/*.jsonl"))
        return sum(sum(load_session(path).summary().seconds or ()) for path in sessions[1:])


def measure(
    args: argparse.Namespace, concurrency: int, folder: Path
) -> tuple[float, float, float, float]:
    """Median walls (direct, proxied) and the whole time beyond the lanes' own of each."""
    pair, options = chosen_pair(args)
    work = (prompts("open") + prompts("divergence"))[: args.prompts]
    direct = Direct(pair, concurrency, args.max_tokens)
    proxied = Proxied(options, concurrency, folder, pair.name)
    try:
        # one of each first: the first request loads what a run needs
        direct.run(work[0])
        first_direct = direct.lane_seconds
        proxied.run_with(args.max_tokens)(work[0])
        walls: dict[str, list[float]] = {"direct": [], "proxy": []}
        for _ in range(args.rounds):
            walls["direct"].append(in_parallel(work, direct.concurrency, direct.run))
            walls["proxy"].append(in_parallel(work, concurrency, proxied.run_with(args.max_tokens)))
    finally:
        direct.close()
        proxied.close()
    direct_lanes = direct.lane_seconds - first_direct
    beyond_direct = sum(walls["direct"]) - direct_lanes
    beyond_proxy = sum(walls["proxy"]) - proxied.lane_seconds(folder, concurrency)
    total = sum(walls["direct"])
    return (
        median(walls["direct"]),
        median(walls["proxy"]),
        beyond_direct / total,
        (beyond_proxy / total),
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pair", default="spec-vs-plain")
    parser.add_argument("--server", help="a llama-server's URL: both lanes on it")
    parser.add_argument("--concurrency", type=int, action="append")
    args = parser.parse_args()
    print(f"{args.prompts} prompts, up to {args.max_tokens} tokens per lane, "
          f"{args.rounds} rounds, {args.server or args.pair}")  # fmt: skip
    with tempfile.TemporaryDirectory() as folder:
        for concurrency in args.concurrency or [1, 4]:
            direct, proxy, beyond_direct, beyond_proxy = measure(args, concurrency, Path(folder))
            print(
                f"concurrency {concurrency}: direct {direct:.2f} s, proxy {proxy:.2f} s, "
                f"ratio {proxy / direct:.3f} (target <= 1.05); time beyond the lanes' own, "
                f"over the direct wall: direct {beyond_direct:.3f}, proxy {beyond_proxy:.3f}"
            )


if __name__ == "__main__":
    main()
