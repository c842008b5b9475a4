"""A run sent again from the start: when a server lane's endpoint failed in a way a fresh
start (to another endpoint) may mend, as its pool says, and at most MAX_RESTARTS times."""

from __future__ import annotations

from specdiff.errors import printable
from specdiff.results import LaneOutcome

MAX_RESTARTS = 3
"""How often one prompt is sent again from the start after its server lane's endpoint
failed (refused, broke the stream, stayed busy past its retries)."""


class Restart(Exception):
    """A server lane's endpoint failed in a way a fresh start may mend."""

    def __init__(self, lane_id: str, why: str) -> None:
        super().__init__(why)
        self.lane_id = lane_id
        self.why = why


def restart_of(outcome: LaneOutcome, restarts: dict[str, int]) -> Restart | None:
    """A Restart for a lane that failed where its pool says the whole prompt may be
    sent again, within MAX_RESTARTS; None otherwise."""
    restartable = outcome.executed.get("restartable") is True
    if outcome.error is None or not restartable or restarts[outcome.lane_id] >= MAX_RESTARTS:
        return None
    return Restart(outcome.lane_id, printable(outcome.error, 300))
