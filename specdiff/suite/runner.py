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
from typing import TYPE_CHECKING, Any

from specdiff.errors import SpecdiffError, printable
from specdiff.grading.graders import NOT_RUN_LANE_FAILED, Grader, grade_text
from specdiff.lanes import Pair
from specdiff.results import LaneOutcome, PairResult
from specdiff.sessions.format import CRASHED
from specdiff.sessions.header import SessionHeader
from specdiff.sessions.records import Grade, RunSummary
from specdiff.sessions.store import (
    PARTIAL_SUFFIX,
    SessionWriter,
    load_session,
)
from specdiff.steps import TokenStep
from specdiff.suite import SuiteError
from specdiff.suite.folder import session_path
from specdiff.suite.kld import score_teacher_forced
from specdiff.suite.ledger import Ledger
from specdiff.suite.lengths import padded_prompt, skipped_message
from specdiff.suite.outcome import SuiteOutcome
from specdiff.suite.prompts import SuitePrompt
from specdiff.suite.records import (
    PromptRecord,
    lane_serving,
    record_from_session,
    unreadable_record,
)
from specdiff.suite.settings import SuiteSettings

if TYPE_CHECKING:
    from specdiff.engine.llama.context import ModelPool
    from specdiff.engine.pairrun import PairRun
    from specdiff.engine.worker import PairWorker

UNREADABLE_ERRORS = (SpecdiffError, ValueError, TypeError, KeyError, IndexError, RecursionError)
"""What reading a session file back may raise: a file shared, edited or cut short must
fail its own run, never the suite."""


class PromptSkipped(Exception):
    """One prompt cannot run (too long for the context, ...); the others can."""


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
class _Tally:
    """What one `SuiteRun.run()` has done so far; the runs in flight share it, under
    `lock`."""

    began: float
    jobs: int
    ledger: Ledger
    executed: dict[str, dict[str, Any]] = field(default_factory=dict)
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


@dataclass
class _Variant:
    """One pair (variant) of the suite and the worker that runs its prompts (a fresh one
    after a crash)."""

    label: str
    pair: Pair
    quant: str
    runner: PairWorker | PairRun | None
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
    ) -> None:
        self.settings = settings
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
        self._loading = threading.Lock()
        self._models: ModelPool | None = None
        """The weights the runs side by side share (their tokenizers), while they run."""
        self.skipped_runs = 0
        """Runs that could not start (a prompt too long, a pair that would not load)."""
        self.unloaded: list[str] = []
        self.grading_seconds = 0.0
        self.program_seconds = 0.0
        self._pair_places: dict[str, int] = {}
        self._prompt_places: dict[str, int] = {}

    def run(self) -> SuiteOutcome:
        started = datetime.now(timezone.utc).isoformat(timespec="seconds")
        variants = self.settings.variants()
        labels = [label for label, _, _ in variants]
        ledger = Ledger(labels, self.report_dir, graded=self.settings.grade)
        tally = _Tally(time.perf_counter(), len(variants) * len(self.prompts), ledger)
        # a run's place in the report: its pair's, then its prompt's
        self._pair_places = {label: n * len(self.prompts) for n, label in enumerate(labels)}
        self._prompt_places = {prompt.id: n for n, prompt in enumerate(self.prompts)}
        cancelled = False
        for label, pair, quant in variants:
            pending = self._read_back(label, quant, tally)
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
            grading_seconds=self.grading_seconds,
            program_seconds=self.program_seconds,
            kld=kld,
        )

    def _kld(self, tally: _Tally, cancelled: bool) -> dict[str, dict[str, Any]]:
        """A teacher-forced suite's KL divergence figures; a stopped suite scores no
        new run."""
        return score_teacher_forced(
            self.settings, self.report_dir, tally.ledger.records(), self.cancel, self.on_message,
            score_new=not cancelled,
        )  # fmt: skip

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
            self._keep(read, tally)
            tally.resumed += 1
            tally.job += 1
        return pending

    def _run_variant(
        self, label: str, pair: Pair, quant: str, pending: list[SuitePrompt], tally: _Tally
    ) -> bool:
        """Run the pending prompts under one pair (variant), up to --concurrency of them at
        once, each on a runner of its own; True when the suite was stopped."""
        self.on_message(f"{label}: {pair.description or pair.name}")
        queue = _Pending(deque(pending))
        slots = min(self.settings.concurrency, len(pending))
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
            if self._models is not None:
                self._models.close()
                self._models = None
        return queue.stopped

    def _slot(
        self,
        variant: _Variant,
        queue: _Pending,
        tally: _Tally,
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
        self, variant: _Variant, prompt: SuitePrompt, queue: _Pending, tally: _Tally
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
                except _Restart as restart:
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
        tally: _Tally,
        loud: bool = True,
    ) -> PairWorker | PairRun | None:
        """A runner with the pair loaded; None, with the `pending` prompts skipped, when
        the pair will not load (or its worker crashes loading it): the other pairs still
        can."""
        label = variant.label
        try:
            return self._new_runner(variant.pair, self.on_message if loud else _quiet)
        except SpecdiffError as error:
            with tally.lock:
                # the runners side by side load the same pair: its failure is told once
                if any(entry.startswith(f"{label}: ") for entry in self.unloaded):
                    return None
                self.unloaded.append(f"{label}: {error}")
            self._skip(tally, label, [f"{p.id}: {error}" for p in pending()], str(error))
            return None

    def _new_runner(self, pair: Pair, progress: Callable[[str], None]) -> PairWorker | PairRun:
        """The runs side by side (server lanes only) are threads of this process, so each
        lane's runs share its endpoint pool; one at a time, a worker process."""
        # the engine loads only once something runs, so the input checks before it stay
        # quick; an in-process lane's llama.cpp loads in the worker process only
        from specdiff.engine.worker import PairWorker

        if self.settings.concurrency == 1:
            return PairWorker(pair, progress, self.cancel)
        from specdiff.engine.pairrun import PairRun
        from specdiff.engine.server.pool import configure

        # each endpoint's connections, shared by the runs, are sized to the concurrency
        configure(concurrency=self.settings.concurrency)
        from specdiff.engine.llama.context import ModelPool

        # one lane loads its tokenizer at a time (llama.cpp's loader is not to be raced),
        # and all load it from one pool: N copies of the weights would grow with N
        with self._loading:
            if self._models is None:
                self._models = ModelPool()
            return PairRun(pair, progress, self.cancel, self._models)

    def _skip(self, tally: _Tally, label: str, runs: list[str], why: str) -> None:
        """Note runs that cannot start, one entry each, and say why once."""
        with tally.lock:
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

    def _keep(self, record: PromptRecord, tally: _Tally) -> None:
        # runs side by side end in any order; the report lists them in the suite's
        place = self._pair_places[record.pair] + self._prompt_places[record.prompt_id]
        tally.ledger.add(record, place)

    def _run_one(
        self,
        variant: _Variant,
        prompt: SuitePrompt,
        tally: _Tally,
        key: str,
        restarts: dict[str, int],
    ) -> tuple[Path, bool]:
        """Run one prompt into its session file, counted in flight under `key`; True when
        the suite was stopped. _Restart when a server lane's endpoint failed in a way
        that sending the prompt again (to another endpoint) may mend."""
        # deferred, as in _open_worker, which has loaded it by now
        from specdiff.engine.worker import WorkerCrashed

        path = session_path(self.report_dir, variant.label, prompt)
        max_tokens = prompt.max_tokens or self.settings.max_tokens
        writer = self._open_session(variant, prompt, path, max_tokens)
        tally.started(key, 2 * max_tokens)
        produced = 0
        last_report = 0.0

        def on_step(step: TokenStep) -> None:
            nonlocal produced, last_report
            writer.step(step)
            produced += 1
            now = time.perf_counter()
            if now - last_report >= 0.1:
                last_report = now
                tally.produced(key, produced)
                self._stopping()  # says so as soon as a Ctrl+C asks to drain
                self.on_progress(tally.progress(variant.label, prompt.id))

        assert variant.runner is not None  # a variant takes prompts only once loaded
        try:
            result = variant.runner.run(
                prompt.prompt,
                max_tokens,
                self._stop(prompt),
                self.settings.near_tie,
                on_step,
                teacher_forced=self.settings.teacher_forced,
                control=self.settings.control,
            )
        except WorkerCrashed as crash:
            # died before its first step: nothing to keep, and --resume runs it again
            writer.abandon()
            raise PromptSkipped(f"{prompt.where}: {crash}") from None
        tally.produced(key, produced)
        if result.cancelled:
            writer.handle.close()  # the partial file stays; --resume runs the prompt again
            return path, True
        restart = _restart_of(result.a, restarts) or _restart_of(result.b, restarts)
        if restart is not None:
            writer.abandon()
            raise restart
        if result.crashed:
            self.on_message(
                f"crashed: {variant.label} {prompt.id} after {produced} steps; "
                f"{result.error_lines()[0]}"
            )
        final = writer.finish(self._footer(result, prompt, restarts))
        if final != path:
            raise SuiteError(f"{path} appeared while the suite was writing it; start again")
        return path, False

    def _footer(
        self, result: PairResult, prompt: SuitePrompt, restarts: dict[str, int]
    ) -> RunSummary:
        """The run's summary with its grades and how each server lane was served."""
        summary = self._graded(result.summary(), (result.a, result.b), prompt)
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
        with self._said:
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
        with self._said:
            self.program_seconds += program_seconds
        return grade


MAX_RESTARTS = 3
"""How often one prompt is sent again from the start after its server lane's endpoint
failed (refused, broke the stream, stayed busy past its retries)."""


class _Restart(Exception):
    """A server lane's endpoint failed in a way a fresh start may mend."""

    def __init__(self, lane_id: str, why: str) -> None:
        super().__init__(why)
        self.lane_id = lane_id
        self.why = why


def _restart_of(outcome: LaneOutcome, restarts: dict[str, int]) -> _Restart | None:
    """A _Restart for a lane that failed where its pool says the whole prompt may be
    sent again, within MAX_RESTARTS; None otherwise."""
    restartable = outcome.executed.get("restartable") is True
    if outcome.error is None or not restartable or restarts[outcome.lane_id] >= MAX_RESTARTS:
        return None
    return _Restart(outcome.lane_id, printable(outcome.error, 300))


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
