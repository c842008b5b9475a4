"""`specdiff suite merge DIR... --report OUT` (also `specdiff suite-merge`): the folders
of a suite's shards (`suite --shard I/N`) put together into one report, the report the
suite would have had run whole (`specdiff.suite.merge`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from specdiff.cli.common import ArgumentError, Exit, Subcommands, add_command
from specdiff.errors import SpecdiffError, printable

if TYPE_CHECKING:
    from specdiff.suite.merge import ShardFolder
    from specdiff.suite.prompts import SuitePrompt
    from specdiff.suite.settings import SuiteSettings

MERGE_COMMAND = "suite-merge"
"""The merge's own name; `specdiff suite merge ...` is read as it (`merge_arguments`)."""


def merge_arguments(arguments: list[str]) -> list[str]:
    """`suite merge ...` as `suite-merge ...`: PROMPTS is suite's first word otherwise
    (a prompt file named merge is reached as ./merge)."""
    if arguments[:2] == ["suite", "merge"]:
        return [MERGE_COMMAND, *arguments[2:]]
    return arguments


def add_parser(commands: Subcommands) -> None:
    merge = add_command(
        commands,
        MERGE_COMMAND,
        "put the folders of a suite's shards (suite --shard I/N) together into one report "
        "(also: specdiff suite merge)",
        command_merge,
    )
    merge.add_argument("folders", nargs="+", metavar="DIR", help="every shard's report folder")
    merge.add_argument("--report", metavar="OUT", required=True, help="the merged report folder")
    merge.add_argument(
        "--prompts",
        metavar="PROMPTS",
        help="the prompts the shards ran, where the path their suite.json names is not "
        "here (checked against the prompts' digest)",
    )
    merge.add_argument("--force", action="store_true", help="replace the report in OUT")


def command_merge(args: argparse.Namespace) -> int:
    """Exit 0 when every run of the merged suite finished; 1 when some failed or crashed."""
    # deferred: the suite's modules load only for the command that runs
    from specdiff.cli.suite import print_summary
    from specdiff.reports.suite import write_reports
    from specdiff.suite.folder import prepare_report_dir, write_settings
    from specdiff.suite.merge import (
        check_every_shard,
        check_same_suite,
        check_units,
        merge_shards,
    )
    from specdiff.suite.outcome import outcome_json
    from specdiff.suite.shards import suite_units

    out = Path(args.report).expanduser()
    shards = read_shards(args.folders, out)
    check_same_suite(shards)
    check_every_shard(shards)
    settings, prompts = shards_suite(shards, args.prompts)
    check_units(shards, suite_units(settings, prompts))
    prepare_report_dir(out, settings, prompts, resume=False, force=args.force)
    write_settings(out, settings, prompts)
    outcome, section = merge_shards(shards, settings, prompts, out)
    data = outcome_json(outcome)
    data["shards"] = section
    try:
        print_summary(data, write_reports(out, data))
    finally:
        outcome.ledger.close()
    for label in section["fork_rate_differs"]:
        rates = ", ".join(
            f"{kind} {c['forked']}/{c['runs']}"
            for kind, c in section["forks_by_cpu"][label].items()
        )
        print(f"  {label}: the fork rate differs between CPU kinds ({rates})")
    failed = sum(pair["summary"]["failed"] + pair["summary"]["crashed"] for pair in data["pairs"])
    return Exit.DIFFERENT if failed else Exit.SAME


def read_shards(folders: list[str], out: Path) -> list[ShardFolder]:
    from specdiff.suite.merge import read_shard

    shards = []
    for name in folders:
        folder = Path(name).expanduser()
        if not folder.is_dir():
            raise ArgumentError(f"{folder} is no folder; give each shard's report folder")
        if folder.resolve() == out.resolve():
            raise ArgumentError(f"--report {out} is a shard's folder; name a new one")
        shards.append(read_shard(folder))
    return shards


def shards_suite(
    shards: list[ShardFolder], given: str | None
) -> tuple[SuiteSettings, list[SuitePrompt]]:
    """The suite the shards ran: its settings from their suite.json, its prompts read
    again (from --prompts, or where suite.json says) and checked against their digest."""
    from specdiff.suite.prompts import load_suite_prompts, prompts_digest, select_prompts
    from specdiff.suite.settings import settings_from_json

    stored = shards[0].suite
    try:
        settings = settings_from_json(stored)
    except (ValueError, KeyError, TypeError, AttributeError, SpecdiffError) as error:
        raise ArgumentError(
            f"{shards[0].folder}/suite.json: cannot read it ({printable(str(error))})"
        ) from None
    source = given or settings.source
    try:
        prompts, _ = load_suite_prompts(source, skip_bad=True)
        prompts = select_prompts(prompts, settings.ids, settings.limit, source)
    except SpecdiffError as error:
        raise ArgumentError(
            f"cannot read the prompts the shards ran ({printable(str(error), 200)}); "
            "name them with --prompts PATH"
        ) from None
    if prompts_digest(prompts) != stored.get("prompts_sha256"):
        raise ArgumentError(
            f"the prompts in {printable(source, 200)} differ from those the shards ran; "
            "name the file they ran with --prompts PATH"
        )
    return settings, prompts
