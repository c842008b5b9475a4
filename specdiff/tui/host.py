"""What a controller may ask of the screen that hosts it: threads, timers and the UI
thread's turn, and the width its status lines must fit. Nothing about drawing: a
controller says what changed (`messages.Changes`), the screen draws it.

A protocol, not the screen: the controllers never import Textual, and a test hosts them
on a fake that records the work and timers asked for, without an app.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

from specdiff.tui.messages import Changes

Report = TypeVar("Report")

IsCancelled = Callable[[], bool]
"""Asked in a worker thread: whether the screen cancelled the work (it is stopping)."""


class Stoppable(Protocol):
    """A timer the host set."""

    def stop(self) -> object: ...


class Host(Protocol):
    """The screen, as its controllers see it."""

    @property
    def columns(self) -> int:
        """The screen's width, for a status line that elides a path to fit."""
        ...

    def post(self, receiver: Callable[[Report], Changes], report: Report) -> None:
        """From any thread: hand `report` to `receiver` on the UI thread, and apply what
        it returns."""
        ...

    def run_in_thread(
        self, work: Callable[[IsCancelled], None], group: str, exclusive: bool = True
    ) -> None:
        """Run `work` in a worker thread of `group` (an exclusive one cancels the group's
        other work first); failures are the screen's to report."""
        ...

    def cancel_group(self, group: str) -> None:
        """Cancel the work of `group` still running."""
        ...

    def later(self, seconds: float, callback: Callable[[], Changes]) -> Stoppable:
        """Call `callback` once, `seconds` from now, and apply what it returns."""
        ...

    def every(self, seconds: float, callback: Callable[[], Changes]) -> Stoppable:
        """Call `callback` every `seconds`, and apply what it returns."""
        ...

    def after_refresh(self, callback: Callable[[], None]) -> None:
        """Call `callback` once the screen has drawn its next frame."""
        ...
