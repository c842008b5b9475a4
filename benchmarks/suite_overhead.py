"""What a suite costs beyond generating: wall time vs the lanes' own generation time.

Runs `specdiff suite`'s runner on 50 bundled prompts (coding, then questions) with one
pair and writes the reports, as the command does. Prints the total wall time over the
sum of every lane's generation time (prompt decode included; target <= 1.05) and the
resident memory after the first and after the last prompt (flat: no leak), of this
process and of the worker process that runs the lanes.

With --grade, every lane's text is graded too (the coding prompts' tests run in the
sandbox), and it prints what grading added beyond the graded programs' own run time
(each program's sandboxed subprocess, from start to reaped), over the rest of the
suite's wall time (target <= 0.05).

    python benchmarks/suite_overhead.py [--prompts 50] [--max-tokens 48] [--pair ubatch]
        [--grade]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from specdiff.lanes import presets
from specdiff.reports.suite import write_reports
from specdiff.suite.folder import write_settings
from specdiff.suite.outcome import SuiteOutcome, outcome_json
from specdiff.suite.prompts import load_suite_prompts
from specdiff.suite.runner import Progress, SuiteRun
from specdiff.suite.settings import SuiteSettings


def rss_mb(pid: str = "self") -> float:
    try:
        with open(f"/proc/{pid}/statm", encoding="ascii") as handle:
            resident_pages = int(handle.read().split()[1])
    except OSError:
        return 0.0  # the process ended between listing and reading
    return resident_pages * os.sysconf("SC_PAGE_SIZE") / 1e6


def total_rss_mb() -> float:
    """This process and its children (the worker holding the lanes)."""
    children = []
    for task in Path("/proc/self/task").iterdir():
        children += (task / "children").read_text(encoding="ascii").split()
    return rss_mb() + sum(rss_mb(pid) for pid in children)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=50)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--pair", default="ubatch")
    parser.add_argument("--grade", action="store_true", help="grade every lane's text too")
    args = parser.parse_args()
    prompts = (load_suite_prompts("coding")[0] + load_suite_prompts("questions")[0])[: args.prompts]
    settings = SuiteSettings(
        "coding+questions", (presets()[args.pair],), args.max_tokens, grade=args.grade
    )
    samples: dict[int, float] = {}

    def on_progress(progress: Progress) -> None:
        job = progress.job
        if job not in samples:
            samples[job] = total_rss_mb()  # while job `job` runs: after `job` finished

    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "report"
        report.mkdir()
        began = time.perf_counter()
        write_settings(report, settings, prompts)
        outcome = SuiteRun(settings, prompts, report, on_progress=on_progress).run()
        write_reports(report, outcome_json(outcome))
        wall = time.perf_counter() - began
    generation = sum(sum(r.get("seconds") or ()) for r in outcome.ledger.records())
    first, last = samples[min(samples)], samples[max(samples)]
    print(f"{outcome.ledger.count} prompts x {args.pair}, up to {args.max_tokens} tokens per lane")
    print(f"wall {wall:.1f} s, lanes' generation {generation:.1f} s")
    print(f"ratio wall / generation: {wall / generation:.3f} (target <= 1.05)")
    print(
        f"RSS during prompt {min(samples) + 1}: {first:.0f} MB, during prompt "
        f"{max(samples) + 1}: {last:.0f} MB ({last - first:+.0f} MB)"
    )
    marks = sorted(samples)[:: max(1, len(samples) // 5)]
    print("RSS along the way: " + ", ".join(f"#{j + 1} {samples[j]:.0f}" for j in marks))
    if args.grade:
        print_grading(outcome, wall)


def print_grading(outcome: SuiteOutcome, wall: float) -> None:
    """What grading added beyond its programs' own run time, over the rest of the suite."""
    added = outcome.grading_seconds - outcome.program_seconds
    rest = wall - outcome.grading_seconds
    grades = [g for r in outcome.ledger.records() for g in r.get("grades") or () if g]
    print(
        f"graded {len(grades)} lane texts: {outcome.grading_seconds:.2f} s grading, of "
        f"which {outcome.program_seconds:.2f} s in the programs' sandboxed subprocesses"
    )
    print(
        f"grading beyond the programs / the rest of the suite: {added / rest:.4f} (target <= 0.05)"
    )


if __name__ == "__main__":
    main()
