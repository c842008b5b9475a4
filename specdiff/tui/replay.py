"""Replay playback: a recorded session played at its recorded pace (times a speed),
paused, stepped token by token, paused at the fork for a demo, while the rest of a long
file is still being read.

`Replay` is the compare screen's playback: it decides which recorded steps are shown
and what the status line says about them; the screen draws them.
"""

from __future__ import annotations

import time
from contextlib import suppress
from typing import TYPE_CHECKING

from textual.app import ScreenStackError
from textual.css.query import NoMatches
from textual.timer import Timer
from textual.worker import get_current_worker

from specdiff.compare import first_divergence
from specdiff.sessions.playback import Playback
from specdiff.sessions.store import Session, SessionError, SessionStream
from specdiff.steps import TokenStep
from specdiff.tui.messages import SessionLoaded, SessionLoadFailed
from specdiff.tui.view_state import CompareView

if TYPE_CHECKING:  # the screen owns its replay; only its type is needed here
    from specdiff.tui.screen import CompareScreen

READ_CHUNK = 2000
"""Steps read per message while a replay reads the rest of its file."""
REPLAY_TICK = 1 / 30
"""How often a replay draws the steps that became due."""


class Replay:
    """A recorded session on the compare screen: shown at once (`speed` None) or played."""

    def __init__(
        self,
        screen: CompareScreen,
        speed: float | None,
        stream: SessionStream | None,
        pause_at_fork: bool,
    ) -> None:
        self.screen = screen
        self.speed = speed
        self.stream = stream
        """The rest of the session's file, read while the replay plays."""
        self.pause_at_fork = pause_at_fork
        self.playback: Playback | None = None
        self.fork_index: int | None = None
        """Where the recorded lanes fork, once what was read shows it."""
        self.paused_at_fork = False
        """The replay has paused at the fork once (space at the end replays and pauses
        again)."""
        self.read_done = stream is None or stream.done
        self.load_error: str | None = None
        self._recorded: dict[str, list[TokenStep]] = {"a": [], "b": []}
        self._clock = 0.0
        self._timer: Timer | None = None

    @property
    def loading(self) -> bool:
        """The session file is still being read (as the UI has heard it, not the worker)."""
        return self.stream is not None and not self.read_done and self.load_error is None

    @property
    def view(self) -> CompareView:
        return self.screen.view

    def start(self, session: Session) -> None:
        """Show a recorded run (no model needed): at once, or played back."""
        screen, view = self.screen, self.screen.view
        self.paused_at_fork = False  # a session shown anew pauses at its own fork
        speeds = session.footer.tokens_per_second if session.footer else (0.0, 0.0)
        for lane_id, speed in zip(("a", "b"), speeds):
            view.lanes[lane_id].speed = float(speed)
        if self.speed is None:
            for lane_id in ("a", "b"):
                view.lanes[lane_id].extend(session.steps[lane_id])
            screen.update_comparison(announce=False)
            screen.render_lanes(follow=False)
            screen.set_status(self.shown_status())
            self.read_later()
            return
        first = session.recorded_steps()
        self.playback = Playback(first, self.speed)
        self._recorded = {"a": list(session.steps["a"]), "b": list(session.steps["b"])}
        self.fork_index = first_divergence(self._recorded["a"], self._recorded["b"])
        self.read_later()
        self._clock = time.monotonic()
        screen.render_lanes(follow=True)
        self._timer = screen.set_interval(REPLAY_TICK, self.tick, name="replay")
        screen.refresh_bindings()
        self.show_status()

    def stop(self) -> None:
        """No more playing (a live run replaces the replay, or the app closes)."""
        if self.playback is not None:
            self.playback = None
            with suppress(ScreenStackError):  # closing: no screen left to show keys on
                self.screen.refresh_bindings()
        if self._timer is not None:
            self._timer.stop()
            self._timer = None

    def drop_stream(self) -> None:
        """A live run replaces the replay: the rest of the file is not wanted any more."""
        if self.stream is not None:
            self.screen.workers.cancel_group(self.screen, "session-read")
            self.stream = None

    # -- the rest of the file

    def read_rest(self, stream: SessionStream) -> None:
        """Read the session's remaining steps while the first ones play (worker thread)."""
        worker = get_current_worker()
        try:
            while not stream.done and not worker.is_cancelled:
                steps = stream.read(READ_CHUNK)
                self.screen.post_message(SessionLoaded(steps, stream.done))
        except SessionError as error:
            self.screen.post_message(SessionLoadFailed(str(error)))

    def read_later(self) -> None:
        stream = self.stream
        if stream is None or stream.done:
            return

        def start_reading() -> None:
            self.screen.run_worker(
                lambda: self.read_rest(stream),
                thread=True,
                exclusive=True,
                group="session-read",
                exit_on_error=False,
            )

        # after the first frame: a reader thread started now would take half the
        # interpreter's time from the app's start-up
        self.screen.call_after_refresh(start_reading)

    def loaded(self, message: SessionLoaded) -> None:
        if self.stream is None:
            return  # a live run replaced the replay
        screen, view = self.screen, self.screen.view
        self.read_done = message.done
        if message.done:
            footer = screen.session.footer if screen.session else None
            speeds = footer.tokens_per_second if footer else ()
            for lane_id, speed in zip(("a", "b"), speeds):
                view.lanes[lane_id].speed = float(speed)
        if self.playback is None:  # --instant: show what was read at once
            try:
                view.add(message.steps)
                if message.done:
                    screen.update_comparison(announce=False)
                else:
                    screen.look_for_fork(announce=False)
                screen.render_lanes(follow=False)
                screen.set_status(self.shown_status())
            except NoMatches:
                pass  # the app is closing
            return
        for step in message.steps:
            self._recorded[step.lane].append(step)
        self.playback.extend(message.steps)
        if self.fork_index is None:
            self.fork_index = first_divergence(self._recorded["a"], self._recorded["b"])
        try:
            if message.done and self.playback is not None and self.playback.finished:
                self.show([])
            self.show_status()
        except NoMatches:
            pass  # the app is closing

    def load_failed(self, message: SessionLoadFailed) -> None:
        if self.stream is None:
            return
        screen = self.screen
        self.load_error = message.error
        screen.notify(message.error, severity="error", timeout=15)
        try:
            if self.playback is None:
                screen.update_comparison(announce=False)
                screen.render_lanes(follow=False)
                screen.set_status(f"{self.summary()} {self.load_error}")
            elif self.playback.finished:
                self.show([])  # what was read is all there is: compare it
            self.show_status()
        except NoMatches:
            pass  # the app is closing

    # -- playing

    def tick(self) -> None:
        now = time.monotonic()
        elapsed, self._clock = now - self._clock, now
        if self.playback is None:
            return
        due = self.playback.advance(elapsed)
        if due and self.pause_at_fork and not self.paused_at_fork:
            due = self.up_to_fork(due)
        if due:
            try:
                self.show(due)
            except NoMatches:
                self.stop()  # the app is closing: its panes are gone

    def up_to_fork(self, due: list[TokenStep]) -> list[TokenStep]:
        """The steps of `due` until both lanes show the fork's token; those after it are
        handed back to the playback, which pauses (`--pause-at-fork`)."""
        playback, fork = self.playback, self.fork_index
        if playback is None or fork is None:
            return due
        shown = {lane_id: len(state.steps) for lane_id, state in self.view.lanes.items()}
        wanted = {lane_id: min(fork + 1, len(steps)) for lane_id, steps in self._recorded.items()}
        for kept, step in enumerate(due, start=1):
            shown[step.lane] += 1
            if all(shown[lane_id] >= wanted[lane_id] for lane_id in shown):
                for _ in due[kept:]:
                    playback.back()
                playback.paused = True
                self.paused_at_fork = True
                return due[:kept]
        return due

    def show(self, steps: list[TokenStep]) -> None:
        screen, view = self.screen, self.screen.view
        view.add(steps)
        if self.playback is not None and self.playback.finished and not self.loading:
            screen.update_comparison(announce=view.fork is None)
            screen.render_lanes(follow=view.follow)
        else:
            found = screen.look_for_fork()
            screen.align_while_streaming()
            # caught up with the file read so far: nothing may come for a while
            caught_up = self.playback is not None and self.playback.finished
            details = found or caught_up or screen.pacer.panel_due()
            screen.render_lanes(follow=view.follow, details=details)
        self.show_status()

    def jump_to_fork(self) -> None:
        """The fork is recorded but not played yet: play up to it and stop there."""
        if self.playback is not None and self.fork_index is not None:
            self.playback.paused = True
            self.show(self.playback.through(self.fork_index))

    def toggle_pause(self) -> None:
        playback, screen, view = self.playback, self.screen, self.screen.view
        if playback is None:
            return
        if playback.finished and not playback.paused and not self.loading:
            playback.restart()
            self.paused_at_fork = False  # a demo played again pauses at the fork again
            view.reset_keeping_speeds()
            screen.render_lanes(follow=True)
        else:
            playback.paused = not playback.paused
            self._clock = time.monotonic()
            if not playback.paused:
                view.follow = True
                view.cursor = None
                screen.render_lanes(follow=True)
            else:
                # a frame may have left the details behind the tokens it drew
                screen.render_lanes(follow=view.follow)
        self.show_status()

    def step(self, delta: int) -> None:
        """Paused replay: show the next step, or hide the last one; the cursor follows."""
        playback, screen, view = self.playback, self.screen, self.screen.view
        assert playback is not None
        if delta > 0:
            step = playback.forward()
            if step is None:
                screen.note("the end of the session")
                return
            view.add((step,))
            if playback.finished:
                screen.update_comparison(announce=False)
            else:
                screen.look_for_fork()
            screen.move_cursor(step.lane, step.index)
        else:
            step = playback.back()
            if step is None:
                screen.note("the start of the session")
                return
            view.forget_last(step.lane, step.index)
            previous = playback.steps[playback.position - 1] if playback.position else None
            if previous is None:
                view.cursor = None
                screen.render_lanes(follow=False)
            else:
                screen.move_cursor(previous.lane, previous.index)
        self.show_status()

    # -- what the status line says

    def summary(self) -> str:
        session, fork = self.screen.session, self.view.fork
        assert session is not None
        if self.loading:
            state = "session (reading…)"
        elif self.load_error is not None:
            state = "unreadable past this point:"
        else:
            state = "partial session" if session.partial else "session"
        forked = f"fork at token {fork.index}" if fork else "lanes identical"
        cut = f" ({session.cut_note})" if session.cut_note and not self.loading else ""
        return f"{state} {session.path.name}{cut}: {forked}"

    def shown_status(self) -> str:
        """The status of a session shown whole (--instant): what it is and what to press."""
        keys = "d jumps to the fork · " if self.view.fork is not None else ""
        return f"{keys}e writes a report · {self.summary()}"

    def show_status(self) -> None:
        playback = self.playback
        if playback is None:
            return
        shown, total = playback.position, len(playback.steps)
        total_text = f"{total}+" if self.loading else str(total)
        jump = " · d jumps to the fork" if self.fork_index is not None else ""
        if playback.finished and not playback.paused and self.loading:
            state, keys = "waiting for the file", "space pauses"
        elif playback.finished and not playback.paused:
            state, keys = "replayed", f"space plays it again{jump}"
        elif playback.paused and self.view.fork is not None and self.paused_at_fork:
            state, keys = "paused at the fork", "space resumes · ←/→ step a token"
        elif playback.paused:
            state, keys = "paused", "space resumes · ←/→ step a token"
        else:
            state, keys = f"replaying at {playback.speed:g}x", f"space pauses{jump}"
        summary = self.summary()
        if self.load_error is not None:
            summary = f"{summary} {self.load_error}"
        # the keys first: a narrow status line keeps what to press
        self.screen.set_status(f"{state}: {keys} · {shown}/{total_text} steps of {summary}")
