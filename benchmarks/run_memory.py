"""Peak RSS of `specdiff run` with two lanes on the default model at n_ctx 4096: the
command's own process and the worker process that holds the lanes, added up.

Samples /proc every 20 ms while the real command runs (target <= 1.5 GB together).

    python benchmarks/run_memory.py [--pair spec-vs-plain] [--n-ctx 4096]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path


def rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def descendants(pid: int) -> list[int]:
    """The process and everything below it, from /proc's parent links."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                parents[int(entry.name)] = int(fields[1])
            except (OSError, ValueError, IndexError):
                continue
    found, frontier = [pid], [pid]
    while frontier:
        frontier = [child for child, parent in parents.items() if parent in frontier]
        found.extend(frontier)
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pair", default="spec-vs-plain")
    parser.add_argument("--n-ctx", type=int, default=4096)
    parser.add_argument("--tokens", type=int, default=200)
    args = parser.parse_args()
    command = [
        sys.executable,
        "-m",
        "specdiff",
        "run",
        "--pair",
        args.pair,
        "--both",
        f"n_ctx={args.n_ctx}",
        "--max-tokens",
        str(args.tokens),
        "--quiet",
        "--json",
    ]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak_total = peak_front = 0
    while process.poll() is None:
        pids = descendants(process.pid)
        peak_total = max(peak_total, sum(rss_kib(pid) for pid in pids))
        peak_front = max(peak_front, rss_kib(process.pid))
        time.sleep(0.02)
    if process.returncode not in (0, 1):
        sys.exit(f"specdiff run failed: {process.stderr.read().decode().strip()}")
    total_gb = peak_total * 1024 / 1e9
    print(f"pair {args.pair}, two lanes, n_ctx {args.n_ctx}, {args.tokens} tokens")
    print(f"peak RSS of the front end alone: {peak_front / 1024:.0f} MiB")
    print(
        f"peak RSS of specdiff run, worker included: {total_gb:.3f} GB "
        f"({peak_total / 1024:.0f} MiB) (target <= 1.5 GB; ratio to target {total_gb / 1.5:.2f})"
    )


if __name__ == "__main__":
    main()
