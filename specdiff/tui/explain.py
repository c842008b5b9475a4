"""The compare screen's `w` ("why?"): the fork autopsy of the run on screen, in the
panel's place.

The autopsy is `specdiff explain`'s: the same engine entry point (`explain_pair`) run the
same way, in a worker process through `call_in_worker`, so llama.cpp never loads in the
TUI's process and a native crash ends the autopsy, not the app. A thread of the app
waits on that process and hands its progress (each stage, with the engine's estimate of
the time left) to the panel and the status bar. A replayed session
whose autopsy was saved beside it (`specdiff explain SESSION --save`) is shown from
that file, without a model. What cannot be explained (server lanes, lanes that agree,
a model file that is gone) is one line in the status bar.

`ForkExplainer` is the screen's controller of the autopsy: it reads the run on screen
from the model (`view_state.CompareView`) and returns what changed (the autopsy's
progress, the autopsy shown, the panel closed); the screen draws it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from specdiff.autopsy import (
    Autopsy,
    AutopsyError,
    AutopsyInterrupted,
    AutopsyStage,
    load_saved,
    missing_model,
    saved_beside,
)
from specdiff.autopsy.progress import duration
from specdiff.errors import SpecdiffError
from specdiff.lanes import Pair
from specdiff.safe_text import visible
from specdiff.tui.host import Host, IsCancelled, Stoppable
from specdiff.tui.messages import (
    Alerted,
    AutopsyClosed,
    AutopsyProgress,
    AutopsyShown,
    Changes,
    Noted,
    StatusChanged,
)
from specdiff.tui.paths import elided_path
from specdiff.tui.view_state import CompareView

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


BUDGET_FIELD = "max tokens"
"""The config field that sets the token budget, named where the estimate suggests it."""
STOP_KEYS = "w or escape stops"


@dataclass(frozen=True)
class AutopsyProgressed:
    """The autopsy of `target` being made says where it is."""

    target: Target
    stage: AutopsyStage


@dataclass(frozen=True)
class AutopsyEnded:
    """The autopsy of `target` ended: made, or not (`problem` says why)."""

    target: Target
    autopsy: Autopsy | None
    problem: str


class ForkExplainer:
    """Starts, cancels and shows the autopsy of the fork on the compare screen."""

    def __init__(self, view: CompareView, host: Host) -> None:
        self.view = view
        self.host = host
        self.cancel = threading.Event()
        self.running: Target | None = None
        self.shown: tuple[Target, Autopsy] | None = None
        self.shown_over: tuple[object, object] = (None, None)
        self.started_over: tuple[object, object] = (None, None)
        """The session and live result on screen when the autopsy was shown."""
        self.panel_open = False
        """The autopsy is in the divergence panel's place."""
        self._checking: Stoppable | None = None

    # -- the panel

    def open_panel(self, change: AutopsyProgress | AutopsyShown) -> Changes:
        self.panel_open = True
        return [change]

    def close_panel(self) -> Changes:
        self.panel_open = False
        return [AutopsyClosed()]

    # -- keys

    def toggle(self) -> Changes:
        """`w`: stop an autopsy being made, close one shown, else make (or show) one."""
        if self._checking is None:
            self._checking = self.host.every(CHECK_SECONDS, self.check_still_current)
        if self.running is not None:
            return self.stop()
        if self.panel_open:
            return self.close_panel()
        target = self.target()
        if isinstance(target, str):
            return [Noted(target)]
        if self.shown is not None and self.shown[0] == target:
            return self.show(*self.shown)
        saved, warnings = self.saved_for(target)
        if saved is not None:
            return [*warnings, *self.show(target, saved)]
        problem = refusal(target)
        if problem is not None:
            return [*warnings, Noted(problem)]
        return [*warnings, *self.start(target)]

    def escape(self) -> Changes | None:
        """Escape over the panes: stop an autopsy being made, or close one shown; None
        when there is neither (the key is left to what else it does)."""
        if self.running is not None:
            return self.stop()
        if self.panel_open:
            return self.close_panel()
        return None

    # -- what to explain

    def target(self) -> Target | str:
        """The run on screen as an autopsy target, or the one line saying why there is
        none yet."""
        view = self.view
        if view.running:
            return "w explains a finished run: wait for it to end (x stops it)"
        session = view.session
        if session is not None:
            prompt, max_tokens = session.prompt, session.header.max_tokens
            comparison = session.comparison()
        elif view.result is not None:
            result = view.result
            prompt, max_tokens, comparison = result.prompt, result.max_tokens, result.comparison
        else:
            return "w explains a fork: run the pair first (r)"
        fork = comparison.fork.index if comparison.fork is not None else -1
        path = session.path if session is not None else None
        return Target(view.pair, prompt, max_tokens, fork, path)

    def saved_for(self, target: Target) -> tuple[Autopsy | None, Changes]:
        """The autopsy saved beside the session on screen, if there is one that reads,
        and the warnings about one that does not."""
        if target.session_path is None:
            return None, []
        path = saved_beside(target.session_path)
        if not path.is_file():
            return None, []
        try:
            autopsy = load_saved(path)
        except AutopsyError as error:
            return None, [Alerted(str(error), "warning", 8)]
        if autopsy.pair != target.pair.name:
            line = (
                f"{visible(path.name)} explains pair {visible(autopsy.pair, 40)}, not "
                f"{visible(target.pair.name, 40)}: not shown"
            )
            return None, [Alerted(line, "warning", 8)]
        return autopsy, []

    # -- making one

    def on_screen(self) -> tuple[object, object]:
        """What identifies the run on screen: its session, or its live result."""
        return (self.view.session, self.view.result)

    def start(self, target: Target) -> Changes:
        self.running = target
        self.started_over = self.on_screen()
        self.cancel.clear()
        progress = AutopsyProgress(
            self.title(target, "explaining"), "starting the engine…", 0, MAX_RUNS + 1
        )
        self.host.run_in_thread(partial(self.explain, target), "autopsy")
        status = StatusChanged(f"explaining the fork · {STOP_KEYS}")
        return [*self.open_panel(progress), status]

    def stop(self) -> Changes:
        self.cancel.set()
        return [StatusChanged("stopping the autopsy…")]

    def explain(self, target: Target, _is_cancelled: IsCancelled) -> None:
        """In the worker thread: the autopsy in a worker process, as `specdiff explain`
        runs it; progress and the outcome go back to the app's thread."""
        # deferred: the engine loads only when an autopsy is asked for
        from specdiff.engine.autopsy import explain_pair
        from specdiff.engine.models import cache_dir
        from specdiff.engine.worker import call_in_worker

        def ended(autopsy: Autopsy | None, problem: str) -> None:
            self.host.post(self.receive, AutopsyEnded(target, autopsy, problem))

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
                {
                    "progress": lambda stage: self.host.post(
                        self.receive, AutopsyProgressed(target, stage)
                    )
                },
                self.cancel,
                doing="explaining the fork",
            )
        except AutopsyInterrupted:
            ended(None, "autopsy stopped")
        except SpecdiffError as error:
            ended(None, f"autopsy failed: {error}")
        except Exception as error:  # a bug: one line, and the app goes on
            ended(None, f"autopsy failed: {error!r}")
        else:
            ended(autopsy, "")

    def receive(self, report: AutopsyProgressed | AutopsyEnded) -> Changes:
        """What the worker thread reported, on the UI thread."""
        if isinstance(report, AutopsyProgressed):
            return self.progressed(report.target, report.stage)
        return self.ended(report.target, report.autopsy, report.problem)

    def progressed(self, target: Target, stage: AutopsyStage) -> Changes:
        """The panel's bar and line at `stage`; the status bar says the time left."""
        if self.running != target:
            return []
        title = self.title(target, "explaining")
        # the taps of part 2 are the bar's last step
        progress = AutopsyProgress(title, stage.line(BUDGET_FIELD), stage.done, stage.runs + 1)
        if self.cancel.is_set():
            return [progress]  # the status line says it is stopping
        left = "" if stage.seconds_left is None else f" · about {duration(stage.seconds_left)} left"
        return [progress, StatusChanged(f"explaining the fork{left} · {STOP_KEYS}")]

    def ended(self, target: Target, autopsy: Autopsy | None, problem: str) -> Changes:
        if self.running != target:
            return []
        self.running = None
        if autopsy is None:
            changes = [*self.close_panel(), StatusChanged(problem)]
            if problem != "autopsy stopped":
                changes.append(Alerted(problem, "error", 8))
            return changes
        if self.on_screen() != self.started_over:
            # another run replaced the one explained while the autopsy was being made
            note = Noted("the autopsy finished after its run left the screen: not shown")
            return [*self.close_panel(), note]
        return self.show(target, autopsy)

    def show(self, target: Target, autopsy: Autopsy) -> Changes:
        # the record names no lanes: how they computed the earlier rows comes from them
        autopsy = autopsy.with_lanes(target.pair.a, target.pair.b)
        self.shown = (target, autopsy)
        self.shown_over = self.on_screen()
        title = f"why the lanes fork · {visible(target.pair.name, 40)}"
        if autopsy.fork is not None:
            title = f"why the lanes fork at token {autopsy.fork} · {visible(target.pair.name, 40)}"
            if target.fork >= 0 and target.fork != autopsy.fork:
                # the autopsy ran the pair again, on this machine: rounding may land elsewhere
                title += f" (the recording forked at {target.fork})"
        shown = self.open_panel(AutopsyShown(title, autopsy))
        return [*shown, StatusChanged("the fork autopsy · w or escape closes it")]

    @staticmethod
    def title(target: Target, doing: str) -> str:
        return f"{doing} the fork at token {target.fork} · {visible(target.pair.name, 40)}"

    def check_still_current(self) -> Changes:
        """A new run or session replaced the one explained: its autopsy is closed."""
        if self.shown is None or not self.panel_open or self.running is not None:
            return []
        if self.on_screen() != self.shown_over:
            return self.close_panel()
        return []

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
