"""Playing a saved session back at the pace it was recorded.

Headless: the TUI asks a Playback which steps are due and draws them. Time is the
session's own (the steps' recorded timestamps), scaled by the speed; pausing stops it.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

from specdiff.errors import SpecdiffError
from specdiff.steps import TokenStep

MAX_GAP_SECONDS = 3.0
"""A longer pause between two recorded steps (a stalled machine, a debugger) replays as
this long, so a replay never sits still for minutes."""


class PlaybackError(SpecdiffError):
    """A replay setting is wrong."""


def check_speed(speed: float) -> float:
    if not speed > 0 or speed == float("inf"):
        raise PlaybackError(f"--speed must be a number above 0, got {speed:g} (e.g. --speed 2)")
    return speed


def offsets_of(steps: Sequence[TokenStep]) -> list[float]:
    """Seconds from the first step to each step, never decreasing, gaps capped."""
    offsets: list[float] = []
    clock = 0.0
    previous: float | None = None
    for step in steps:
        if previous is not None:
            clock += min(max(step.timestamp - previous, 0.0), MAX_GAP_SECONDS)
        previous = step.timestamp
        offsets.append(clock)
    return offsets


class Playback:
    """Which of a session's steps are shown: the first `position` in recorded order."""

    def __init__(self, steps: Sequence[TokenStep], speed: float = 1.0) -> None:
        self.steps: list[TokenStep] = []
        self.offsets: list[float] = []
        self.extend(steps)
        self.speed = check_speed(speed)
        self.position = 0
        self.clock = 0.0
        """Session seconds played so far."""
        self.paused = False

    def extend(self, steps: Sequence[TokenStep]) -> None:
        """More recorded steps (a session still being read), after those known."""
        if not steps:
            return
        offsets = offsets_of(steps)
        if self.steps:
            gap = min(max(steps[0].timestamp - self.steps[-1].timestamp, 0.0), MAX_GAP_SECONDS)
            start = self.offsets[-1] + gap
            offsets = [start + offset for offset in offsets]
        self.steps.extend(steps)
        self.offsets.extend(offsets)

    @property
    def finished(self) -> bool:
        return self.position >= len(self.steps)

    @property
    def duration(self) -> float:
        return self.offsets[-1] if self.offsets else 0.0

    def advance(self, wall_seconds: float) -> list[TokenStep]:
        """Let `wall_seconds` pass; the steps that became due, in order."""
        if self.paused or self.finished:
            return []
        self.clock += wall_seconds * self.speed
        end = bisect_right(self.offsets, self.clock, lo=self.position)
        due = self.steps[self.position : end]
        self.position = end
        return due

    def forward(self) -> TokenStep | None:
        """Show the next step (the clock jumps to it); None at the end."""
        if self.finished:
            return None
        step = self.steps[self.position]
        self.clock = self.offsets[self.position]
        self.position += 1
        return step

    def back(self) -> TokenStep | None:
        """Hide the last shown step; None at the start."""
        if self.position == 0:
            return None
        self.position -= 1
        self.clock = self.offsets[self.position - 1] if self.position else 0.0
        return self.steps[self.position]

    def through(self, lane_index: int) -> list[TokenStep]:
        """Show steps until both lanes show index `lane_index` (or all they have)."""
        totals = {"a": 0, "b": 0}
        shown = {"a": 0, "b": 0}
        for number, step in enumerate(self.steps):
            totals[step.lane] += 1
            if number < self.position:
                shown[step.lane] += 1
        wanted = {lane: min(lane_index + 1, total) for lane, total in totals.items()}
        due = []
        while any(shown[lane] < wanted[lane] for lane in shown):
            following = self.forward()
            assert following is not None  # wanted never exceeds what the lanes hold
            shown[following.lane] += 1
            due.append(following)
        return due

    def restart(self) -> None:
        self.position = 0
        self.clock = 0.0
        self.paused = False
