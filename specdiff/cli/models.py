"""`specdiff models`: the known models, or requantized variants written into the cache."""

from __future__ import annotations

import argparse
import os
import sys

from specdiff.cli import options
from specdiff.cli.common import ArgumentError, CommandParser, Exit, Status, Subcommands, add_command
from specdiff.errors import did_you_mean
from specdiff.safe_text import visible


def add_parser(commands: Subcommands) -> None:
    models = add_command(commands, "models", "list known models, or make variants", command_models)
    model_commands = models.add_subparsers(dest="models_command", parser_class=CommandParser)
    model_commands.add_parser("list", help="list known models (the default)")
    variants = model_commands.add_parser(
        "variants", help="write requantized copies of a model into the cache"
    )
    variants.add_argument("--to", required=True, help="comma-separated types, e.g. f16,q8_0")
    variants.add_argument("--model", default="default", help="GGUF path (default: bundled)")
    variants.add_argument("--threads", type=options.thread_count, default=0)


def command_models(args: argparse.Namespace) -> int:
    # deferred: the engine, session and report modules load only for the command that runs
    from specdiff.engine.models import known_models

    status = Status(sys.stderr, True)
    if args.models_command == "variants":
        return make_variants(args, status)
    entries = known_models(status.message)
    print(f"{'role':<18} {'quant':<8} {'size':>9}  {'sha256':<12}  path")
    for entry in entries:
        print(
            f"{entry.role:<18} {entry.quantization:<8} {entry.size / 1e6:>7.1f}MB  "
            f"{entry.sha256[:12]}  {visible(str(entry.path))}"
        )
    return Exit.SAME


def make_variants(args: argparse.Namespace, status: Status) -> int:
    """Write each type of --to; print each copy's path."""
    # deferred: the engine, session and report modules load only for the command that runs
    from specdiff.engine.models import VARIANT_FTYPES, base_model_path, make_variant

    wanted = [part.strip().lower() for part in args.to.split(",") if part.strip()]
    unknown = [w for w in wanted if w not in VARIANT_FTYPES]
    if not wanted or unknown:
        raise ArgumentError(
            f"unknown variant {unknown[0] if unknown else args.to!r}; "
            f"{did_you_mean(unknown[0], VARIANT_FTYPES) if unknown else ''}"
            f"choose from {', '.join(VARIANT_FTYPES)}"
        )
    base = base_model_path(args.model, status.message)
    threads = args.threads or os.cpu_count() or 1
    for quant in wanted:
        print(visible(str(make_variant(base, quant, threads, status.message))))
    return Exit.SAME
