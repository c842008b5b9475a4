"""The compare screen's `w` ("why?"): the fork autopsy of the run on screen, in the
panel's place.

The autopsy is `specdiff explain`'s: the same engine entry point (`explain_pair`) run the
same way, in a worker process through `call_in_worker`, so llama.cpp never loads in the
TUI's process and a native crash ends the autopsy, not the app. A thread of the app
waits on that process and hands its progress lines to the panel. A replayed session
whose autopsy was saved beside it (`specdiff explain SESSION --save`) is shown from
that file, without a model. What cannot be explained (server lanes, lanes that agree,
a model file that is gone) is one line in the status bar.
"""

from __future__ import annotations

import threading
from contextlib import suppress
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from textual.actions import SkipAction
from textual.css.query import NoMatches

from specdiff.autopsy import (
    Autopsy,
    AutopsyError,
    AutopsyInterrupted,
    load_saved,
    missing_model,
    saved_beside,
)
from specdiff.errors import SpecdiffError
from specdiff.lanes import Pair
from specdiff.safe_text import visible
from specdiff.tui.paths import elided_path
from specdiff.tui.widgets.autopsy_panel import AutopsyPanel

if TYPE_CHECKING:
    from specdiff.tui.screen import CompareScreen

MAX_RUNS = 8
"""Runs of the pair the settings sweep may make: `specdiff explain`'s default."""
CHECK_SECONDS = 0.5
"""How often a shown autopsy checks that the run it explains is still the one on screen."""
SERVER_LANES = (
    "w explains in-process lanes only: it traces layers with llama.cpp's eval callback, "
    "which a server does not offer (specdiff explain --help)"
)


@dataclass(frozen=True)
class Target:
    """What an autopsy is of: the pair, prompt and budget of the run on screen."""

    pair: Pair
    prompt: str
    max_tokens: int
    fork: int
    session_path: Path | None


class ForkExplainer:
    """Starts, cancels and shows the autopsy of the fork on the compare screen."""

    def __init__(self, screen: CompareScreen) -> None:
        self.screen = screen
        self.cancel = threading.Event()
        self.running: Target | None = None
        self.shown: tuple[Target, Autopsy] | None = None
        self.shown_over: tuple[object, object] = (None, None)
        self.started_over: tuple[object, object] = (None, None)
        """The session and live result on screen when the autopsy was shown."""
        self.progress_done = 0

    # -- the panel

    @property
    def panel(self) -> AutopsyPanel:
        return self.screen.query_one("#autopsy", AutopsyPanel)

    async def mounted_panel(self) -> AutopsyPanel:
        """The panel, mounted (with its parts) the first time it is wanted."""
        try:
            return self.panel
        except NoMatches:
            panel = AutopsyPanel(id="autopsy")
            await self.screen.mount(panel, after="#panel")
            self.screen.set_interval(CHECK_SECONDS, self.check_still_current)
            return panel

    @property
    def panel_open(self) -> bool:
        with suppress(NoMatches):
            return bool(self.screen.query_one("#autopsy", AutopsyPanel).display)
        return False

    def open_panel(self) -> AutopsyPanel:
        panel = self.panel
        panel.display = True
        self.screen.query_one("#panel").display = False
        return panel

    def close_panel(self) -> None:
        with suppress(NoMatches):
            self.screen.query_one("#autopsy", AutopsyPanel).display = False
            self.screen.query_one("#panel").display = True

    # -- keys

    async def toggle(self) -> None:
        """`w`: stop an autopsy being made, close one shown, else make (or show) one."""
        await self.mounted_panel()
        if self.running is not None:
            self.stop()
            return
        if self.panel_open:
            self.close_panel()
            return
        target = self.target()
        if isinstance(target, str):
            self.screen.note(target)
            return
        if self.shown is not None and self.shown[0] == target:
            self.show(*self.shown)
            return
        saved = self.saved_for(target)
        if saved is not None:
            self.show(target, saved)
            return
        problem = refusal(target)
        if problem is not None:
            self.screen.note(problem)
            return
        self.start(target)

    def escape(self) -> None:
        """Escape over the panes: stop an autopsy being made, or close one shown."""
        if self.running is not None:
            self.stop()
        elif self.panel_open:
            self.close_panel()
        else:
            raise SkipAction()

    # -- what to explain

    def target(self) -> Target | str:
        """The run on screen as an autopsy target, or the one line saying why there is
        none yet."""
        screen = self.screen
        if screen.running:
            return "w explains a finished run: wait for it to end (x stops it)"
        session = screen.session
        if session is not None:
            prompt, max_tokens = session.prompt, session.header.max_tokens
            comparison = session.comparison()
        elif screen.view.result is not None:
            result = screen.view.result
            prompt, max_tokens, comparison = result.prompt, result.max_tokens, result.comparison
        else:
            return "w explains a fork: run the pair first (r)"
        fork = comparison.fork.index if comparison.fork is not None else -1
        path = session.path if session is not None else None
        return Target(screen.pair, prompt, max_tokens, fork, path)

    def saved_for(self, target: Target) -> Autopsy | None:
        """The autopsy saved beside the session on screen, if there is one that reads."""
        if target.session_path is None:
            return None
        path = saved_beside(target.session_path)
        if not path.is_file():
            return None
        try:
            autopsy = load_saved(path)
        except AutopsyError as error:
            self.screen.notify(str(error), severity="warning", timeout=8)
            return None
        if autopsy.pair != target.pair.name:
            self.screen.notify(
                f"{visible(path.name)} explains pair {visible(autopsy.pair, 40)}, not "
                f"{visible(target.pair.name, 40)}: not shown",
                severity="warning",
                timeout=8,
            )
            return None
        return autopsy

    # -- making one

    def on_screen(self) -> tuple[object, object]:
        """What identifies the run on screen: its session, or its live result."""
        return (self.screen.session, self.screen.view.result)

    def start(self, target: Target) -> None:
        self.running = target
        self.started_over = self.on_screen()
        self.cancel.clear()
        self.progress_done = 0
        self.open_panel().show_progress(
            self.title(target, "explaining"), "starting the engine…", 0, MAX_RUNS + 1
        )
        self.screen.set_status("explaining the fork · w or escape stops")
        self.screen.run_worker(
            partial(self.explain, target),
            thread=True,
            exclusive=True,
            group="autopsy",
            exit_on_error=False,
        )

    def stop(self) -> None:
        self.cancel.set()
        self.screen.set_status("stopping the autopsy…")

    def explain(self, target: Target) -> None:
        """In the worker thread: the autopsy in a worker process, as `specdiff explain`
        runs it; progress and the outcome go back to the app's thread."""
        # deferred: the engine loads only when an autopsy is asked for
        from specdiff.engine.autopsy import explain_pair
        from specdiff.engine.models import cache_dir
        from specdiff.engine.worker import call_in_worker

        call = self.screen.app.call_from_thread
        try:
            autopsy = call_in_worker(
                explain_pair,
                (
                    target.pair,
                    target.prompt,
                    target.max_tokens,
                    MAX_RUNS,
                    str(cache_dir() / "explain"),
                ),
                {"progress": lambda line: self._post(call, self.progressed, target, line)},
                self.cancel,
                doing="explaining the fork",
            )
        except AutopsyInterrupted:
            self._post(call, self.ended, target, None, "autopsy stopped")
        except SpecdiffError as error:
            self._post(call, self.ended, target, None, f"autopsy failed: {error}")
        except Exception as error:  # a bug: one line, and the app goes on
            self._post(call, self.ended, target, None, f"autopsy failed: {error!r}")
        else:
            self._post(call, self.ended, target, autopsy, "")

    @staticmethod
    def _post(call: object, function: object, *args: object) -> None:
        # the app may be closing: what it can no longer show is dropped
        with suppress(RuntimeError):
            call(function, *args)  # type: ignore[operator]

    def progressed(self, target: Target, line: str) -> None:
        if self.running != target:
            return
        self.progress_done += 1
        with suppress(NoMatches):
            self.panel.show_progress(
                self.title(target, "explaining"), line, self.progress_done, MAX_RUNS + 1
            )

    def ended(self, target: Target, autopsy: Autopsy | None, problem: str) -> None:
        if self.running != target:
            return
        self.running = None
        if autopsy is None:
            self.close_panel()
            self.screen.set_status(problem)
            if problem != "autopsy stopped":
                self.screen.notify(problem, severity="error", timeout=8)
            return
        if self.on_screen() != self.started_over:
            # another run replaced the one explained while the autopsy was being made
            self.close_panel()
            self.screen.note("the autopsy finished after its run left the screen: not shown")
            return
        self.show(target, autopsy)

    def show(self, target: Target, autopsy: Autopsy) -> None:
        self.shown = (target, autopsy)
        self.shown_over = self.on_screen()
        title = f"why the lanes fork · {visible(target.pair.name, 40)}"
        if autopsy.fork is not None:
            title = f"why the lanes fork at token {autopsy.fork} · {visible(target.pair.name, 40)}"
            if target.fork >= 0 and target.fork != autopsy.fork:
                # the autopsy ran the pair again, on this machine: rounding may land elsewhere
                title += f" (the recording forked at {target.fork})"
        self.open_panel().show_autopsy(title, autopsy)
        self.screen.set_status("the fork autopsy · w or escape closes it")

    @staticmethod
    def title(target: Target, doing: str) -> str:
        return f"{doing} the fork at token {target.fork} · {visible(target.pair.name, 40)}"

    def check_still_current(self) -> None:
        """A new run or session replaced the one explained: its autopsy is closed."""
        if self.shown is None or not self.panel_open or self.running is not None:
            return
        if self.on_screen() != self.shown_over:
            self.close_panel()

    def close(self) -> None:
        """The app is closing: an autopsy being made is stopped with it."""
        self.cancel.set()


def refusal(target: Target) -> str | None:
    """Why the engine cannot explain this run, in one line; None when it can."""
    pair = target.pair
    if pair.a.backend == "server" or pair.b.backend == "server":
        return SERVER_LANES
    if target.fork < 0:
        return "nothing to explain: the two lanes agree token for token"
    missing = missing_model(pair)
    if missing is not None:
        lane_id, path = missing
        return (
            f"lane {lane_id}'s model file {visible(elided_path(path, 80))} is missing: put it "
            "back to explain this fork, or save an autopsy beside the session "
            "(specdiff explain SESSION --save)"
        )
    return None
