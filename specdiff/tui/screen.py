"""The compare screen: the two lanes side by side, the divergence panel below them, the
controls above. It lays them out, keeps the keys with the panes (escape always comes
back here), and draws what its model holds.

State flows one way. The model is `view_state.CompareView` (the session or live run on
screen, the fork, the cursor, the diff). The controllers change it: `live.Streaming`
(a live run), `replay.Replay` (a recorded one), `explain.ForkExplainer` (the autopsy),
`output.OutputFiles` (files written) and `navigation` (where the keys take the cursor).
Each returns what changed, as `messages.Changes`; their worker threads post reports
(`messages.StepsArrived`, ...) that reach them here, on the UI thread, inside one
`Report` message. The screen applies the changes (`apply`) and is the only one that
draws: through `drawing.CompareDrawing`, its status line and its widgets.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from textual import events, on
from textual.actions import SkipAction
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.message import Message
from textual.reactive import var
from textual.screen import Screen
from textual.timer import Timer
from textual.widget import Widget
from textual.worker import Worker, WorkerState, get_current_worker

from specdiff.compare import Fork
from specdiff.errors import SpecdiffError
from specdiff.tui import navigation
from specdiff.tui.controls import Controls
from specdiff.tui.drawing import CompareDrawing
from specdiff.tui.explain import ForkExplainer
from specdiff.tui.host import IsCancelled, Report
from specdiff.tui.keys import SCREEN_BINDINGS
from specdiff.tui.live import LiveRun, Streaming
from specdiff.tui.messages import (
    Alerted,
    AutopsyClosed,
    AutopsyProgress,
    AutopsyShown,
    Changes,
    CursorMoved,
    ForkFound,
    FrameDue,
    KeysChanged,
    Noted,
    PairShown,
    ReplayShown,
    RunAgain,
    RunningChanged,
    StatusChanged,
)
from specdiff.tui.options import CompareOptions
from specdiff.tui.output import OutputFiles
from specdiff.tui.replay import SPACE_ACTIONS, Replay, RunConfirmation
from specdiff.tui.view_state import CompareView
from specdiff.tui.widgets.autopsy_panel import AutopsyPanel
from specdiff.tui.widgets.footer import FittedFooter
from specdiff.tui.widgets.line import StatusLine
from specdiff.tui.widgets.styles import Palette
from specdiff.tui.widgets.token_view import TokenView

NARROW_COLUMNS = 100
"""Below this width the input rows fold into a one-line config bar that `c` opens."""
SHORT_ROWS = 30
"""Below this height the panel and the margin strips are smaller."""


class Lanes(Horizontal, can_focus=True):
    """The two panes; focusable so that the screen's keys reach it instead of an input."""


@dataclass
class WorkerReport(Message, bubble=False):
    """A worker thread's report, for `receiver` (a controller) on the UI thread."""

    receiver: Callable[[Any], Changes]
    report: object


class ScreenHost:
    """The screen's threads, timers and width, as its controllers ask for them
    (`host.Host`); what a callback returns is applied by the screen."""

    def __init__(self, screen: CompareScreen) -> None:
        self.screen = screen

    @property
    def columns(self) -> int:
        return self.screen.size.width

    def post(self, receiver: Callable[[Report], Changes], report: Report) -> None:
        self.screen.post_message(WorkerReport(receiver, report))

    def run_in_thread(
        self, work: Callable[[IsCancelled], None], group: str, exclusive: bool = True
    ) -> None:
        def run() -> None:
            worker = get_current_worker()
            work(lambda: worker.is_cancelled)

        self.screen.run_worker(
            run, thread=True, exclusive=exclusive, group=group, exit_on_error=False
        )

    def cancel_group(self, group: str) -> None:
        self.screen.workers.cancel_group(self.screen, group)

    def later(self, seconds: float, callback: Callable[[], Changes]) -> Timer:
        return self.screen.set_timer(seconds, lambda: self.screen.apply(callback()))

    def every(self, seconds: float, callback: Callable[[], Changes]) -> Timer:
        return self.screen.set_interval(seconds, lambda: self.screen.apply(callback()))

    def after_refresh(self, callback: Callable[[], None]) -> None:
        self.screen.call_after_refresh(callback)


def panes_have_focus(focused: Widget | None) -> bool:
    """Whether the screen's keys act on the panes: the aligned view stands in for them."""
    return focused is None or focused.id in ("lanes", "aligned")


class CompareScreen(Screen[None]):
    """Two lanes, their fork and the keys that move through them."""

    BINDINGS = SCREEN_BINDINGS

    shown_fork: var[Fork | None] = var(None, init=False, always_update=True)
    """The fork as last found: set each time one is (the same fork again when a replay
    plays again), so the watcher offers `d` and brings it into view."""

    def __init__(self, options: CompareOptions) -> None:
        super().__init__()
        self.options = options
        self.view = CompareView(options.pair, options.near_tie)
        self.view.session = options.session
        self.host = host = ScreenHost(self)
        live = LiveRun(options.near_tie, options.control)
        live.max_tokens = options.max_tokens
        self.streaming = Streaming(self.view, live, host)
        self.replay = Replay(
            self.view,
            host,
            self.streaming.pacer,
            options.replay_speed,
            options.session_stream,
            options.pause_at_fork,
        )
        self.replay.compare_machine = options.compare_machine
        self.confirmation = RunConfirmation(self.replay, host)
        self.output = OutputFiles(options.sessions_dir)
        self.explainer = ForkExplainer(self.view, host)
        self.controls = Controls(options, id="run-controls")
        self.drawing = CompareDrawing(self.view, lambda: Palette.from_theme(self.app.current_theme))
        self.lanes = Lanes(id="lanes")
        self.status_line = StatusLine(id="status")
        self.footer_bar = FittedFooter()
        self.autopsy = AutopsyPanel(id="autopsy")
        """Mounted the first time `w` is pressed."""

    # -- layout

    def compose(self) -> ComposeResult:
        yield self.controls
        with self.lanes:
            yield from self.drawing.panes.values()
        yield self.drawing.aligned
        yield self.drawing.panel
        yield self.drawing.legend
        yield self.status_line
        yield self.footer_bar

    def on_mount(self) -> None:
        # a new theme: the tokens are drawn again in its colours, after the app has
        # applied its styles (which it queues as the theme changes)
        self.watch(
            self.app, "theme", lambda: self.app.call_next(self.drawing.draw, False), init=False
        )
        self.drawing.set_titles()
        if self.options.session is not None:
            self.apply(self.replay.show_session(self.options.session))
        elif self.options.autostart:
            self.action_run()
        self.lanes.focus()
        self.drawing.mark_current_lane(panes_have_focus(self.focused))

    def on_screen_resume(self) -> None:
        """Back from help or the palette: the lanes take the keys and the current one is
        lit again (its focus was never handed back to it)."""
        if self.focused is None or self.focused.id == "lanes":
            self.lanes.focus()
        self.drawing.mark_current_lane(panes_have_focus(self.focused))
        self.refresh_bindings()

    def on_screen_suspend(self) -> None:
        """Help or the palette is over the panes: they do not take the keys meanwhile."""
        for pane in self.drawing.panes.values():
            pane.lit = False

    def on_resize(self, event: events.Resize) -> None:
        # the event's size: this handler runs before the screen records the new one
        self.set_class(event.size.height < SHORT_ROWS, "short")
        narrow = event.size.width < NARROW_COLUMNS
        self.set_class(narrow, "narrow")
        if not narrow:
            self.remove_class("configuring")
        self.controls.set_narrow(narrow)
        self.footer_bar.compact = narrow
        self.refresh_bindings()
        # the lanes' stats lines keep what fits the new width
        self.call_after_refresh(self.drawing.draw, False)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # space belongs to replays, escape to inputs, c to narrow screens: each is
        # hidden from the footer where it does nothing
        if action in SPACE_ACTIONS:
            return self.replay.space_action() == action
        if action == "panes":
            return not panes_have_focus(self.focused) or self.has_class("configuring")
        if action == "configure":
            return self.has_class("narrow")
        if action == "run":
            return self.options.runs_refused is None
        if action in ("stop", "stop_replay"):
            return self.view.replaying == (action == "stop_replay")
        if action == "go" and parameters == (navigation.FORK,):
            recorded = self.replay.playback is not None and self.replay.fork_index is not None
            return self.view.fork is not None or recorded
        return True

    # -- focus and the controls

    @on(events.DescendantFocus)
    @on(events.DescendantBlur)
    def focus_moved(self, event: events.DescendantFocus | events.DescendantBlur) -> None:
        self.drawing.mark_current_lane(panes_have_focus(self.focused))
        if isinstance(event, events.DescendantFocus):
            self.refresh_bindings()

    def action_panes(self) -> None:
        """Leave an input (or the open config bar) for the panes, where the keys act."""
        self.remove_class("configuring")
        self.lanes.focus()
        self.controls.show_config()

    def action_configure(self) -> None:
        """On a narrow screen: unfold the input rows and put the cursor in the prompt."""
        if self.has_class("narrow"):
            self.add_class("configuring")
        self.controls.focus_prompt()
        self.refresh_bindings()

    @on(Controls.PairChosen)
    def pair_chosen(self, message: Controls.PairChosen) -> None:
        if message.by_keyboard:
            self.action_panes()

    def action_toggle_prompt_mode(self) -> None:
        self.controls.toggle_prompt_mode()

    @on(Controls.PromptModeChanged)
    def prompt_mode_changed(self, message: Controls.PromptModeChanged) -> None:
        self.status_line.note(message.note)

    # -- what the controllers changed, drawn

    def on_worker_report(self, message: WorkerReport) -> None:
        # the app is closing: what a thread posted before it was stopped (a run that
        # started or ended as the user quit) finds nothing to draw on
        if self.app.is_running:
            self.apply(message.receiver(message.report))

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.state == WorkerState.ERROR:
            self.apply(self.streaming.broke(event.worker.error))

    def apply(self, changes: Changes) -> None:
        """Draw what a controller changed, in order."""
        if not self.app.is_running:
            return  # closing: the widgets are being removed
        view = self.view
        for change in changes:
            match change:
                case FrameDue(follow, details):
                    self.drawing.draw(follow, details)
                case StatusChanged(text):
                    self.status_line.say(text)
                case Noted(text):
                    self.status_line.note(text)
                case Alerted(text, severity, timeout):
                    self.notify(text, severity=severity, timeout=timeout)
                case ForkFound(announce):
                    self.shown_fork = view.fork
                    if announce and view.fork is not None:
                        self.status_line.note(f"lanes forked at token {view.fork.index}")
                case CursorMoved(lane_id, index, scroll_both):
                    self.status_line.drop_note()
                    self.drawing.mark_current_lane(panes_have_focus(self.focused))
                    self.drawing.draw(follow=False)
                    if index is not None:
                        self.drawing.scroll_to(index, ("a", "b") if scroll_both else (lane_id,))
                case PairShown():
                    self.drawing.set_titles()
                case ReplayShown(replaying):
                    # while a replay is shown, what would discard it is disabled
                    self.controls.lock_for_replay(replaying)
                    self.refresh_bindings()
                case KeysChanged():
                    self.refresh_bindings()
                case RunningChanged(running):
                    self.controls.set_running(running)
                case RunAgain():
                    self.action_run()
                case AutopsyProgress(title, line, done, total):
                    self.autopsy.display, self.drawing.panel.display = True, False
                    self.autopsy.show_progress(title, line, done, total)
                case AutopsyShown(title, autopsy):
                    self.autopsy.display, self.drawing.panel.display = True, False
                    self.autopsy.show_autopsy(title, autopsy)
                case AutopsyClosed():
                    self.autopsy.display, self.drawing.panel.display = False, True

    def watch_shown_fork(self, fork: Fork | None) -> None:
        """The fork was just found: d is offered from now on, and both panes keep it in
        view once laid out (d, n, p and the arrows still move them)."""
        if fork is not None:
            self.refresh_bindings()
            self.call_after_refresh(self.drawing.scroll_to_fork)

    # -- a live run

    @on(Controls.RunRequested)
    def action_run(self, message: Controls.RunRequested | None = None) -> None:
        """`r` (or Run, or Enter in a field): run what the controls say; mid-run, stop
        and run again; over a replay, ask first."""
        if message is not None:
            # the keys go back to the panes: a `d` typed next must jump, not type
            self.action_panes()
        if self.options.runs_refused is not None:
            self.apply([Alerted(self.options.runs_refused, "warning", 8)])
            return
        if self.view.running:
            self.apply(self.streaming.restart())
            return
        asked = self.confirmation.ask()
        if asked is not None:
            self.apply(asked)
            return
        try:
            pair, prompt, max_tokens = self.controls.resolve_pair()
        except SpecdiffError as error:
            self.apply([Alerted(str(error), "error", 8), StatusChanged(f"not started: {error}")])
            return
        self.output.forget_saved()
        self.apply([*self.replay.close_for_live(), *self.streaming.start(pair, prompt, max_tokens)])

    def key_seen(self, key: str) -> None:
        """Before any binding acts (the app hands each key here first)."""
        self.apply(self.confirmation.key_seen(key))

    @on(Controls.StopRequested)
    def action_stop(self) -> None:
        """`x` (or Stop): stop the live run; over a replay, say what does what instead."""
        if self.view.replaying:
            self.status_line.note(
                "x stops a live run; this is a recording: space pauses it, r runs it live"
            )
            return
        self.apply(self.streaming.stop())

    # x over a replay, where it is hidden from the footer
    action_stop_replay = action_stop

    # -- a replay

    def action_toggle_pause(self) -> None:
        self.apply(self.replay.toggle_pause())

    # space's other names in the footer, while paused and at the end
    action_resume_replay = action_replay_again = action_toggle_pause

    # -- navigation

    def action_go(self, where: str) -> None:
        """d, n, p and l: the cursor to the fork (played up to it in a replay), the
        current lane's next or previous near tie, or the other lane."""
        if where == navigation.FORK and self.view.fork is None:
            self.apply(self.replay.jump_to_fork())
        self.apply(navigation.go(self.view, where))

    def action_move(self, delta: int) -> None:
        """←/→: the cursor a token along; in a paused replay, a step played or taken
        back."""
        if self.replay.playback is not None and self.replay.playback.paused:
            self.apply(self.replay.step(delta))
            return
        self.apply(navigation.step(self.view, delta))

    @on(TokenView.Selected)
    def token_selected(self, message: TokenView.Selected) -> None:
        self.apply(navigation.select(self.view, message.lane_id, message.index))

    async def action_explain(self, escape: bool = False) -> None:
        """Why the lanes fork: the autopsy in the panel's place (w again closes it).
        With `escape` (escape over the panes): stop or close an autopsy, else the key
        is left to what else it does."""
        if escape:
            changes = self.explainer.escape()
            if changes is None:
                raise SkipAction()
            self.apply(changes)
            return
        if not self.autopsy.is_mounted:
            await self.mount(self.autopsy, after=self.drawing.panel)
        self.apply(self.explainer.toggle())

    def action_toggle_aligned(self) -> None:
        """Swap the panes for the aligned view (shared prefix collapsed, the branches
        stacked), or back."""
        aligned, lanes = self.drawing.aligned, self.lanes
        aligned.display, lanes.display = not aligned.display, aligned.display
        (aligned if aligned.display else lanes).focus()
        self.drawing.draw(follow=False)
        # the panes have their width again only once laid out: their stats lines then
        self.call_after_refresh(self.drawing.draw, False)

    def action_panel_share(self, step: int) -> None:
        """Let the panel take more (or less) of the screen when it has more to show."""
        share = self.drawing.panel.change_share(step)
        self.status_line.note(f"the panel takes up to {share}% of the screen (+ and - change it)")

    # -- files

    def action_save(self) -> None:
        """Save the finished run as a session file and say where it went."""
        self.apply(self.output.save_shown(self.view, self.size.width))

    def action_export(self) -> None:
        """Write the HTML report of the session on screen and say where it went."""
        self.apply(self.output.report_shown(self.view, self.size.width))

    def close(self) -> None:
        """The app is closing. Quitting mid-run: what the run set aside from collection
        is given back, a busy worker is killed, not waited for, and an autopsy being
        made is stopped."""
        self.replay.stop()
        self.streaming.close()
        self.explainer.close()
