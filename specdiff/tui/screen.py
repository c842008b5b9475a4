"""The compare screen: the two lanes side by side, the divergence panel below them, the
controls above. It lays them out, keeps the keys with the panes (escape always comes
back here), moves the cursor, and draws what the view state holds.

What it draws comes from elsewhere: a live run from `live.LiveRun` (through messages a
worker thread posts), a recorded one from `replay.Replay`; the fork, cursor and diff are
`view_state.CompareView`'s.
"""

from __future__ import annotations

from contextlib import suppress
from pathlib import Path

from textual import events, on
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import Footer, Input
from textual.worker import Worker, WorkerState

from specdiff.errors import SpecdiffError
from specdiff.forecast import model_for
from specdiff.lanes import Pair, headline
from specdiff.sessions.store import Session, SessionStream
from specdiff.tui.controls import Controls
from specdiff.tui.explain import ForkExplainer
from specdiff.tui.keys import SCREEN_BINDINGS
from specdiff.tui.live import FramePacer, LiveRun, Streaming
from specdiff.tui.messages import (
    RunFailed,
    RunFinished,
    RunStarted,
    SessionLoaded,
    SessionLoadFailed,
    StepsArrived,
)
from specdiff.tui.output import OutputFiles
from specdiff.tui.replay import SPACE_ACTIONS, Replay
from specdiff.tui.view_state import (
    CompareView,
    fitted,
    lane_differences,
    near_ties_before,
    other_lane,
    pending_forecast,
)
from specdiff.tui.widgets.aligned_view import AlignedView
from specdiff.tui.widgets.footer import FittedFooter
from specdiff.tui.widgets.lane_pane import LanePane
from specdiff.tui.widgets.legend import Legend
from specdiff.tui.widgets.line import Line
from specdiff.tui.widgets.panel import Panel
from specdiff.tui.widgets.panel_text import PanelView
from specdiff.tui.widgets.styles import Palette, TokenMarks
from specdiff.tui.widgets.token_view import TokenView

NARROW_COLUMNS = 100
"""Below this width the input rows fold into a one-line config bar that `c` opens."""
SHORT_ROWS = 30
"""Below this height the panel and the margin strips are smaller."""
CONFIRM_SECONDS = 5.0
"""How long a first `r` over a replay waits for the second that loads the model."""


class Lanes(Horizontal, can_focus=True):
    """The two panes; focusable so that the screen's keys reach it instead of an input."""


class CompareScreen(Screen[None]):
    """Two lanes, their fork and the keys that move through them."""

    BINDINGS = SCREEN_BINDINGS

    def __init__(
        self,
        pairs: dict[str, Pair],
        pair_name: str,
        prompt: str,
        max_tokens: int,
        near_tie: float,
        autostart: bool,
        session: Session | None,
        sessions_dir: str | Path | None,
        replay_speed: float | None,
        session_stream: SessionStream | None,
        refused_pairs: dict[str, str],
        pause_at_fork: bool,
        overrides: dict[str, str],
        control: bool,
    ) -> None:
        super().__init__()
        self.pairs = pairs
        self.pair: Pair = pairs[pair_name]
        self.near_tie = near_tie
        self.autostart = autostart
        self.session = session
        self.view = CompareView(near_tie)
        self.live = LiveRun(near_tie, control)
        self.live.max_tokens = max_tokens
        self.pacer = FramePacer()
        self.streaming = Streaming(self)
        self.replay = Replay(self, replay_speed, session_stream, pause_at_fork)
        self.output = OutputFiles(sessions_dir)
        self.controls = Controls(
            pairs, pair_name, prompt, max_tokens, overrides, refused_pairs, id="run-controls"
        )
        self.explainer = ForkExplainer(self)
        self._confirm_timer: Timer | None = None
        self._status = ""
        """The status line's text without the note shown before it."""

    # -- layout

    def compose(self) -> ComposeResult:
        yield self.controls
        with Lanes(id="lanes"):
            yield LanePane("a")
            yield LanePane("b")
        yield AlignedView(id="aligned")
        yield Panel(id="panel")
        yield Legend(id="legend")
        yield Line(id="status")
        yield FittedFooter()

    def on_mount(self) -> None:
        self.app.theme_changed_signal.subscribe(self, lambda _theme: self.render_lanes(False))
        self.set_titles()
        if self.session is not None:
            self.show_session(self.session)
        elif self.autostart:
            self.action_run()
        self.query_one("#lanes").focus()
        self.mark_current_lane()

    def on_screen_resume(self) -> None:
        """Back from help or the palette: the lanes take the keys and the current one is
        lit again (its focus was never handed back to it)."""
        if self.focused is None or self.focused.id == "lanes":
            self.query_one("#lanes").focus()
        self.mark_current_lane()
        self.refresh_bindings()

    def on_screen_suspend(self) -> None:
        """Help or the palette is over the panes: they do not take the keys meanwhile."""
        for pane in self.query(LanePane):
            pane.remove_class("focused")

    def on_resize(self, event: events.Resize) -> None:
        # the event's size: this handler runs before the screen records the new one
        self.set_class(event.size.height < SHORT_ROWS, "short")
        narrow = event.size.width < NARROW_COLUMNS
        self.set_class(narrow, "narrow")
        if not narrow:
            self.remove_class("configuring")
        with suppress(NoMatches):
            self.controls.set_narrow(narrow)
            self.query_one(Footer).compact = narrow
        self.refresh_bindings()
        # the lanes' stats lines keep what fits the new width
        self.call_after_refresh(self.render_lanes, False)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # space belongs to replays, escape to inputs, c to narrow screens: each is
        # hidden from the footer where it does nothing
        if action in SPACE_ACTIONS:
            return self.replay.space_action() == action
        if action == "panes":
            return not self.panes_focused or self.has_class("configuring")
        if action == "configure":
            return self.has_class("narrow")
        if action == "stop":
            return not self.replaying
        if action == "stop_replay":
            return self.replaying
        if action == "fork":
            recorded = self.replay.playback is not None and self.replay.fork_index is not None
            return self.view.fork is not None or recorded
        return True

    # -- focus

    @property
    def panes_focused(self) -> bool:
        # the aligned view stands in for the panes: the same keys act there
        return self.focused is None or self.focused.id in ("lanes", "aligned")

    @property
    def replaying(self) -> bool:
        """A recorded session is on screen (no live run has replaced it)."""
        return self.session is not None

    @property
    def running(self) -> bool:
        """The lanes are generating."""
        return self.live.running

    @running.setter
    def running(self, running: bool) -> None:
        self.live.running = running
        with suppress(NoMatches):  # not composed yet: no field to stop
            self.controls.set_running(running)

    def action_panes(self) -> None:
        """Leave an input (or the open config bar) for the panes, where the keys act."""
        self.remove_class("configuring")
        self.query_one("#lanes").focus()
        self.controls.show_config()

    def action_configure(self) -> None:
        """On a narrow screen: unfold the input rows and put the cursor in the prompt."""
        if self.has_class("narrow"):
            self.add_class("configuring")
        self.query_one("#prompt", Input).focus()
        self.refresh_bindings()

    def on_descendant_focus(self) -> None:
        self.mark_current_lane()
        self.refresh_bindings()

    def on_descendant_blur(self) -> None:
        # a blur also arrives while the app shuts down, after the panes are gone
        with suppress(NoMatches):
            self.mark_current_lane()

    def mark_current_lane(self) -> None:
        """Border and title the current lane's pane (the one `l` switches), lit while
        the panes have focus."""
        focused = self.panes_focused
        for lane_id in ("a", "b"):
            pane = self.query_one(f"#lane-{lane_id}", LanePane)
            current = lane_id == self.view.cursor_lane
            pane.set_class(current, "current")
            pane.set_class(current and focused, "focused")
            pane.border_title = f"lane {lane_id.upper()}" + (" · current" if current else "")

    # -- the controls

    @on(Controls.RunRequested)
    def run_requested(self) -> None:
        # the keys go back to the panes: a `d` typed next must jump, not type
        self.action_panes()
        self.action_run()

    @on(Controls.StopRequested)
    def stop_requested(self) -> None:
        self.action_stop()

    @on(Controls.PairChosen)
    def pair_chosen(self, message: Controls.PairChosen) -> None:
        if message.by_keyboard:
            self.action_panes()

    def action_toggle_prompt_mode(self) -> None:
        self.controls.toggle_prompt_mode()

    @on(Controls.PromptModeChanged)
    def prompt_mode_changed(self, message: Controls.PromptModeChanged) -> None:
        self.note(message.note)

    # -- state to screen

    def palette(self) -> Palette:
        return Palette.from_theme(self.app.current_theme)

    def set_titles(self) -> None:
        for lane_id in ("a", "b"):
            lane, other = getattr(self.pair, lane_id), getattr(self.pair, other_lane(lane_id))
            pane = self.query_one(f"#lane-{lane_id}", LanePane)
            pane.set_title(f"{lane_id.upper()} · {headline(lane, other)}")
            pane.set_stats("")

    def stats_line(self, lane_id: str, width: int | None = None) -> str:
        """The lane's numbers, as many whole ones as fit `width` when given (the error is
        in full under the lane's tokens)."""
        grades = self.session.footer.grades if self.session and self.session.footer else None
        grade = grades[0 if lane_id == "a" else 1] if grades else None
        parts = self.view.stats_parts(
            lane_id, self.pair, None if grade is None else (grade.passed, grade.reason)
        )
        return " · ".join(parts) if width is None else fitted(parts, width)

    def marks(self, lane_id: str) -> TokenMarks:
        view = self.view
        return TokenMarks(
            palette=self.palette(),
            threshold=self.near_tie,
            fork_index=view.fork.index if view.fork is not None else None,
            cursor=view.cursor if lane_id == view.cursor_lane else None,
            changed_after_fork=frozenset(view.changed[lane_id]),
            forecast=pending_forecast(
                view.lanes[lane_id].steps,
                len(view.lanes[other_lane(lane_id)].steps),
                view.fork is not None,
                model_for(self.pair.name),
            ),
        )

    def render_lanes(self, follow: bool, details: bool = True) -> None:
        """Draw the lanes' tokens; with `details`, also what summarises them: each lane's
        stats line and margin strip, the legend, the aligned view and the panel. A
        streaming frame draws the details at most every PANEL_SECONDS: they sit above,
        below and beside the tokens, and a frame repaints everything between the parts
        that changed."""
        forecast_shown = False
        for lane_id, state in self.view.lanes.items():
            pane = self.query_one(f"#lane-{lane_id}", LanePane)
            marks = self.marks(lane_id)
            forecast_shown = forecast_shown or bool(marks.forecast)
            pane.show_tokens(state, marks, follow=follow, strip=details)
            if details and pane.content_size.width:
                # a pane without a width (hidden, or before the first layout) is given
                # its stats line once it has one
                pane.set_stats(self.stats_line(lane_id, pane.content_size.width - 2))
        if not details:
            return
        self.query_one(Legend).show_forecast(forecast_shown)
        aligned = self.query_one("#aligned", AlignedView)
        if aligned.display:
            lanes = self.view.lanes
            aligned.show(lanes, {lane_id: self.marks(lane_id) for lane_id in lanes})
        self.render_panel()

    def render_panel(self) -> None:
        view = self.view
        index = view.panel_index()
        a_steps, b_steps = view.lanes["a"].steps, view.lanes["b"].steps
        panel = PanelView(
            index,
            a_steps[index] if index is not None and index < len(a_steps) else None,
            b_steps[index] if index is not None and index < len(b_steps) else None,
            view.fork,
            view.similarity,
            view.generated(),
            self.near_tie,
            near_ties_before(a_steps, self.near_tie, view.fork),
            lane_differences(self.pair),
        )
        self.query_one("#panel", Panel).show(panel)

    @property
    def shutting_down(self) -> bool:
        """The app is closing: its widgets are being removed, and what the generation
        thread posted before it was stopped (a run that started or ended as the user
        quit) finds nothing to draw on."""
        return not self.app.is_running

    def set_status(self, text: str) -> None:
        self._status = text
        self.query_one("#status", Line).set(text)

    def note(self, text: str) -> None:
        """A routine note (theme, fork found, nothing further): said first in the status
        line, before what it said; toasts are for errors, as they sit over the panes."""
        self.query_one("#status", Line).set(f"{text} · {self._status}" if self._status else text)

    def look_for_fork(self, announce: bool = True) -> bool:
        """Look for the fork in what has arrived; True when it was found just now."""
        found = self.view.find_fork()
        if found:
            self.fork_found(announce)
        return found

    def update_comparison(self, announce: bool = True) -> None:
        if self.view.update_comparison():
            self.fork_found(announce)

    def fork_found(self, announce: bool) -> None:
        """The fork was just found: d is offered from now on, and both panes keep it in
        view (d, n, p and the arrows still move them)."""
        fork = self.view.fork
        assert fork is not None
        self.refresh_bindings()
        if announce:
            self.note(f"lanes forked at token {fork.index}")

        def scroll() -> None:
            # the fork as it is once the panes are laid out: another session may have
            # replaced the one this was asked for
            if self.view.fork is None or self.view.follow:
                return
            for lane_id in ("a", "b"):
                shown = len(self.view.lanes[lane_id].steps)
                if shown:
                    pane = self.query_one(f"#lane-{lane_id}", LanePane)
                    pane.scroll_to_token(min(self.view.fork.index, shown - 1))

        self.call_after_refresh(scroll)

    def align_while_streaming(self) -> None:
        """Diff colours from the moment the lanes fork, redone as often as affordable."""
        if self.view.fork is not None:
            self.pacer.align(self.view.update_comparison)

    def show_session(self, session: Session) -> None:
        """Show a recorded run (no model needed): at once, or played back."""
        self.replay.stop()
        self.view.reset()
        self.session = session
        self.pair = session.pair
        self.set_titles()
        self.lock_replay_controls(True)
        self.replay.start(session)

    def lock_replay_controls(self, replaying: bool) -> None:
        """While a replay is shown, what would discard it (Run, Stop, lane overrides)
        is disabled; `r` asks first."""
        self.controls.lock_for_replay(replaying)
        self.refresh_bindings()

    # -- a live run

    def action_run(self) -> None:
        if self.running:
            self.live.restart = True
            self.live.cancel.set()
            self.set_status("stopping the current run to start again…")
            return
        if self.replaying and self._confirm_timer is None:
            # a replay is not thrown away on one key: the second r loads the model
            self._confirm_timer = self.set_timer(CONFIRM_SECONDS, self.disarm_run)
            self.set_status(
                "this is a recorded session: press r again to load the model and run "
                "the pair on its prompt (the replay is closed)"
            )
            return
        self.forget_confirmation()
        try:
            pair, prompt, max_tokens = self.controls.resolve_pair()
        except SpecdiffError as error:
            self.notify(str(error), severity="error", timeout=8)
            self.set_status(f"not started: {error}")
            return
        self.streaming.start(pair, prompt, max_tokens)

    def key_seen(self, key: str) -> None:
        """Before any binding acts: a key other than r disarms a pending r over a replay,
        so a later r asks again instead of closing the replay."""
        if key != "r" and self._confirm_timer is not None:
            self.disarm_run()

    def forget_confirmation(self) -> None:
        if self._confirm_timer is not None:
            self._confirm_timer.stop()
            self._confirm_timer = None

    def disarm_run(self) -> None:
        """Forget a pending r over a replay and put back the replay's own status."""
        self.forget_confirmation()
        if self.replay.playback is not None:
            self.replay.show_status()
        elif self.session is not None:
            self.set_status(self.replay.shown_status())

    def on_run_started(self, message: RunStarted) -> None:
        self.streaming.started(message)

    def on_steps_arrived(self, message: StepsArrived) -> None:
        self.streaming.arrived(message)

    def on_run_finished(self, message: RunFinished) -> None:
        self.streaming.finished(message)

    def on_run_failed(self, message: RunFailed) -> None:
        self.streaming.failed(message)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.state == WorkerState.ERROR:
            self.streaming.broke(event.worker.error)

    def action_stop(self) -> None:
        if self.running:
            self.live.cancel.set()
            self.set_status("stopping…")

    # -- a replay

    def on_session_loaded(self, message: SessionLoaded) -> None:
        self.replay.loaded(message)

    def on_session_load_failed(self, message: SessionLoadFailed) -> None:
        self.replay.load_failed(message)

    def action_stop_replay(self) -> None:
        """x over a replay: nothing runs to stop; say what does what instead."""
        self.note("x stops a live run; this is a recording: space pauses it, r runs it live")

    def action_toggle_pause(self) -> None:
        if self.replay.playback is None:
            self.note("space pauses a replay (specdiff replay FILE)")
            return
        self.replay.toggle_pause()

    # space's other names in the footer, while paused and at the end
    action_resume_replay = action_replay_again = action_toggle_pause

    # -- navigation

    def move_cursor(self, lane_id: str, index: int | None, scroll_both: bool = False) -> None:
        self.view.select(lane_id, index)
        self.mark_current_lane()
        self.render_lanes(follow=False)
        if index is None:
            return
        for pane_lane in ("a", "b") if scroll_both else (lane_id,):
            if index < len(self.view.lanes[pane_lane].steps):
                self.query_one(f"#lane-{pane_lane}", LanePane).scroll_to_token(index)

    def action_fork(self) -> None:
        if self.view.fork is None:
            self.replay.jump_to_fork()
        if self.view.fork is None:
            self.note("no fork: the lanes agree so far")
            return
        self.move_cursor(self.view.cursor_lane, self.view.fork.index, scroll_both=True)

    async def action_explain(self) -> None:
        """Why the lanes fork: the autopsy in the panel's place (w again closes it)."""
        await self.explainer.toggle()

    def action_explain_escape(self) -> None:
        self.explainer.escape()

    def action_next_tie(self) -> None:
        index = self.view.next_tie()
        if index is None:
            self.note(self.view.no_tie_note("after"))
            return
        self.move_cursor(self.view.cursor_lane, index)

    def action_previous_tie(self) -> None:
        index = self.view.previous_tie()
        if index is None:
            self.note(self.view.no_tie_note("before"))
            return
        self.move_cursor(self.view.cursor_lane, index)

    def action_move(self, delta: int) -> None:
        if self.replay.playback is not None and self.replay.playback.paused:
            self.replay.step(delta)
            return
        index = self.view.moved(delta)
        if index is not None:
            self.move_cursor(self.view.cursor_lane, index)

    def action_toggle_aligned(self) -> None:
        """Swap the panes for the aligned view (shared prefix collapsed, the branches
        stacked), or back."""
        aligned, lanes = self.query_one("#aligned", AlignedView), self.query_one("#lanes")
        aligned.display, lanes.display = not aligned.display, aligned.display
        (aligned if aligned.display else lanes).focus()
        self.render_lanes(follow=False)
        # the panes have their width again only once laid out: their stats lines then
        self.call_after_refresh(self.render_lanes, False)

    def action_panel_share(self, step: int) -> None:
        """Let the panel take more (or less) of the screen when it has more to show."""
        share = self.query_one("#panel", Panel).change_share(step)
        self.note(f"the panel takes up to {share}% of the screen (+ and - change it)")

    def action_switch_lane(self) -> None:
        self.move_cursor(*self.view.switched())

    @on(TokenView.Selected)
    def token_selected(self, message: TokenView.Selected) -> None:
        if self.view.holds(message.lane_id, message.index):
            self.move_cursor(message.lane_id, message.index)

    # -- files

    def action_save(self) -> None:
        self.output.save_shown(self)

    def action_export(self) -> None:
        """Write the HTML report of the session on screen and say where it went."""
        self.output.report_shown(self)

    def close(self) -> None:
        """The app is closing. Quitting mid-run: what the run set aside from collection
        is given back, and a busy worker is killed, not waited for (the `running` setter
        would restyle fields that are gone)."""
        self.replay.stop()
        self.live.close()
        self.explainer.close()
