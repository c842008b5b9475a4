"""What running a suite on Ray costs here: the wall time of a suite on a local Ray
cluster against the same suite in-process, and Ray's round trip per unit.

Runs `specdiff suite`'s runner over the first N bundled coding prompts with one pair,
four ways: in-process (one worker process, one prompt at a time) with the lanes on every
core and on one thread each, on one Ray actor (one CPU, so one thread), and on two
actors (one CPU each). Each Ray run's ratio is given against both in-process runs: the
one-thread run is like for like with an actor's lanes. Wall times include loading
the model (once per actor) and writing the report; the Ray cluster's own start is
timed apart. Then the scheduling overhead per unit: an empty actor call's round trip,
and a loaded pair's tokenize through its actor against the same call to the worker
process in-process (what a unit adds beyond its own work).

    python benchmarks/ray_overhead.py [--prompts 4] [--max-tokens 16] [--pair ubatch]
        [--calls 200]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import ray

from specdiff.cluster.actors import pinned
from specdiff.engine.worker import PairWorker
from specdiff.lanes import Pair, default_threads, presets
from specdiff.reports.suite import write_reports
from specdiff.suite.folder import write_settings
from specdiff.suite.outcome import outcome_json
from specdiff.suite.prompts import SuitePrompt, load_suite_prompts
from specdiff.suite.ray_runner import RayPairRunner, RayRunners
from specdiff.suite.runner import SuiteRun
from specdiff.suite.runners import UnitRunners
from specdiff.suite.settings import SuiteSettings


class Empty:
    def call(self) -> None:
        return None


def suite_seconds(
    settings: SuiteSettings, prompts: list[SuitePrompt], runners: UnitRunners | None
) -> tuple[float, int]:
    """Wall seconds of the suite (model loads and report included), and its runs."""
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "report"
        report.mkdir()
        began = time.perf_counter()
        write_settings(report, settings, prompts)
        outcome = SuiteRun(settings, prompts, report, runners=runners).run()
        write_reports(report, outcome_json(outcome))
        return time.perf_counter() - began, outcome.ledger.count


def timed(call: Callable[[], object]) -> float:
    began = time.perf_counter()
    call()
    return time.perf_counter() - began


def round_trips(pair: Pair, prompt: str, calls: int) -> None:
    """An empty actor call, and a loaded pair's tokenize via an actor and in-process, the
    two taken in turn so that both see the same load on a shared machine."""
    empty = ray.remote(num_cpus=1)(Empty).remote()
    ray.get(empty.call.remote())
    spent = [timed(lambda: ray.get(empty.call.remote())) for _ in range(calls)]
    print(f"empty actor call: {1000 * statistics.median(spent):.2f} ms (median of {calls})")
    ray.kill(empty)
    on_ray = RayPairRunner(pair, lambda _: None, threading.Event(), 1, print)
    via_ray: list[float] = []
    here: list[float] = []
    with PairWorker(pair) as worker:
        for _ in range(calls):
            via_ray.append(timed(lambda: on_ray.tokenize(prompt)))
            here.append(timed(lambda: worker.tokenize(prompt)))
    on_ray.close()
    ray_ms, here_ms = (1000 * statistics.median(times) for times in (via_ray, here))
    print(
        f"tokenize a prompt: {ray_ms:.2f} ms via an actor, {here_ms:.2f} ms in-process "
        f"(worker process): Ray adds {ray_ms - here_ms:.2f} ms per call"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--pair", default="ubatch")
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    prompts = load_suite_prompts("coding")[0][: args.prompts]
    pair = presets()[args.pair]
    settings = SuiteSettings("coding", (pair,), args.max_tokens)
    print(f"{len(prompts)} prompts x {args.pair}, up to {args.max_tokens} tokens per lane")
    here, runs = suite_seconds(settings, prompts, None)
    print(f"in-process, lanes on {pair.a.threads} threads: {here:.1f} s for {runs} runs")
    one = replace(
        pair, a=pinned(pair.a, 1, default_threads()), b=pinned(pair.b, 1, default_threads())
    )
    single, runs = suite_seconds(replace(settings, pairs=(one,)), prompts, None)
    print(f"in-process, lanes on 1 thread: {single:.1f} s for {runs} runs")
    with tempfile.TemporaryDirectory(prefix="ray") as temp:
        began = time.perf_counter()
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=temp)
        print(f"local Ray start: {time.perf_counter() - began:.1f} s (not counted below)")
        try:
            for actors in (1, 2):
                runners = RayRunners(actors, 1, threading.Event(), print)
                wall, runs = suite_seconds(settings, prompts, runners)
                print(
                    f"Ray, {actors} actor{'s' if actors > 1 else ''} x 1 CPU: {wall:.1f} s for "
                    f"{runs} runs; ratio Ray / in-process {wall / here:.2f} "
                    f"(/ in-process on 1 thread {wall / single:.2f})"
                )
            round_trips(pair, prompts[0].prompt, args.calls)
        finally:
            ray.shutdown()


if __name__ == "__main__":
    main()
