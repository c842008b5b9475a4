"""The fork autopsy for server lanes: part 1 only, as a sweep of runs of the pair.

A server offers no eval callback, so no layer can be traced (part 2 is left out, with
the reason in the record). What can be moved is the server itself: under `serve-pair`,
specdiff started the speculative server, so it can start it again drafting at most k
tokens and run the pair once per draft length. Each run is one `server_trial` in a
worker process, so a native crash ends one trial with one line, as in-process
explains do; this module only orders the runs and assembles the record.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from specdiff.autopsy import DRAFT_KEY, Autopsy, AutopsyError, AutopsyStage, SettingTrial
from specdiff.engine.autopsy import SERVER_PART2_NOTE, server_trial
from specdiff.engine.worker import call_in_worker
from specdiff.lanes import Pair

DraftRestart = Callable[[int], tuple[str, str]]
"""Starts the speculative server again drafting at most k tokens per step; returns its
URL and its launch line (the lane's server_flags)."""
DEFAULT_DRAFT_LENGTHS = (1, 2, 4, 8)
"""The speculative server's draft lengths serve-pair explain tries, as --max-runs allows."""
Progress = Callable[[AutopsyStage], None]


@dataclass(frozen=True)
class ServerSweep:
    """One server autopsy: the pair as given, then (with `restart`) one run per draft
    length of the speculative server, lane a's, within `max_runs` runs in all."""

    pair: Pair
    prompt: str
    max_tokens: int
    max_runs: int
    restart: DraftRestart | None = None
    draft_lengths: tuple[int, ...] | None = None
    """None: DEFAULT_DRAFT_LENGTHS where there is a restart."""

    @property
    def lengths(self) -> tuple[int, ...]:
        """Every draft length asked for; none without a server to restart."""
        if self.restart is None:
            return ()
        return self.draft_lengths or DEFAULT_DRAFT_LENGTHS

    def run(self, progress: Progress, cancel: threading.Event) -> Autopsy:
        """The autopsy record; raises AutopsyError when the pair as given fails, and
        AutopsyInterrupted once `cancel` is set."""
        began = time.perf_counter()
        trials = self._trials(progress, cancel)
        return Autopsy(
            self.pair.name,
            self.max_tokens,
            trials[0].fork,
            trials=tuple(trials),
            max_runs=self.max_runs,
            not_tried=self._not_tried(),
            part2_note=SERVER_PART2_NOTE,
            seconds=round(time.perf_counter() - began, 3),
        )

    def _trials(self, progress: Progress, cancel: threading.Event) -> list[SettingTrial]:
        """Each run, a restart of the server included, timed: the mean of those done
        times the runs left is the time left each stage reports."""
        lengths = self.lengths[: self.max_runs - 1]
        runs = len(lengths) + 1
        began = time.perf_counter()
        progress(AutopsyStage("the pair as given", 1, runs))
        trials = [self._trial(self.pair, "as given", "as started", "as given", cancel)]
        if trials[0].error is not None:
            raise AutopsyError(f"the pair as given failed: {trials[0].error}")
        for number, length in enumerate(lengths, start=2):
            assert self.restart is not None  # lengths are empty without it
            mean = (time.perf_counter() - began) / (number - 1)
            doing = f"server a drafting at most {length} tokens"
            progress(AutopsyStage(doing, number, runs, mean * (runs - number + 1)))
            url, flags = self.restart(length)
            lane_a = replace(self.pair.a, endpoint=url, server_flags=flags)
            moved = replace(self.pair, a=lane_a)
            setting = f"draft length {length} (server a)"
            trials.append(self._trial(moved, setting, str(length), "server a", cancel))
        return trials

    def _trial(
        self, pair: Pair, setting: str, value: str, scope: str, cancel: threading.Event
    ) -> SettingTrial:
        key = DRAFT_KEY if self.restart is not None else ""
        return call_in_worker(
            server_trial,
            (pair, self.prompt, self.max_tokens, setting, key, value, scope),
            None,
            cancel,
            doing="running the pair on the servers",
        )

    def _not_tried(self) -> tuple[str, ...]:
        """The draft lengths past the run budget, and the whole sweep where no server
        can be restarted."""
        over = self.lengths[self.max_runs - 1 :]
        not_tried = [f"draft length {k} (over --max-runs)" for k in over]
        if self.restart is None:
            not_tried.append(
                "the draft-length sweep: it restarts the speculative server, so it runs "
                "under specdiff serve-pair explain"
            )
        return tuple(not_tried)
