"""What the app writes: the run as a session file (`s`), the HTML report of what is on
screen (`e`), screenshots. Sessions and reports go to the sessions folder, screenshots to
a `screenshots` folder beside it (an SVG among the sessions would be offered to
`specdiff replay`); each folder is made when missing. A run is saved once: `e` writes its
session file for the report, and a later `s` names that file instead of writing another.

`OutputFiles` reads what is on screen from the model (`view_state.CompareView`) and
returns what the status line says (or the toast that says why nothing was written)."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from specdiff.errors import SpecdiffError
from specdiff.results import PairResult
from specdiff.sessions.store import Session, load_session, save_result, sessions_dir
from specdiff.tui.messages import Alerted, Changes, StatusChanged
from specdiff.tui.paths import line_with_path
from specdiff.tui.view_state import CompareView


def free_path(folder: Path, stem: str, suffix: str) -> Path:
    """`folder/stem+suffix`, or with -2, -3 … added: a report never replaces another."""
    path = folder / f"{stem}{suffix}"
    number = 2
    while path.exists():
        path = folder / f"{stem}-{number}{suffix}"
        number += 1
    return path


class OutputFiles:
    """The files one compare screen writes, and the session file its live run was saved
    as (a report of it reads that file)."""

    def __init__(self, folder: str | Path | None) -> None:
        self.sessions_dir = folder
        self.saved: Path | None = None

    def forget_saved(self) -> None:
        """A new run: the last one's session file is not what is on screen any more."""
        self.saved = None

    def folder(self) -> Path:
        """Where reports and screenshots go: the sessions folder (made when missing)."""
        folder = sessions_dir(self.sessions_dir)
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def screenshots_folder(self) -> Path:
        """Where screenshots go: `screenshots` beside the sessions folder (made when
        missing)."""
        folder = sessions_dir(self.sessions_dir).parent / "screenshots"
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def save(self, result: PairResult) -> tuple[Path, bool]:
        """The run's session file, and whether it was written just now (False: it was
        written already, by `s` or for a report, and is not written twice)."""
        if self.saved is not None:
            return self.saved, False
        self.saved = save_result(result, self.sessions_dir)
        return self.saved, True

    def session_on_screen(self, session: Session | None, result: PairResult | None) -> Session:
        """The recorded session shown, or the finished live run saved as one."""
        if session is not None:
            return session
        if result is None:
            raise SpecdiffError("nothing to report yet: run a pair first (r)")
        if self.saved is None:
            self.saved = save_result(result, self.sessions_dir)
        return load_session(self.saved)

    def report(
        self, session: Session | None, result: PairResult | None, near_tie: float
    ) -> tuple[Path, bool]:
        """Write the HTML report of what is on screen; where it went, and whether the
        live run's session file was written for it just now."""
        # deferred: the report renderer loads only when a report is asked for
        from specdiff.reports.export import export_session, write_report

        saved_before = self.saved
        shown = self.session_on_screen(session, result)
        path = free_path(self.folder(), shown.path.stem, ".html")
        write_report(export_session(shown, "html", near_tie), path)
        return path, session is None and saved_before is None

    def save_shown(self, view: CompareView, columns: int) -> Changes:
        """`s`: save the finished run on screen, and say where (or why not) in a line
        `columns` wide."""
        result = view.result
        if view.running or result is None:
            running = "the run is still going: wait for it or stop it (x), then save"
            problem = running if view.running else "nothing to save yet: run a pair first"
            return [Alerted(problem, "warning", None)]
        try:
            path, written = self.save(result)
        except (OSError, SpecdiffError) as error:
            return [Alerted(f"could not save the session: {error}", "error", None)]
        said = "saved: " if written else "already saved: "
        return [StatusChanged(line_with_path(said, path, "", columns))]

    def report_shown(self, view: CompareView, columns: int) -> Changes:
        """`e`: write the HTML report of what is on screen, and say where (or why not)."""
        try:
            if view.running:
                raise SpecdiffError("the run is still going: wait for it or stop it (x), then e")
            path, session_written = self.report(view.session, view.result, view.near_tie)
        except (OSError, SpecdiffError) as error:
            return [Alerted(f"no report written: {error}", "error", 8)]
        # the report reads a session file: a live run is saved for it (the same name,
        # .jsonl), and the line says so in few words so the file name keeps its room
        after = " + .jsonl" if session_written else ""
        return [StatusChanged(line_with_path("report written: ", path, after, columns))]


def screenshot_name(folder: Path) -> str:
    """A new screenshot's file name in `folder`: the time it was taken, never one that
    is there already."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return free_path(folder, f"specdiff-{stamp}", ".svg").name
