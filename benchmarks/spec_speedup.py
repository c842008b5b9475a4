"""Speculative (n-gram prompt lookup) lane vs plain lane, tokens per second, beside
llama-server's own n-gram speculation vs llama-server's own plain decoding.

On the bundled repetitive prompts (rewrite / extract / repeat tasks, where n-gram drafts
hit) and on open-ended ones. For each prompt, in an order that rotates from prompt to
prompt and round to round (so that a change in the machine's load falls on every
measurement alike): specdiff's spec-vs-plain pair (its two lanes step in turn), then
llama-server plain and one llama-server per n-gram type (`--spec-type`), all on the same
model, with the lanes' threads, context, batch sizes, flash-attention and kernels
(repack as the lanes run it). Prints per set the median of the per-prompt ratios spec ÷
plain: specdiff's (its own decode clock, from the first token), and llama-server's per
type from its `timings.predicted_per_second` and from the wall clock (first to last
streamed token). Each round starts the servers afresh (ngram-mod and ngram-cache learn
from every request they serve, so within a round from the prompts before), and each
prompt counts the fastest spec and fastest plain speed of its rounds: a busy moment only
ever slows a measurement. Targets: specdiff >= 1.5x repetitive, >= 0.9x open, and at
least llama-server's best n-gram type.

    python benchmarks/spec_speedup.py [--tokens 200] [--sets repetitive open]
        [--prompts N] [--rounds 2] [--lane-a spec_drafts=8 ...]
        [--no-server | --server-only] [--spec-types ngram-simple,ngram-mod]
        [--draft-max N]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections import defaultdict
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import median, prompts  # noqa: E402
from _llama_server_spec import PLAIN, Completion, ServerSet  # noqa: E402

from specdiff.engine.pairrun import PairRun  # noqa: E402
from specdiff.lanes import apply_overrides, parse_overrides, presets  # noqa: E402

SPECDIFF = "specdiff"


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--sets", nargs="+", default=["repetitive", "open"])
    parser.add_argument("--prompts", type=int, default=0, help="the first N of each set (0: all)")
    parser.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="times each prompt is measured, on servers started afresh; the best counts",
    )
    parser.add_argument("--lane-a", action="append", default=[])
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--no-server", action="store_true", help="specdiff's lanes only")
    which.add_argument("--server-only", action="store_true", help="llama-server only")
    parser.add_argument(
        "--spec-types", default="", help="comma-separated llama-server types (default: n-gram ones)"
    )
    parser.add_argument(
        "--draft-max",
        type=int,
        default=None,
        help="llama-server's --spec-draft-n-max (default: the server's own default)",
    )
    return parser.parse_args()


class Measured:
    """Per set, per configuration, per prompt: the speeds of every round, spec and plain,
    and the drafted and accepted tokens of the first round."""

    def __init__(self) -> None:
        self.speeds: dict[tuple[str, str, str], dict[int, list[tuple[float, float]]]] = defaultdict(
            lambda: defaultdict(list)
        )
        self.drafts: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
        """Accepted and drafted tokens, summed over the prompts (first round)."""

    def add(self, key: tuple[str, str, str], prompt: int, spec: float, plain: float) -> None:
        self.speeds[key][prompt].append((spec, plain))

    def count_drafts(self, key: tuple[str, str], accepted: int, drafted: int) -> None:
        self.drafts[key][0] += accepted
        self.drafts[key][1] += drafted

    def best(self, key: tuple[str, str, str]) -> list[tuple[float, float]]:
        """Each prompt's fastest spec and fastest plain speed over the rounds: a busy
        moment only ever slows a measurement, so the fastest is the least disturbed."""
        return [
            (max(s for s, _ in rounds), max(p for _, p in rounds))
            for rounds in self.speeds[key].values()
        ]


def measure_prompt(
    name: str,
    number: int,
    first_round: bool,
    text: str,
    order: list[str],
    args: argparse.Namespace,
    runner: PairRun | None,
    servers: ServerSet | None,
    measured: Measured,
) -> None:
    pair_result = None
    done: dict[str, Completion] = {}
    for which in order:
        if which == SPECDIFF and runner is not None:
            pair_result = runner.run(text, args.tokens)
        elif servers is not None and which != SPECDIFF:
            done[which] = servers.complete(which, text, args.tokens)
    parts = []
    if pair_result is not None:
        a, b = pair_result.a, pair_result.b
        speeds = (a.tokens_per_second, b.tokens_per_second)
        measured.add((name, SPECDIFF, "own clock"), number, *speeds)
        if first_round:
            measured.count_drafts((name, SPECDIFF), a.accepted, a.drafted)
        parts.append(
            f"specdiff {a.tokens_per_second:5.1f}/{b.tokens_per_second:5.1f} "
            f"x{a.tokens_per_second / b.tokens_per_second:.2f} acc {a.acceptance or 0:.0%}"
        )
    if done:
        plain = done.pop(PLAIN)
        parts.append(f"server plain {plain.server_tokens_per_second:5.1f}")
        for kind, spec in done.items():
            server = (spec.server_tokens_per_second, plain.server_tokens_per_second)
            measured.add((name, kind, "timings"), number, *server)
            wall = (spec.wall_tokens_per_second, plain.wall_tokens_per_second)
            measured.add((name, kind, "wall"), number, *wall)
            if first_round:
                measured.count_drafts((name, kind), spec.accepted, spec.drafted)
            parts.append(f"{kind} x{server[0] / server[1]:.2f}")
    print(f"  {name:<10} " + "  ".join(parts), flush=True)


def report(name: str, measured: Measured) -> None:
    print(f"{name}: median over the prompts of spec ÷ plain, each the best of its rounds")
    for set_name, which, clock in measured.speeds:
        if set_name != name:
            continue
        best = measured.best((set_name, which, clock))
        ratios = [spec / plain for spec, plain in best]
        spec = median([s for s, _ in best])
        plain = median([p for _, p in best])
        accepted, drafted = measured.drafts[(set_name, which)]
        share = f"{accepted / drafted:.0%}" if drafted else "-"
        target = ""
        if which == SPECDIFF:
            target = f"  (target >= {1.5 if name == 'repetitive' else 0.9}x)"
        print(
            f"  {which:<14} {clock:<9} x{median(ratios):.2f} over {len(ratios)} "
            f"({spec:6.1f} / {plain:6.1f} tok/s; {accepted}/{drafted} drafts accepted, "
            f"{share}){target}",
            flush=True,
        )


def stop_on_sigterm(started: list[ServerSet]) -> None:
    """A killed benchmark (a timeout's SIGTERM) stops its servers first: the exit it then
    raises can land in a llama.cpp callback, which swallows it."""

    def unwind(signum: int, _frame: object) -> None:
        for servers in started:
            servers.stop()
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, unwind)


def main() -> None:
    args = parse_arguments()
    started: list[ServerSet] = []
    stop_on_sigterm(started)
    pair = presets()["spec-vs-plain"]
    pair = type(pair)(pair.name, apply_overrides(pair.a, parse_overrides(args.lane_a)), pair.b)
    measured = Measured()
    with ExitStack() as stack:
        runner = stack.enter_context(PairRun(pair))
        lane = runner.lanes["a"]
        repack = bool(lane.repack.on)
        print(
            f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; threads "
            f"{pair.a.threads}, repack {'on' if repack else 'off'}; "
            f"{args.tokens} tokens per completion; {args.rounds} round(s)",
            flush=True,
        )
        kinds = [kind for kind in args.spec_types.split(",") if kind]
        if args.server_only:
            runner.close()
        turn = 0
        for number in range(args.rounds):
            # every round on servers started afresh: ngram-mod and ngram-cache keep what
            # earlier requests taught them, and a prompt seen in an earlier round would
            # be drafted from its own previous answer (within a round they still learn
            # from the prompts before, as a server in use does). The order shifts by the
            # round too, or a round of len(order) prompts would repeat the last one's.
            with ExitStack() as round_stack:
                servers = None
                if not args.no_server:
                    servers = ServerSet(lane.model_path, pair.b, repack, kinds, args.draft_max)
                    started[:] = [servers]
                    round_stack.enter_context(servers)
                order = [SPECDIFF, PLAIN, *(servers.kinds if servers is not None else [])]
                for name in args.sets:
                    for index, text in enumerate(prompts(name)[: args.prompts or None]):
                        shift = (turn + number) % len(order)
                        measure_prompt(
                            name, index, number == 0, text, order[shift:] + order[:shift],
                            args, None if args.server_only else runner, servers, measured,
                        )  # fmt: skip
                        turn += 1
        for name in args.sets:
            report(name, measured)
        print(f"load {os.getloadavg()[0]:.1f} at the end", flush=True)


if __name__ == "__main__":
    main()
