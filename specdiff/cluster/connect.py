"""Joining a Ray cluster, or starting one on this machine, and sizing the actors to it."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from specdiff.cluster import import_ray
from specdiff.errors import SpecdiffError


@dataclass(frozen=True)
class Cluster:
    """The Ray cluster this process drives."""

    address: str | None
    """What --ray named; None for a cluster on this machine."""
    started: bool
    """This process started (or joined) it, and so ends its part in it when done; False
    when the caller had already connected (ray.init before specdiff ran)."""
    cpus: int
    """The CPUs the whole cluster offers."""


def connect(address: str | None) -> Cluster:
    """Join the cluster at `address`, or start one on this machine with every core; a
    process already connected (a caller's own ray.init) stays on its cluster."""
    ray = import_ray()
    started = not ray.is_initialized()
    if started:
        try:
            # Ray's own INFO lines would break into the progress line
            quiet = {"log_to_driver": False, "logging_level": logging.ERROR}
            if address:
                ray.init(address=address, **quiet)
            else:
                ray.init(num_cpus=os.cpu_count(), include_dashboard=False, **quiet)
        except (ConnectionError, RuntimeError, ValueError) as error:
            where = f"the Ray cluster at {address}" if address else "a Ray cluster here"
            raise SpecdiffError(
                f"could not start or join {where}: {str(error).splitlines()[0][:200]}; check "
                "the address (ray status on the head node shows it)"
            ) from None
    cpus = int(ray.cluster_resources().get("CPU", 0))
    return Cluster(address, started, cpus)


def disconnect(cluster: Cluster) -> None:
    """Leave the cluster (a local one ends with it) unless the caller had joined it."""
    if cluster.started:
        import_ray().shutdown()


def actor_count(cluster: Cluster, cpus_per_actor: int, asked: int | None) -> int:
    """--ray-actors, else as many actors as the cluster's CPUs hold at `cpus_per_actor`.
    More than it holds are refused: the ones left waiting for CPUs would hold up the
    others, which start units only once every actor has loaded."""
    held = cluster.cpus // cpus_per_actor
    if asked is not None and asked > held:
        raise SpecdiffError(
            f"--ray-actors {asked} at {cpus_per_actor} CPU each needs {asked * cpus_per_actor} "
            f"CPUs, and the Ray cluster offers {cluster.cpus}: ask for at most {held}"
        )
    if asked is not None:
        return asked
    if cluster.cpus < cpus_per_actor:
        raise SpecdiffError(
            f"the Ray cluster offers {cluster.cpus} CPUs, fewer than --ray-cpus "
            f"{cpus_per_actor} for one actor: lower --ray-cpus"
        )
    return cluster.cpus // cpus_per_actor
