"""Where a running suite is: jobs finished, the runs in flight and the share of each
one's token budget produced, and the rates of this invocation's runs. The runs side by
side count into one `Tally` from their own threads; a progress bar reads `Progress`, a log
a `FinishedRun`'s line.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from specdiff.errors import printable
from specdiff.suite.ledger import Ledger
from specdiff.suite.records import Configuration, PromptRecord


@dataclass
class Progress:
    """Where a running suite is, for a progress bar: runs finished, those in flight, and
    the rates of this invocation's runs."""

    label: str
    prompt_id: str
    """The run last heard of."""
    job: int
    """Jobs (prompt x pair) finished, read back or skipped."""
    jobs: int
    tokens: int
    """Tokens produced by this invocation's runs so far (both lanes, in flight too; not
    those of a run sent again from the start)."""
    within: float
    """The runs in flight, each counted by the share of its token budget produced."""
    in_flight: int
    elapsed: float
    run_seconds: float
    """Wall time since this invocation's first run started."""
    run_jobs: int
    """How many jobs were run (not resumed) so far."""

    @property
    def fraction(self) -> float:
        return min(1.0, (self.job + self.within) / self.jobs) if self.jobs else 1.0

    @property
    def prompts_per_second(self) -> float | None:
        return self.run_jobs / self.run_seconds if self.run_jobs and self.run_seconds else None

    @property
    def tokens_per_second(self) -> float | None:
        return self.tokens / self.run_seconds if self.run_seconds > 0 else None

    @property
    def eta_seconds(self) -> float | None:
        rate = self.prompts_per_second
        if rate is None:
            return None
        return max(0.0, (self.jobs - self.job - self.within) / rate)


@dataclass(frozen=True)
class FinishedRun:
    """One run that came to an end (or failed), with where the suite stands after it:
    what a log that cannot rewrite a progress line shows, one line a run."""

    progress: Progress
    record: PromptRecord
    seconds: float
    """The run's wall time, grading included."""

    def line(self) -> str:
        """`suite: 12/164 HumanEval/11 forked at 37 (near tie) 4.1 s, eta 9m05s`."""
        progress, summary = self.progress, self.record.summary
        if summary.crashed:
            result = "crashed" + (
                "" if summary.fork_index is None else f" after a fork at {summary.fork_index}"
            )
        elif summary.failed:
            why = next((e for e in summary.errors if e), "no reason given")
            result = f"failed: {printable(why, 160)}"
        elif summary.fork_index is not None:
            kind = f" ({summary.fork_class})" if summary.fork_class else ""
            result = f"forked at {summary.fork_index}{kind}"
        elif summary.identical:
            result = f"identical ({summary.generated[0]} tokens)"
        else:
            result = f"same tokens, lengths {summary.generated[0]} / {summary.generated[1]}"
        return (
            f"suite: {progress.job}/{progress.jobs} {progress.label} {progress.prompt_id} "
            f"{result} {self.seconds:.1f} s, eta {duration(progress.eta_seconds)}"
        )


def duration(seconds: float | None) -> str:
    """`…` (not known yet), `42s`, `3m07s` or `1h05m`: a time short enough for a
    progress line."""
    if seconds is None:
        return "…"
    whole = int(seconds)
    if whole >= 3600:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 60}m{whole % 60:02d}s" if whole >= 60 else f"{whole}s"


@dataclass
class Tally:
    """What one `SuiteRun.run()` has done so far; the runs in flight share it, under
    `lock`."""

    began: float
    jobs: int
    ledger: Ledger
    executed: dict[str, Configuration] = field(default_factory=dict)
    """Per variant label: what its first readable session file says it ran."""
    job: int = 0
    """Jobs finished, read back or skipped."""
    resumed: int = 0
    run_jobs: int = 0
    done_tokens: int = 0
    """Tokens of the runs that ended."""
    running: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Per run in flight (label and prompt id): tokens produced and the most it can."""
    run_began: float | None = None
    lock: threading.RLock = field(default_factory=threading.RLock)

    def progress(self, label: str, prompt_id: str) -> Progress:
        with self.lock:
            now = time.perf_counter()
            return Progress(
                label=label,
                prompt_id=prompt_id,
                job=self.job,
                jobs=self.jobs,
                tokens=self.done_tokens + sum(done for done, _ in self.running.values()),
                within=sum(done / most for done, most in self.running.values() if most),
                in_flight=len(self.running),
                elapsed=now - self.began,
                run_seconds=0.0 if self.run_began is None else now - self.run_began,
                run_jobs=self.run_jobs,
            )

    def started(self, key: str, most: int) -> None:
        with self.lock:
            if self.run_began is None:
                self.run_began = time.perf_counter()
            self.running[key] = (0, most)

    def produced(self, key: str, tokens: int) -> None:
        with self.lock:
            self.running[key] = (tokens, self.running.get(key, (0, 0))[1])

    def ended(self, key: str, counted: bool, kept: bool = True) -> None:
        """A run in flight is over; `counted` when it ran to its end (not skipped or
        stopped); not `kept` when its steps were thrown away (it runs again from the
        start), so its tokens are no part of the rate."""
        with self.lock:
            tokens, _ = self.running.pop(key, (0, 0))
            self.done_tokens += tokens if kept else 0
            if counted:
                self.run_jobs += 1
                self.job += 1
