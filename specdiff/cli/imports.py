"""`specdiff import`: two runs of another evaluation tool (lm-evaluation-harness,
promptfoo) paired item by item, as a suite compares its two lanes: which outputs differ,
which grades flipped, McNemar's test; one line on stdout, a report folder with --report.
Exit 0 when every output agrees, 1 when some differ, 2 when the runs cannot be read or
paired."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specdiff.cli.common import CommandParser, Exit, Subcommands, add_command

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
    comparison = compare_runs(run_a, run_b)
    if args.report is not None:
        written = write_import_reports(Path(args.report).expanduser(), comparison.to_json())
        print(f"specdiff: wrote {', '.join(str(p) for p in written)}", file=sys.stderr)
    print(comparison.summary_line())
    return Exit.DIFFERENT if comparison.differing else Exit.SAME
