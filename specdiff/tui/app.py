"""The specdiff app: two lanes streaming side by side, the fork highlighted.

The app only renders records. A thread worker drives a ``PairWorker`` (the lanes run in
their own process, so a crash in llama.cpp ends a run, not the app) and posts batches of
TokenSteps; the fork, near ties and alignment come from ``compare.py``.
"""

from __future__ import annotations

import gc
import re
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from contextlib import suppress
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.text import Text
from textual import events, on, work
from textual.app import App, ComposeResult, ScreenStackError, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal
from textual.css.query import NoMatches
from textual.filter import LineFilter
from textual.notifications import Notify, SeverityLevel
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import Button, Footer, Input, Select, Static
from textual.worker import Worker, WorkerState, get_current_worker

from specdiff.chat import (
    Conversation,
    looks_like_messages,
    one_message,
    shown_prompt,
    typed_messages,
)
from specdiff.compare import DEFAULT_NEAR_TIE, Fork, align_after, first_divergence, fork_at
from specdiff.compare import near_ties as find_near_ties
from specdiff.control import control_brief
from specdiff.engine.worker import PairWorker
from specdiff.errors import SpecdiffError
from specdiff.forecast import model_for
from specdiff.lanes import Pair, apply_overrides, headline, override_words, parse_overrides
from specdiff.results import PairResult
from specdiff.safe_text import from_one_line, on_one_line, visible
from specdiff.sessions.playback import Playback
from specdiff.sessions.store import (
    Session,
    SessionError,
    SessionStream,
    load_session,
    save_result,
    sessions_dir,
)
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
    AlignedView,
    FittedFooter,
    LanePane,
    LaneState,
    Legend,
    Line,
    Palette,
    Panel,
    PanelView,
    TokenMarks,
    WithoutControls,
    counted,
    lane_differences,
    near_ties_before,
    pending_forecast,
)

WITHOUT_CONTROLS = WithoutControls()
READ_CHUNK = 2000
"""Steps read per message while a replay reads the rest of its file."""
REPLAY_TICK = 1 / 30
"""How often a replay draws the steps that became due."""
SWITCH_INTERVAL = 0.0005
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


NARROW_COLUMNS = 100
"""Below this width the input rows fold into a one-line config bar that `c` opens."""
CONFIRM_SECONDS = 5.0
"""How long a first `r` over a replay waits for the second that loads the model."""
TEXT, MESSAGES = "text", "messages"
"""The prompt box's two modes, named as its toggle shows them."""
PAIR_OPTION_WIDTH = 58
"""The pair picker's rows: the name, then what the pair compares, cut to fit."""


class Lanes(Horizontal, can_focus=True):
    """The two panes; focusable so that the app's keys reach it instead of an input."""


def fitted(parts: Sequence[str], width: int) -> str:
    """As many whole parts as fit in `width` columns, in order: a cut line never ends in a
    name without its value."""
    shown: list[str] = []
    for part in parts:
        line = " · ".join([*shown, part])
        if shown and len(line) > width:
            break
        shown.append(part)
    return " · ".join(shown)


def pair_option(name: str, pair: Pair) -> Text:
    """A row of the pair picker: the name, then what the pair compares, on one line."""
    row = Text(visible(name), style="bold", no_wrap=True, overflow="ellipsis")
    described = pair.description or f"{headline(pair.a, pair.b)} vs {headline(pair.b, pair.a)}"
    row.append(f"  {visible(described)}", style="dim")
    row.truncate(PAIR_OPTION_WIDTH, overflow="ellipsis")
    return row


class SpecdiffApp(App[int]):
    CSS_PATH = "app.tcss"
    TITLE = "specdiff"
    # Help and quit come first so that a narrow footer, which cuts from the right, keeps
    # them. An input takes printable keys, so while one has focus the footer shows f1 and
    # ctrl+q in their place, and escape, which leaves the input (it never stops a run: x
    # does), is shown only then.
    BINDINGS = [
        Binding("question_mark", "help", "help"),
        Binding("f1", "help", "help"),
        Binding("q", "quit", "quit"),
        # ctrl+q is shown only while an input has focus (where q types a q)
        Binding("ctrl+q", "quit_from_input", "quit"),
        Binding("ctrl+q", "quit", "quit", show=False),
        Binding("escape", "panes", "panes"),
        Binding("r", "run", "run"),
        Binding("x", "stop", "stop"),
        Binding("d", "fork", "fork"),
        Binding("n", "next_tie", "next tie"),
        Binding("p", "previous_tie", "prev tie"),
        Binding("left", "move(-1)", "←", show=False),
        Binding("right", "move(1)", "→", show=False),
        Binding("space", "toggle_pause", "pause"),
        Binding("l", "switch_lane", "lane"),
        Binding("a", "toggle_aligned", "aligned"),
        Binding("c", "configure", "config"),
        Binding("e", "export", "report"),
        Binding("s", "save", "save"),
        Binding("t", "next_theme", "theme"),
        # a ctrl key: it must work while the prompt box has focus, where letters type
        Binding("ctrl+o", "toggle_prompt_mode", "text/messages", show=False),
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
        pause_at_fork: bool = False,
        overrides: dict[str, str] | None = None,
        control: bool = False,
    ) -> None:
        """`session` opens a recorded run: at once when `replay_speed` is None, else
        played at the recorded pace times `replay_speed`; `session_stream`, when given,
        holds the rest of the session's file, read while the replay plays.
        `refused_pairs`: pairs shown but never run, each with the reason (a shared
        session's server lanes, which the user has not allowed). `pause_at_fork`: a
        played replay pauses once both lanes show the fork's token. `overrides`: each
        lane's overrides from the command line, as "key=value" words, shown (and
        applied again, to the same effect) in its overrides field."""
        super().__init__()
        self.pairs = pairs
        self.refused_pairs = refused_pairs or {}
        self.pair_name = pair_name
        self.initial_prompt = prompt
        # a prompt's kind is known (a session's, the command line's): never guessed from
        # its text, so a raw prompt that looks like JSON runs as the raw prompt it was
        self.prompt_mode = MESSAGES if isinstance(prompt, Conversation) else TEXT
        """How the prompt box is read: as raw text, or as a JSON messages list."""
        self._box_stands_for = (on_one_line(shown_prompt(prompt)), shown_prompt(prompt))
        """(what the box shows, the text it stands for): the box shows newlines and control
        characters as pictures (␤, ␛), read back when edited, and other unprintable
        characters as escapes, so while it is unedited it stands for the text itself."""
        self.initial_max_tokens = max_tokens
        self.initial_overrides = overrides or {}
        self.near_tie = near_tie
        self.control = control
        """Run lane a again, cold, after each run (--control)."""
        self.requested_theme = theme_name
        self.autostart = autostart
        self.session = session
        self.sessions_dir = sessions_dir
        self.theme_dirs = theme_dirs
        self.pair: Pair = pairs[pair_name]
        self.reset_view()
        self._next_alignment = 0.0
        self._next_panel = 0.0
        self._pending_frame: Timer | None = None
        """The timer that draws steps held back from a frame, while one is set."""
        self._last_frame: tuple[float, float] | None = None
        """(monotonic, UI thread CPU seconds) when streamed steps were last drawn."""
        self._status = ""
        """The status line's text without the note shown before it."""
        self.cursor_lane = "a"
        self._lanes_running = False
        self.max_tokens = max_tokens
        self.cancel = threading.Event()
        self._runner: PairWorker | None = None
        self._restart = False
        self.our_themes: list[str] = []
        self._saved_path: Path | None = None
        self._loading_lane: str | None = None
        """The lane being loaded (the worker's progress names it): a failure before the
        run starts belongs to it."""
        self.init_replay(replay_speed, session_stream, pause_at_fork)

    def init_replay(
        self, speed: float | None, stream: SessionStream | None, pause_at_fork: bool
    ) -> None:
        """What a replay keeps: its pace, the file still being read, where it forks."""
        self.replay_speed = speed
        self.playback: Playback | None = None
        self._replay_fork: int | None = None
        self._replay_clock = 0.0
        self._replay_timer: Timer | None = None
        self.session_stream = stream
        self._read_done = stream is None or stream.done
        self.load_error: str | None = None
        self._recorded: dict[str, list[TokenStep]] = {"a": [], "b": []}
        self.pause_at_fork = pause_at_fork
        self._paused_at_fork = False
        """The replay has paused at the fork once (space at the end replays and pauses
        again)."""
        self._confirm_timer: Timer | None = None

    # -- layout ---------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Line(id="config-bar")
        with Horizontal(id="controls"):
            yield Input(self._box_stands_for[0], placeholder="prompt", id="prompt")
            yield Button(
                self.prompt_mode,
                id="prompt-mode",
                tooltip="how the prompt box is read: raw text, or a JSON messages list "
                "(a conversation, which chat lanes format); ctrl+o switches",
            )
            yield Select(
                [(pair_option(name, pair), name) for name, pair in self.pairs.items()],
                value=self.pair_name,
                allow_blank=False,
                id="pair",
            )
            yield Static("max tokens", id="max-label")
            yield Input(
                str(self.initial_max_tokens), type="integer", id="max-tokens", tooltip="max tokens"
            )
            yield Button("Run", id="run", variant="primary")
            yield Button("Stop", id="stop", variant="error")
        with Horizontal(id="overrides"):
            for lane_id in ("a", "b"):
                # a label of its own: a placeholder is gone once the field has a value
                yield Static(f"lane {lane_id} overrides", classes="field-label")
                yield Input(
                    visible(self.initial_overrides.get(lane_id, "")),
                    placeholder="key=value …",
                    id=f"lane-{lane_id}-overrides",
                )
        with Lanes(id="lanes"):
            yield LanePane("a")
            yield LanePane("b")
        yield AlignedView(id="aligned")
        yield Panel(id="panel")
        yield Legend(id="legend")
        yield Line(id="status")
        yield FittedFooter()

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

    def on_notify(self, _event: Notify) -> None:
        # one note at a time (this runs before the note is added): a stack of them
        # would reach down over the panel
        self.clear_notifications()

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
        self.show_config()
        if self.session is not None:
            self.show_session(self.session)
        elif self.autostart:
            self.action_run()
        self.query_one("#lanes").focus()
        self.mark_current_lane()
        self.screen_change_signal.subscribe(self, self.screen_changed)

    def screen_changed(self, screen: Screen) -> None:
        """Back on the main screen from help or the palette: the lanes take the keys
        and the current one is lit again (its focus was never handed back to it)."""
        if screen is not self.screen_stack[0]:
            return
        if screen.focused is None or screen.focused.id in ("lanes", "help-box"):
            self.query_one("#lanes").focus()
        self.mark_current_lane()
        self.refresh_bindings()

    async def on_event(self, event: events.Event) -> None:
        # before any binding acts: a key other than r disarms a pending r over a replay,
        # so a later r asks again instead of closing the replay
        if isinstance(event, events.Key) and event.key != "r" and self._confirm_timer:
            self.disarm_run()
        await super().on_event(event)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # space belongs to replays, escape to inputs, c to narrow screens: each is
        # hidden from the footer where it does nothing
        if action == "toggle_pause":
            return self.playback is not None
        if action == "panes":
            return not self.panes_focused or self.has_class("configuring")
        if action == "quit_from_input":
            # only where q would type a q: a focused button passes q on to the app
            return isinstance(self.focused, Input)
        if action == "configure":
            return self.has_class("narrow")
        if action == "stop":
            return None if self.replaying else True
        if action == "fork":
            recorded = self.playback is not None and self._replay_fork is not None
            return self.fork is not None or recorded
        return True

    def on_resize(self, event: events.Resize) -> None:
        # the event's size: this handler runs before the app records the new one
        self.set_class(event.size.height < 30, "short")
        narrow = event.size.width < NARROW_COLUMNS
        self.set_class(narrow, "narrow")
        if not narrow:
            self.remove_class("configuring")
        with suppress(NoMatches):
            # a narrow row gives the prompt the room of the label's second word
            self.query_one("#max-label", Static).update("max" if narrow else "max tokens")
        with suppress(NoMatches):
            self.query_one(Footer).compact = narrow
        self.refresh_bindings()
        # the lanes' stats lines keep what fits the new width
        self.call_after_refresh(self.render_lanes, False)

    # -- focus ----------------------------------------------------------------------
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
        return self._lanes_running

    @running.setter
    def running(self, running: bool) -> None:
        self._set_lanes_running(running)
        if not self.screen_stack:  # not composed yet: no field to stop
            return
        # A blinking cursor repaints its field twice a second, and while lanes stream
        # every frame is CPU their decode threads lose; the cursor stays shown meanwhile.
        for field in self.query(Input):
            if field.has_focus or running:
                field.cursor_blink = not running
            else:
                # an unfocused field's timer would tick, unseen, until it is focused
                field.set_reactive(Input.cursor_blink, True)

    def action_panes(self) -> None:
        """Leave an input (or the open config bar) for the panes, where the keys act."""
        self.remove_class("configuring")
        self.query_one("#lanes").focus()
        self.show_config()

    def action_configure(self) -> None:
        """On a narrow screen: unfold the input rows and put the cursor in the prompt."""
        if not self.has_class("narrow"):
            self.query_one("#prompt", Input).focus()
            return
        self.add_class("configuring")
        self.query_one("#prompt", Input).focus()
        self.refresh_bindings()

    def on_descendant_focus(self) -> None:
        if self.screen_stack:
            self.mark_current_lane()
            self.refresh_bindings()

    def on_descendant_blur(self) -> None:
        # a blur also arrives while the app shuts down, after its last screen is gone
        if self.screen_stack:
            self.mark_current_lane()

    def mark_current_lane(self) -> None:
        """Border and title the current lane's pane (the one `l` switches), lit while
        the panes have focus."""
        focused = self.panes_focused
        for lane_id in ("a", "b"):
            pane = self.query_one(f"#lane-{lane_id}", LanePane)
            current = lane_id == self.cursor_lane
            pane.set_class(current, "current")
            pane.set_class(current and focused, "focused")
            pane.border_title = f"lane {lane_id.upper()}" + (" · current" if current else "")

    def show_config(self) -> None:
        """The one-line config bar of a narrow screen: prompt, pair and max tokens."""
        prompt = " ".join(self.query_one("#prompt", Input).value.split())
        pair = self.query_one("#pair", Select).value
        max_tokens = self.query_one("#max-tokens", Input).value
        overrides = [
            f"{lane_id}: {value}"
            for lane_id in ("a", "b")
            if (value := self.query_one(f"#lane-{lane_id}-overrides", Input).value.strip())
        ]
        mode = [MESSAGES] if self.prompt_mode == MESSAGES else []
        parts = ["c config", str(pair), f"max {max_tokens}", *overrides, *mode, prompt]
        self.query_one("#config-bar", Line).set(visible(" · ".join(parts)))

    # -- state to screen ------------------------------------------------------------
    def palette(self) -> Palette:
        return Palette.from_theme(self.current_theme)

    def watch_theme(self) -> None:
        if self.is_mounted:
            self.render_lanes(follow=False)

    def set_titles(self) -> None:
        for lane_id, other_id in (("a", "b"), ("b", "a")):
            lane, other = getattr(self.pair, lane_id), getattr(self.pair, other_id)
            pane = self.query_one(f"#lane-{lane_id}", LanePane)
            pane.set_title(f"{lane_id.upper()} · {headline(lane, other)}")
            pane.set_stats("")

    def stats_line(self, lane_id: str, width: int | None = None) -> str:
        """The lane's numbers, as many whole ones as fit `width` when given (the error is
        in full under the lane's tokens)."""
        state = self.lanes[lane_id]
        parts = [counted(len(state.steps), "token")]
        if state.steps:  # a lane with no tokens has no rate to speak of
            parts.append(f"{state.speed:.1f} tok/s")
        if state.error:
            parts.insert(0, "ERROR")
        elif self.stopped_by not in (None, lane_id):
            parts.insert(0, f"stopped: lane {self.stopped_by} failed")
        if getattr(self.pair, lane_id).speculative and state.drafted:
            parts.append(f"{state.accepted / state.drafted:.0%} accepted")
        ties = sum(1 for step in state.steps if step.margin < self.near_tie)
        parts.append(counted(ties, "near tie"))
        grades = self.session.footer.grades if self.session and self.session.footer else None
        grade = grades[0 if lane_id == "a" else 1] if grades else None
        if grade is not None:
            parts.insert(1, "PASS" if grade.passed else "FAIL")
            parts.append(f"graded: {grade.reason}")
        return " · ".join(parts) if width is None else fitted(parts, width)

    def marks(self, lane_id: str) -> TokenMarks:
        return TokenMarks(
            palette=self.palette(),
            threshold=self.near_tie,
            fork_index=self.fork.index if self.fork is not None else None,
            cursor=self.cursor if lane_id == self.cursor_lane else None,
            changed_after_fork=frozenset(self.changed[lane_id]),
            forecast=pending_forecast(
                self.lanes[lane_id].steps,
                len(self.lanes["b" if lane_id == "a" else "a"].steps),
                self.fork is not None,
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
        for lane_id, state in self.lanes.items():
            pane = self.query_one(f"#lane-{lane_id}", LanePane)
            marks = self.marks(lane_id)
            forecast_shown = forecast_shown or bool(marks.forecast)
            pane.show_tokens(state, marks, follow=follow, strip=details)
            if details:
                # before the first layout a pane has no width: the screen's stands in
                width = pane.content_size.width - 2 if pane.content_size.width else self.size.width
                pane.set_stats(self.stats_line(lane_id, width))
        if not details:
            return
        self.query_one(Legend).show_forecast(forecast_shown)
        aligned = self.query_one("#aligned", AlignedView)
        if aligned.display:
            aligned.show(self.lanes, {lane_id: self.marks(lane_id) for lane_id in self.lanes})
        self.render_panel()

    def render_panel(self) -> None:
        index = (
            self.cursor
            if self.cursor is not None
            else (self.fork.index if self.fork is not None else None)
        )
        a_steps, b_steps = self.lanes["a"].steps, self.lanes["b"].steps
        view = PanelView(
            index,
            a_steps[index] if index is not None and index < len(a_steps) else None,
            b_steps[index] if index is not None and index < len(b_steps) else None,
            self.fork,
            self.similarity,
            max(len(a_steps), len(b_steps)),
            self.near_tie,
            near_ties_before(a_steps, self.near_tie, self.fork),
            lane_differences(self.pair),
        )
        self.query_one("#panel", Panel).show(view)

    def _set_lanes_running(self, running: bool) -> None:
        # Python's full collection walks every object the app holds (about 100,000): one
        # took ~50 ms of the UI thread mid-run, and the lanes' decode threads share its
        # cores. While lanes run, what exists already is set aside (gc.freeze), so a
        # collection walks only what the run made.
        if running and not self._lanes_running:
            gc.collect()
            gc.freeze()
        elif not running and self._lanes_running:
            gc.unfreeze()
        self._lanes_running = running

    @property
    def shutting_down(self) -> bool:
        """The app is closing: its widgets are being removed, and what the generation
        thread posted before it was stopped (a run that started or ended as the user
        quit) finds nothing to draw on."""
        return not self.is_running

    def set_status(self, text: str) -> None:
        self._status = text
        self.query_one("#status", Line).set(text)

    def note(self, text: str) -> None:
        """A routine note (theme, fork found, nothing further): said first in the status
        line, before what it said; toasts are for errors, as they sit over the panes."""
        self.query_one("#status", Line).set(f"{text} · {self._status}" if self._status else text)

    def find_fork(self, announce: bool = True) -> bool:
        """Look for the fork in what has arrived; True when it was found just now."""
        a, b = self.lanes["a"].steps, self.lanes["b"].steps
        if self.fork is None and first_divergence(a, b) is not None:
            self.fork = fork_at(a, b)
            self.refresh_bindings()  # the footer offers d from now on
            if announce:
                self.note(f"lanes forked at token {self.fork.index}")
            self.scroll_to_fork()
            return True
        return False

    def scroll_to_fork(self) -> None:
        """Keep the fork in view in both panes: later tokens no longer drag the panes
        to the end (d, n, p and the arrows still move them)."""
        if self.fork is None:
            return
        self.follow = False
        # the cursor sits on the fork, so that ←/→, n and p go on from there
        self.cursor = self.fork.index

        def scroll() -> None:
            # the fork as it is once the panes are laid out: another session may have
            # replaced the one this was asked for
            if self.fork is None or self.follow:
                return
            for lane_id in ("a", "b"):
                shown = len(self.lanes[lane_id].steps)
                if shown:
                    pane = self.query_one(f"#lane-{lane_id}", LanePane)
                    pane.scroll_to_token(min(self.fork.index, shown - 1))

        self.call_after_refresh(scroll)

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

    def align_while_streaming(self) -> None:
        """Diff colours from the moment the lanes fork. The alignment's cost grows with
        the square of the tokens after the fork, so it waits long enough after each
        redo to take at most ALIGN_COST_SHARE of the UI thread: long runs keep their speed."""
        now = time.monotonic()
        if self.fork is None or now < self._next_alignment:
            return
        self.update_comparison(announce=False)
        self._next_alignment = now + (time.monotonic() - now) / ALIGN_COST_SHARE

    def reset_view(self) -> None:
        """What a run (or a session) on screen holds: nothing yet."""
        self.lanes = {"a": LaneState("a"), "b": LaneState("b")}
        self.fork: Fork | None = None
        self.stopped_by: str | None = None
        """The lane whose failure stopped the run: the other lane's pane says so."""
        self.changed: dict[str, set[int]] = {"a": set(), "b": set()}
        self.similarity: float | None = None
        self.result: PairResult | None = None
        self.cursor: int | None = None
        self.follow = True

    def show_session(self, session: Session) -> None:
        """Show a recorded run (no model needed): at once, or played back."""
        self.stop_playback()
        self.reset_view()
        self.session = session
        self.pair = session.pair
        self.set_titles()
        self.lock_replay_controls(True)
        speeds = session.footer.tokens_per_second if session.footer else (0.0, 0.0)
        for lane_id, speed in zip(("a", "b"), speeds):
            self.lanes[lane_id].speed = float(speed)
        if self.replay_speed is None:
            for lane_id in ("a", "b"):
                self.lanes[lane_id].extend(session.steps[lane_id])
            self.update_comparison(announce=False)
            self.render_lanes(follow=False)
            self.set_status(self.shown_status())
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

    def shown_status(self) -> str:
        """The status of a session shown whole (--instant): what it is and what to press."""
        keys = "d jumps to the fork · " if self.fork is not None else ""
        return f"{keys}e writes a report · {self.session_summary()}"

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
                self.set_status(self.shown_status())
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
        if due and self.pause_at_fork and not self._paused_at_fork:
            due = self.up_to_fork(due)
        if due:
            try:
                self.show_replayed(due)
            except NoMatches:
                self.stop_playback()  # the app is closing: its panes are gone

    def up_to_fork(self, due: list[TokenStep]) -> list[TokenStep]:
        """The steps of `due` until both lanes show the fork's token; those after it are
        handed back to the playback, which pauses (`--pause-at-fork`)."""
        playback, fork = self.playback, self._replay_fork
        if playback is None or fork is None:
            return due
        shown = {lane_id: len(state.steps) for lane_id, state in self.lanes.items()}
        wanted = {lane_id: min(fork + 1, len(steps)) for lane_id, steps in self._recorded.items()}
        for kept, step in enumerate(due, start=1):
            shown[step.lane] += 1
            if all(shown[lane_id] >= wanted[lane_id] for lane_id in shown):
                for _ in due[kept:]:
                    playback.back()
                playback.paused = True
                self._paused_at_fork = True
                return due[:kept]
        return due

    def show_replayed(self, steps: list[TokenStep]) -> None:
        for step in steps:
            self.lanes[step.lane].extend((step,))
        if self.playback is not None and self.playback.finished and not self.loading:
            self.update_comparison(announce=self.fork is None)
            self.render_lanes(follow=self.follow)
        else:
            found = self.find_fork()
            self.align_while_streaming()
            # caught up with the file read so far: nothing may come for a while
            caught_up = self.playback is not None and self.playback.finished
            self.render_lanes(follow=self.follow, details=found or caught_up or self.panel_due())
        self.replay_status()

    def replay_status(self) -> None:
        playback = self.playback
        if playback is None:
            return
        shown, total = playback.position, len(playback.steps)
        total_text = f"{total}+" if self.loading else str(total)
        jump = " · d jumps to the fork" if self._replay_fork is not None else ""
        if playback.finished and not playback.paused and self.loading:
            state, keys = "waiting for the file", "space pauses"
        elif playback.finished and not playback.paused:
            state, keys = "replayed", f"space plays it again{jump}"
        elif playback.paused and self.fork is not None and self._paused_at_fork:
            state, keys = "paused at the fork", "space resumes · ←/→ step a token"
        elif playback.paused:
            state, keys = "paused", "space resumes · ←/→ step a token"
        else:
            state, keys = f"replaying at {playback.speed:g}x", f"space pauses{jump}"
        summary = self.session_summary()
        if self.load_error is not None:
            summary = f"{summary} {self.load_error}"
        # the keys first: a narrow status line keeps what to press
        self.set_status(f"{state}: {keys} · {shown}/{total_text} steps of {summary}")

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
            self.note("space pauses a replay (specdiff replay FILE)")
            return
        if playback.finished and not playback.paused and not self.loading:
            playback.restart()
            self._paused_at_fork = False  # a demo played again pauses at the fork again
            self.reset_view_keeping_speeds()
            self.render_lanes(follow=True)
        else:
            playback.paused = not playback.paused
            self._replay_clock = time.monotonic()
            if not playback.paused:
                self.follow = True
                self.cursor = None
                self.render_lanes(follow=True)
            else:
                # a frame may have left the details behind the tokens it drew
                self.render_lanes(follow=self.follow)
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
                self.note("the end of the session")
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
                self.note("the start of the session")
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
    def box_text(self) -> str:
        """The prompt box's text: what an unedited box stands for, else what it holds."""
        value = self.query_one("#prompt", Input).value
        shown, text = self._box_stands_for
        if value == shown:
            return text
        # JSON spells its own escapes: a messages list is read as typed
        return from_one_line(value) if self.prompt_mode == TEXT else value

    def box_prompt(self) -> str:
        """The prompt the box gives in its mode: text, or a checked conversation."""
        text = self.box_text()
        if not text.strip():
            raise SpecdiffError("the prompt is empty; type some text to continue")
        if self.prompt_mode == TEXT:
            return text
        try:
            return typed_messages(text)
        except SpecdiffError as error:
            raise SpecdiffError(f"{error} (ctrl+o: send as text)") from None

    def set_box(self, text: str) -> None:
        shown = on_one_line(text)
        self._box_stands_for = (shown, text)
        self.query_one("#prompt", Input).value = shown

    def action_toggle_prompt_mode(self) -> None:
        """Read the prompt box the other way. Plain text becomes a conversation of one
        user message, and a conversation of one user message becomes its text, so the
        prompt stays the same; anything else stays as typed."""
        text = self.box_text()
        if self.prompt_mode == TEXT:
            self.prompt_mode = MESSAGES
            if not looks_like_messages(text):
                with suppress(SpecdiffError):
                    self.set_box(shown_prompt(one_message(text)))
            note = "the prompt box is read as a JSON messages list"
        else:
            self.prompt_mode = TEXT
            with suppress(SpecdiffError):
                messages = typed_messages(text).messages
                if len(messages) == 1 and messages[0].role == "user":
                    self.set_box(messages[0].content)
            note = "the prompt box is read as raw text"
        self.query_one("#prompt-mode", Button).label = self.prompt_mode
        self.show_config()
        self.note(f"{note} (ctrl+o switches)")

    @on(Button.Pressed, "#prompt-mode")
    def prompt_mode_pressed(self) -> None:
        self.action_toggle_prompt_mode()

    def resolve_pair(self) -> tuple[Pair, str, int]:
        prompt = self.box_prompt()
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
        lanes = {}
        for lane_id in ("a", "b"):
            typed = self.query_one(f"#lane-{lane_id}-overrides", Input).value
            try:
                # a value keeps its spaces: serve-pair's labels and a JSON request hold them
                overrides = parse_overrides(override_words(typed))
                lanes[lane_id] = apply_overrides(getattr(base, lane_id), overrides)
            except SpecdiffError as error:
                raise SpecdiffError(f"lane {lane_id} overrides: {error}") from None
        pair = replace(base, a=lanes["a"], b=lanes["b"])
        return pair, prompt, max_tokens

    def action_run(self) -> None:
        if self.running:
            self._restart = True
            self.cancel.set()
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
            pair, prompt, max_tokens = self.resolve_pair()
        except SpecdiffError as error:
            self.notify(str(error), severity="error", timeout=8)
            self.set_status(f"not started: {error}")
            return
        self.stop_playback()
        self.session = None
        self._saved_path = None
        self.lock_replay_controls(False)
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

    def forget_confirmation(self) -> None:
        if self._confirm_timer is not None:
            self._confirm_timer.stop()
            self._confirm_timer = None

    def disarm_run(self) -> None:
        """Forget a pending r over a replay and put back the replay's own status."""
        self.forget_confirmation()
        if self.playback is not None:
            self.replay_status()
        elif self.session is not None:
            self.set_status(self.shown_status())

    def lock_replay_controls(self, replaying: bool) -> None:
        """While a replay is shown, what would discard it (Run, Stop, lane overrides)
        is disabled; `r` asks first."""
        for selector in ("#run", "#stop", "#lane-a-overrides", "#lane-b-overrides"):
            self.query_one(selector).disabled = replaying
        self.refresh_bindings()

    @work(thread=True, exclusive=True, group="generation", exit_on_error=False)
    def generate(self, pair: Pair, prompt: str, max_tokens: int) -> None:
        worker = get_current_worker()
        self._loading_lane = None
        try:
            runner = self.runner_for(pair)
            self._loading_lane = None  # both loaded: what fails now is the pair's
            tokens = runner.tokenize(prompt)
            self.post_message(RunStarted(len(tokens)))
            buffer = []
            last = time.monotonic()
            stream = runner.stream(prompt, max_tokens, near_tie=self.near_tie, control=self.control)
            for step in stream:
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
            text = str(error)
            self.post_message(RunFailed(text, failed_lane(pair, text, self._loading_lane)))

    def runner_for(self, pair: Pair) -> PairWorker:
        """Reuse loaded lanes while the pair stays the same and their process lives (runs
        in the worker thread); after a crash the next run starts a fresh one."""
        if self._runner is not None and self._runner.pair == pair and self._runner.alive:
            return self._runner
        if self._runner is not None:
            self._runner.close()
            self._runner = None
        self._runner = PairWorker(pair, self.loading_progress, self.cancel, READ_EVERY)
        return self._runner

    def loading_progress(self, text: str) -> None:
        """A line of the lanes' loading (in the worker thread): shown in the status, and
        the lane it names kept, so a failure to load is shown in that lane's pane."""
        for lane_id in ("a", "b"):
            if text.startswith(f"loading lane {lane_id}"):
                self._loading_lane = lane_id
        self.call_from_thread(self.set_status, text)

    def on_run_started(self, message: RunStarted) -> None:
        if self.shutting_down:
            return
        self._last_frame = None  # the first tokens are drawn as they come
        self.set_status(
            f"generating: {message.prompt_tokens}-token prompt, up to "
            f"{self.max_tokens} tokens per lane"
        )

    def on_steps_arrived(self, message: StepsArrived) -> None:
        if self.shutting_down:
            return
        by_lane: dict[str, list] = {"a": [], "b": []}
        for step in message.steps:
            by_lane[step.lane].append(step)
        for lane_id, steps in by_lane.items():
            state = self.lanes[lane_id]
            state.extend(steps)
            state.speed, state.drafted, state.accepted = message.live.get(lane_id, (0.0, 0, 0))
        if not self.frame_due():
            # drawn with the next batch, or by this timer if none comes (lane a's control
            # run after the pair sends nothing for a while)
            if self._pending_frame is None:
                self._pending_frame = self.set_timer(FRAME_GAP_MAX, self.draw_pending)
            return
        self.draw_streamed()

    def draw_pending(self) -> None:
        """Steps held back from a frame, drawn once no batch has come to bring them."""
        self._pending_frame = None
        if self.running:
            self._last_frame = (time.monotonic(), time.thread_time())
            self.draw_streamed()

    def draw_streamed(self) -> None:
        """The steps that have arrived, as a streaming frame draws them."""
        if self._pending_frame is not None:
            self._pending_frame.stop()
            self._pending_frame = None
        # While streaming only new tokens are drawn; the alignment after the fork is
        # drawn once the run ends, the details at the fork and once a panel period.
        found = self.find_fork()
        self.align_while_streaming()
        self.render_lanes(follow=self.follow, details=found or self.panel_due())

    def frame_due(self) -> bool:
        """Whether streamed steps are drawn now: not while the UI thread has used more
        than FRAME_CPU_SHARE of a core since the last frame (unless FRAME_GAP_MAX has
        passed)."""
        now, cpu = time.monotonic(), time.thread_time()
        if self._last_frame is not None:
            elapsed, used = now - self._last_frame[0], cpu - self._last_frame[1]
            if elapsed < FRAME_GAP_MAX and used > FRAME_CPU_SHARE * elapsed:
                return False
        self._last_frame = (now, cpu)
        return True

    def panel_due(self) -> bool:
        """True at most once every PANEL_SECONDS: the panel's count of tokens shown
        keeps up with streaming lanes without a redraw per batch."""
        now = time.monotonic()
        if now < self._next_panel:
            return False
        self._next_panel = now + PANEL_SECONDS
        return True

    def on_run_finished(self, message: RunFinished) -> None:
        if self.shutting_down:
            return
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
            lengths = (counted(comparison.length_a, "token"), counted(comparison.length_b, "token"))
            summary = f"forked at token {comparison.fork.index} (a {lengths[0]}, b {lengths[1]})"
        else:
            summary = "same tokens, different lengths"
        control = control_brief(result.summary())
        summary += f" · {control}" if control else ""
        speed = f" · speed a/b {result.speedup:.2f}x" if result.speedup else ""
        jump = "d jumps to the fork · " if self.fork is not None else ""
        # the keys first: a narrow status line keeps what to press
        self.set_status(f"{jump}s saves · e writes a report · {summary}{speed}")
        if self._restart:
            self._restart = False
            self.action_run()

    def on_run_failed(self, message: RunFailed) -> None:
        if self.shutting_down:
            return
        self.running = False
        self._restart = False
        # an error that opens with its lane ("lane a asks for ...") names it already
        named = not message.lane or message.error.startswith(f"lane {message.lane}")
        where = "" if named else f"lane {message.lane}: "
        self.notify(f"{where}{message.error}", severity="error", timeout=10)
        self.set_status(f"failed: {where}{message.error}")
        for lane_id in (message.lane,) if message.lane else ("a", "b"):
            self.lanes[lane_id].error = message.error
        self.stopped_by = message.lane
        self.render_lanes(follow=False)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if self.shutting_down:
            return
        if event.state == WorkerState.ERROR:
            self.running = False
            self.render_lanes(follow=self.follow)  # steps held back from a frame
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
        # Enter hands the keys back to the panes: a `d` typed next must jump, not type
        self.action_panes()
        self.action_run()

    @on(Select.Changed, "#pair")
    def pair_chosen(self) -> None:
        if self.is_mounted:
            self.show_config()
            if self.focused is not None and self.focused.id == "pair":
                self.action_panes()

    # -- navigation -----------------------------------------------------------------
    def move_cursor(self, lane_id: str, index: int | None, scroll_both: bool = False) -> None:
        self.cursor_lane = lane_id
        self.cursor = index
        self.follow = False
        self.mark_current_lane()
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
            self.note("no fork: the lanes agree so far")
            return
        self.move_cursor(self.cursor_lane, self.fork.index, scroll_both=True)

    def near_ties(self) -> tuple[int, ...]:
        return find_near_ties(self.lanes[self.cursor_lane].steps, self.near_tie)

    def action_next_tie(self) -> None:
        ties = self.near_ties()
        later = [i for i in ties if self.cursor is None or i > self.cursor]
        if not later:
            self.note(f"no near tie after this in lane {self.cursor_lane}")
            return
        self.move_cursor(self.cursor_lane, later[0])

    def action_previous_tie(self) -> None:
        ties = self.near_ties()
        earlier = [i for i in ties if self.cursor is not None and i < self.cursor]
        if not earlier:
            self.note(f"no near tie before this in lane {self.cursor_lane}")
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

    def action_toggle_aligned(self) -> None:
        """Swap the panes for the aligned view (shared prefix collapsed, the branches
        stacked), or back."""
        aligned, lanes = self.query_one("#aligned", AlignedView), self.query_one("#lanes")
        aligned.display, lanes.display = not aligned.display, aligned.display
        (aligned if aligned.display else lanes).focus()
        self.render_lanes(follow=False)

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
        self._saved_path = path
        self.set_status(f"saved {path}")

    def output_folder(self) -> Path:
        """Where reports and screenshots go: the sessions folder (made when missing)."""
        folder = sessions_dir(self.sessions_dir)
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def session_on_screen(self) -> Session:
        """The recorded session shown, or the finished live run saved as one."""
        if self.session is not None:
            return self.session
        if self.running:
            raise SpecdiffError("the run is still going: wait for it or stop it (x), then e")
        if self.result is None:
            raise SpecdiffError("nothing to report yet: run a pair first (r)")
        if self._saved_path is None:
            self._saved_path = save_result(self.result, self.sessions_dir)
        return load_session(self._saved_path)

    def action_export(self) -> None:
        """Write the HTML report of the session on screen and say where it went."""
        # deferred: the report renderer loads only when a report is asked for
        from specdiff.reports.export import export_session, write_report

        try:
            session = self.session_on_screen()
            folder = self.output_folder()
            path = free_path(folder, session.path.stem, ".html")
            write_report(export_session(session, "html", self.near_tie), path)
        except (OSError, SpecdiffError) as error:
            self.notify(f"no report written: {error}", severity="error", timeout=8)
            return
        self.set_status(f"report written: {path}")

    def deliver_screenshot(
        self,
        filename: str | None = None,
        path: str | None = None,
        time_format: str | None = None,
    ) -> str | None:
        # Textual saves to ~/Downloads by default, which need not exist
        try:
            folder = Path(path) if path else self.output_folder()
        except OSError as error:
            self.notify(f"no screenshot saved: {error}", severity="error", timeout=8)
            return None
        key = super().deliver_screenshot(filename, str(folder), time_format)
        self.set_status(f"screenshot saved in {folder}")
        return key

    def action_next_theme(self) -> None:
        names = self.our_themes
        if not names:
            return
        position = names.index(self.theme) if self.theme in names else -1
        self.theme = names[(position + 1) % len(names)]
        self.note(f"theme {self.theme}")

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    async def action_quit(self) -> None:
        self.cancel.set()
        self.exit(0)

    async def action_quit_from_input(self) -> None:
        await self.action_quit()

    def on_unmount(self) -> None:
        # quitting mid-run: what the run set aside from collection is given back (the
        # `running` setter would restyle fields that are gone)
        self._set_lanes_running(False)
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
        yield SystemCommand(
            "Write report", "The HTML report of what is on screen", self.action_export
        )
        yield SystemCommand("Next theme", "Cycle specdiff's themes", self.action_next_theme)
        yield SystemCommand("Help", "Every key binding", self.action_help)


LANE_NAMED = re.compile(r"\blane ([ab])\b")
"""A lane named in an error: "lane a" or "lane b" as words, not "a lane asks" or "lane and"."""


def failed_lane(pair: Pair, error: str, loading: str | None) -> str | None:
    """Whose failure `error` is: the lane it names (as "lane a", or by its model file:
    models are checked before either lane loads), else the lane being loaded; None when
    it names both lanes (vocabularies that differ) or neither and no lane was loading."""
    named = set(LANE_NAMED.findall(error))
    if not named:
        lanes = (("a", pair.a), ("b", pair.b))
        named = {
            lane_id
            for lane_id, lane in lanes
            for model in (lane.model, lane.draft_model)
            if model and model != "default" and str(Path(model).expanduser()) in error
        }
    if len(named) == 1:
        return named.pop()
    return None if named else loading


def free_path(folder: Path, stem: str, suffix: str) -> Path:
    """`folder/stem+suffix`, or with -2, -3 … added: a report never replaces another."""
    path = folder / f"{stem}{suffix}"
    number = 2
    while path.exists():
        path = folder / f"{stem}-{number}{suffix}"
        number += 1
    return path


def make_app(*args: Any, **kwargs: Any) -> SpecdiffApp:
    """The one way the CLI and the tests build the app; arguments as SpecdiffApp's."""
    return SpecdiffApp(*args, **kwargs)
