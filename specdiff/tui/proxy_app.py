"""`specdiff proxy --tui`: the app showing the proxy's newest saved pair, as `specdiff
replay --instant` shows a session, with a line above it counting the requests and
forks so far.

The app only renders what the proxy says: each `ProxyProgress` record (a pair saved, and
the counts after it) is handed to `ProxyApp.saved` from whichever thread saved it. The
proxy itself runs beside the app and never sees it; quitting the app is how the command
line learns to stop the proxy.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from textual import events
from textual.binding import Binding
from textual.message import Message

from specdiff.lanes import Pair
from specdiff.proxy.progress import ProxyProgress
from specdiff.sessions.store import SessionError, load_session
from specdiff.tui.app import SpecdiffApp
from specdiff.tui.messages import Noted
from specdiff.tui.options import CompareOptions
from specdiff.tui.widgets.line import Line

NOT_HERE = (
    "the proxy runs this pair for its clients: send a request to it, or quit and run "
    "`specdiff run` to try a prompt here"
)
"""Why r does not run the pair here: a second copy of its model would load beside the
proxy's."""


@dataclass
class PairSaved(Message):
    """The proxy saved a pair: the newest is in `ProxyApp.latest`."""


@dataclass
class ProxySaid(Message):
    """A line the proxy would have written on stderr."""

    text: str


def proxy_line(endpoint: str, progress: ProxyProgress | None) -> str:
    """What the line above the panes says: where clients connect, the counts, and the
    pair on screen."""
    if progress is None:
        return f"proxy {endpoint} · 0 requests · waiting for the first"
    if progress.failed:
        outcome = "a lane failed"
    elif progress.fork_index is None:
        outcome = "identical"
    else:
        outcome = f"forked at token {progress.fork_index}"
    plural = "" if progress.requests == 1 else "s"
    return (
        f"proxy {endpoint} · {progress.requests} request{plural} · {progress.forked} forked"
        f" · latest: #{progress.requests} {progress.prompt_id} {outcome}"
    )


class ProxyApp(SpecdiffApp):
    """The compare screen following a proxy's suite folder: its newest pair, at once."""

    # ctrl+c quits here, as it stops the proxy without the TUI
    BINDINGS = [Binding("ctrl+c", "quit", "quit", show=False, priority=True)]

    def __init__(self, options: CompareOptions, endpoint: str, theme_name: str | None) -> None:
        super().__init__(options, theme_name)
        self.endpoint = endpoint
        self.latest: ProxyProgress | None = None
        """The newest pair saved (set from the proxy's threads)."""
        self.shown: ProxyProgress | None = None
        self.ready = threading.Event()
        """The screen is up: what is posted from now on is shown."""
        self.closed = threading.Event()
        """The app has stopped running (set by whoever ran it): nothing more is shown."""
        self.proxy_line = Line(proxy_line(endpoint, None), id="proxy-line")

    def saved(self, progress: ProxyProgress) -> None:
        """A pair was saved (any thread): show it, or the newer one that follows it."""
        self.latest = progress
        if self.ready.is_set():
            self.post_message(PairSaved())

    def said(self, text: str) -> bool:
        """A line from the proxy (any thread), shown as a note on the status line; False
        when the app is not up to show it."""
        if not self.ready.is_set() or self.closed.is_set():
            return False
        return self.post_message(ProxySaid(text))

    def on_ready(self, _event: events.Ready) -> None:
        self.compare.mount(self.proxy_line, before=0)
        self.ready.set()
        self.show_latest()  # a pair saved before the screen was up

    def on_pair_saved(self, _message: PairSaved) -> None:
        self.show_latest()

    def on_proxy_said(self, message: ProxySaid) -> None:
        self.compare.apply([Noted(message.text)])

    def show_latest(self) -> None:
        progress = self.latest
        if progress is None or progress is self.shown:
            return
        self.shown = progress
        self.proxy_line.set(proxy_line(self.endpoint, progress))
        self.title = f"specdiff proxy · {progress.requests} requests · {progress.forked} forked"
        try:
            session = load_session(progress.session)
        except SessionError as error:
            self.compare.apply([Noted(f"#{progress.requests} not shown: {error}")])
            return
        self.compare.apply(self.compare.replay.show_session(session))


def make_proxy_app(
    pair: Pair, max_tokens: int, endpoint: str, theme_name: str | None = None
) -> ProxyApp:
    """The app for `specdiff proxy --tui`: the pair's panes, empty until the first pair
    is saved; no run of its own (the proxy runs the pair)."""
    options = CompareOptions(
        {pair.name: pair},
        pair.name,
        "",
        max_tokens,
        autostart=False,
        runs_refused=NOT_HERE,
    )
    return ProxyApp(options, endpoint, theme_name)
