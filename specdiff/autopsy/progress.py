"""Where an autopsy being made stands, as one record its progress carries: the run of
the settings sweep (or the taps of part 2), and about how long the rest will take.

The time left is the engine's estimate from the runs it has measured, so each front end
reads the number, not a sentence to take apart; `line` is the words both the command
line and the TUI show.
"""

from __future__ import annotations

from dataclasses import dataclass

BUDGET_OPTION = "--max-tokens"
"""What `specdiff explain` calls the token budget; the TUI names its own field."""


@dataclass(frozen=True)
class AutopsyStage:
    """What the autopsy runs now, and about how long what is left takes."""

    doing: str
    """The setting this run moves ("the pair as given", "repack off"), or part 2's
    taps ("tapping both lanes at token 30")."""
    run: int | None
    """This run's number in the settings sweep, from 1; None for part 2."""
    runs: int
    """The runs the sweep makes, the pair as given included."""
    seconds_left: float | None = None
    """About how long this run and what follows it take, from the runs measured so far
    (each run's seconds, and the prefix decoded once per lane for part 2); None until
    one run was measured."""

    @property
    def done(self) -> int:
        """Runs finished: every run of the sweep once part 2 has begun."""
        return self.runs if self.run is None else self.run - 1

    def line(self, budget: str = BUDGET_OPTION) -> str:
        """The stage in words: "run 3/8: repack off · about 40 s left · fewer
        --max-tokens is faster"."""
        where = self.doing if self.run is None else f"run {self.run}/{self.runs}: {self.doing}"
        if self.seconds_left is None:
            return where
        return f"{where} · about {duration(self.seconds_left)} left · fewer {budget} is faster"


def duration(seconds: float) -> str:
    """A time left as a reader takes it in at a glance: whole seconds under two minutes,
    whole minutes above (an estimate has no more digits than that to give)."""
    if seconds < 120:
        return f"{max(1, round(seconds))} s"
    return f"{round(seconds / 60)} min"
