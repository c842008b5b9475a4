"""Running a suite: every pair (variant) over every prompt, each run written to its
session file as it goes; runs whose files exist already are read back instead.

The lanes run in a worker process (`PairWorker`): a native crash in llama.cpp ends one
prompt's run, whose session keeps every step that arrived and names the crash in its
footer, and a fresh worker runs the next prompt. A run whose session file cannot be
read back (corrupt, cut short, holding a value a reader rejects) is recorded as failed
with the reason. A resumed suite runs crashed, failed-to-read and cut-short prompts
again.

With --grade, each lane's text is graded once its run ends, and the grades go into the
session's footer beside the run's summary (the steps are the run's, untouched)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specdiff.errors import SpecdiffError, printable
from specdiff.grading.graders import NOT_RUN_LANE_FAILED, Grader, grade_text
from specdiff.lanes import Pair
from specdiff.sessions.format import CRASHED, Grade, LaneOutcome, RunSummary, SessionHeader
from specdiff.sessions.store import (
    PARTIAL_SUFFIX,
    SessionWriter,
    load_session,
)
from specdiff.steps import TokenStep
from specdiff.suite import SuiteError
from specdiff.suite.folder import session_path
from specdiff.suite.prompts import SuitePrompt
from specdiff.suite.records import PromptRecord, record_from_session, unreadable_record
from specdiff.suite.settings import SuiteSettings

if TYPE_CHECKING:
    from specdiff.engine.worker import PairWorker

UNREADABLE_ERRORS = (SpecdiffError, ValueError, TypeError, KeyError, IndexError, RecursionError)
"""What reading a session file back may raise: a file shared, edited or cut short must
fail its own run, never the suite."""


class PromptSkipped(Exception):
    """One prompt cannot run (too long for the context, ...); the others can."""


@dataclass
class Progress:
    """Where a running suite is, for a progress bar."""

    label: str
    prompt_id: str
    job: int
    """Jobs (prompt x pair) finished before the current one."""
    jobs: int
    tokens: int
    """Tokens produced so far in the current job (both lanes)."""
    job_tokens: int
    """Most tokens the current job can produce (both lanes)."""
    elapsed: float
    done_seconds: float
    """Wall time of the jobs run (not resumed) so far."""
    run_jobs: int
    """How many jobs were run (not resumed) so far."""

    @property
    def fraction(self) -> float:
        within = self.tokens / self.job_tokens if self.job_tokens else 0.0
        return min(1.0, (self.job + within) / self.jobs) if self.jobs else 1.0

    @property
    def eta_seconds(self) -> float | None:
        if not self.run_jobs:
            return None
        per_job = self.done_seconds / self.run_jobs
        within = self.tokens / self.job_tokens if self.job_tokens else 0.0
        return max(0.0, per_job * (self.jobs - self.job - within))


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
class SuiteOutcome:
    settings: SuiteSettings
    prompts: list[SuitePrompt]
    records: list[PromptRecord]
    executed: dict[str, dict[str, Any]]
    """Per variant label: the header's lanes, executed settings and build."""
    skipped: list[str]
    cancelled: bool
    wall_seconds: float
    resumed: int
    started: str
    skipped_runs: int = 0
    unloaded: list[str] = field(default_factory=list)
    """`label: why` for each pair (variant) whose models would not load."""
    executed_code: bool = False
    """Model-written programs were run (graded with tests)."""
    grading_seconds: float = 0.0
    """Time spent grading the runs of this invocation, its programs' time included."""
    program_seconds: float = 0.0
    """Of that, the time the graded programs ran in the sandbox."""

    @property
    def finished_runs(self) -> int:
        """Runs that came to an end: neither failed (unreadable included) nor crashed."""
        return sum(1 for r in self.records if not r.summary.failed and not r.summary.crashed)

    def nothing_ran(self) -> str | None:
        """Why no run of the suite came to an end, when none did and it was not stopped:
        a pair that would not load, else the first failed or crashed run's error."""
        if self.cancelled or self.finished_runs:
            return None
        if self.unloaded:
            return self.unloaded[0]
        for record in self.records:
            error = next((e for e in record.summary.errors if e), None)
            if error:
                return f"{record.pair} {record.prompt_id}: {error}"
        if self.skipped:
            return self.skipped[0]
        return "the prompt set is empty" if not self.prompts else None


@dataclass
class _Tally:
    """What one `SuiteRun.run()` has done so far."""

    began: float
    jobs: int
    records: list[PromptRecord] = field(default_factory=list)
    executed: dict[str, dict[str, Any]] = field(default_factory=dict)
    job: int = 0
    """Jobs finished, read back or skipped."""
    resumed: int = 0
    run_jobs: int = 0
    done_seconds: float = 0.0

    def progress(self, label: str, prompt_id: str, tokens: int, job_tokens: int) -> Progress:
        return Progress(
            label=label,
            prompt_id=prompt_id,
            job=self.job,
            jobs=self.jobs,
            tokens=tokens,
            job_tokens=job_tokens,
            elapsed=time.perf_counter() - self.began,
            done_seconds=self.done_seconds,
            run_jobs=self.run_jobs,
        )


@dataclass
class _Variant:
    """One pair (variant) of the suite and the worker that runs its prompts (a fresh one
    after a crash)."""

    label: str
    pair: Pair
    quant: str
    runner: PairWorker


class SuiteRun:
    """Runs a suite into a report folder; `run()` returns what finished."""

    def __init__(
        self,
        settings: SuiteSettings,
        prompts: list[SuitePrompt],
        report_dir: Path,
        skipped: Sequence[str] = (),
        on_progress: Callable[[Progress], None] | None = None,
        on_message: Callable[[str], None] | None = None,
        cancel: threading.Event | None = None,
        on_finished: Callable[[FinishedRun], None] | None = None,
    ) -> None:
        self.settings = settings
        self.prompts = prompts
        self.report_dir = report_dir
        self.skipped = list(skipped)
        self.on_progress = on_progress or (lambda _: None)
        self.on_message = on_message or (lambda _: None)
        self.cancel = cancel or threading.Event()
        self.on_finished = on_finished or (lambda _: None)
        self.skipped_runs = 0
        """Runs that could not start (a prompt too long, a pair that would not load)."""
        self.unloaded: list[str] = []
        self.grading_seconds = 0.0
        self.program_seconds = 0.0

    def run(self) -> SuiteOutcome:
        started = datetime.now(timezone.utc).isoformat(timespec="seconds")
        variants = self.settings.variants()
        tally = _Tally(time.perf_counter(), len(variants) * len(self.prompts))
        cancelled = False
        for label, pair, quant in variants:
            pending = self._read_back(label, quant, tally)
            if not pending:
                continue
            if self.cancel.is_set() or self._run_variant(label, pair, quant, pending, tally):
                cancelled = True
                break
        return SuiteOutcome(
            settings=self.settings,
            prompts=self.prompts,
            records=tally.records,
            executed=tally.executed,
            skipped=self.skipped,
            cancelled=cancelled,
            wall_seconds=time.perf_counter() - tally.began,
            resumed=tally.resumed,
            started=started,
            skipped_runs=self.skipped_runs,
            unloaded=self.unloaded,
            executed_code=self.settings.executes_code(self.prompts),
            grading_seconds=self.grading_seconds,
            program_seconds=self.program_seconds,
        )

    def _read_back(self, label: str, quant: str, tally: _Tally) -> list[SuitePrompt]:
        """Record the prompts whose session files a stopped run left; returns the others:
        crashed runs, and files that cannot be read or were cut short, among them (their
        files are replaced when they run again)."""
        pending = []
        for prompt in self.prompts:
            path = session_path(self.report_dir, label, prompt)
            if not path.exists():
                pending.append(prompt)
                continue
            read = self._read_record(path, label, quant, prompt, tally)
            if isinstance(read, str):
                self.on_message(f"running {label} {prompt.id} again: {read}")
                pending.append(prompt)
                continue
            if read.summary.crashed:
                pending.append(prompt)
                continue
            tally.records.append(read)
            tally.resumed += 1
            tally.job += 1
        return pending

    def _run_variant(
        self, label: str, pair: Pair, quant: str, pending: list[SuitePrompt], tally: _Tally
    ) -> bool:
        """Run the pending prompts under one pair (variant); True when the suite was stopped."""
        self.on_message(f"{label}: {pair.description or pair.name}")
        runner = self._open_worker(label, pair, pending, tally)
        if runner is None:
            return False
        variant = _Variant(label, pair, quant, runner)
        try:
            for number, prompt in enumerate(pending):
                if not variant.runner.alive:
                    # the last prompt crashed the worker: a fresh one runs the rest
                    variant.runner.close()
                    runner = self._open_worker(label, pair, pending[number:], tally)
                    if runner is None:
                        return False
                    variant.runner = runner
                job_began = time.perf_counter()
                try:
                    path, stopped = self._run_one(variant, prompt, tally)
                except PromptSkipped as skipped:
                    self._skip(tally, label, [str(skipped)], str(skipped))
                    continue
                if stopped:
                    return True
                self._record_run(path, label, quant, prompt, tally)
                seconds = time.perf_counter() - job_began
                tally.done_seconds += seconds
                tally.run_jobs += 1
                tally.job += 1
                self.on_finished(
                    FinishedRun(tally.progress(label, prompt.id, 0, 0), tally.records[-1], seconds)
                )
        finally:
            variant.runner.close()
        return False

    def _open_worker(
        self, label: str, pair: Pair, pending: list[SuitePrompt], tally: _Tally
    ) -> PairWorker | None:
        """A worker with the pair loaded; None, with the pending prompts skipped, when the
        pair will not load (or its worker crashes loading it): the other pairs still can."""
        # the worker module loads only once something runs, so the input checks before it
        # stay quick; llama.cpp itself loads in the worker process only
        from specdiff.engine.worker import PairWorker

        try:
            return PairWorker(pair, self.on_message, self.cancel)
        except SpecdiffError as error:
            self._skip(tally, label, [f"{prompt.id}: {error}" for prompt in pending], str(error))
            self.unloaded.append(f"{label}: {error}")
            return None

    def _skip(self, tally: _Tally, label: str, runs: list[str], why: str) -> None:
        """Note runs that cannot start, one entry each, and say why once."""
        self.skipped.extend(f"{label}: {run}" for run in runs)
        self.skipped_runs += len(runs)
        tally.job += len(runs)
        self.on_message(f"skipped {label}: {why}")

    def _read_record(
        self, path: Path, label: str, quant: str, prompt: SuitePrompt, tally: _Tally
    ) -> PromptRecord | str:
        """The run's record from its session file, or why the file cannot give one; the
        first readable file of a variant gives its configuration."""
        relative = str(path.relative_to(self.report_dir))
        try:
            session = load_session(path)
            if session.footer is None:
                return f"{relative} ends before its footer (the run was cut short)"
            record = record_from_session(
                session, label, quant, prompt.id, relative, self.settings.near_tie
            )
            header = session.header.to_json()
        except UNREADABLE_ERRORS as error:
            if isinstance(error, SpecdiffError):
                return printable(str(error), 300)
            return f"cannot read {relative}: {printable(repr(error), 300)}"
        tally.executed.setdefault(label, {k: header[k] for k in ("lanes", "executed", "build")})
        return record

    def _record_run(
        self, path: Path, label: str, quant: str, prompt: SuitePrompt, tally: _Tally
    ) -> None:
        """Record the run just written; one that cannot be read back is a failed run."""
        read = self._read_record(path, label, quant, prompt, tally)
        if isinstance(read, str):
            self.on_message(f"failed: {label} {prompt.id}: {read}")
            relative = str(path.relative_to(self.report_dir))
            read = unreadable_record(label, quant, prompt.id, relative, read)
        tally.records.append(read)

    def _run_one(self, variant: _Variant, prompt: SuitePrompt, tally: _Tally) -> tuple[Path, bool]:
        """Run one prompt into its session file; True when the suite was stopped."""
        # deferred, as in _open_worker, which has loaded it by now
        from specdiff.engine.worker import WorkerCrashed

        path = session_path(self.report_dir, variant.label, prompt)
        max_tokens = prompt.max_tokens or self.settings.max_tokens
        writer = self._open_session(variant, prompt, path, max_tokens)
        produced = 0
        last_report = 0.0

        def on_step(step: TokenStep) -> None:
            nonlocal produced, last_report
            writer.step(step)
            produced += 1
            now = time.perf_counter()
            if now - last_report >= 0.1:
                last_report = now
                self.on_progress(tally.progress(variant.label, prompt.id, produced, 2 * max_tokens))

        try:
            result = variant.runner.run(
                prompt.prompt,
                max_tokens,
                self._stop(prompt),
                self.settings.near_tie,
                on_step,
                teacher_forced=self.settings.teacher_forced,
            )
        except WorkerCrashed as crash:
            # died before its first step: nothing to keep, and --resume runs it again
            writer.abandon()
            raise PromptSkipped(f"{prompt.where}: {crash}") from None
        if result.cancelled:
            writer.handle.close()  # the partial file stays; --resume runs the prompt again
            return path, True
        summary = self._graded(result.summary(), (result.a, result.b), prompt)
        if summary.crashed:
            self.on_message(
                f"crashed: {variant.label} {prompt.id} after {produced} steps; "
                f"{result.error_lines()[0]}"
            )
        final = writer.finish(summary)
        if final != path:
            raise SuiteError(f"{path} appeared while the suite was writing it; start again")
        return path, False

    def _open_session(
        self, variant: _Variant, prompt: SuitePrompt, path: Path, max_tokens: int
    ) -> SessionWriter:
        """Start the prompt's session file with its header, or raise PromptSkipped when
        the prompt cannot run under this pair."""
        folder = path.parent
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{prompt.file_stem}{PARTIAL_SUFFIX}").unlink(missing_ok=True)
        # a pending prompt's finished file is a crashed run's: this run replaces it
        path.unlink(missing_ok=True)
        runner = variant.runner
        try:
            tokens = runner.tokenize(prompt.prompt)
            runner.check(tokens, max_tokens)
        except SpecdiffError as error:
            raise PromptSkipped(f"{prompt.where}: {error}") from None
        writer = SessionWriter(folder, variant.pair.name, prompt.prompt, name=prompt.file_stem)
        writer.header(
            SessionHeader(
                pair=variant.pair,
                prompt=prompt.prompt,
                prompt_token_ids=tuple(tokens),
                max_tokens=max_tokens,
                stop=tuple(self._stop(prompt)),
                executed=runner.executed(),
                build=runner.build,
                created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                teacher_forced=self.settings.teacher_forced,
            )
        )
        return writer

    def _stop(self, prompt: SuitePrompt) -> list[str]:
        """The suite's stop strings (--stop), then the prompt's own."""
        return list(dict.fromkeys((*self.settings.stop, *prompt.stop)))

    def _graded(
        self, summary: RunSummary, lanes: tuple[LaneOutcome, LaneOutcome], prompt: SuitePrompt
    ) -> RunSummary:
        """The summary with each lane's grade, when the suite grades this prompt: with
        --grade, a grader on the prompt, and, for tests, no --no-exec."""
        grader = prompt.grader
        settings = self.settings
        if not settings.grade or grader is None or (grader.executes and settings.no_exec):
            return summary
        began = time.perf_counter()
        grades = (self._grade(grader, prompt, lanes[0]), self._grade(grader, prompt, lanes[1]))
        self.grading_seconds += time.perf_counter() - began
        return replace(summary, grades=grades)

    def _grade(self, grader: Grader, prompt: SuitePrompt, lane: LaneOutcome) -> Grade:
        if lane.error is not None or lane.stop_reason == CRASHED:
            # a lane cut short by its failure has no answer to grade: it solved nothing
            return Grade(False, NOT_RUN_LANE_FAILED, grader.kind)
        text = b"".join(step.piece for step in lane.steps).decode("utf-8", "replace")
        grade, program_seconds = grade_text(
            grader, prompt.prompt, text, self._stop(prompt), self.settings.grade_timeout
        )
        self.program_seconds += program_seconds
        return grade
