"""`specdiff export`: a saved session as one self-contained report (md, html or json);
with --format llm-comparator, a suite folder (or a session) as LLM Comparator's JSON."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from specdiff.cli import options
from specdiff.cli.common import Exit, Subcommands, add_command
from specdiff.cli.session_arg import add_session_argument, session_path
from specdiff.files import check_replaceable
from specdiff.safe_text import json_text

LLM_COMPARATOR = "llm-comparator"


def add_parser(commands: Subcommands) -> None:
    export = add_command(
        commands,
        "export",
        "write a saved session as one self-contained report (md, html, json)",
        command_export,
    )
    add_session_argument(export)
    export.add_argument(
        "--format",
        metavar="FORMAT",
        help="md, html or json (default: --output's suffix, else md); llm-comparator "
        "writes LLM Comparator's JSON, and then SESSION may be a suite's --report folder",
    )
    export.add_argument(
        "--output",
        "-o",
        metavar="PATH",
        help="where to write; - for stdout (default: stdout when it is piped, else a "
        "file beside the session, or in the current folder if that one is read-only)",
    )
    export.add_argument(
        "--force", action="store_true", help="overwrite an existing --output (a regular file)"
    )
    options.add_near_tie(export)


def command_export(args: argparse.Namespace) -> int:
    """Exit 0 once the report is written; it describes the session, it does not judge it."""
    # deferred: the engine, session and report modules load only for the command that runs
    from specdiff.reports.export import check_output, export_session, report_format
    from specdiff.sessions.store import load_session

    if (args.format or "").strip().lower() == LLM_COMPARATOR:
        return export_llm_comparator(args)
    session = session_path(args)
    fmt = report_format(args.format, args.output)
    output = None if args.output in (None, "-") else Path(args.output).expanduser()
    if args.output is None and sys.stdout.isatty():
        # a report is a page of markup (an HTML one carries a base64 plot): a terminal
        # shows it as a wall of text, so it goes to a file and the terminal gets its name
        output = default_output(session, fmt)
    if output is not None:
        # refuse before the work of loading and rendering: a device, pipe or folder
        # first, whatever --force says, then an existing file without --force
        check_replaceable(output)
        check_output(output, args.force)
    report = export_session(load_session(session), fmt, args.near_tie)
    return _write(report, output, args.force)


def _write(report: str, output: Path | None, force: bool) -> int:
    # deferred: the report modules load only for the command that runs
    from specdiff.reports.export import write_report

    if output is not None:
        write_report(report, output, force)
        print(f"specdiff: wrote {output}", file=sys.stderr)
        return Exit.SAME
    binary = getattr(sys.stdout, "buffer", None)
    if binary is None:
        sys.stdout.write(report)
    else:
        # the report says it is UTF-8 (<meta charset>), whatever the terminal's encoding
        sys.stdout.flush()
        binary.write(report.encode("utf-8"))
        binary.flush()
    return Exit.SAME


def export_llm_comparator(args: argparse.Namespace) -> int:
    """The suite folder (or session) as LLM Comparator's JSON: to --output, to stdout
    when it is piped, else to llm-comparator.json in the suite folder."""
    # deferred: the session and report modules load only for the command that runs
    from specdiff.reports.export import check_output
    from specdiff.reports.llm_comparator import llm_comparator

    source = Path(args.session) if os.path.isdir(args.session) else session_path(args)
    output = None if args.output in (None, "-") else Path(args.output).expanduser()
    if args.output is None and sys.stdout.isatty():
        output = (
            source / "llm-comparator.json"
            if source.is_dir()
            else Path(source.name.removesuffix(".jsonl") + ".llm-comparator.json")
        )
    if output is not None:
        check_replaceable(output)
        check_output(output, args.force)
    data = llm_comparator(source)
    return _write(
        json_text(json.dumps(data, ensure_ascii=False, indent=1)) + "\n", output, args.force
    )


def default_output(session: Path, fmt: str) -> Path:
    """Where a report goes when stdout is a terminal: beside the session, named after
    it, or in the current folder where the session's folder is read-only."""
    name = session.name.removesuffix(".partial").removesuffix(".jsonl") + f".{fmt}"
    folder = session.expanduser().parent
    return folder / name if os.access(folder, os.W_OK) else Path(name)
