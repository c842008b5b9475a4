"""Which class runs a lane: a lane's `backend` key names one, and `open_lane` builds it
from the pool of weights (ModelPool) that a pair's lanes share."""

from __future__ import annotations

import threading
from collections.abc import Callable

from specdiff.engine.base import LaneBackend
from specdiff.engine.llama.context import ModelPool
from specdiff.engine.llama.lane import LocalLane
from specdiff.engine.models import Progress
from specdiff.engine.server.lane import ServerLane
from specdiff.lanes import Lane, LaneId

LaneFactory = Callable[[Lane, LaneId, ModelPool, Progress, threading.Event], LaneBackend]

__all__ = ["BACKENDS", "LaneFactory", "ModelPool", "open_lane"]

BACKENDS: dict[str, LaneFactory] = {"local": LocalLane, "server": ServerLane}
"""Every value a lane's `backend` key takes, and the class that runs it."""


def open_lane(
    lane: Lane, lane_id: LaneId, pool: ModelPool, progress: Progress, cancel: threading.Event
) -> LaneBackend:
    """Load a lane's model or connect to its server; models come from (and stay in) `pool`,
    so lanes of one pair share their weights."""
    return BACKENDS[lane.backend](lane, lane_id, pool, progress, cancel)
