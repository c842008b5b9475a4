"""Live streaming: the lanes run in a worker process (a crash in llama.cpp ends a run,
not the app), a thread reads their steps and posts them in batches, and the UI draws
them at a pace the lanes can afford.

The lanes decode on the same few cores the UI thread runs on, so every frame is paid for
in their tokens/s: `FramePacer` keeps the UI under a small share of a core, and while
lanes run the objects that exist already are set aside from garbage collection.
`benchmarks/tui_stream.py` measures what the app costs the lanes.

`Streaming` is the screen's controller of a live run: it puts what the worker thread
reports into the model (`view_state.CompareView`) and returns what changed, a frame
among it only when the pacer says one is due; the screen draws.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable
from functools import partial

from specdiff.control import control_brief
from specdiff.engine.worker import PairWorker
from specdiff.errors import SpecdiffError
from specdiff.fork_words import counted
from specdiff.lanes import Pair
from specdiff.results import PairResult
from specdiff.steps import TokenStep
from specdiff.tui.host import Host, IsCancelled, Stoppable
from specdiff.tui.messages import (
    Alerted,
    Changes,
    ForkFound,
    FrameDue,
    PairShown,
    ReplayShown,
    RunAgain,
    RunFailed,
    RunFinished,
    RunningChanged,
    RunStarted,
    StatusChanged,
    StepsArrived,
)
from specdiff.tui.view_state import CompareView

SWITCH_INTERVAL = 0.0005
"""The interpreter's switch interval while the app runs: the lanes' loop needs the GIL
for a moment between two llama_decode calls, and a shorter interval hands it over sooner
while the UI thread draws."""
ALIGN_COST_SHARE = 0.05
"""The most of the UI thread's time the alignment after the fork takes while streaming."""
PANEL_SECONDS = 1.0
"""While lanes stream or a replay plays, the panel (its token count) is redrawn at
most this often."""
BATCH_SECONDS = 0.25
"""The worker posts steps at most this often: smooth to the eye, cheap for the UI (which
shares the CPU with the lanes)."""
READ_EVERY = 0.05
"""While lanes stream, the worker's steps are read in batches this often (seconds)."""
FRAME_CPU_SHARE = 0.03
"""While lanes stream, the most of one core the UI thread takes drawing them: the lanes
decode on the same cores, so every frame is paid for in their tokens/s. A batch that
arrives while the UI is over this share since its last frame is drawn with the next one
(a 4-per-second stream on a fast machine, 2 on a slow one)."""
FRAME_GAP_MAX = 1.0
"""However slow its frames, a streaming pane is drawn at least this often (seconds)."""

LiveReport = RunStarted | StepsArrived | RunFinished | RunFailed | StatusChanged
"""What a live run's worker thread reports."""


class FramePacer:
    """When streamed steps, the details around them and the alignment are drawn. The
    limits are read when asked, so a test (or a slower machine) may change them."""

    def __init__(self) -> None:
        self.last_frame: tuple[float, float] | None = None
        """(monotonic, UI thread CPU seconds) when streamed steps were last drawn."""
        self.next_panel = 0.0
        self.next_alignment = 0.0

    def restart(self) -> None:
        """A run starts: its first tokens are drawn as they come."""
        self.last_frame = None

    def frame_due(self) -> bool:
        """Whether streamed steps are drawn now: not while the UI thread has used more
        than FRAME_CPU_SHARE of a core since the last frame (unless FRAME_GAP_MAX has
        passed)."""
        now, cpu = time.monotonic(), time.thread_time()
        if self.last_frame is not None:
            elapsed, used = now - self.last_frame[0], cpu - self.last_frame[1]
            if elapsed < FRAME_GAP_MAX and used > FRAME_CPU_SHARE * elapsed:
                return False
        self.last_frame = (now, cpu)
        return True

    def frame_drawn(self) -> None:
        """A frame was drawn outside `frame_due` (by the timer for steps held back)."""
        self.last_frame = (time.monotonic(), time.thread_time())

    def panel_due(self) -> bool:
        """True at most once every PANEL_SECONDS: the panel's count of tokens shown
        keeps up with streaming lanes without a redraw per batch."""
        now = time.monotonic()
        if now < self.next_panel:
            return False
        self.next_panel = now + PANEL_SECONDS
        return True

    def align(self, redo: Callable[[], object]) -> None:
        """Redo the alignment after the fork when it is due. Its cost grows with the
        square of the tokens after the fork, so it waits long enough after each redo to
        take at most ALIGN_COST_SHARE of the UI thread: long runs keep their speed."""
        now = time.monotonic()
        if now < self.next_alignment:
            return
        redo()
        self.next_alignment = now + (time.monotonic() - now) / ALIGN_COST_SHARE


class LiveRun:
    """The lanes of live runs: loaded once and kept while the pair stays the same, run
    on each prompt in a worker thread (`stream`)."""

    def __init__(self, near_tie: float, control: bool) -> None:
        self.near_tie = near_tie
        self.control = control
        """Run lane a again, cold, after each run (--control)."""
        self.cancel = threading.Event()
        self.restart = False
        """Start again once the run being stopped has ended (`r` mid-run)."""
        self.max_tokens = 0
        self._runner: PairWorker | None = None

    def stream(
        self,
        pair: Pair,
        prompt: str,
        max_tokens: int,
        post: Callable[[LiveReport], object],
        is_cancelled: IsCancelled,
    ) -> None:
        """One run, in the worker thread: its steps posted in batches every BATCH_SECONDS,
        then how it ended (RunFinished, or RunFailed with the lane the engine named);
        what the lanes say while they load, as StatusChanged."""
        try:
            def status(text: str) -> None:
                post(StatusChanged(text))

            runner = self.runner_for(pair, status)
            tokens = runner.tokenize(prompt)
            post(RunStarted(len(tokens)))
            buffer: list[TokenStep] = []
            last = time.monotonic()
            steps = runner.stream(prompt, max_tokens, near_tie=self.near_tie, control=self.control)
            for step in steps:
                buffer.append(step)
                now = time.monotonic()
                if now - last >= BATCH_SECONDS:
                    post(StepsArrived(buffer, runner.live()))
                    buffer, last = [], now
                if is_cancelled():
                    self.cancel.set()
            if buffer:
                post(StepsArrived(buffer, runner.live()))
            assert runner.result is not None
            post(RunFinished(runner.result))
        except SpecdiffError as error:
            post(RunFailed(str(error), error.lane))

    @property
    def worker_pid(self) -> int | None:
        """The process id of the worker holding the loaded lanes, while one lives: the
        same id from one run to the next means the lanes were not loaded again."""
        runner = self._runner
        return runner.process.pid if runner is not None and runner.alive else None

    def holds(self, pair: Pair) -> bool:
        """Whether `pair`'s lanes are loaded already: a run with another prompt (or max
        tokens) starts on them; only other lane settings make another pair."""
        runner = self._runner
        return runner is not None and runner.pair == pair and runner.alive

    def runner_for(self, pair: Pair, status: Callable[[str], None]) -> PairWorker:
        """Reuse loaded lanes while the pair stays the same and their process lives (runs
        in the worker thread); after a crash the next run starts a fresh one."""
        if self._runner is not None and self.holds(pair):
            return self._runner
        if self._runner is not None:
            self._runner.close()
            self._runner = None
        self._runner = PairWorker(pair, status, self.cancel, READ_EVERY)
        return self._runner

    def close(self) -> None:
        """The app is closing: a busy worker is killed, not waited for."""
        self.cancel.set()
        if self._runner is not None:
            self._runner.close()
            self._runner = None


def finished_summary(result: PairResult) -> str:
    """How a run ended, for the status line: crashed, stopped, identical, or where it
    forked, with the cold control's verdict and the speed ratio where there are ones."""
    comparison = result.comparison
    if result.crashed:
        summary = "the lanes' process crashed; r runs again in a fresh one"
    elif result.cancelled:
        summary = "stopped"
    elif comparison.identical:
        summary = f"identical over {comparison.length_a} tokens"
    elif comparison.fork is not None:
        lengths = (counted(comparison.length_a, "token"), counted(comparison.length_b, "token"))
        summary = f"forked at token {comparison.fork.index} (a {lengths[0]}, b {lengths[1]})"
    else:
        summary = "same tokens, different lengths"
    control = control_brief(result.summary())
    summary += f" · {control}" if control else ""
    return summary + (f" · speed a/b {result.speedup:.2f}x" if result.speedup else "")


class Streaming:
    """The compare screen's live run: starts it in a worker thread, puts what arrives
    into the model, and says when a frame is due at the pacer's pace."""

    def __init__(self, view: CompareView, live: LiveRun, host: Host) -> None:
        self.view = view
        self.live = live
        self.host = host
        self.pacer = FramePacer()
        self._pending_frame: Stoppable | None = None
        """The timer that draws steps held back from a frame, while one is set."""

    def set_running(self, running: bool) -> Changes:
        # Python's full collection walks every object the app holds (about 100,000): one
        # took ~50 ms of the UI thread mid-run, and the lanes' decode threads share its
        # cores. While lanes run, what exists already is set aside (gc.freeze), so a
        # collection walks only what the run made.
        if running and not self.view.running:
            gc.collect()
            gc.freeze()
        elif not running and self.view.running:
            gc.unfreeze()
        self.view.running = running
        return [RunningChanged(running)]

    def start(self, pair: Pair, prompt: str, max_tokens: int) -> Changes:
        """A live run replaces what is on screen and starts (the caller has stopped a
        replay there was)."""
        self.view.start_live(pair)
        self.live.max_tokens = max_tokens
        changes: Changes = [
            ReplayShown(False),
            PairShown(),
            FrameDue(follow=True),
            *self.set_running(True),
        ]
        self.live.cancel.clear()
        # said as it is: the lanes load only for a pair whose settings changed
        loaded = self.live.holds(pair)
        changes.append(
            StatusChanged(
                f"starting {pair.name} on the loaded lanes…" if loaded else f"loading {pair.name}…"
            )
        )
        self.host.run_in_thread(partial(self.generate, pair, prompt, max_tokens), "generation")
        return changes

    def generate(self, pair: Pair, prompt: str, max_tokens: int, is_cancelled: IsCancelled) -> None:
        """The run, in the worker thread; what it reports goes to `receive`."""
        post = partial(self.host.post, self.receive)
        self.live.stream(pair, prompt, max_tokens, post, is_cancelled)

    def stop(self) -> Changes:
        """`x`: the run stops (its lanes end their step first)."""
        if not self.view.running:
            return []
        self.live.cancel.set()
        return [StatusChanged("stopping…")]

    def restart(self) -> Changes:
        """`r` mid-run: stop this run, and start the next once it has ended."""
        self.live.restart = True
        self.live.cancel.set()
        return [StatusChanged("stopping the current run to start again…")]

    def receive(self, report: LiveReport) -> Changes:
        """What the worker thread reported, on the UI thread."""
        if isinstance(report, StepsArrived):
            return self.arrived(report)
        if isinstance(report, RunStarted):
            return self.started(report)
        if isinstance(report, RunFinished):
            return self.finished(report)
        if isinstance(report, RunFailed):
            return self.failed(report)
        return [report]

    def started(self, message: RunStarted) -> Changes:
        self.pacer.restart()
        # the number that says how long it may take first: a narrow line cuts the end
        return [
            StatusChanged(
                f"generating up to {self.live.max_tokens} tokens a lane · "
                f"prompt {counted(message.prompt_tokens, 'token')}"
            )
        ]

    def arrived(self, message: StepsArrived) -> Changes:
        view = self.view
        view.add(message.steps)
        for lane_id, live in message.live.items():
            state = view.lanes[lane_id]
            state.speed, state.drafted, state.accepted = (
                live.tokens_per_second,
                live.drafted,
                live.accepted,
            )
        if not self.pacer.frame_due():
            # drawn with the next batch, or by this timer if none comes (lane a's control
            # run after the pair sends nothing for a while)
            if self._pending_frame is None:
                self._pending_frame = self.host.later(FRAME_GAP_MAX, self.draw_pending)
            return []
        return self.draw()

    def draw_pending(self) -> Changes:
        """Steps held back from a frame, drawn once no batch has come to bring them."""
        self._pending_frame = None
        if not self.view.running:
            return []
        self.pacer.frame_drawn()
        return self.draw()

    def draw(self) -> Changes:
        """The steps that have arrived, as a streaming frame draws them."""
        if self._pending_frame is not None:
            self._pending_frame.stop()
            self._pending_frame = None
        # While streaming only new tokens are drawn; the alignment after the fork is
        # drawn once the run ends, the details at the fork and once a panel period.
        view = self.view
        found = view.find_fork()
        align_while_streaming(view, self.pacer)
        details = found or self.pacer.panel_due()
        return [*([ForkFound(True)] if found else []), FrameDue(view.follow, details)]

    def finished(self, message: RunFinished) -> Changes:
        view, result = self.view, message.result
        view.result = result
        changes = self.set_running(False)
        for outcome in (result.a, result.b):
            state = view.lanes[outcome.lane_id]
            state.error = outcome.error
            state.speed = outcome.tokens_per_second
            state.drafted, state.accepted = outcome.drafted, outcome.accepted
        if view.update_comparison():
            changes.append(ForkFound(True))
        changes.append(FrameDue(view.follow))
        errors = result.error_lines()
        if errors:
            changes.append(Alerted("; ".join(errors), "error", 10))
        jump = "d jumps to the fork · " if view.fork is not None else ""
        # the keys first: a narrow status line keeps what to press
        changes.append(
            StatusChanged(f"{jump}s saves · e writes a report · {finished_summary(result)}")
        )
        if self.live.restart:
            self.live.restart = False
            changes.append(RunAgain())
        return changes

    def failed(self, message: RunFailed) -> Changes:
        view = self.view
        changes = self.set_running(False)
        self.live.restart = False
        # an error that opens with its lane ("lane a asks for ...") names it already
        named = not message.lane or message.error.startswith(f"lane {message.lane}")
        where = "" if named else f"lane {message.lane}: "
        changes += [
            Alerted(f"{where}{message.error}", "error", 10),
            StatusChanged(f"failed: {where}{message.error}"),
        ]
        for lane_id in (message.lane,) if message.lane else ("a", "b"):
            view.lanes[lane_id].error = message.error
        view.stopped_by = message.lane
        return [*changes, FrameDue(follow=False)]

    def broke(self, error: BaseException | None) -> Changes:
        """The worker raised what no run should (a bug): said once, the app lives on."""
        return [
            *self.set_running(False),
            FrameDue(self.view.follow),  # steps held back from a frame
            Alerted(f"unexpected error: {error}", "error", 10),
            StatusChanged(f"failed: {error}"),
        ]

    def close(self) -> None:
        """The app is closing: a busy worker is killed, not waited for."""
        self.set_running(False)
        self.live.close()


def align_while_streaming(view: CompareView, pacer: FramePacer) -> None:
    """Diff colours from the moment the lanes fork, redone as often as affordable."""
    if view.fork is not None:
        pacer.align(view.update_comparison)
