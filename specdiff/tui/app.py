"""The specdiff app: two lanes streaming side by side, the fork highlighted.

The app only renders records. A thread worker drives a ``PairWorker`` (the lanes run in
their own process, so a crash in llama.cpp ends a run, not the app) and posts batches of
TokenSteps; the fork, near ties and alignment come from ``compare.py``.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterable, Sequence
from contextlib import suppress
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.text import Text
from textual import on, work
from textual.app import App, ComposeResult, ScreenStackError, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal
from textual.css.query import NoMatches
from textual.filter import LineFilter
from textual.notifications import SeverityLevel
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import Button, Footer, Input, Select
from textual.worker import Worker, WorkerState, get_current_worker

from specdiff.compare import DEFAULT_NEAR_TIE, Fork, align_after, first_divergence, fork_at
from specdiff.compare import near_ties as find_near_ties
from specdiff.engine.worker import PairWorker
from specdiff.errors import SpecdiffError
from specdiff.lanes import Pair, apply_overrides, headline, parse_overrides
from specdiff.safe_text import visible
from specdiff.sessions.format import PairResult
from specdiff.sessions.playback import Playback
from specdiff.sessions.store import Session, SessionError, SessionStream, save_result
from specdiff.steps import TokenStep
from specdiff.tui.help import HelpScreen
from specdiff.tui.messages import (
    RunFailed,
    RunFinished,
    RunStarted,
    SessionLoaded,
    SessionLoadFailed,
    StepsArrived,
)
from specdiff.tui.themes import APP_VARIABLES, DEFAULT_THEME, load_themes
from specdiff.tui.widgets import (
    LanePane,
    LaneState,
    Line,
    Palette,
    Panel,
    TokenMarks,
    WithoutControls,
    render_panel,
)

WITHOUT_CONTROLS = WithoutControls()
READ_CHUNK = 2000
"""Steps read per message while a replay reads the rest of its file."""
REPLAY_TICK = 1 / 30
"""How often a replay draws the steps that became due."""
SWITCH_INTERVAL = 0.0005
BATCH_SECONDS = 0.25
"""The worker posts steps at most this often: smooth to the eye, cheap for the UI (which
shares the CPU with the lanes)."""


class Lanes(Horizontal, can_focus=True):
    """The two panes; focusable so that the app's keys reach it instead of an input."""


class SpecdiffApp(App[int]):
    CSS_PATH = "app.tcss"
    TITLE = "specdiff"
    BINDINGS = [
        Binding("r", "run", "run"),
        Binding("x", "stop", "stop"),
        Binding("escape", "stop", "stop", show=False),
        Binding("d", "fork", "fork"),
        Binding("n", "next_tie", "next tie"),
        Binding("p", "previous_tie", "prev tie"),
        Binding("left", "move(-1)", "←", show=False),
        Binding("right", "move(1)", "→", show=False),
        Binding("space", "toggle_pause", "pause"),
        Binding("l", "switch_lane", "lane"),
        Binding("s", "save", "save"),
        Binding("t", "next_theme", "theme"),
        Binding("question_mark", "help", "help"),
        Binding("q", "quit", "quit"),
    ]

    def __init__(
        self,
        pairs: dict[str, Pair],
        pair_name: str,
        prompt: str,
        max_tokens: int,
        near_tie: float = DEFAULT_NEAR_TIE,
        theme_name: str | None = None,
        autostart: bool = True,
        session: Session | None = None,
        sessions_dir: str | Path | None = None,
        theme_dirs: list[Path] | None = None,
        replay_speed: float | None = None,
        session_stream: SessionStream | None = None,
        refused_pairs: dict[str, str] | None = None,
    ) -> None:
        """`session` opens a recorded run: at once when `replay_speed` is None, else
        played at the recorded pace times `replay_speed`; `session_stream`, when given,
        holds the rest of the session's file, read while the replay plays.
        `refused_pairs`: pairs shown but never run, each with the reason (a shared
        session's server lanes, which the user has not allowed)."""
        super().__init__()
        self.pairs = pairs
        self.refused_pairs = refused_pairs or {}
        self.pair_name = pair_name
        self.initial_prompt = prompt
        self.initial_max_tokens = max_tokens
        self.near_tie = near_tie
        self.requested_theme = theme_name
        self.autostart = autostart
        self.session = session
        self.sessions_dir = sessions_dir
        self.theme_dirs = theme_dirs
        self.lanes = {"a": LaneState("a"), "b": LaneState("b")}
        self.pair: Pair = pairs[pair_name]
        self.fork: Fork | None = None
        self.changed: dict[str, set[int]] = {"a": set(), "b": set()}
        self.similarity: float | None = None
        self.result: PairResult | None = None
        self.cursor_lane = "a"
        self.cursor: int | None = None
        self.follow = True
        self.running = False
        self.max_tokens = max_tokens
        self.cancel = threading.Event()
        self._runner: PairWorker | None = None
        self._restart = False
        self.our_themes: list[str] = []
        self.replay_speed = replay_speed
        self.playback: Playback | None = None
        self._replay_fork: int | None = None
        self._replay_clock = 0.0
        self._replay_timer: Timer | None = None
        self.session_stream = session_stream
        self._read_done = session_stream is None or session_stream.done
        self.load_error: str | None = None
        self._recorded: dict[str, list[TokenStep]] = {"a": [], "b": []}

    # -- layout ---------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        with Horizontal(id="controls"):
            yield Input(visible(self.initial_prompt), placeholder="prompt", id="prompt")
            yield Select(
                [(Text(visible(name)), name) for name in self.pairs],
                value=self.pair_name,
                allow_blank=False,
                id="pair",
            )
            yield Input(
                str(self.initial_max_tokens), type="integer", id="max-tokens", tooltip="max tokens"
            )
            yield Button("Run", id="run", variant="primary")
            yield Button("Stop", id="stop", variant="error")
        with Horizontal(id="overrides"):
            yield Input(placeholder="lane a overrides: key=value …", id="lane-a-overrides")
            yield Input(placeholder="lane b overrides: key=value …", id="lane-b-overrides")
        with Lanes(id="lanes"):
            yield LanePane("a")
            yield LanePane("b")
        yield Panel(id="panel")
        yield Line(id="status")
        yield Footer()

    def get_line_filters(self) -> Sequence[LineFilter]:
        # the last guard: whatever a widget forgot to escape never reaches the terminal
        return [*super().get_line_filters(), WITHOUT_CONTROLS]

    def notify(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: float | None = None,
        markup: bool = False,
    ) -> None:
        # messages quote errors and file names: shown as text, never read as markup
        super().notify(
            visible(message), title=title, severity=severity, timeout=timeout, markup=markup
        )

    def get_theme_variable_defaults(self) -> dict[str, str]:
        return dict(APP_VARIABLES)

    def on_mount(self) -> None:
        # The lanes' loop needs the GIL for a moment between two llama_decode calls; a
        # shorter switch interval hands it over sooner while the UI thread draws.
        sys.setswitchinterval(SWITCH_INTERVAL)
        found = load_themes(self.theme_dirs)
        for theme in found.themes.values():
            self.register_theme(theme)
        self.our_themes = sorted(found.themes)
        problems = list(found.problems)
        wanted = self.requested_theme or DEFAULT_THEME
        if wanted not in self.available_themes:
            problems.append(
                f"unknown theme {wanted!r}; using {DEFAULT_THEME} "
                f"(known: {', '.join(self.our_themes)})"
            )
            wanted = DEFAULT_THEME
        self.theme = wanted
        for problem in problems:
            self.notify(problem, severity="warning", timeout=8)
        self.set_titles()
        if self.session is not None:
            self.show_session(self.session)
        elif self.autostart:
            self.action_run()
        self.query_one("#lanes").focus()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # space belongs to replays: hidden from the footer while there is none
        if action == "toggle_pause":
            return self.playback is not None
        return True

    def on_resize(self) -> None:
        self.set_class(self.size.height < 30, "short")
        self.set_class(self.size.width < 100, "narrow")

    # -- state to screen ------------------------------------------------------------
    def palette(self) -> Palette:
        variables = dict(self.theme_variables)
        return Palette.from_variables(variables)

    def watch_theme(self) -> None:
        if self.is_mounted:
            self.render_lanes(follow=False)

    def set_titles(self) -> None:
        for lane_id, other_id in (("a", "b"), ("b", "a")):
            lane, other = getattr(self.pair, lane_id), getattr(self.pair, other_id)
            pane = self.query_one(f"#lane-{lane_id}", LanePane)
            pane.set_title(f"{lane_id.upper()} · {headline(lane, other)}")
            pane.set_stats("")

    def stats_line(self, lane_id: str) -> str:
        state = self.lanes[lane_id]
        parts = [f"{len(state.steps)} tokens", f"{state.speed:.1f} tok/s"]
        if getattr(self.pair, lane_id).speculative and state.drafted:
            parts.append(f"acceptance {state.accepted / state.drafted:.0%}")
        ties = sum(1 for step in state.steps if step.margin < self.near_tie)
        parts.append(f"{ties} near ties")
        if state.error:
            parts.append(f"ERROR: {state.error}")
        grades = self.session.footer.grades if self.session and self.session.footer else None
        grade = grades[0 if lane_id == "a" else 1] if grades else None
        if grade is not None:
            parts.append(f"{'PASS' if grade.passed else 'FAIL'} ({grade.reason})")
        return " · ".join(parts)

    def marks(self, lane_id: str) -> TokenMarks:
        return TokenMarks(
            palette=self.palette(),
            threshold=self.near_tie,
            fork_index=self.fork.index if self.fork is not None else None,
            cursor=self.cursor if lane_id == self.cursor_lane else None,
            changed_after_fork=frozenset(self.changed[lane_id]),
        )

    def render_lanes(self, follow: bool, panel: bool = True) -> None:
        for lane_id, state in self.lanes.items():
            pane = self.query_one(f"#lane-{lane_id}", LanePane)
            pane.show_tokens(state, self.marks(lane_id), follow=follow)
            pane.set_stats(self.stats_line(lane_id))
            pane.set_margins([step.margin for step in state.steps])
        if panel:
            self.render_panel()

    def render_panel(self) -> None:
        index = (
            self.cursor
            if self.cursor is not None
            else (self.fork.index if self.fork is not None else None)
        )
        a_steps, b_steps = self.lanes["a"].steps, self.lanes["b"].steps
        panel = render_panel(
            index,
            a_steps[index] if index is not None and index < len(a_steps) else None,
            b_steps[index] if index is not None and index < len(b_steps) else None,
            self.fork,
            self.similarity,
            max(len(a_steps), len(b_steps)),
            self.near_tie,
        )
        self.query_one("#panel", Panel).set(panel)

    def set_status(self, text: str) -> None:
        self.query_one("#status", Line).set(text)

    def find_fork(self, announce: bool = True) -> bool:
        """Look for the fork in what has arrived; True when it was found just now."""
        a, b = self.lanes["a"].steps, self.lanes["b"].steps
        if self.fork is None and first_divergence(a, b) is not None:
            self.fork = fork_at(a, b)
            if announce:
                self.notify(f"lanes forked at token {self.fork.index}", timeout=4)
            return True
        return False

    def update_comparison(self, announce: bool = True) -> None:
        a, b = self.lanes["a"].steps, self.lanes["b"].steps
        self.find_fork(announce)
        if self.fork is not None:
            alignment = align_after(a, b, self.fork.index)
            self.similarity = alignment.similarity
            changed: dict[str, set[int]] = {"a": set(), "b": set()}
            for tag, a0, a1, b0, b1 in alignment.opcodes:
                if tag != "equal":
                    changed["a"].update(range(self.fork.index + a0, self.fork.index + a1))
                    changed["b"].update(range(self.fork.index + b0, self.fork.index + b1))
            self.changed = changed

    def reset_view(self) -> None:
        self.lanes = {"a": LaneState("a"), "b": LaneState("b")}
        self.fork = None
        self.changed = {"a": set(), "b": set()}
        self.similarity = None
        self.result = None
        self.cursor = None
        self.follow = True

    def show_session(self, session: Session) -> None:
        """Show a recorded run (no model needed): at once, or played back."""
        self.stop_playback()
        self.reset_view()
        self.pair = session.pair
        self.set_titles()
        speeds = session.footer.tokens_per_second if session.footer else (0.0, 0.0)
        for lane_id, speed in zip(("a", "b"), speeds):
            self.lanes[lane_id].speed = float(speed)
        if self.replay_speed is None:
            for lane_id in ("a", "b"):
                self.lanes[lane_id].extend(session.steps[lane_id])
            self.update_comparison(announce=False)
            self.render_lanes(follow=False)
            self.set_status(self.session_summary())
            self.read_later()
            return
        first = session.recorded_steps()
        self.playback = Playback(first, self.replay_speed)
        self._recorded = {"a": list(session.steps["a"]), "b": list(session.steps["b"])}
        self._replay_fork = first_divergence(self._recorded["a"], self._recorded["b"])
        self.read_later()
        self._replay_clock = time.monotonic()
        self.render_lanes(follow=True)
        self._replay_timer = self.set_interval(REPLAY_TICK, self.replay_tick, name="replay")
        self.refresh_bindings()
        self.replay_status()

    @property
    def loading(self) -> bool:
        """The session file is still being read (as the UI has heard it, not the worker)."""
        return self.session_stream is not None and not self._read_done and self.load_error is None

    def session_summary(self) -> str:
        assert self.session is not None
        if self.loading:
            state = "session (reading…)"
        elif self.load_error is not None:
            state = "unreadable past this point:"
        else:
            state = "partial session" if self.session.partial else "session"
        fork = f"fork at token {self.fork.index}" if self.fork else "lanes identical"
        cut = f" ({self.session.cut_note})" if self.session.cut_note and not self.loading else ""
        return f"{state} {self.session.path.name}{cut}: {fork}"

    # -- replay ---------------------------------------------------------------------
    @work(thread=True, exclusive=True, group="session-read", exit_on_error=False)
    def read_rest(self, stream: SessionStream) -> None:
        """Read the session's remaining steps while the first ones play."""
        worker = get_current_worker()
        try:
            while not stream.done and not worker.is_cancelled:
                steps = stream.read(READ_CHUNK)
                self.post_message(SessionLoaded(steps, stream.done))
        except SessionError as error:
            self.post_message(SessionLoadFailed(str(error)))

    def read_later(self) -> None:
        if self.session_stream is not None and not self.session_stream.done:
            # after the first frame: a reader thread started now would take half the
            # interpreter's time from the app's start-up
            self.call_after_refresh(self.read_rest, self.session_stream)

    def on_session_loaded(self, message: SessionLoaded) -> None:
        if self.session_stream is None:
            return  # a live run replaced the replay
        self._read_done = message.done
        if message.done:
            footer = self.session.footer if self.session else None
            speeds = footer.tokens_per_second if footer else ()
            for lane_id, speed in zip(("a", "b"), speeds):
                self.lanes[lane_id].speed = float(speed)
        if self.playback is None:  # --instant: show what was read at once
            try:
                for step in message.steps:
                    self.lanes[step.lane].extend((step,))
                if message.done:
                    self.update_comparison(announce=False)
                else:
                    self.find_fork(announce=False)
                self.render_lanes(follow=False)
                self.set_status(self.session_summary())
            except NoMatches:
                pass  # the app is closing
            return
        for step in message.steps:
            self._recorded[step.lane].append(step)
        self.playback.extend(message.steps)
        if self._replay_fork is None:
            self._replay_fork = first_divergence(self._recorded["a"], self._recorded["b"])
        try:
            if message.done and self.playback is not None and self.playback.finished:
                self.show_replayed([])
            self.replay_status()
        except NoMatches:
            pass  # the app is closing

    def on_session_load_failed(self, message: SessionLoadFailed) -> None:
        if self.session_stream is None:
            return
        self.load_error = message.error
        self.notify(message.error, severity="error", timeout=15)
        try:
            if self.playback is None:
                self.update_comparison(announce=False)
                self.render_lanes(follow=False)
                self.set_status(f"{self.session_summary()} {self.load_error}")
            elif self.playback.finished:
                self.show_replayed([])  # what was read is all there is: compare it
            self.replay_status()
        except NoMatches:
            pass  # the app is closing

    def replay_tick(self) -> None:
        now = time.monotonic()
        elapsed, self._replay_clock = now - self._replay_clock, now
        if self.playback is None:
            return
        due = self.playback.advance(elapsed)
        if due:
            try:
                self.show_replayed(due)
            except NoMatches:
                self.stop_playback()  # the app is closing: its panes are gone

    def show_replayed(self, steps: list[TokenStep]) -> None:
        for step in steps:
            self.lanes[step.lane].extend((step,))
        if self.playback is not None and self.playback.finished and not self.loading:
            self.update_comparison(announce=self.fork is None)
            self.render_lanes(follow=self.follow)
        else:
            self.render_lanes(follow=self.follow, panel=self.find_fork())
        self.replay_status()

    def replay_status(self) -> None:
        playback = self.playback
        if playback is None:
            return
        shown, total = playback.position, len(playback.steps)
        total_text = f"{total}+" if self.loading else str(total)
        if playback.finished and not playback.paused and self.loading:
            state = "waiting for the file"
            keys = "space pauses"
        elif playback.finished and not playback.paused:
            state = "replayed"
            keys = "space plays it again · d jumps to the fork"
        elif playback.paused:
            state = "paused"
            keys = "space resumes · ←/→ step a token"
        else:
            state = f"replaying at {playback.speed:g}x"
            keys = "space pauses · d jumps to the fork"
        summary = self.session_summary()
        if self.load_error is not None:
            summary = f"{summary} {self.load_error}"
        self.set_status(f"{state}: {shown}/{total_text} steps of {summary} · {keys}")

    def stop_playback(self) -> None:
        if self.playback is not None:
            self.playback = None
            with suppress(ScreenStackError):  # closing: no screen left to show keys on
                self.refresh_bindings()
        if self._replay_timer is not None:
            self._replay_timer.stop()
            self._replay_timer = None

    def action_toggle_pause(self) -> None:
        playback = self.playback
        if playback is None:
            self.notify("space pauses a replay (specdiff replay FILE)", timeout=3)
            return
        if playback.finished and not playback.paused and not self.loading:
            playback.restart()
            self.reset_view_keeping_speeds()
            self.render_lanes(follow=True)
        else:
            playback.paused = not playback.paused
            self._replay_clock = time.monotonic()
            if not playback.paused:
                self.follow = True
                self.cursor = None
                self.render_lanes(follow=True)
        self.replay_status()

    def reset_view_keeping_speeds(self) -> None:
        speeds = {lane_id: state.speed for lane_id, state in self.lanes.items()}
        self.reset_view()
        for lane_id, speed in speeds.items():
            self.lanes[lane_id].speed = speed

    def replay_step(self, delta: int) -> None:
        """Paused replay: show the next step, or hide the last one; the cursor follows."""
        playback = self.playback
        assert playback is not None
        if delta > 0:
            step = playback.forward()
            if step is None:
                self.notify("the end of the session", timeout=2)
                return
            self.lanes[step.lane].extend((step,))
            if playback.finished:
                self.update_comparison(announce=False)
            else:
                self.find_fork()
            self.move_cursor(step.lane, step.index)
        else:
            step = playback.back()
            if step is None:
                self.notify("the start of the session", timeout=2)
                return
            self.lanes[step.lane].truncate(step.index)
            if self.fork is not None and step.index <= self.fork.index:
                self.fork, self.similarity = None, None
                self.changed = {"a": set(), "b": set()}
            previous = playback.steps[playback.position - 1] if playback.position else None
            if previous is None:
                self.cursor = None
                self.render_lanes(follow=False)
            else:
                self.move_cursor(previous.lane, previous.index)
        self.replay_status()

    # -- running --------------------------------------------------------------------
    def resolve_pair(self) -> tuple[Pair, str, int]:
        prompt = self.query_one("#prompt", Input).value
        if prompt == visible(self.initial_prompt):
            # the box shows control characters and newlines as escapes; unedited, it
            # stands for the prompt itself
            prompt = self.initial_prompt
        if not prompt.strip():
            raise SpecdiffError("the prompt is empty; type some text to continue")
        raw = self.query_one("#max-tokens", Input).value.strip()
        try:
            max_tokens = int(raw)
        except ValueError:
            raise SpecdiffError(f"max tokens must be a whole number, got {raw!r}") from None
        if max_tokens < 1:
            raise SpecdiffError(f"max tokens must be at least 1, got {max_tokens}")
        name = str(self.query_one("#pair", Select).value)
        if name in self.refused_pairs:
            raise SpecdiffError(self.refused_pairs[name])
        base = self.pairs[name]
        overrides = {
            lane_id: parse_overrides(
                self.query_one(f"#lane-{lane_id}-overrides", Input).value.split()
            )
            for lane_id in ("a", "b")
        }
        pair = replace(
            base,
            a=apply_overrides(base.a, overrides["a"]),
            b=apply_overrides(base.b, overrides["b"]),
        )
        return pair, prompt, max_tokens

    def action_run(self) -> None:
        if self.running:
            self._restart = True
            self.cancel.set()
            self.set_status("stopping the current run to start again…")
            return
        try:
            pair, prompt, max_tokens = self.resolve_pair()
        except SpecdiffError as error:
            self.notify(str(error), severity="error", timeout=8)
            self.set_status(f"not started: {error}")
            return
        self.stop_playback()
        if self.session_stream is not None:
            # a live run replaces the replay: the rest of the file is not wanted any more
            self.workers.cancel_group(self, "session-read")
            self.session_stream = None
        self.reset_view()
        self.pair = pair
        self.max_tokens = max_tokens
        self.set_titles()
        self.render_lanes(follow=True)
        self.running = True
        self.cancel.clear()
        self.set_status(f"loading {pair.name}…")
        self.generate(pair, prompt, max_tokens)

    @work(thread=True, exclusive=True, group="generation", exit_on_error=False)
    def generate(self, pair: Pair, prompt: str, max_tokens: int) -> None:
        worker = get_current_worker()
        try:
            runner = self.runner_for(pair)
            tokens = runner.tokenize(prompt)
            self.post_message(RunStarted(len(tokens)))
            buffer = []
            last = time.monotonic()
            for step in runner.stream(prompt, max_tokens, near_tie=self.near_tie):
                buffer.append(step)
                now = time.monotonic()
                if now - last >= BATCH_SECONDS:
                    self.post_message(StepsArrived(buffer, runner.live()))
                    buffer, last = [], now
                if worker.is_cancelled:
                    self.cancel.set()
            if buffer:
                self.post_message(StepsArrived(buffer, runner.live()))
            assert runner.result is not None
            self.post_message(RunFinished(runner.result))
        except SpecdiffError as error:
            self.post_message(RunFailed(str(error)))

    def runner_for(self, pair: Pair) -> PairWorker:
        """Reuse loaded lanes while the pair stays the same and their process lives (runs
        in the worker thread); after a crash the next run starts a fresh one."""
        if self._runner is not None and self._runner.pair == pair and self._runner.alive:
            return self._runner
        if self._runner is not None:
            self._runner.close()
            self._runner = None
        self._runner = PairWorker(
            pair, lambda text: self.call_from_thread(self.set_status, text), self.cancel
        )
        return self._runner

    def on_run_started(self, message: RunStarted) -> None:
        self.set_status(
            f"generating: {message.prompt_tokens}-token prompt, up to "
            f"{self.max_tokens} tokens per lane"
        )

    def on_steps_arrived(self, message: StepsArrived) -> None:
        by_lane: dict[str, list] = {"a": [], "b": []}
        for step in message.steps:
            by_lane[step.lane].append(step)
        for lane_id, steps in by_lane.items():
            state = self.lanes[lane_id]
            state.extend(steps)
            state.speed, state.drafted, state.accepted = message.live.get(lane_id, (0.0, 0, 0))
        # While streaming only new tokens are drawn; the alignment after the fork is
        # drawn once the run ends.
        # The panel changes only with the fork, the cursor or the theme.
        self.render_lanes(follow=self.follow, panel=self.find_fork())

    def on_run_finished(self, message: RunFinished) -> None:
        result = message.result
        self.result = result
        self.running = False
        for outcome in (result.a, result.b):
            state = self.lanes[outcome.lane_id]
            state.error = outcome.error
            state.speed = outcome.tokens_per_second
            state.drafted, state.accepted = outcome.drafted, outcome.accepted
        self.update_comparison()
        self.render_lanes(follow=self.follow)
        errors = result.error_lines()
        if errors:
            self.notify("; ".join(errors), severity="error", timeout=10)
        comparison = result.comparison
        if result.crashed:
            summary = "the lanes' process crashed; r runs again in a fresh one"
        elif result.cancelled:
            summary = "stopped"
        elif comparison.identical:
            summary = f"identical over {comparison.length_a} tokens"
        elif comparison.fork is not None:
            summary = (
                f"forked at token {comparison.fork.index} of "
                f"{max(comparison.length_a, comparison.length_b)}"
            )
        else:
            summary = "same tokens, different lengths"
        speed = f" · speed a/b {result.speedup:.2f}x" if result.speedup else ""
        self.set_status(f"{summary}{speed} · s saves the session · d jumps to the fork")
        if self._restart:
            self._restart = False
            self.action_run()

    def on_run_failed(self, message: RunFailed) -> None:
        self.running = False
        self._restart = False
        self.notify(message.error, severity="error", timeout=10)
        self.set_status(f"failed: {message.error}")
        for lane_id in ("a", "b"):
            self.lanes[lane_id].error = message.error
        self.render_lanes(follow=False)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.state == WorkerState.ERROR:
            self.running = False
            error = event.worker.error
            self.notify(f"unexpected error: {error}", severity="error", timeout=10)
            self.set_status(f"failed: {error}")

    def action_stop(self) -> None:
        if self.running:
            self.cancel.set()
            self.set_status("stopping…")

    @on(Button.Pressed, "#run")
    def run_pressed(self) -> None:
        self.action_run()

    @on(Button.Pressed, "#stop")
    def stop_pressed(self) -> None:
        self.action_stop()

    @on(Input.Submitted)
    def input_submitted(self) -> None:
        self.action_run()

    # -- navigation -----------------------------------------------------------------
    def move_cursor(self, lane_id: str, index: int | None, scroll_both: bool = False) -> None:
        self.cursor_lane = lane_id
        self.cursor = index
        self.follow = False
        self.render_lanes(follow=False)
        if index is None:
            return
        for pane_lane in ("a", "b") if scroll_both else (lane_id,):
            if index < len(self.lanes[pane_lane].steps):
                self.query_one(f"#lane-{pane_lane}", LanePane).scroll_to_token(index)

    def action_fork(self) -> None:
        if self.fork is None and self.playback is not None and self._replay_fork is not None:
            # The fork is recorded but not played yet: play up to it and stop there.
            self.playback.paused = True
            self.show_replayed(self.playback.through(self._replay_fork))
        if self.fork is None:
            self.notify("no fork: the lanes agree so far", timeout=4)
            return
        self.move_cursor(self.cursor_lane, self.fork.index, scroll_both=True)

    def near_ties(self) -> tuple[int, ...]:
        return find_near_ties(self.lanes[self.cursor_lane].steps, self.near_tie)

    def action_next_tie(self) -> None:
        ties = self.near_ties()
        later = [i for i in ties if self.cursor is None or i > self.cursor]
        if not later:
            self.notify(f"no near tie after this in lane {self.cursor_lane}", timeout=3)
            return
        self.move_cursor(self.cursor_lane, later[0])

    def action_previous_tie(self) -> None:
        ties = self.near_ties()
        earlier = [i for i in ties if self.cursor is not None and i < self.cursor]
        if not earlier:
            self.notify(f"no near tie before this in lane {self.cursor_lane}", timeout=3)
            return
        self.move_cursor(self.cursor_lane, earlier[-1])

    def action_move(self, delta: int) -> None:
        if self.playback is not None and self.playback.paused:
            self.replay_step(delta)
            return
        steps = self.lanes[self.cursor_lane].steps
        if not steps:
            return
        start = self.cursor if self.cursor is not None else (0 if delta > 0 else len(steps))
        self.move_cursor(self.cursor_lane, max(0, min(len(steps) - 1, start + delta)))

    def action_switch_lane(self) -> None:
        other = "b" if self.cursor_lane == "a" else "a"
        index = self.cursor
        if index is not None:
            index = (
                min(index, len(self.lanes[other].steps) - 1) if self.lanes[other].steps else None
            )
        self.move_cursor(other, index)

    def action_select_token(self, lane_id: str, index: int) -> None:
        if lane_id in self.lanes and 0 <= index < len(self.lanes[lane_id].steps):
            self.move_cursor(lane_id, index)

    # -- the rest -------------------------------------------------------------------
    def action_save(self) -> None:
        if self.running:
            self.notify(
                "the run is still going: wait for it or stop it (x), then save", severity="warning"
            )
            return
        if self.result is None:
            self.notify("nothing to save yet: run a pair first", severity="warning")
            return
        try:
            path = save_result(self.result, self.sessions_dir)
        except (OSError, SpecdiffError) as error:
            self.notify(f"could not save the session: {error}", severity="error")
            return
        self.notify(f"saved {path}", timeout=6)
        self.set_status(f"saved {path}")

    def action_next_theme(self) -> None:
        names = self.our_themes
        if not names:
            return
        position = names.index(self.theme) if self.theme in names else -1
        self.theme = names[(position + 1) % len(names)]
        self.notify(f"theme {self.theme}", timeout=2)

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    async def action_quit(self) -> None:
        self.cancel.set()
        self.exit(0)

    def on_unmount(self) -> None:
        self.stop_playback()
        self.cancel.set()
        if self._runner is not None:
            # a busy worker is killed, not waited for: quitting mid-run quits at once
            self._runner.close()

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield SystemCommand("Run", "Run the pair on the prompt", self.action_run)
        yield SystemCommand("Stop", "Stop both lanes", self.action_stop)
        yield SystemCommand("Jump to the fork", "Show the first diverging token", self.action_fork)
        yield SystemCommand("Next near tie", "In the current lane", self.action_next_tie)
        yield SystemCommand("Previous near tie", "In the current lane", self.action_previous_tie)
        yield SystemCommand(
            "Switch lane", "Move the cursor to the other lane", self.action_switch_lane
        )
        yield SystemCommand("Save session", "Write the run as a session file", self.action_save)
        yield SystemCommand("Next theme", "Cycle specdiff's themes", self.action_next_theme)
        yield SystemCommand("Help", "Every key binding", self.action_help)


def make_app(*args: Any, **kwargs: Any) -> SpecdiffApp:
    """The one way the CLI and the tests build the app; arguments as SpecdiffApp's."""
    return SpecdiffApp(*args, **kwargs)
