"""Running a suite: every pair (variant) over every prompt, each run written to its
session file as it goes; runs whose files exist already are read back instead.

With --concurrency N (server lanes only), up to N prompts of a pair are in flight at once,
each run in a thread of this process with lanes of its own, so that the runs of one lane
share that lane's endpoint pool (least-loaded endpoint, back-off, circuit breaking, one
kept-alive connection pool per endpoint); a server lane decodes nothing here, it only
tokenizes. A run whose server lane's endpoint failed in a way a fresh start may mend runs
again from the start.

Otherwise the lanes run in a worker process (`PairWorker`): a native crash in llama.cpp ends one
prompt's run, whose session keeps every step that arrived and names the crash in its
footer, and a fresh worker runs the next prompt. A run whose session file cannot be
read back (corrupt, cut short, holding a value a reader rejects) is recorded as failed
with the reason. A resumed suite runs crashed, failed-to-read and cut-short prompts
again.

With --grade, each lane's text is graded once its run ends, and the grades go into the
session's footer beside the run's summary (the steps are the run's, untouched)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from specdiff.errors import SpecdiffError
from specdiff.lanes import Pair
from specdiff.results import PairResult
from specdiff.sessions.header import SessionHeader
from specdiff.sessions.records import RunSummary
from specdiff.sessions.store import PARTIAL_SUFFIX, SessionWriter
from specdiff.steps import TokenStep
from specdiff.suite import SuiteError
from specdiff.suite.folder import session_path
from specdiff.suite.grades import RunGrader
from specdiff.suite.kld import score_teacher_forced
from specdiff.suite.ledger import Ledger
from specdiff.suite.lengths import padded_prompt, skipped_message
from specdiff.suite.outcome import SuiteOutcome
from specdiff.suite.progress import FinishedRun, Progress, Tally, duration
from specdiff.suite.prompts import SuitePrompt
from specdiff.suite.records import PromptRecord, lane_serving, read_record, unreadable_record
from specdiff.suite.restarts import Restart, restart_of
from specdiff.suite.runners import PairRunner, Runners, UnitRunners
from specdiff.suite.settings import SuiteSettings
from specdiff.suite.shards import Shard, prompts_by_label

# a caller of SuiteRun reads its progress from these records too
__all__ = ["FinishedRun", "Progress", "PromptSkipped", "SuiteRun", "duration"]


class PromptSkipped(Exception):
    """One prompt cannot run (too long for the context, ...); the others can."""


@dataclass
class _Variant:
    """One pair (variant) of the suite and the worker that runs its prompts (a fresh one
    after a crash)."""

    label: str
    pair: Pair
    quant: str
    runner: PairRunner | None
    """None until it has loaded, and where it would not."""


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
        drain: threading.Event | None = None,
        score_kld: bool = True,
        runners: UnitRunners | None = None,
        shard: Shard | None = None,
    ) -> None:
        self.settings = settings
        self.shard = shard
        """Run only this shard's units (`specdiff.suite.shards`); None runs them all."""
        self.score_kld = score_kld
        """A teacher-forced suite's KL divergence pass runs (--no-kld turns it off)."""
        self.prompts = prompts
        self.report_dir = report_dir
        self.skipped = list(skipped)
        # the runs in flight report from their own threads: one at a time
        self._said = threading.RLock()
        self.on_progress = _serialized(on_progress, self._said)
        self.on_message = _serialized(on_message, self._said)
        self.on_finished = _serialized(on_finished, self._said)
        self.cancel = cancel or threading.Event()
        """Stop at once: the runs in flight end where they are (--resume runs them again)."""
        self.drain = drain or threading.Event()
        """Start no new run; those in flight finish."""
        self._drain_noted = False
        self.runners: UnitRunners = runners or Runners(settings.concurrency, self.cancel)
        """What runs the prompts: here (worker processes, or threads with --concurrency),
        or on a cluster's actors."""
        self.skipped_runs = 0
        """Runs that could not start (a prompt too long, a pair that would not load)."""
        self.unloaded: list[str] = []
        self.grader = RunGrader(settings)
        """Grades each run's lanes as it ends, and keeps the time that took."""
        self._pair_places: dict[str, int] = {}
        self._prompt_places: dict[str, int] = {}

    def run(self) -> SuiteOutcome:
        started = datetime.now(timezone.utc).isoformat(timespec="seconds")
        variants = self.settings.variants()
        labels = [label for label, _, _ in variants]
        ledger = Ledger(labels, self.report_dir, graded=self.settings.grade)
        chosen = prompts_by_label(self.settings, self.prompts, self.shard)
        jobs = sum(len(prompts) for prompts in chosen.values())
        tally = Tally(time.perf_counter(), jobs, ledger)
        # a run's place in the report: its pair's, then its prompt's
        self._pair_places = {label: n * len(self.prompts) for n, label in enumerate(labels)}
        self._prompt_places = {prompt.id: n for n, prompt in enumerate(self.prompts)}
        cancelled = False
        for label, pair, quant in variants:
            pending = self._read_back(label, quant, tally, chosen[label])
            if not pending:
                continue
            if self._stopping() or self._run_variant(label, pair, quant, pending, tally):
                cancelled = True
                break
        kld = self._kld(tally, cancelled) if self.score_kld else {}
        return SuiteOutcome(
            settings=self.settings,
            prompts=self.prompts,
            ledger=ledger,
            executed=tally.executed,
            skipped=self.skipped,
            cancelled=cancelled,
            wall_seconds=time.perf_counter() - tally.began,
            resumed=tally.resumed,
            started=started,
            skipped_runs=self.skipped_runs,
            unloaded=self.unloaded,
            executed_code=self.settings.executes_code(self.prompts),
            grading_seconds=self.grader.grading_seconds,
            program_seconds=self.grader.program_seconds,
            kld=kld,
            jobs=jobs,
        )

    def _kld(self, tally: Tally, cancelled: bool) -> dict[str, dict[str, Any]]:
        """A teacher-forced suite's KL divergence figures; a stopped suite scores no
        new run."""
        return score_teacher_forced(
            self.settings, self.report_dir, tally.ledger.records(), self.cancel, self.on_message,
            score_new=not cancelled,
        )  # fmt: skip

    def _read_back(
        self, label: str, quant: str, tally: Tally, prompts: list[SuitePrompt]
    ) -> list[SuitePrompt]:
        """Record the prompts whose session files a stopped run left; returns the others:
        crashed runs, and files that cannot be read or were cut short, among them (their
        files are replaced when they run again)."""
        pending = []
        for prompt in prompts:
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
            self._keep(read, tally)
            tally.resumed += 1
            tally.job += 1
        return pending

    def _run_variant(
        self, label: str, pair: Pair, quant: str, pending: list[SuitePrompt], tally: Tally
    ) -> bool:
        """Run the pending prompts under one pair (variant), up to --concurrency of them at
        once, each on a runner of its own; True when the suite was stopped."""
        self.on_message(f"{label}: {pair.description or pair.name}")
        queue = _Pending(deque(pending))
        slots = min(self.runners.slots, len(pending))
        # no run starts before every runner has loaded: the load is N from the first run
        loaded = threading.Barrier(slots)
        helpers = [
            threading.Thread(
                target=self._slot,
                args=(_Variant(label, pair, quant, None), queue, tally, loaded, False),
                daemon=True,
            )
            for _ in range(1, slots)
        ]
        for helper in helpers:
            helper.start()
        try:
            # this thread runs prompts too: with one at a time, it runs them all
            self._slot(_Variant(label, pair, quant, None), queue, tally, loaded)
        finally:
            for helper in helpers:
                helper.join()
            self.runners.release()
        return queue.stopped

    def _slot(
        self,
        variant: _Variant,
        queue: _Pending,
        tally: Tally,
        loaded: threading.Barrier,
        loud: bool = True,
    ) -> None:
        """Load a runner, then take prompts from the queue and run them one after another
        (on a fresh worker after a crash) until the queue is empty or the suite stops;
        only a `loud` slot says what its runner loads (the others load the same)."""
        try:
            variant.runner = self._open_worker(variant, queue.take_all, tally, loud)
        finally:
            with contextlib.suppress(threading.BrokenBarrierError):
                loaded.wait()
        try:
            while variant.runner is not None and (prompt := self._next_prompt(queue)):
                # a run in this process has no worker to lose: it is never spent
                if not getattr(variant.runner, "alive", True):
                    variant.runner.close()  # the last prompt crashed the worker
                    variant.runner = self._open_worker(
                        variant, lambda: [prompt, *queue.take_all()], tally, loud
                    )
                    if variant.runner is None:
                        return
                self._run_job(variant, prompt, queue, tally)
        finally:
            if variant.runner is not None:
                variant.runner.close()

    def _next_prompt(self, queue: _Pending) -> SuitePrompt | None:
        """The next prompt to run; None when none is left or the suite is stopping."""
        with queue.lock:
            if not queue.prompts:
                return None
            if self._stopping():
                queue.stopped = True
                return None
            return queue.prompts.popleft()

    def _stopping(self) -> bool:
        """Whether the suite takes no new prompt (said once, when it starts draining)."""
        if self.drain.is_set() and not self.cancel.is_set() and not self._drain_noted:
            self._drain_noted = True
            self.on_message(
                "stopping: no new prompts; the runs in flight finish (Ctrl+C again stops "
                "them now, and --resume runs them again)"
            )
        return self.drain.is_set() or self.cancel.is_set()

    def _run_job(
        self, variant: _Variant, prompt: SuitePrompt, queue: _Pending, tally: Tally
    ) -> None:
        """Run one prompt and record it; a prompt that cannot run is skipped, and a
        stopped run marks the suite stopped."""
        key = f"{variant.label}\0{prompt.id}"
        job_began = time.perf_counter()
        restarts = {"a": 0, "b": 0}
        try:
            prompt = self._padded(variant, prompt)
            while True:
                try:
                    path, stopped = self._run_one(variant, prompt, tally, key, restarts)
                    break
                except Restart as restart:
                    tally.ended(key, counted=False, kept=False)
                    restarts[restart.lane_id] += 1
                    self.on_message(
                        f"running {variant.label} {prompt.id} again from the start: lane "
                        f"{restart.lane_id} {restart.why}"
                    )
        except PromptSkipped as skipped:
            tally.ended(key, counted=False)
            self._skip(tally, variant.label, [str(skipped)], str(skipped))
            return
        if stopped:
            tally.ended(key, counted=False)
            queue.stopped = True
            return
        record = self._record_run(path, variant.label, variant.quant, prompt, tally)
        seconds = time.perf_counter() - job_began
        tally.ended(key, counted=True)
        self.on_finished(FinishedRun(tally.progress(variant.label, prompt.id), record, seconds))

    def _padded(self, variant: _Variant, prompt: SuitePrompt) -> SuitePrompt:
        """The prompt as the variant runs it: padded to its --prompt-lengths length, if
        any; PromptSkipped when the prompt alone is longer."""
        length = self.settings.prompt_length(variant.label)
        if length is None or variant.runner is None:
            return prompt
        padded = padded_prompt(prompt, length, variant.runner.tokenize)
        if padded is None:
            tokens = len(variant.runner.tokenize(prompt.prompt))
            raise PromptSkipped(f"{prompt.where}: {skipped_message(length, tokens)}")
        return padded

    def _open_worker(
        self,
        variant: _Variant,
        pending: Callable[[], list[SuitePrompt]],
        tally: Tally,
        loud: bool = True,
    ) -> PairRunner | None:
        """A runner with the pair loaded; None, with the `pending` prompts skipped, when
        the pair will not load (or its worker crashes loading it): the other pairs still
        can."""
        label = variant.label
        try:
            return self.runners.new(variant.pair, self.on_message if loud else _quiet)
        except SpecdiffError as error:
            with tally.lock:
                # the runners side by side load the same pair: its failure is told once
                if any(entry.startswith(f"{label}: ") for entry in self.unloaded):
                    return None
                self.unloaded.append(f"{label}: {error}")
            self._skip(tally, label, [f"{p.id}: {error}" for p in pending()], str(error))
            return None

    def _skip(self, tally: Tally, label: str, runs: list[str], why: str) -> None:
        """Note runs that cannot start, one entry each, and say why once."""
        with tally.lock:
            self.skipped.extend(f"{label}: {run}" for run in runs)
            self.skipped_runs += len(runs)
            tally.job += len(runs)
        self.on_message(f"skipped {label}: {why}")

    def _read_record(
        self, path: Path, label: str, quant: str, prompt: SuitePrompt, tally: Tally
    ) -> PromptRecord | str:
        """The run's record from its session file, or why the file cannot give one; the
        first readable file of a variant gives its configuration."""
        relative = str(path.relative_to(self.report_dir))
        read = read_record(path, relative, label, quant, prompt.id, self.settings.near_tie)
        if isinstance(read, str):
            return read
        record, configuration = read
        tally.executed.setdefault(label, configuration)
        return record

    def _record_run(
        self, path: Path, label: str, quant: str, prompt: SuitePrompt, tally: Tally
    ) -> PromptRecord:
        """Record the run just written; one that cannot be read back is a failed run."""
        read = self._read_record(path, label, quant, prompt, tally)
        if isinstance(read, str):
            self.on_message(f"failed: {label} {prompt.id}: {read}")
            relative = str(path.relative_to(self.report_dir))
            read = unreadable_record(label, quant, prompt.id, relative, read)
        with tally.lock:
            self._keep(read, tally)
        return read

    def _keep(self, record: PromptRecord, tally: Tally) -> None:
        # runs side by side end in any order; the report lists them in the suite's
        place = self._pair_places[record.pair] + self._prompt_places[record.prompt_id]
        tally.ledger.add(record, place)

    def _run_one(
        self,
        variant: _Variant,
        prompt: SuitePrompt,
        tally: Tally,
        key: str,
        restarts: dict[str, int],
    ) -> tuple[Path, bool]:
        """Run one prompt into its session file, counted in flight under `key`; True when
        the suite was stopped. Restart when a server lane's endpoint failed in a way
        that sending the prompt again (to another endpoint) may mend."""
        # deferred, as in Runners.new, which has loaded it by now
        from specdiff.engine.worker import WorkerCrashed

        path = session_path(self.report_dir, variant.label, prompt)
        max_tokens = prompt.max_tokens or self.settings.max_tokens
        writer = self._open_session(variant, prompt, path, max_tokens)
        tally.started(key, 2 * max_tokens)
        recorder = _StepRecorder(writer, self._teller(tally, key, variant.label, prompt.id))
        assert variant.runner is not None  # a variant takes prompts only once loaded
        try:
            result = variant.runner.run(
                prompt.prompt,
                max_tokens,
                self._stop(prompt),
                self.settings.near_tie,
                recorder,
                teacher_forced=self.settings.teacher_forced,
                control=self.settings.control,
            )
        except WorkerCrashed as crash:
            # died before its first step: nothing to keep, and --resume runs it again
            writer.abandon()
            raise PromptSkipped(f"{prompt.where}: {crash}") from None
        tally.produced(key, recorder.produced)
        if self._stopped(result, writer, variant, prompt, restarts, recorder.produced):
            return path, True
        final = writer.finish(self._footer(result, prompt, restarts))
        if final != path:
            raise SuiteError(f"{path} appeared while the suite was writing it; start again")
        return path, False

    def _teller(self, tally: Tally, key: str, label: str, prompt_id: str) -> Callable[[int], None]:
        """What a run in flight does with its count of steps produced so far."""

        def tell(produced: int) -> None:
            tally.produced(key, produced)
            self._stopping()  # says so as soon as a Ctrl+C asks to drain
            self.on_progress(tally.progress(label, prompt_id))

        return tell

    def _stopped(
        self,
        result: PairResult,
        writer: SessionWriter,
        variant: _Variant,
        prompt: SuitePrompt,
        restarts: dict[str, int],
        produced: int,
    ) -> bool:
        """True, the session file left partial, when the suite was stopped; Restart, the
        file thrown away, when a lane's endpoint failed in a way a fresh start may mend. A
        crash is said here; its run is finished like any other."""
        if result.cancelled:
            writer.handle.close()  # the partial file stays; --resume runs the prompt again
            return True
        restart = restart_of(result.a, restarts) or restart_of(result.b, restarts)
        if restart is not None:
            writer.abandon()
            raise restart
        if result.crashed:
            self.on_message(
                f"crashed: {variant.label} {prompt.id} after {produced} steps; "
                f"{result.error_lines()[0]}"
            )
        return False

    def _footer(
        self, result: PairResult, prompt: SuitePrompt, restarts: dict[str, int]
    ) -> RunSummary:
        """The run's summary with its grades and how each server lane was served."""
        lanes = (result.a, result.b)
        summary = self.grader.graded(result.summary(), lanes, prompt, self._stop(prompt))
        serving = (lane_serving(result.a, restarts["a"]), lane_serving(result.b, restarts["b"]))
        return summary if serving == (None, None) else replace(summary, serving=serving)

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
        assert runner is not None  # a variant takes prompts only once loaded
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
                executed={
                    # the load the run was measured under: the split rate depends on it
                    lane_id: {**table, "concurrency": self.settings.concurrency}
                    for lane_id, table in runner.executed().items()
                },
                build=runner.build,
                created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                teacher_forced=self.settings.teacher_forced,
            )
        )
        return writer

    def _stop(self, prompt: SuitePrompt) -> list[str]:
        """The suite's stop strings (--stop), then the prompt's own."""
        return list(dict.fromkeys((*self.settings.stop, *prompt.stop)))


PROGRESS_SECONDS = 0.1
"""How often a run in flight tells its progress: a step can take a millisecond."""


class _StepRecorder:
    """A run's steps written to its session file as they arrive, its count told at most
    every PROGRESS_SECONDS."""

    def __init__(self, writer: SessionWriter, tell: Callable[[int], None]) -> None:
        self.writer = writer
        self.tell = tell
        self.produced = 0
        self._last_told = 0.0

    def __call__(self, step: TokenStep) -> None:
        self.writer.step(step)
        self.produced += 1
        now = time.perf_counter()
        if now - self._last_told >= PROGRESS_SECONDS:
            self._last_told = now
            self.tell(self.produced)


@dataclass
class _Pending:
    """A variant's prompts not yet taken by a run, shared by the runs in flight."""

    prompts: deque[SuitePrompt]
    stopped: bool = False
    """Prompts were left (or a run stopped) because the suite was stopped."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take_all(self) -> list[SuitePrompt]:
        with self.lock:
            taken = list(self.prompts)
            self.prompts.clear()
            return taken


def _quiet(_: str) -> None:
    return None


def _serialized(
    callback: Callable[[Any], None] | None, lock: threading.RLock
) -> Callable[[Any], None]:
    """`callback` called under `lock` (a no-op for None)."""

    def call(value: Any) -> None:
        if callback is not None:
            with lock:
                callback(value)

    return call
