"""Live streaming: the lanes run in a worker process (a crash in llama.cpp ends a run,
not the app), a thread reads their steps and posts them in batches, and the UI draws
them at a pace the lanes can afford.

The lanes decode on the same few cores the UI thread runs on, so every frame is paid for
in their tokens/s: `FramePacer` keeps the UI under a small share of a core, and while
lanes run the objects that exist already are set aside from garbage collection.
`benchmarks/tui_stream.py` measures what the app costs the lanes.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from textual.message import Message
from textual.timer import Timer
from textual.worker import get_current_worker

from specdiff.control import control_brief
from specdiff.engine.worker import PairWorker
from specdiff.errors import SpecdiffError
from specdiff.fork_words import counted
from specdiff.lanes import Pair
from specdiff.results import PairResult
from specdiff.steps import TokenStep
from specdiff.tui.messages import RunFailed, RunFinished, RunStarted, StepsArrived

if TYPE_CHECKING:  # the screen owns its live run; only its type is needed here
    from specdiff.tui.screen import CompareScreen

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
    on each prompt in a thread the screen starts (`stream`)."""

    def __init__(self, near_tie: float, control: bool) -> None:
        self.near_tie = near_tie
        self.control = control
        """Run lane a again, cold, after each run (--control)."""
        self.cancel = threading.Event()
        self.restart = False
        """Start again once the run being stopped has ended (`r` mid-run)."""
        self.max_tokens = 0
        self._runner: PairWorker | None = None
        self._running = False

    @property
    def running(self) -> bool:
        return self._running

    @running.setter
    def running(self, running: bool) -> None:
        # Python's full collection walks every object the app holds (about 100,000): one
        # took ~50 ms of the UI thread mid-run, and the lanes' decode threads share its
        # cores. While lanes run, what exists already is set aside (gc.freeze), so a
        # collection walks only what the run made.
        if running and not self._running:
            gc.collect()
            gc.freeze()
        elif not running and self._running:
            gc.unfreeze()
        self._running = running

    def stream(
        self,
        pair: Pair,
        prompt: str,
        max_tokens: int,
        post: Callable[[Message], object],
        status: Callable[[str], None],
        is_cancelled: Callable[[], bool],
    ) -> None:
        """One run, in the worker thread: its steps posted in batches every BATCH_SECONDS,
        then how it ended (RunFinished, or RunFailed with the lane the engine named)."""
        try:
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
        self.running = False
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
    """The compare screen's side of a live run: starts it in a worker thread, and draws
    what arrives at the pacer's pace."""

    def __init__(self, screen: CompareScreen) -> None:
        self.screen = screen
        self._pending_frame: Timer | None = None
        """The timer that draws steps held back from a frame, while one is set."""

    def start(self, pair: Pair, prompt: str, max_tokens: int) -> None:
        """A live run replaces what is on screen (a replay included) and starts."""
        screen = self.screen
        screen.replay.stop()
        screen.replay.drop_stream()
        screen.session = None
        screen.output.forget_saved()
        screen.lock_replay_controls(False)
        screen.view.reset()
        screen.pair = pair
        screen.live.max_tokens = max_tokens
        screen.set_titles()
        screen.render_lanes(follow=True)
        screen.running = True
        screen.live.cancel.clear()
        # said as it is: the lanes load only for a pair whose settings changed
        loaded = screen.live.holds(pair)
        screen.set_status(
            f"starting {pair.name} on the loaded lanes…" if loaded else f"loading {pair.name}…"
        )
        screen.run_worker(
            partial(self.generate, pair, prompt, max_tokens),
            thread=True,
            exclusive=True,
            group="generation",
            exit_on_error=False,
        )

    def generate(self, pair: Pair, prompt: str, max_tokens: int) -> None:
        """The run, in the worker thread; what it posts goes to the screen."""
        screen, current = self.screen, get_current_worker()
        screen.live.stream(
            pair,
            prompt,
            max_tokens,
            screen.post_message,
            partial(screen.app.call_from_thread, screen.set_status),
            lambda: current.is_cancelled,
        )

    def started(self, message: RunStarted) -> None:
        screen = self.screen
        if screen.shutting_down:
            return
        screen.pacer.restart()
        # the number that says how long it may take first: a narrow line cuts the end
        screen.set_status(
            f"generating up to {screen.live.max_tokens} tokens a lane · "
            f"prompt {counted(message.prompt_tokens, 'token')}"
        )

    def arrived(self, message: StepsArrived) -> None:
        screen = self.screen
        if screen.shutting_down:
            return
        screen.view.add(message.steps)
        for lane_id, live in message.live.items():
            state = screen.view.lanes[lane_id]
            state.speed, state.drafted, state.accepted = (
                live.tokens_per_second,
                live.drafted,
                live.accepted,
            )
        if not screen.pacer.frame_due():
            # drawn with the next batch, or by this timer if none comes (lane a's control
            # run after the pair sends nothing for a while)
            if self._pending_frame is None:
                self._pending_frame = screen.set_timer(FRAME_GAP_MAX, self.draw_pending)
            return
        self.draw()

    def draw_pending(self) -> None:
        """Steps held back from a frame, drawn once no batch has come to bring them."""
        self._pending_frame = None
        if self.screen.running:
            self.screen.pacer.frame_drawn()
            self.draw()

    def draw(self) -> None:
        """The steps that have arrived, as a streaming frame draws them."""
        screen = self.screen
        if self._pending_frame is not None:
            self._pending_frame.stop()
            self._pending_frame = None
        # While streaming only new tokens are drawn; the alignment after the fork is
        # drawn once the run ends, the details at the fork and once a panel period.
        found = screen.look_for_fork()
        screen.align_while_streaming()
        screen.render_lanes(follow=screen.view.follow, details=found or screen.pacer.panel_due())

    def finished(self, message: RunFinished) -> None:
        screen, view = self.screen, self.screen.view
        if screen.shutting_down:
            return
        result = message.result
        view.result = result
        screen.running = False
        for outcome in (result.a, result.b):
            state = view.lanes[outcome.lane_id]
            state.error = outcome.error
            state.speed = outcome.tokens_per_second
            state.drafted, state.accepted = outcome.drafted, outcome.accepted
        screen.update_comparison()
        screen.render_lanes(follow=view.follow)
        errors = result.error_lines()
        if errors:
            screen.notify("; ".join(errors), severity="error", timeout=10)
        jump = "d jumps to the fork · " if view.fork is not None else ""
        # the keys first: a narrow status line keeps what to press
        screen.set_status(f"{jump}s saves · e writes a report · {finished_summary(result)}")
        if screen.live.restart:
            screen.live.restart = False
            screen.action_run()

    def failed(self, message: RunFailed) -> None:
        screen, view = self.screen, self.screen.view
        if screen.shutting_down:
            return
        screen.running = False
        screen.live.restart = False
        # an error that opens with its lane ("lane a asks for ...") names it already
        named = not message.lane or message.error.startswith(f"lane {message.lane}")
        where = "" if named else f"lane {message.lane}: "
        screen.notify(f"{where}{message.error}", severity="error", timeout=10)
        screen.set_status(f"failed: {where}{message.error}")
        for lane_id in (message.lane,) if message.lane else ("a", "b"):
            view.lanes[lane_id].error = message.error
        view.stopped_by = message.lane
        screen.render_lanes(follow=False)

    def broke(self, error: BaseException | None) -> None:
        """The worker raised what no run should (a bug): said once, the app lives on."""
        screen = self.screen
        if screen.shutting_down:
            return
        screen.running = False
        screen.render_lanes(follow=screen.view.follow)  # steps held back from a frame
        screen.notify(f"unexpected error: {error}", severity="error", timeout=10)
        screen.set_status(f"failed: {error}")
