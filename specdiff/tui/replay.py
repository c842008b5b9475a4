"""Replay playback: a recorded session played at its recorded pace (times a speed),
paused, stepped token by token, paused at the fork for a demo, while the rest of a long
file is still being read.

For a presenter: the status line says REPLAY and names the file; a replay that pauses
at the fork takes at least BUILD_UP_SECONDS to get there (a fast recording reaches it in
a fraction of a second, before the audience has seen any text stream); at the end both
panes go back to the fork (not the tail the lanes ended on); space is offered as pause,
resume or replay as it applies; and a session recorded on another CPU says so.

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
from specdiff.errors import SpecdiffError
from specdiff.sessions.playback import Playback
from specdiff.sessions.store import Session, SessionError, SessionStream
from specdiff.steps import TokenStep
from specdiff.tui.machine import recorded_elsewhere, this_machine
from specdiff.tui.messages import SessionLoaded, SessionLoadFailed
from specdiff.tui.paths import elided_path
from specdiff.tui.view_state import CompareView

if TYPE_CHECKING:  # the screen owns its replay; only its type is needed here
    from specdiff.tui.screen import CompareScreen

READ_CHUNK = 2000
"""Steps read per message while a replay reads the rest of its file."""
REPLAY_TICK = 1 / 30
"""How often a replay draws the steps that became due."""
BUILD_UP_SECONDS = 4.0
"""With --pause-at-fork, the least time a replay takes to reach the fork: played slower
than asked where the recording got there sooner, so the text is seen to stream first."""
BADGE = "REPLAY"
"""What the status line opens with while a recorded session is on screen."""
STATE_ROOM = 40
"""Columns the status line keeps for the replay's state and keys after the file's path
(whose middle is elided first; its file name never is)."""
PAUSE, RESUME, REPLAY_AGAIN = "toggle_pause", "resume_replay", "replay_again"
"""The screen's actions for space, one offered at a time so the footer says what
space does now."""
SPACE_ACTIONS = (PAUSE, RESUME, REPLAY_AGAIN)


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
        self.compare_machine = False
        """Compare the recording's CPU with this machine's (`specdiff replay` asks;
        it starts a worker process that loads llama.cpp, but no model)."""
        self.elsewhere: str | None = None
        """Why this replay may not be what a run here gives (another CPU), once known."""
        self.slowed_from: float | None = None
        self._space_offered: str | None = None
        """The pace asked for, while the build-up to the fork plays slower."""
        """Why this replay may not be what a run here gives (another CPU), once known."""
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
        self.elsewhere = None
        if self.compare_machine:
            self.check_machine(session)
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
        self.build_up()
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
                screen.set_status(f"{self.badge()}{self.summary()} {self.load_error}")
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
                self.end_build_up()
                return due[:kept]
        return due

    def show(self, steps: list[TokenStep]) -> None:
        screen, view = self.screen, self.screen.view
        view.add(steps)
        if self.playback is not None and self.playback.finished and not self.loading:
            screen.update_comparison(announce=view.fork is None)
            screen.render_lanes(follow=view.follow)
            if view.fork is not None:
                # the end: both panes back at the fork, not the tail the lanes ended on
                screen.move_cursor(view.cursor_lane, view.fork.index, scroll_both=True)
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
            self.end_build_up()
            self.show(self.playback.through(self.fork_index))

    def toggle_pause(self) -> None:
        playback, screen, view = self.playback, self.screen, self.screen.view
        if playback is None:
            return
        if playback.finished and not playback.paused and not self.loading:
            playback.restart()
            self.paused_at_fork = False  # a demo played again pauses at the fork again
            self.build_up()
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
        elsewhere = " · recorded on another CPU" if self.elsewhere else ""
        return f"{state}{cut}: {forked}{elsewhere}"

    def badge(self) -> str:
        """REPLAY and the session's path (its middle elided to leave the state room)."""
        session = self.screen.session
        assert session is not None
        room = self.screen.size.width - len(BADGE) - 4 - STATE_ROOM
        return f"{BADGE} {elided_path(session.path, room)} · "

    def shown_status(self) -> str:
        """The status of a session shown whole (--instant): what it is and what to press."""
        keys = "d jumps to the fork · " if self.view.fork is not None else ""
        return f"{self.badge()}{keys}e writes a report · {self.summary()}"

    # -- for a presenter

    def build_up(self) -> None:
        """With --pause-at-fork, slow the playback so the fork comes BUILD_UP_SECONDS
        after the start at the earliest; `end_build_up` puts the pace back."""
        playback = self.playback
        self.end_build_up()
        at_fork = self.fork_offset()
        if playback is None or not self.pause_at_fork or self.paused_at_fork or not at_fork:
            return
        if at_fork / playback.speed < BUILD_UP_SECONDS:
            self.slowed_from = playback.speed
            playback.speed = at_fork / BUILD_UP_SECONDS

    def end_build_up(self) -> None:
        """The fork is reached (or jumped to): the pace asked for again."""
        if self.playback is not None and self.slowed_from is not None:
            self.playback.speed = self.slowed_from
        self.slowed_from = None

    def fork_offset(self) -> float | None:
        """Recorded seconds from the first step until both lanes show the fork's token;
        None while the fork is not known."""
        playback, fork = self.playback, self.fork_index
        if playback is None or fork is None:
            return None
        wanted = {lane: min(fork + 1, len(steps)) for lane, steps in self._recorded.items()}
        shown = {"a": 0, "b": 0}
        for number, step in enumerate(playback.steps):
            shown[step.lane] += 1
            if all(shown[lane] >= wanted[lane] for lane in shown):
                return playback.offsets[number]
        return None

    def space_action(self) -> str | None:
        """Which of the screen's space actions applies now: pause while playing, resume
        while paused, replay at the end; None without a replay playing."""
        playback = self.playback
        if playback is None:
            return None
        if playback.finished and not playback.paused and not self.loading:
            return REPLAY_AGAIN
        return RESUME if playback.paused else PAUSE

    def check_machine(self, session: Session) -> None:
        """Compare the recording's CPU with this machine's in a worker thread (the
        answer comes from a worker process that loads llama.cpp, no model)."""
        recorded = dict(session.header.build)
        screen = self.screen

        def compare() -> None:
            try:
                here = this_machine()
            except (SpecdiffError, OSError):
                return  # no llama.cpp here to ask: nothing to compare against
            line = recorded_elsewhere(recorded, here)
            if line is not None:
                screen.app.call_from_thread(self.recorded_elsewhere, session, line)

        screen.run_worker(compare, thread=True, group="machine", exit_on_error=False)

    def recorded_elsewhere(self, session: Session, line: str) -> None:
        """Say once, where it stays in view for a while, that the session comes from
        another CPU; the status line keeps a short form."""
        if self.screen.session is not session:
            return  # a live run or another session replaced it
        self.elsewhere = line
        self.screen.notify(line, severity="warning", timeout=12)
        if self.playback is not None:
            self.show_status()
        else:
            self.screen.set_status(self.shown_status())

    def show_status(self) -> None:
        playback = self.playback
        if playback is None:
            return
        space = self.space_action()
        if space != self._space_offered:
            # the footer names what space does now (pause, resume, replay)
            self._space_offered = space
            self.screen.refresh_bindings()
        shown, total = playback.position, len(playback.steps)
        total_text = f"{total}+" if self.loading else str(total)
        jump = " · d jumps to the fork" if self.fork_index is not None else ""
        if playback.finished and not playback.paused and self.loading:
            state, keys = "waiting for the file", "space pauses"
        elif playback.finished and not playback.paused:
            state, keys = "replayed", f"space plays it again{jump}"
        elif not playback.paused and self.slowed_from is not None:
            state, keys = "building up to the fork", f"space pauses{jump}"
        elif playback.paused and self.view.fork is not None and self.paused_at_fork:
            state, keys = "paused at the fork", "space resumes · ←/→ step a token"
        elif playback.paused:
            state, keys = "paused", "space resumes · ←/→ step a token"
        else:
            state, keys = f"replaying at {playback.speed:g}x", f"space pauses{jump}"
        summary = self.summary()
        if self.load_error is not None:
            summary = f"{summary} {self.load_error}"
        # REPLAY and the file first, then the keys: a narrow line keeps what to press
        self.screen.set_status(
            f"{self.badge()}{state}: {keys} · {shown}/{total_text} steps of {summary}"
        )
