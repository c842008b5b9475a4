"""`specdiff import`: two runs of another evaluation tool (lm-evaluation-harness,
promptfoo) paired item by item, as a suite compares its two lanes: which outputs differ,
which grades flipped, McNemar's test; one line on stdout, a report folder with --report.
Exit 0 when every output agrees, 1 when some differ, 2 when the runs cannot be read or
paired."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from specdiff.cli import options
from specdiff.cli.common import ArgumentError, CommandParser, Exit, Subcommands, add_command

TOOLS = {
    "lm-eval": (
        "two lm-evaluation-harness --log_samples runs (their --output_path folders)",
        "an lm-eval --output_path folder (or one samples_<task>_<time>.jsonl)",
    ),
    "promptfoo": (
        "two promptfoo `eval -o out.json` results",
        "a JSON file promptfoo eval -o wrote",
    ),
}


def add_parser(commands: Subcommands) -> None:
    importing = add_command(
        commands,
        "import",
        "compare two runs of lm-evaluation-harness or promptfoo item by item",
        command_import,
    )
    tools = importing.add_subparsers(dest="tool", parser_class=CommandParser, required=True)
    for tool, (description, run_help) in TOOLS.items():
        parser = tools.add_parser(tool, help=description, description=description)
        parser.add_argument("run_a", metavar="RUN_A", help=f"{run_help}: lane a")
        parser.add_argument("run_b", metavar="RUN_B", help=f"{run_help}: lane b")
        parser.add_argument(
            "--report",
            metavar="DIR",
            help="write report.json, report.md and report.html into DIR (made if missing)",
        )
        parser.add_argument(
            "--rerun",
            action="store_true",
            help="send the prompts of the items whose outputs differ through --pair, as a "
            "suite into DIR/rerun, to find where each forks and the margins there "
            "(needs --report)",
        )
        parser.add_argument(
            "--pair", default="spec-vs-plain", help="the pair --rerun runs (default: %(default)s)"
        )
        parser.add_argument(
            "--max-tokens",
            type=options.token_budget,
            default=64,
            metavar="N",
            help="tokens each --rerun lane generates (default: %(default)s)",
        )


def command_import(args: argparse.Namespace) -> int:
    """Exit 0 when the two runs' outputs agree item for item, 1 when some differ."""
    # deferred: the readers and the report load only for the command that runs
    from specdiff.imports.compare import compare_runs
    from specdiff.imports.lm_eval import read_lm_eval
    from specdiff.imports.promptfoo import pair_providers, read_promptfoo
    from specdiff.reports.imported import write_import_reports

    paths = Path(args.run_a).expanduser(), Path(args.run_b).expanduser()
    if args.tool == "lm-eval":
        run_a, run_b = read_lm_eval(paths[0]), read_lm_eval(paths[1])
    else:
        run_a, run_b = read_promptfoo(paths[0]), read_promptfoo(paths[1])
        run_b = pair_providers(run_a, run_b)
    if args.rerun and args.report is None:
        raise ArgumentError("--rerun writes its suite into the report folder: give --report DIR")
    if args.rerun:
        # deferred: the presets load only for a rerun; an unknown pair is refused before
        # anything is read
        from specdiff.api import pair

        args.pair = pair(args.pair)
    comparison = compare_runs(run_a, run_b)
    data = comparison.to_json()
    lines = [comparison.summary_line()]
    if args.rerun:
        lines.append(rerun(data, Path(args.report).expanduser() / "rerun", args))
    if args.report is not None:
        written = write_import_reports(Path(args.report).expanduser(), data)
        print(f"specdiff: wrote {', '.join(str(p) for p in written)}", file=sys.stderr)
    print("\n".join(lines))
    return Exit.DIFFERENT if comparison.differing else Exit.SAME


def rerun(data: dict[str, Any], folder: Path, args: argparse.Namespace) -> str:
    """Run the differing items' prompts through --pair as a suite in `folder` (replaced
    if it is there), and mark each item in `data` with its run: fork and margins. The
    line that says how many forked."""
    # deferred: the suite runner and the engine load only for a rerun
    from specdiff.api import run_suite
    from specdiff.imports.rerun import differing_prompts, mark_reruns

    prompts = differing_prompts(data)
    if not prompts:
        return f"rerun through {args.pair.name}: no item differs, nothing to run"
    suite = run_suite(prompts, [args.pair], folder, args.max_tokens, force=True)
    return mark_reruns(data, suite["prompts"], args.pair.name)
