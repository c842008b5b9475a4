"""`specdiff explain`: the fork autopsy. Which setting, which layer and which operation
made two lanes fork, for a saved session or a pair and prompt given as `run` takes them.

The work runs in a worker process (`call_in_worker`), as every decoding command's
does, so a native crash in a kernel ends the command with one line and llama.cpp
never loads in this process.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from pathlib import Path

from specdiff.autopsy import AutopsyError, AutopsyInterrupted, save_beside
from specdiff.cli import options
from specdiff.cli.common import Exit, Status, Subcommands, add_command, interrupt_sets
from specdiff.cli.run import read_chat_request
from specdiff.compare import DEFAULT_NEAR_TIE
from specdiff.errors import ModelError, SpecdiffError
from specdiff.lanes import Pair
from specdiff.safe_text import visible

DEFAULT_MAX_RUNS = 8
"""The pair as given, its one differing setting, and the six kernel switches."""
DEFAULT_EXPLAIN_TOKENS = 100


def add_parser(commands: Subcommands) -> None:
    explain = add_command(
        commands,
        "explain",
        "trace a fork to the setting, the layer and the operation that caused it",
        command_explain,
    )
    explain.add_argument(
        "session", nargs="?", help="a session file (.jsonl) to explain; else the pair options"
    )
    options.add_lane_options(explain)
    options.add_prompt_options(explain)
    options.add_chat_options(explain)
    explain.add_argument(
        "--max-tokens",
        type=options.token_budget,
        default=None,
        help=f"tokens per lane in each run (default {DEFAULT_EXPLAIN_TOKENS}; a session: its own)",
    )
    # a run's near-tie threshold marks steps and changes no token: nothing here reads it
    explain.set_defaults(near_tie=DEFAULT_NEAR_TIE)
    explain.add_argument(
        "--max-runs",
        type=options.whole_number(1, 100),
        default=DEFAULT_MAX_RUNS,
        help=f"runs of the pair the settings sweep may make, the first included "
        f"(default {DEFAULT_MAX_RUNS})",
    )
    explain.add_argument(
        "--no-cache",
        action="store_true",
        help="run every setting again, not reading or writing the cache of earlier runs",
    )
    explain.add_argument(
        "--svg", metavar="FILE", help="also write the per-layer growth chart as SVG to FILE"
    )
    explain.add_argument(
        "--save",
        action="store_true",
        help="with a session file: also write the autopsy beside it (NAME.autopsy.json), "
        "where the TUI's w key finds it in a replay without loading the model",
    )
    options.add_json_summary(explain)
    options.add_quiet(explain)
    options.add_allow_servers(explain)


def command_explain(args: argparse.Namespace) -> int:
    """Exit 0 with the autopsy (or with nothing to explain), 2 on bad input."""
    # deferred: the engine and report modules load only for the command that runs
    from specdiff.engine.autopsy import explain_pair, refuse_servers
    from specdiff.engine.models import cache_dir
    from specdiff.engine.worker import call_in_worker
    from specdiff.reports.autopsy import format_autopsy, growth_svg

    if args.save and args.session is None:
        raise SpecdiffError("--save writes beside a session file: give one, or leave --save out")
    pair, prompt, max_tokens = read_target(args)
    refuse_servers(pair)
    svg = Path(args.svg).expanduser() if args.svg else None
    if svg is not None:
        options.check_output_file(svg, "--svg")
    status = Status(sys.stderr, not args.quiet)
    cancel = threading.Event()
    cache = None if args.no_cache else str(cache_dir() / "explain")
    try:
        with interrupt_sets(cancel):
            autopsy = call_in_worker(
                explain_pair,
                (pair, prompt, max_tokens, args.max_runs, cache),
                {"progress": status.message},
                cancel,
                doing="explaining the fork",
            )
    except AutopsyInterrupted:
        status.done()
        print("specdiff: interrupted", file=sys.stderr)
        return Exit.INTERRUPTED
    status.done()
    if svg is not None and not autopsy.nothing_to_explain:
        options.write_output_file(svg, growth_svg(autopsy), "--svg")
    if args.save:
        saved = save_beside(Path(args.session).expanduser(), autopsy)
        if not args.quiet:
            print(f"specdiff: autopsy saved as {visible(str(saved), 160)}", file=sys.stderr)
    if args.json:
        json.dump(autopsy.to_json(), sys.stdout, indent=1, ensure_ascii=True, allow_nan=False)
        sys.stdout.write("\n")
    else:
        print(format_autopsy(autopsy))
    return Exit.SAME


def read_target(args: argparse.Namespace) -> tuple[Pair, str, int]:
    """The pair, prompt and token budget: from the session file, or from the options."""
    if args.session is None:
        if args.max_tokens is None:
            args.max_tokens = DEFAULT_EXPLAIN_TOKENS
        _, pair, prompt = read_chat_request(args)
        return pair, prompt, args.max_tokens
    from specdiff.sessions.store import load_session  # deferred: only a session needs it

    given = [flag for flag, value in _pair_options(args) if value]
    if given:
        raise SpecdiffError(
            f"give a session file or {', '.join(given)}, not both: a session names its pair "
            "and prompt"
        )
    session = load_session(args.session)
    pair = session.pair
    unsafe = pair.servers_named(session.path.name)
    if unsafe and not args.allow_servers:
        raise SpecdiffError(unsafe)
    for lane_id, lane in (("a", pair.a), ("b", pair.b)):
        if lane.backend == "local" and lane.model != "default":
            path = Path(lane.model).expanduser()
            if not path.is_file():
                raise ModelError(
                    f"{visible(session.path.name)}: lane {lane_id}'s model file "
                    f"{visible(str(path), 160)} is missing; put it back there, or run "
                    "explain with --pair and --model"
                )
    max_tokens = args.max_tokens or session.header.max_tokens
    if max_tokens < 1:
        raise AutopsyError(f"{visible(session.path.name)}: the session's token budget is 0")
    return pair, session.prompt, max_tokens


def _pair_options(args: argparse.Namespace) -> list[tuple[str, object]]:
    return [
        ("--prompt", args.prompt),
        ("--prompt-file", args.prompt_file),
        ("--messages", args.messages),
        ("--system", args.system),
        ("--pairs", args.pairs),
        ("--model", args.model),
        ("--lane-a", args.lane_a),
        ("--lane-b", args.lane_b),
        ("--both", args.both),
        ("--pair", args.pair != options.DEFAULT_PAIR),
    ]
