"""Replay playback: a recorded session played at its recorded pace (times a speed),
paused, stepped token by token, paused at the fork for a demo, while the rest of a long
file is still being read.

For a presenter: the status line says REPLAY and names the file; a replay that pauses
at the fork takes at least BUILD_UP_SECONDS to get there (a fast recording reaches it in
a fraction of a second, before the audience has seen any text stream); at the end both
panes go back to the fork (not the tail the lanes ended on); space is offered as pause,
resume or replay as it applies; and a session recorded on another CPU says so.

`Replay` is the compare screen's playback: it decides which recorded steps are shown
(putting them into the model, `view_state.CompareView`) and what the status line says
about them, and returns what changed; the screen draws it.
"""

from __future__ import annotations

import time
from functools import partial

from specdiff.compare import first_divergence
from specdiff.errors import SpecdiffError
from specdiff.sessions.playback import Playback
from specdiff.sessions.store import Session, SessionError, SessionStream
from specdiff.steps import TokenStep
from specdiff.tui.host import Host, IsCancelled, Stoppable
from specdiff.tui.live import FramePacer, align_while_streaming
from specdiff.tui.machine import recorded_elsewhere, this_machine
from specdiff.tui.messages import (
    Alerted,
    Changes,
    ForkFound,
    FrameDue,
    KeysChanged,
    MachineCompared,
    Noted,
    PairShown,
    ReplayShown,
    SessionLoaded,
    SessionLoadFailed,
    StatusChanged,
)
from specdiff.tui.navigation import move_cursor
from specdiff.tui.paths import elided_path
from specdiff.tui.view_state import CompareView

READ_CHUNK = 2000
"""Steps read per message while a replay reads the rest of its file."""
REPLAY_TICK = 1 / 30
"""How often a replay draws the steps that became due."""
BUILD_UP_SECONDS = 4.0
"""With --pause-at-fork, the least time a replay takes to reach the fork: played slower
than asked where the recording got there sooner, so the text is seen to stream first."""
BADGE = "REPLAY"
ELSEWHERE = "another CPU"
"""Beside the file's name in the status of a replay recorded on another CPU."""
ELSEWHERE_NOTE = "recorded on another CPU: a run here may fork elsewhere than this replay"
"""What the status line opens with while a recorded session is on screen."""
STATE_ROOM = 40
"""Columns the status line keeps for the replay's state and keys after the file's path
(whose middle is elided first; its file name never is)."""
PAUSE, RESUME, REPLAY_AGAIN = "toggle_pause", "resume_replay", "replay_again"
"""The screen's actions for space, one offered at a time so the footer says what
space does now."""
SPACE_ACTIONS = (PAUSE, RESUME, REPLAY_AGAIN)
CONFIRM_SECONDS = 5.0
"""How long a first `r` over a replay waits for the second that loads the model."""

ReplayReport = SessionLoaded | SessionLoadFailed | MachineCompared
"""What a replay's worker threads report."""


def fork_found(found: bool, announce: bool = True) -> Changes:
    return [ForkFound(announce)] if found else []


class Replay:
    """A recorded session on the compare screen: shown at once (`speed` None) or played."""

    def __init__(
        self,
        view: CompareView,
        host: Host,
        pacer: FramePacer,
        speed: float | None,
        stream: SessionStream | None,
        pause_at_fork: bool,
    ) -> None:
        self.view = view
        self.host = host
        self.pacer = pacer
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
        """The pace asked for, while the build-up to the fork plays slower."""
        self._space_offered: str | None = None
        """The space action the footer was last asked to show."""
        self._recorded: dict[str, list[TokenStep]] = {"a": [], "b": []}
        self._clock = 0.0
        self._timer: Stoppable | None = None

    @property
    def loading(self) -> bool:
        """The session file is still being read (as the UI has heard it, not the worker)."""
        return self.stream is not None and not self.read_done and self.load_error is None

    def show_session(self, session: Session) -> Changes:
        """Show a recorded run (no model needed) in place of what is on screen: at once,
        or played back."""
        changes = self.stop()
        self.view.show_session(session)
        return [*changes, PairShown(), ReplayShown(True), *self.start(session)]

    def start(self, session: Session) -> Changes:
        view = self.view
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
            changes = fork_found(view.update_comparison(), announce=False)
            self.read_later()
            return [*changes, FrameDue(follow=False), StatusChanged(self.shown_status())]
        first = session.recorded_steps()
        self.playback = Playback(first, self.speed)
        self._recorded = {"a": list(session.steps["a"]), "b": list(session.steps["b"])}
        self.fork_index = first_divergence(self._recorded["a"], self._recorded["b"])
        self.build_up()
        self.read_later()
        self._clock = time.monotonic()
        self._timer = self.host.every(REPLAY_TICK, self.tick)
        return [FrameDue(follow=True), KeysChanged(), *self.show_status()]

    def stop(self) -> Changes:
        """No more playing (a live run replaces the replay, or the app closes)."""
        changes: Changes = []
        if self.playback is not None:
            self.playback = None
            changes.append(KeysChanged())
        if self._timer is not None:
            self._timer.stop()
            self._timer = None
        return changes

    def close_for_live(self) -> Changes:
        """A live run replaces the replay: no more playing, and the rest of the file is
        not wanted any more."""
        changes = self.stop()
        if self.stream is not None:
            self.host.cancel_group("session-read")
            self.stream = None
        return changes

    # -- the rest of the file

    def read_rest(self, stream: SessionStream, is_cancelled: IsCancelled) -> None:
        """Read the session's remaining steps while the first ones play (worker thread)."""
        try:
            while not stream.done and not is_cancelled():
                steps = stream.read(READ_CHUNK)
                self.host.post(self.receive, SessionLoaded(steps, stream.done))
        except SessionError as error:
            self.host.post(self.receive, SessionLoadFailed(str(error)))

    def read_later(self) -> None:
        stream = self.stream
        if stream is None or stream.done:
            return
        # after the first frame: a reader thread started now would take half the
        # interpreter's time from the app's start-up
        self.host.after_refresh(
            lambda: self.host.run_in_thread(partial(self.read_rest, stream), "session-read")
        )

    def receive(self, report: ReplayReport) -> Changes:
        """What a worker thread reported, on the UI thread."""
        if isinstance(report, SessionLoaded):
            return self.loaded(report)
        if isinstance(report, SessionLoadFailed):
            return self.load_failed(report)
        return self.recorded_elsewhere(report)

    def loaded(self, message: SessionLoaded) -> Changes:
        if self.stream is None:
            return []  # a live run replaced the replay
        view = self.view
        self.read_done = message.done
        if message.done:
            footer = view.session.footer if view.session else None
            speeds = footer.tokens_per_second if footer else ()
            for lane_id, speed in zip(("a", "b"), speeds):
                view.lanes[lane_id].speed = float(speed)
        if self.playback is None:  # --instant: show what was read at once
            view.add(message.steps)
            found = view.update_comparison() if message.done else view.find_fork()
            changes = fork_found(found, announce=False)
            return [*changes, FrameDue(follow=False), StatusChanged(self.shown_status())]
        for step in message.steps:
            self._recorded[step.lane].append(step)
        self.playback.extend(message.steps)
        if self.fork_index is None:
            self.fork_index = first_divergence(self._recorded["a"], self._recorded["b"])
        changes = []
        if message.done and self.playback.finished:
            changes = self.show([])
        return [*changes, *self.show_status()]

    def load_failed(self, message: SessionLoadFailed) -> Changes:
        if self.stream is None:
            return []
        self.load_error = message.error
        changes: Changes = [Alerted(message.error, "error", 15)]
        if self.playback is None:
            changes += fork_found(self.view.update_comparison(), announce=False)
            changes += [
                FrameDue(follow=False),
                StatusChanged(f"{self.badge()}{self.summary()} {self.load_error}"),
            ]
        elif self.playback.finished:
            changes += self.show([])  # what was read is all there is: compare it
        return [*changes, *self.show_status()]

    # -- playing

    def tick(self) -> Changes:
        now = time.monotonic()
        elapsed, self._clock = now - self._clock, now
        if self.playback is None:
            return []
        due = self.playback.advance(elapsed)
        if due and self.pause_at_fork and not self.paused_at_fork:
            due = self.up_to_fork(due)
        return self.show(due) if due else []

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

    def show(self, steps: list[TokenStep]) -> Changes:
        view = self.view
        view.add(steps)
        if self.playback is not None and self.playback.finished and not self.loading:
            changes = fork_found(view.update_comparison(), announce=view.fork is None)
            changes.append(FrameDue(view.follow))
            if view.fork is not None:
                # the end: both panes back at the fork, not the tail the lanes ended on
                changes += move_cursor(view, view.cursor_lane, view.fork.index, scroll_both=True)
        else:
            changes = fork_found(view.find_fork())
            align_while_streaming(view, self.pacer)
            # caught up with the file read so far: nothing may come for a while
            caught_up = self.playback is not None and self.playback.finished
            details = bool(changes) or caught_up or self.pacer.panel_due()
            changes.append(FrameDue(view.follow, details))
        return [*changes, *self.show_status()]

    def jump_to_fork(self) -> Changes:
        """The fork is recorded but not played yet: play up to it and stop there."""
        if self.playback is None or self.fork_index is None:
            return []
        self.playback.paused = True
        self.end_build_up()
        return self.show(self.playback.through(self.fork_index))

    def toggle_pause(self) -> Changes:
        playback, view = self.playback, self.view
        if playback is None:
            return [Noted("space pauses a replay (specdiff replay FILE)")]
        if playback.finished and not playback.paused and not self.loading:
            playback.restart()
            self.paused_at_fork = False  # a demo played again pauses at the fork again
            self.build_up()
            view.reset_keeping_speeds()
            changes = [FrameDue(follow=True)]
        else:
            playback.paused = not playback.paused
            self._clock = time.monotonic()
            if not playback.paused:
                view.follow = True
                view.cursor = None
                changes = [FrameDue(follow=True)]
            else:
                # a frame may have left the details behind the tokens it drew
                changes = [FrameDue(view.follow)]
        return [*changes, *self.show_status()]

    def step(self, delta: int) -> Changes:
        """Paused replay: show the next step, or hide the last one; the cursor follows."""
        playback, view = self.playback, self.view
        assert playback is not None
        if delta > 0:
            step = playback.forward()
            if step is None:
                return [Noted("the end of the session")]
            view.add((step,))
            found = view.update_comparison() if playback.finished else view.find_fork()
            changes = fork_found(found, announce=not playback.finished)
            changes += move_cursor(view, step.lane, step.index)
        else:
            step = playback.back()
            if step is None:
                return [Noted("the start of the session")]
            view.forget_last(step.lane, step.index)
            previous = playback.steps[playback.position - 1] if playback.position else None
            if previous is None:
                view.cursor = None
                changes = [FrameDue(follow=False)]
            else:
                changes = move_cursor(view, previous.lane, previous.index)
        return [*changes, *self.show_status()]

    # -- what the status line says

    def summary(self) -> str:
        session, fork = self.view.session, self.view.fork
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

    def badge(self, keys: str = "") -> str:
        """REPLAY and the session's path, its middle elided to leave room for the state
        (or for `keys`, the hints after it, where they are longer)."""
        session = self.view.session
        assert session is not None
        # another CPU stays in view beside the file, where no narrow line cuts it
        elsewhere = f"{ELSEWHERE} · " if self.elsewhere else ""
        kept = max(STATE_ROOM, len(keys) + 4)  # the padding, and " …" if the line is cut
        room = self.host.columns - len(BADGE) - 4 - kept - len(elsewhere)
        return f"{BADGE} {elided_path(session.path, room)} · {elsewhere}"

    def shown_status(self) -> str:
        """The status of a session shown whole (--instant): what it is and what to press
        (the hints whole where the file's folders can make room for them)."""
        keys = "d jumps to the fork · " if self.view.fork is not None else ""
        keys += "e writes a report"
        return f"{self.badge(keys)}{keys} · {self.summary()}"

    def replay_status(self) -> Changes:
        """The status of the session on screen, played or shown whole (`r` disarmed)."""
        if self.playback is not None:
            return self.show_status()
        if self.view.session is not None:
            return [StatusChanged(self.shown_status())]
        return []

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

        def compare(_is_cancelled: IsCancelled) -> None:
            try:
                here = this_machine()
            except (SpecdiffError, OSError):
                return  # no llama.cpp here to ask: nothing to compare against
            line = recorded_elsewhere(recorded, here)
            if line is not None:
                self.host.post(self.receive, MachineCompared(session, line))

        self.host.run_in_thread(compare, "machine", exclusive=False)

    def recorded_elsewhere(self, report: MachineCompared) -> Changes:
        """Say that the session comes from another CPU in the status line, once in a
        sentence and from then on beside the file's name: a toast would sit over the
        controls and lane b's title."""
        if self.view.session is not report.session:
            return []  # a live run or another session replaced it
        self.elsewhere = report.line
        # the note after the status it leads: a new status drops the note before it
        if self.playback is not None:
            return [*self.show_status(), Noted(ELSEWHERE_NOTE)]
        return [StatusChanged(self.shown_status()), Noted(ELSEWHERE_NOTE)]

    def show_status(self) -> Changes:
        playback = self.playback
        if playback is None:
            return []
        changes: Changes = []
        space = self.space_action()
        if space != self._space_offered:
            # the footer names what space does now (pause, resume, replay)
            self._space_offered = space
            changes.append(KeysChanged())
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
        text = f"{self.badge()}{state}: {keys} · {shown}/{total_text} steps of {summary}"
        return [*changes, StatusChanged(text)]


class RunConfirmation:
    """`r` over a replay: a replay is not thrown away on one key. The first `r` asks;
    a second within CONFIRM_SECONDS loads the model and runs; any other key, or the
    time running out, disarms it and puts back the replay's own status."""

    def __init__(self, replay: Replay, host: Host) -> None:
        self.replay = replay
        self.host = host
        self._timer: Stoppable | None = None

    def ask(self) -> Changes | None:
        """What `r` says over a replay (the first time); None when the run goes ahead."""
        if not self.replay.view.replaying or self._timer is not None:
            self.forget()
            return None
        self._timer = self.host.later(CONFIRM_SECONDS, self.disarm)
        return [
            StatusChanged(
                "this is a recorded session: press r again to load the model and run "
                "the pair on its prompt (the replay is closed)"
            )
        ]

    def key_seen(self, key: str) -> Changes:
        """Before any binding acts: a key other than r disarms a pending r, so a later
        r asks again instead of closing the replay."""
        if key != "r" and self._timer is not None:
            return self.disarm()
        return []

    def forget(self) -> None:
        if self._timer is not None:
            self._timer.stop()
            self._timer = None

    def disarm(self) -> Changes:
        """Forget a pending r and put back the replay's own status."""
        self.forget()
        return self.replay.replay_status()
