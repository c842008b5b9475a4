"""`specdiff repeat`: one prompt N times on one lane, each run beside other sequences in
the batch (or other requests to a server); exit 1 when the completions split.

The runs happen in a worker process, which alone loads llama.cpp: a native crash there
is one line and exit 2."""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from specdiff.cli import options
from specdiff.cli.cluster import add_ray_options, check_ray_options, cpus_of, joined
from specdiff.cli.common import (
    ArgumentError,
    Exit,
    Status,
    Subcommands,
    add_command,
    bar_line,
    interrupt_sets,
    read_prompt,
)
from specdiff.lanes import Lane, apply_overrides, parse_overrides, without_credentials
from specdiff.safe_text import terminal_text, visible

if TYPE_CHECKING:
    from specdiff.repeat_summary import RepeatSummary, SweepSummary


def add_parser(commands: Subcommands) -> None:
    parser = add_command(
        commands,
        "repeat",
        "one prompt N times on one lane, beside other sequences in the batch",
        command_repeat,
    )
    options.add_prompt_options(parser, file_help="read the prompt from FILE")
    parser.add_argument(
        "-n", "--runs", type=options.run_count, default=8, help="how many runs (default 8)"
    )
    parser.add_argument(
        "--companions",
        type=count_list("--companions", 0, 255),
        metavar="K[,K...]",
        help="run r shares its batches with r mod (K+1) other sequences (default K=3); "
        "a list (0,1,3,7) sweeps: each run beside exactly K, per value",
    )
    options.add_max_tokens(parser)
    parser.add_argument(
        "--batch",
        type=options.whole_number(1, 256),
        metavar="B",
        help="batch the runs themselves: up to B in flight in one KV memory, a new run "
        "entering as one ends (continuous batching; for -n 1000)",
    )
    parser.add_argument(
        "--endpoint",
        metavar="URL",
        help="repeat against a server (OpenAI-compatible, or --lane api=llama-server)",
    )
    parser.add_argument(
        "--concurrency",
        type=count_list("--concurrency", 1, 1024),
        metavar="C[,C...]",
        help="with --endpoint: requests in flight at once (default 4); a list (1,2,4,8) sweeps",
    )
    parser.add_argument(
        "--plot",
        metavar="FILE.svg",
        help="with a sweep: write unique completions and the first split against the value",
    )
    options.add_model(parser)
    parser.add_argument(
        "--lane", action="append", default=[], metavar="KEY=VALUE", help="lane setting"
    )
    parser.add_argument(
        "--control",
        action="store_true",
        help="refused: every run of repeat is lane a again, so the runs are each other's control",
    )
    add_ray_options(parser)
    options.add_json_summary(parser)
    options.add_quiet(parser)


def count_list(flag: str, low: int, high: int) -> Callable[[str], list[int]]:
    """An argparse type: one whole number, or a comma-separated list of distinct ones
    (a sweep), each from low to high."""
    number = options.whole_number(low, high)

    def read(text: str) -> list[int]:
        parts = text.split(",")
        if not text.strip() or any(not part.strip() for part in parts):
            raise argparse.ArgumentTypeError(
                f"needs whole numbers separated by commas, e.g. {low},{low + 1}; got {text!r}"
            )
        values = [number(part) for part in parts]
        repeated = sorted({v for v in values if values.count(v) > 1})
        if repeated:
            raise argparse.ArgumentTypeError(
                f"lists {', '.join(map(str, repeated))} twice; give each value once"
            )
        return values

    return read


def repeat_lane(args: argparse.Namespace) -> Lane:
    """A plain lane with --lane, --model and --endpoint applied."""
    settings = parse_overrides(args.lane)
    if args.model:
        settings.setdefault("model", args.model)
    if args.endpoint is not None:  # an empty one (an unset variable) is refused, not ignored
        settings.update(backend="server", endpoint=args.endpoint)
    return apply_overrides(Lane(), settings)


def widths(args: argparse.Namespace, served: bool) -> list[int]:
    """The companions (in-process) or the concurrency (server) to repeat at: several
    values are a sweep. Refuses options that do not go with the mode."""
    if served and args.companions is not None:
        raise ArgumentError(
            "--companions sets in-process batches; with --endpoint use --concurrency"
        )
    if not served and args.concurrency is not None:
        raise ArgumentError(
            "--concurrency needs --endpoint; in-process, use --companions or --batch"
        )
    if args.batch is not None and served:
        raise ArgumentError(
            "--batch batches in-process runs; a server batches requests itself: use --concurrency"
        )
    if args.batch is not None and args.companions is not None:
        raise ArgumentError("--batch runs the prompt beside its own runs; drop --companions")
    values = (args.concurrency or [4]) if served else (args.companions or [3])
    if args.plot is not None and len(values) < 2:
        raise ArgumentError(
            "--plot draws a sweep: give a list, e.g. --companions 0,1,3,7 or --concurrency 1,2,4,8"
        )
    return values


def command_repeat(args: argparse.Namespace) -> int:
    """Exit 0 when every run gave the same tokens, 1 when they split, 130 when stopped."""
    # deferred: the engine, session and report modules load only for the command that runs
    from specdiff.engine.worker import call_in_worker
    from specdiff.repeat import check_batch, check_repeat, run_repeat, run_sweep

    if args.control:
        raise ArgumentError(
            "--control has no meaning for repeat: every run is the same lane again, so the "
            "runs are each other's control; for the noise floor without the load, sweep "
            "down to it (--companions 0,3 or --concurrency 1,4)"
        )
    check_ray_options(args)
    lane = repeat_lane(args)
    if lane.chat:
        raise ArgumentError(
            "repeat decodes the prompt in-process as raw text, so chat would change nothing; "
            "drop chat, repeat against a server with --lane api=chat, or compare chat lanes "
            "with run or suite"
        )
    prompt = read_prompt(args)
    served = lane.backend == "server"
    values = widths(args, served)
    for value in values:
        check_repeat(lane, prompt, args.runs, value, args.max_tokens)
    if args.batch is not None:
        check_batch(lane, args.batch, args.max_tokens)
    if args.plot is not None:
        check_plot(Path(args.plot))
    if args.ray is not None:
        check_ray_repeat(args, served, values)
    where = without_credentials(lane.endpoint)
    status = Status(sys.stderr, not args.quiet)
    status.message(opening_line(args, values, where, served))
    cancel = threading.Event()
    bar = RunProgress(status, args.runs * len(values))
    events: dict[str, Callable[..., None]] = {"on_run": bar.ended, "progress": status.message}
    doing = "repeating the prompt" + (f" against {where}" if served else "")
    data: RepeatSummary | SweepSummary
    with interrupt_sets(cancel):
        if args.ray is not None:
            data = ray_repeat(args, lane, prompt, values[0], bar, cancel, status)
        elif len(values) > 1:
            sweep = (lane, prompt, args.runs, values, args.max_tokens)
            data = call_in_worker(run_sweep, sweep, events, cancel, doing=doing)
        else:
            one = (lane, prompt, args.runs, values[0], args.max_tokens, args.batch)
            data = call_in_worker(run_repeat, one, events, cancel, doing=doing)
    status.done()
    return report(args, data)


def check_ray_repeat(args: argparse.Namespace, served: bool, values: list[int]) -> None:
    """--ray shares a plain in-process repeat's runs among actors: the other modes each
    need their runs in one place (one batch, one server's load, one sweep's context)."""
    if served:
        raise ArgumentError("--ray runs in-process repeats; a server repeat drops --ray")
    if args.batch is not None:
        raise ArgumentError("--batch runs every run in one KV memory; drop --batch or --ray")
    if len(values) > 1:
        raise ArgumentError("--ray runs one --companions value; sweep without --ray")


def ray_repeat(
    args: argparse.Namespace,
    lane: Lane,
    prompt: str,
    width: int,
    bar: RunProgress,
    cancel: threading.Event,
    status: Status,
) -> RepeatSummary:
    """The repeat's runs shared among the actors of the cluster --ray names."""
    from specdiff.cluster.repeat import repeat_on_cluster  # deferred: Ray loads only here

    with joined(args, status.message) as (_, actors):
        return repeat_on_cluster(
            lane, prompt, args.runs, width, args.max_tokens, actors, cpus_of(args),
            bar.ended, cancel, status.message,
        )  # fmt: skip


def check_plot(path: Path) -> None:
    """Refused before any run: a plot that could not be written at the end."""
    options.check_output_file(path, "--plot")
    if path.suffix.lower() != ".svg":
        raise ArgumentError(f"--plot writes SVG: name a .svg file, got {path.name}")


def opening_line(args: argparse.Namespace, values: list[int], where: str, served: bool) -> str:
    """What the command is about to do, before the model loads."""
    what = f"a sweep of {len(values)} values x {args.runs} runs" if len(values) > 1 else ""
    if served:
        return f"repeat: {what or f'{args.runs} requests'} to {where}, " + (
            f"{values[0]} at a time" if len(values) == 1 else "concurrency " + list_text(values)
        )
    if args.batch is not None:
        return f"repeat: {args.runs} runs of a plain lane, up to {args.batch} in flight at once"
    if len(values) > 1:
        return f"repeat: {what}, each run beside exactly {list_text(values)} other sequences"
    return f"repeat: {args.runs} runs of a plain lane, each beside 0..{values[0]} other sequences"


def list_text(values: list[int]) -> str:
    """Values as the option reads them: 0,1,3,7."""
    return ",".join(str(value) for value in values)


def report(args: argparse.Namespace, data: RepeatSummary | SweepSummary) -> int:
    """Print the summary (or the sweep's table) and write the plot; the exit code counts
    a split at any value."""
    from specdiff.repeat_summary import format_summary, format_sweep  # deferred, as above

    if args.json:
        # ASCII: a completion's control characters stay escapes on the terminal
        json.dump(data, sys.stdout, indent=1, ensure_ascii=True)
        sys.stdout.write("\n")
    if "points" not in data:
        if not args.json:
            print(terminal_text(format_summary(data)))
        unique = [data["unique"]]
    else:
        if not args.json:
            print(terminal_text(format_sweep(data)))
        if args.plot is not None:
            # written after the table is out, so a failed write loses no result
            write_plot(args.plot, data, args.quiet)
        unique = [point["unique"] for point in data["points"]]
    if data["cancelled"]:
        return Exit.INTERRUPTED
    return Exit.SAME if max(unique, default=1) <= 1 else Exit.DIFFERENT


def write_plot(plot: str, data: SweepSummary, quiet: bool) -> None:
    """The sweep's chart as SVG to --plot's file (only a sweep takes --plot)."""
    from specdiff.reports.repeat import sweep_chart  # deferred: only a plot needs the chart

    options.write_output_file(Path(plot), sweep_chart(data), "--plot")
    if not quiet:
        print(f"plot: {visible(plot)}", file=sys.stderr)


class RunProgress:
    """Runs done, their rate and the time left: a bar rewritten in place on a terminal,
    else a line at every tenth of the runs or each minute, whichever comes first."""

    def __init__(self, status: Status, total: int) -> None:
        self.status = status
        self.total = total
        self.done = 0
        self.first = self.last_line = time.monotonic()
        self.tenths = 0

    def ended(self, _number: int, _tokens: int, _beside: int) -> None:
        # deferred: the suite's runner loads for the first progress line only
        from specdiff.suite.runner import duration

        self.done += 1
        now = time.monotonic()
        if self.done == 1:
            self.first = now  # the rate is taken from here: loading the model is no run
        rate = (self.done - 1) / (now - self.first) if now > self.first else 0.0
        left = (self.total - self.done) / rate if rate else None
        figures = f"{self.done}/{self.total} runs · {rate:.2f} runs/s · ETA {duration(left)}"
        if self.status.live:
            self.status.bar(self.done / self.total, figures)
            return
        line = bar_line(self.done / self.total, figures, None)
        tenths = self.done * 10 // self.total
        if tenths > self.tenths or now - self.last_line >= 60:
            self.tenths, self.last_line = tenths, now
            self.status.message(line)
