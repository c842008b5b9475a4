"""--ray for `suite` and `repeat`: the options, and the cluster a command runs on."""

from __future__ import annotations

import argparse
import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from specdiff.cli import options
from specdiff.cli.common import ArgumentError

if TYPE_CHECKING:
    from specdiff.cluster.connect import Cluster
    from specdiff.suite.ray_runner import RayRunners

MAX_ACTORS = 4096


def add_ray_options(parser: argparse.ArgumentParser, cpus: bool = True) -> None:
    """--ray [ADDRESS] and --ray-actors K; with `cpus`, --ray-cpus N too."""
    parser.add_argument(
        "--ray",
        nargs="?",
        const="",
        default=None,
        metavar="ADDRESS",
        help="run on a Ray cluster (pip install -e '.[ray]'): the one at ADDRESS "
        "(e.g. ray://head:10001 or head:6379), or without it one started on this machine",
    )
    parser.add_argument(
        "--ray-actors",
        type=options.whole_number(1, MAX_ACTORS),
        metavar="K",
        help="with --ray: how many actors run at once, each loading the model once "
        "(default: the cluster's CPUs / CPUs per actor)",
    )
    if cpus:
        parser.add_argument(
            "--ray-cpus",
            type=options.whole_number(1, 1024),
            metavar="N",
            help="with --ray: CPUs per actor, also its lanes' llama.cpp threads unless a "
            "lane sets threads (default 1)",
        )


def check_ray_options(args: argparse.Namespace) -> None:
    """Refuse --ray-actors/--ray-cpus without --ray, and Ray missing, before any work."""
    if args.ray is None:
        cpus = getattr(args, "ray_cpus", None)
        values = (("--ray-actors", args.ray_actors), ("--ray-cpus", cpus))
        given = [flag for flag, value in values if value is not None]
        if given:
            raise ArgumentError(f"{', '.join(given)} sets how --ray runs: add --ray")
        return
    if args.ray and getattr(args, "prompts", "") is None and not getattr(args, "resume", False):
        raise ArgumentError(
            f"--ray took {args.ray!r} as the cluster's address, and no PROMPTS are left: "
            f"give PROMPTS before --ray (specdiff suite {args.ray} --ray), or the address "
            "as --ray=ADDRESS"
        )
    from specdiff.cluster import import_ray

    import_ray()


def cpus_of(args: argparse.Namespace) -> int:
    """CPUs per actor: --ray-cpus, else 1."""
    return int(getattr(args, "ray_cpus", None) or 1)


@contextlib.contextmanager
def joined(args: argparse.Namespace, say: Callable[[str], None]) -> Iterator[tuple[Cluster, int]]:
    """The cluster --ray names (or one started here) and the actors to run, said in a
    line; left (a local one ended) afterwards."""
    from specdiff.cluster.connect import actor_count, connect, disconnect

    cluster = connect(args.ray or None)
    try:
        actors = actor_count(cluster, cpus_of(args), args.ray_actors)
        where = f"the cluster at {cluster.address}" if cluster.address else "this machine"
        say(f"ray: {actors} actors x {cpus_of(args)} CPU on {where} ({cluster.cpus} CPUs)")
        yield cluster, actors
    finally:
        disconnect(cluster)


@contextlib.contextmanager
def suite_runners(
    args: argparse.Namespace, cancel: threading.Event, say: Callable[[str], None]
) -> Iterator[RayRunners | None]:
    """The suite's runners on the cluster with --ray; None (runs here) without it."""
    if args.ray is None:
        yield None
        return
    from specdiff.suite.ray_runner import RayRunners

    with joined(args, say) as (_, actors):
        runners = RayRunners(actors, cpus_of(args), cancel, say)
        try:
            yield runners
        finally:
            runners.release()
