"""`specdiff suite --shard I/N`: the options and checks of a suite run in shards, beside
the suite's own (`specdiff.suite.shards`; the merge is `specdiff.cli.suite_merge`)."""

from __future__ import annotations

import argparse
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from specdiff.cli import options
from specdiff.cli.common import ArgumentError

if TYPE_CHECKING:
    from specdiff.suite.prompts import SuitePrompt
    from specdiff.suite.settings import SuiteSettings
    from specdiff.suite.shards import Shard


def add_shard_options(suite: argparse.ArgumentParser) -> None:
    suite.add_argument(
        "--shard",
        metavar="I/N|auto",
        help="run only shard I of N of the suite's runs (each prompt under each pair goes "
        "to the shard its content hashes to), into a folder of its own; auto reads "
        "JOB_COMPLETION_INDEX (Kubernetes) or SLURM_ARRAY_TASK_ID (Slurm). Put the shards "
        "together with: specdiff suite merge DIR... --report OUT",
    )
    suite.add_argument(
        "--shards",
        type=options.whole_number(1, 100_000),
        metavar="N",
        help="with --shard auto under a Kubernetes Indexed Job: the number of shards (the "
        "Job's completions; default: the SPECDIFF_SHARDS variable)",
    )


def given_shard(args: argparse.Namespace, report_dir: Path) -> Shard | None:
    """The shard --shard names, or a resumed folder holds (None: the whole suite); a bad
    value, or one that is not the resumed folder's, is refused before anything is
    written."""
    from specdiff.suite.shards import parse_shard, resumed_shard

    shard = None
    if args.shard is not None:
        shard = parse_shard(args.shard, args.shards, os.environ)
    elif args.shards is not None:
        raise ArgumentError("--shards N goes with --shard auto; add it, or drop --shards")
    return resumed_shard(report_dir, shard) if args.resume else shard


def record_shard(
    report_dir: Path, shard: Shard | None, settings: SuiteSettings, prompts: list[SuitePrompt]
) -> None:
    """shard.json: which shard of which suite the folder holds, and this machine (nothing
    for a whole suite)."""
    if shard is None:
        return
    from specdiff.suite.shards import (
        prompts_by_label,
        start_shard_file,
        suite_identity,
        this_machine,
    )

    units = sum(len(p) for p in prompts_by_label(settings, prompts, shard).values())
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    identity = suite_identity(settings, prompts)
    start_shard_file(report_dir, shard, identity, units, this_machine(now))
