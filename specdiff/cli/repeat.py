"""`specdiff repeat`: one prompt N times on one lane, each run beside other sequences in
the batch (or other requests to a server); exit 1 when the completions split.

The runs happen in a worker process, which alone loads llama.cpp: a native crash there
is one line and exit 2."""

from __future__ import annotations

import argparse
import json
import sys
import threading
from typing import TYPE_CHECKING

from specdiff.cli import options
from specdiff.cli.common import Exit, Status, Subcommands, add_command, interrupt_sets, read_prompt
from specdiff.lanes import Lane, apply_overrides, parse_overrides, without_credentials
from specdiff.safe_text import terminal_text

if TYPE_CHECKING:
    from specdiff.steps import TokenStep


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
        type=options.companion_count,
        default=3,
        help="run r shares its batches with r mod (K+1) other sequences (default K=3)",
    )
    options.add_max_tokens(parser)
    parser.add_argument(
        "--endpoint",
        metavar="URL",
        help="repeat against a server (OpenAI-compatible, or --lane api=llama-server)",
    )
    parser.add_argument(
        "--concurrency",
        type=options.concurrency,
        default=4,
        help="with --endpoint: requests in flight at once (default 4)",
    )
    options.add_model(parser)
    parser.add_argument(
        "--lane", action="append", default=[], metavar="KEY=VALUE", help="lane setting"
    )
    options.add_json_summary(parser)
    options.add_quiet(parser)


def repeat_lane(args: argparse.Namespace) -> Lane:
    """A plain lane with --lane, --model and --endpoint applied."""
    settings = parse_overrides(args.lane)
    if args.model:
        settings.setdefault("model", args.model)
    if args.endpoint:
        settings.update(backend="server", endpoint=args.endpoint)
    return apply_overrides(Lane(), settings)


def command_repeat(args: argparse.Namespace) -> int:
    """Exit 0 when every run gave the same tokens, 1 when they split, 130 when stopped."""
    # deferred: the engine, session and report modules load only for the command that runs
    from specdiff.engine.worker import call_in_worker
    from specdiff.repeat import check_repeat, format_summary, run_repeat

    lane = repeat_lane(args)
    prompt = read_prompt(args)
    served = lane.backend == "server"
    width = args.concurrency if served else args.companions
    check_repeat(lane, prompt, args.runs, width, args.max_tokens)
    where = without_credentials(lane.endpoint)
    status = Status(sys.stderr, not args.quiet)
    cancel = threading.Event()
    if served:
        status.message(f"repeat: {args.runs} requests to {where}, {args.concurrency} at a time")
    else:
        status.message(
            f"repeat: {args.runs} runs of a plain lane, each beside 0..{args.companions} "
            "other sequences"
        )

    def on_run(number: int, steps: list[TokenStep], companions: int) -> None:
        beside = (
            f"{args.concurrency} in flight"
            if served
            else f"beside {companions} other sequence{'s' if companions != 1 else ''}"
        )
        status.message(f"run {number + 1}/{args.runs}: {len(steps)} tokens, {beside}")

    with interrupt_sets(cancel):
        data = call_in_worker(
            run_repeat,
            (lane, prompt, args.runs, width, args.max_tokens),
            {"on_run": on_run, "progress": status.message},
            cancel,
            doing="repeating the prompt" + (f" against {where}" if served else ""),
        )
    if args.json:
        # ASCII: a completion's control characters stay escapes on the terminal
        json.dump(data, sys.stdout, indent=1, ensure_ascii=True)
        sys.stdout.write("\n")
    else:
        print(terminal_text(format_summary(data)))
    if data["cancelled"]:
        return Exit.INTERRUPTED
    return Exit.SAME if data["unique"] <= 1 else Exit.DIFFERENT
