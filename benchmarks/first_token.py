"""Time from `specdiff run --max-tokens 1`'s start to its first token: with the kernel
probe's verdict cached vs with no probe at all (SPECDIFF_PROBE=off).

Each repetition starts fresh processes, the two kinds alternating so both see the same
machine state; the first token is when the run's progress line first says
"generating" (stderr is a pseudo-terminal, where that line is drawn as each step
arrives). Prints both medians and their difference (target: within 0.3 s). Run once
beforehand so that the probe's verdict is cached; `--uncached` also times one run that
probes, in a cache directory of its own.

    python benchmarks/first_token.py [--repeat 7] [--uncached]
"""

from __future__ import annotations

import argparse
import os
import pty
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import median  # noqa: E402

from specdiff.engine.models import models_dir  # noqa: E402

COMMAND = ["run", "--max-tokens", "1", "--prompt", "The capital of France is"]
FIRST_TOKEN = b"generating:"


def first_token_seconds(env: dict[str, str]) -> float:
    """Seconds from the command's start to its first step on the progress line."""
    controller, terminal = pty.openpty()
    began = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "specdiff", *COMMAND],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=terminal,
        env=env,
    )
    os.close(terminal)
    seen, first = b"", None
    while True:
        try:
            chunk = os.read(controller, 4096)
        except OSError:  # the terminal closed with the process
            break
        if not chunk:
            break
        seen += chunk
        if first is None and FIRST_TOKEN in seen:
            first = time.perf_counter() - began
    process.wait()
    os.close(controller)
    if first is None:
        raise SystemExit(f"no token seen (exit {process.returncode}): {seen[-400:]!r}")
    return first


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--uncached", action="store_true", help="also time one probing run")
    args = parser.parse_args()
    base = {**os.environ, "PYTHONWARNINGS": "ignore"}
    base.pop("SPECDIFF_PROBE_FAULT", None)
    cached_env = {k: v for k, v in base.items() if k != "SPECDIFF_PROBE"}
    unprobed_env = {**base, "SPECDIFF_PROBE": "off"}
    first_token_seconds(cached_env)  # the verdict is cached from here on
    cached: list[float] = []
    unprobed: list[float] = []
    for index in range(args.repeat):
        order = [(cached, cached_env), (unprobed, unprobed_env)]
        for times, env in order if index % 2 == 0 else reversed(order):
            times.append(first_token_seconds(env))
    print(f"first token, verdict cached: median {median(cached):.3f} s over {len(cached)}")
    print(f"first token, no probe:       median {median(unprobed):.3f} s over {len(unprobed)}")
    print(f"cached probe costs:          {median(cached) - median(unprobed):+.3f} s")
    if args.uncached:
        with tempfile.TemporaryDirectory() as cache:
            (Path(cache) / "models").symlink_to(models_dir(), target_is_directory=True)
            probing = first_token_seconds({**cached_env, "SPECDIFF_CACHE_DIR": cache})
        print(f"first token, probing first:  {probing:.3f} s (once per build, model, n_ubatch)")


if __name__ == "__main__":
    main()
