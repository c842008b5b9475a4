"""Running a suite: every pair (variant) over every prompt, each run written to its
session file as it goes; runs whose files exist already are read back instead.

The lanes run in a worker process (`PairWorker`): a native crash in llama.cpp ends one
prompt's run, whose session keeps every step that arrived and names the crash in its
footer, and a fresh worker runs the next prompt. A resumed suite runs crashed prompts
again."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specdiff.errors import SpecdiffError
from specdiff.lanes import Pair
from specdiff.sessions.format import SessionHeader
from specdiff.sessions.store import (
    PARTIAL_SUFFIX,
    Session,
    SessionWriter,
    load_session,
)
from specdiff.steps import TokenStep
from specdiff.suite import SuiteError
from specdiff.suite.folder import session_path
from specdiff.suite.prompts import SuitePrompt
from specdiff.suite.records import PromptRecord, record_from_session
from specdiff.suite.settings import SuiteSettings

if TYPE_CHECKING:
    from specdiff.engine.worker import PairWorker


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
    ) -> None:
        self.settings = settings
        self.prompts = prompts
        self.report_dir = report_dir
        self.skipped = list(skipped)
        self.on_progress = on_progress or (lambda _: None)
        self.on_message = on_message or (lambda _: None)
        self.cancel = cancel or threading.Event()
        self.skipped_runs = 0
        """Runs that could not start (a prompt too long, a pair that would not load)."""

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
        )

    def _read_back(self, label: str, quant: str, tally: _Tally) -> list[SuitePrompt]:
        """Record the prompts whose session files a stopped run left; returns the others,
        crashed ones among them (their files are replaced when they run again)."""
        pending = []
        for prompt in self.prompts:
            path = session_path(self.report_dir, label, prompt)
            session = load_session(path) if path.exists() else None
            if session is None or session.summary().crashed:
                pending.append(prompt)
                continue
            self._record(session, path, label, quant, prompt, tally)
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
                tally.done_seconds += time.perf_counter() - job_began
                tally.run_jobs += 1
                tally.job += 1
                self._record(load_session(path), path, label, quant, prompt, tally)
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
            return None

    def _skip(self, tally: _Tally, label: str, runs: list[str], why: str) -> None:
        """Note runs that cannot start, one entry each, and say why once."""
        self.skipped.extend(f"{label}: {run}" for run in runs)
        self.skipped_runs += len(runs)
        tally.job += len(runs)
        self.on_message(f"skipped {label}: {why}")

    def _record(
        self,
        session: Session,
        path: Path,
        label: str,
        quant: str,
        prompt: SuitePrompt,
        tally: _Tally,
    ) -> None:
        if label not in tally.executed:
            header = session.header.to_json()
            tally.executed[label] = {key: header[key] for key in ("lanes", "executed", "build")}
        relative = str(path.relative_to(self.report_dir))
        tally.records.append(
            record_from_session(session, label, quant, prompt.id, relative, self.settings.near_tie)
        )

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
                list(self.settings.stop),
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
        summary = result.summary()
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
                stop=tuple(self.settings.stop),
                executed=runner.executed(),
                build=runner.build,
                created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                teacher_forced=self.settings.teacher_forced,
            )
        )
        return writer
