"""Peak RSS of `specdiff run` with two lanes on the default model at n_ctx 4096.

Runs the real command in a child process and reads its peak resident set size with
resource.getrusage (target <= 1.5 GB).

    python benchmarks/run_memory.py [--pair spec-vs-plain] [--n-ctx 4096]
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys


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
    completed = subprocess.run(command, capture_output=True, text=True)
    if completed.returncode not in (0, 1):
        sys.exit(f"specdiff run failed: {completed.stderr.strip()}")
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # KiB on Linux
    peak_gb = peak_kib * 1024 / 1e9
    print(f"pair {args.pair}, two lanes, n_ctx {args.n_ctx}, {args.tokens} tokens")
    print(
        f"peak RSS of specdiff run: {peak_gb:.3f} GB ({peak_kib / 1024:.0f} MiB) "
        f"(target <= 1.5 GB; ratio to target {peak_gb / 1.5:.2f})"
    )


if __name__ == "__main__":
    main()
