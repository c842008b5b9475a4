"""The specdiff app: themes, the keys that work everywhere (help, quit, theme), the
command palette, notes and screenshots. What is compared lives on its one screen,
`screen.CompareScreen`.

The app only renders records: a worker process runs the lanes, the fork, near ties and
alignment come from ``compare.py``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from textual import events
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.filter import LineFilter
from textual.notifications import Notify, SeverityLevel
from textual.screen import Screen
from textual.widgets import Input

from specdiff.compare import DEFAULT_NEAR_TIE
from specdiff.lanes import Pair
from specdiff.safe_text import visible
from specdiff.sessions.store import Session, SessionStream
from specdiff.tui.help import HelpScreen
from specdiff.tui.live import SWITCH_INTERVAL
from specdiff.tui.messages import Noted, StatusChanged
from specdiff.tui.options import CompareOptions
from specdiff.tui.output import screenshot_name
from specdiff.tui.paths import line_with_path
from specdiff.tui.screen import CompareScreen
from specdiff.tui.themes import APP_VARIABLES, DEFAULT_THEME, load_themes
from specdiff.tui.widgets.without_controls import WithoutControls

WITHOUT_CONTROLS = WithoutControls()
PALETTE_COMMANDS = (
    ("Run", "run the pair on the prompt (over a replay: press r twice)", "run"),
    ("Stop", "stop both lanes", "stop"),
    ("Jump to the fork", "the first token the lanes differ at, in both panes", "go('fork')"),
    ("Explain the fork", "why the lanes fork: the setting, layer and operation", "explain"),
    ("Next near tie", "in the current lane", "go('next_tie')"),
    ("Previous near tie", "in the current lane", "go('previous_tie')"),
    ("Switch lane", "move the cursor to the other lane", "go('other_lane')"),
    ("Aligned view", "the shared text folded, the two branches stacked", "toggle_aligned"),
    ("Save session", "write the run as a session file", "save"),
    ("Write report", "the HTML report of what is on screen", "export"),
    ("Next theme", "cycle specdiff's themes", "app.next_theme"),
    ("Help", "every key, and what each colour and mark means", "app.help"),
    ("Quit", "leave specdiff", "app.quit"),
)
"""The command palette: (title, what it does, the action, as the compare screen binds it)."""


class SpecdiffApp(App[int]):
    CSS_PATH = "app.tcss"
    TITLE = "specdiff"
    # Help and quit come first so that a narrow footer, which cuts from the right, keeps
    # them. An input takes printable keys, so while one has focus the footer shows f1 and
    # ctrl+q in their place.
    BINDINGS = [
        Binding("question_mark", "help", "help"),
        Binding("f1", "help", "help"),
        Binding("q", "quit", "quit"),
        # ctrl+q is shown only while an input has focus (where q types a q)
        Binding("ctrl+q", "quit_from_input", "quit"),
        Binding("ctrl+q", "quit", "quit", show=False),
    ]

    def __init__(
        self,
        options: CompareOptions,
        theme_name: str | None = None,
        theme_dirs: list[Path] | None = None,
    ) -> None:
        """`options`: what the compare screen opens with; `theme_name`: the theme asked
        for (the default one when None); `theme_dirs`: folders of theme files besides
        specdiff's own."""
        super().__init__()
        self.requested_theme = theme_name
        self.theme_dirs = theme_dirs
        self.our_themes: list[str] = []
        self.compare = CompareScreen(options)

    def get_default_screen(self) -> Screen[Any]:
        return self.compare

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

    async def on_event(self, event: events.Event) -> None:
        # before any binding acts, on whichever screen
        if isinstance(event, events.Key):
            self.compare.key_seen(event.key)
        await super().on_event(event)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # quit is offered once: as q, or as ctrl+q where an input (the prompt box, the
        # palette's) takes the q; a focused button passes q on to the app
        if action == "quit_from_input":
            return isinstance(self.focused, Input)
        if action == "quit":
            return not isinstance(self.focused, Input)
        return True

    def deliver_screenshot(
        self,
        filename: str | None = None,
        path: str | None = None,
        time_format: str | None = None,
    ) -> str | None:
        # Textual saves to ~/Downloads by default, which need not exist; specdiff's go to
        # a screenshots folder of their own, and the status line names the file
        try:
            folder = Path(path) if path else self.compare.output.screenshots_folder()
        except OSError as error:
            self.notify(f"no screenshot saved: {error}", severity="error", timeout=8)
            return None
        name = filename or screenshot_name(folder)
        key = super().deliver_screenshot(name, str(folder), time_format)
        said = line_with_path("screenshot saved: ", folder / name, "", self.size.width)
        self.compare.apply([StatusChanged(said)])
        return key

    def action_next_theme(self) -> None:
        names = self.our_themes
        if not names:
            return
        position = names.index(self.theme) if self.theme in names else -1
        self.theme = names[(position + 1) % len(names)]
        self.compare.apply([Noted(f"theme {self.theme}")])

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    async def action_quit(self) -> None:
        # a run, a replay and an autopsy stop with the app (a busy worker is killed)
        self.compare.close()
        self.exit(0)

    async def action_quit_from_input(self) -> None:
        await self.action_quit()

    def on_unmount(self) -> None:
        self.compare.close()

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        # specdiff's own commands only, each with the key that does the same: the
        # palette teaches the keys (Textual's generic commands are not offered)
        keys: dict[str, Binding] = {}
        for binding in self.compare.BINDINGS:
            if isinstance(binding, Binding) and binding.show:
                keys.setdefault(binding.action, binding)  # the first key: ? before f1
        for title, does, action in PALETTE_COMMANDS:
            namespace = None if action.startswith("app.") else self.compare
            callback = partial(self.run_action, action, namespace)
            bound = keys.get(action)
            key = f" ({self.get_key_display(bound)})" if bound is not None else ""
            yield SystemCommand(f"{title}{key}", does, callback)

    @property
    def load_error(self) -> str | None:
        """Why a replayed session's file could not be read to its end (the command line
        reports it once the app has closed)."""
        return self.compare.replay.load_error


def make_app(
    pairs: Mapping[str, Pair],
    pair_name: str,
    prompt: str,
    max_tokens: int,
    *,
    near_tie: float = DEFAULT_NEAR_TIE,
    theme_name: str | None = None,
    autostart: bool = True,
    session: Session | None = None,
    sessions_dir: str | Path | None = None,
    theme_dirs: list[Path] | None = None,
    replay_speed: float | None = None,
    session_stream: SessionStream | None = None,
    refused_pairs: Mapping[str, str] | None = None,
    pause_at_fork: bool = False,
    overrides: Mapping[str, str] | None = None,
    control: bool = False,
    compare_machine: bool = False,
) -> SpecdiffApp:
    """The one way the command line and the tests build the app: the compare screen's
    `CompareOptions` (which say what each of these is) and the theme."""
    options = CompareOptions(
        pairs,
        pair_name,
        prompt,
        max_tokens,
        near_tie=near_tie,
        autostart=autostart,
        session=session,
        sessions_dir=sessions_dir,
        replay_speed=replay_speed,
        session_stream=session_stream,
        refused_pairs=refused_pairs or {},
        pause_at_fork=pause_at_fork,
        overrides=overrides or {},
        control=control,
        compare_machine=compare_machine,
    )
    return SpecdiffApp(options, theme_name, theme_dirs)
