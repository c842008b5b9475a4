"""A suite at server scale: its throughput against the server's ceiling, and its memory
and report time over thousands of prompts.

Default: starts llama-server (the bundled model, --parallel 8) and, at concurrency 1, 2,
4 and 8, measures two sides on the same prompts:

- the suite: `suite --concurrency N` on a pair of two server lanes (both on this server,
  llama-server's own API). N prompts are in flight; each prompt's lanes a and b stream
  side by side, so 2N requests are in flight at once. It writes every session file as
  a suite does. Its tokens are the steps both lanes produced (generated tokens only),
  its time from its first run's start to its last run's end (loading the lanes and
  reading back excluded).
- the bare client: the suite's own request bodies (each prompt twice, as lanes a and b
  send it), POSTed from an httpx client by a pool of 2N threads, so 2N requests are in
  flight at once. Its tokens are the streamed events that carry one; its time from the
  first request to the last answer. A request the server drops before its first token
  is sent again (the suite's client sends such a prompt again too); nothing of the
  dropped attempt is counted.

Both are measured on a warm server (a fresh llama-server's first requests are slower:
its weights are paged in, each slot runs its first batch), so the warm-up runs once
before the first level. The machine's load drifts while a level runs, so each round
measures the two sides one after the other, in the opposite order to the round before
(--rounds 2 is suite, bare, bare, suite), and each side's rate is its tokens over its
seconds summed over the rounds. Prints each side's generated tokens per second, their
ratio (target: the suite >= 0.9x of the bare client at every level), and each side's
CPU milliseconds per token (this process's, the suite's worker process included): a
proxy that load on a shared machine does not move.

--fake: runs 1,000 and then 10,000 prompts at concurrency 8 against
benchmarks/stream_server.py (a few tokens per request, no delay), each size in a fresh
process, and prints the peak resident memory of each (flat: it must not grow with the
prompt count) and the time to build and write the reports (target < 10 s).

    python benchmarks/suite_concurrency.py [--prompts 16] [--max-tokens 32] [--rounds 2]
    python benchmarks/suite_concurrency.py --fake [--sizes 1000,10000]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx

from specdiff.engine.models import bundled_model_path
from specdiff.engine.server.dialects import dialect_for, request_body
from specdiff.engine.server.process import LlamaServer, find_llama_server
from specdiff.lanes import Lane, Pair
from specdiff.reports.suite import write_reports
from specdiff.suite.folder import write_settings
from specdiff.suite.outcome import outcome_json
from specdiff.suite.prompts import SuitePrompt, load_suite_prompts
from specdiff.suite.runner import FinishedRun, SuiteRun
from specdiff.suite.settings import SuiteSettings

sys.path.insert(0, str(Path(__file__).parent))
from stream_server import serving  # noqa: E402 - this folder is no package

LEVELS = (1, 2, 4, 8)


def server_pair(url: str, api: str = "completions") -> Pair:
    lane = Lane(backend="server", endpoint=url, api=api)
    return Pair("servers", lane, lane, "both lanes on one server")


@dataclass
class Side:
    """What one side did over a level's rounds, summed."""

    tokens: float = 0.0
    seconds: float = 0.0
    cpu: float = 0.0

    def add(self, tokens: float, seconds: float, cpu: float) -> None:
        self.tokens += tokens
        self.seconds += seconds
        self.cpu += cpu

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds if self.seconds else float("nan")

    @property
    def cpu_ms_per_token(self) -> float:
        return 1000 * self.cpu / self.tokens if self.tokens else float("nan")


def cpu_seconds() -> float:
    """This process's CPU time and that of its children that ended (the suite's worker)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def run_suite(
    prompts: list[SuitePrompt], pair: Pair, max_tokens: int, concurrency: int, folder: Path
) -> tuple[float, float]:
    """(generated tokens, seconds from the first run's start to the last run's end)."""
    settings = SuiteSettings(
        source="benchmark", pairs=(pair,), max_tokens=max_tokens, concurrency=concurrency
    )
    folder.mkdir(parents=True)
    write_settings(folder, settings, prompts)
    last: list[FinishedRun] = []
    outcome = SuiteRun(settings, prompts, folder, on_finished=last.append).run()
    assert outcome.finished_runs == len(prompts), outcome.nothing_ran()
    progress = max((run.progress for run in last), key=lambda p: p.run_seconds)
    return float(progress.tokens), progress.run_seconds


DROPPED_TRIES = 3
"""How often the bare client sends a request the server dropped before its first token."""


def run_bare(
    prompts: list[SuitePrompt], lane: Lane, max_tokens: int, streams: int
) -> tuple[float, float]:
    """The same requests from a bare httpx client, `streams` at a time: (tokens, s)."""
    dialect = dialect_for(lane.api, lambda _: b"")
    bodies = [
        request_body(lane, dialect, p.prompt, max_tokens, (), {}) for p in prompts for _ in "ab"
    ]
    client = httpx.Client(base_url=lane.endpoint, timeout=float(lane.timeout))
    lock, counted = threading.Lock(), [0]

    def attempt(body: dict) -> int:
        tokens = 0
        with client.stream("POST", dialect.path, json=body) as response:
            for line in response.iter_lines():
                if line.startswith("data: {"):
                    tokens += has_token(json.loads(line[6:]))
        return tokens

    def send(body: dict) -> None:
        for tried in range(1, DROPPED_TRIES + 1):
            try:
                tokens = attempt(body)
                break
            except (httpx.RemoteProtocolError, httpx.ConnectError):
                if tried == DROPPED_TRIES:
                    raise
        with lock:
            counted[0] += tokens

    began = time.perf_counter()
    with ThreadPoolExecutor(streams) as pool:
        list(pool.map(send, bodies))
    seconds = time.perf_counter() - began
    client.close()
    return float(counted[0]), seconds


def has_token(event: dict) -> int:
    """The tokens a streamed event carries: its token ids where llama-server's own API
    sends them (return_tokens; a token that ends inside a character has no text yet),
    else one where it has text (OpenAI's completions API) or content."""
    if isinstance(event.get("tokens"), list):
        return len(event["tokens"])
    if "choices" in event:
        return int(bool(event["choices"][0].get("text")))
    return int(bool(event.get("content")))


def measure_level(
    prompts: list[SuitePrompt], pair: Pair, args: argparse.Namespace, level: int, folder: Path
) -> tuple[Side, Side]:
    """The suite at `level` and the bare client at 2 x `level` streams, `args.rounds`
    rounds, each round in the opposite order to the one before."""
    suite, bare = Side(), Side()

    def suite_round(round_number: int) -> None:
        began = cpu_seconds()
        folder_of_round = folder / f"c{level}r{round_number}"
        tokens, seconds = run_suite(prompts, pair, args.max_tokens, level, folder_of_round)
        suite.add(tokens, seconds, cpu_seconds() - began)

    def bare_round(_: int) -> None:
        began = cpu_seconds()
        tokens, seconds = run_bare(prompts, pair.a, args.max_tokens, 2 * level)
        bare.add(tokens, seconds, cpu_seconds() - began)

    for round_number in range(args.rounds):
        order = (suite_round, bare_round) if round_number % 2 == 0 else (bare_round, suite_round)
        for side in order:
            side(round_number)
    return suite, bare


def llama_server_levels(args: argparse.Namespace) -> None:
    prompts = load_suite_prompts("questions")[0][: args.prompts]
    arguments = ["--parallel", "8", "--threads", str(args.threads), "--no-cache-prompt"]
    with LlamaServer(find_llama_server(), bundled_model_path(), arguments) as server:
        pair = server_pair(server.url, "llama-server")  # its own API gives the probabilities
        print(
            f"{len(prompts)} prompts x 2 lanes, {args.max_tokens} tokens, "
            f"llama-server --parallel 8, {args.rounds} round(s) a level"
        )
        run_bare(prompts, pair.a, args.max_tokens, 2 * max(LEVELS))  # the warm-up
        print("concurrency  suite tok/s  bare tok/s  suite/bare  suite CPU ms/tok  bare CPU ms/tok")
        with tempfile.TemporaryDirectory() as folder:
            for level in LEVELS:
                suite, bare = measure_level(prompts, pair, args, level, Path(folder))
                print(
                    f"{level:>11}  {suite.rate:>11.1f}  {bare.rate:>10.1f}  "
                    f"{suite.rate / bare.rate:>9.2f}x  {suite.cpu_ms_per_token:>15.2f}  "
                    f"{bare.cpu_ms_per_token:>14.2f}"
                )


def fake_size(count: int, concurrency: int) -> dict[str, float]:
    """One size in this process: peak RSS and the report's time, as JSON on stdout."""
    prompts = [SuitePrompt(id=f"p{n}", prompt=f"Say hello {n}") for n in range(count)]
    with serving("tokens=4") as url, tempfile.TemporaryDirectory() as folder:
        settings = SuiteSettings(
            source="benchmark", pairs=(server_pair(url),), max_tokens=4, concurrency=concurrency
        )
        report = Path(folder) / "report"
        report.mkdir()
        write_settings(report, settings, prompts)
        began = time.perf_counter()
        outcome = SuiteRun(settings, prompts, report).run()
        run_seconds = time.perf_counter() - began
        began = time.perf_counter()
        write_reports(report, outcome_json(outcome))
        report_seconds = time.perf_counter() - began
    return {
        "prompts": count,
        "finished": outcome.finished_runs,
        "run_seconds": run_seconds,
        "report_seconds": report_seconds,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def fake_sizes(args: argparse.Namespace) -> None:
    print("prompts  finished  run s  report s  peak RSS MB")
    for count in (int(size) for size in args.sizes.split(",")):
        child = subprocess.run(
            [sys.executable, __file__, "--one-size", str(count), "--concurrency", "8"],
            capture_output=True,
            text=True,
            check=True,
        )
        size = json.loads(child.stdout.splitlines()[-1])
        print(
            f"{size['prompts']:>7}  {size['finished']:>8}  {size['run_seconds']:>5.0f}  "
            f"{size['report_seconds']:>8.2f}  {size['peak_rss_mb']:>11.0f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2, help="rounds a level, order alternating")
    parser.add_argument("--threads", type=int, default=2, help="llama-server's --threads")
    parser.add_argument("--fake", action="store_true", help="thousands of prompts, a fake server")
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--one-size", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--concurrency", type=int, default=8, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one_size:
        print(json.dumps(fake_size(args.one_size, args.concurrency)))
    elif args.fake:
        fake_sizes(args)
    else:
        llama_server_levels(args)


if __name__ == "__main__":
    main()
