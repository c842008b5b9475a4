"""The help screen: how to close it, every key binding, what each colour and mark in the
panes means, and the words the panes use (where a glossary gives them).

It scrolls, so it reads whole on an 80x24 terminal; its first line says how.
"""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from specdiff.glossary import GLOSSARY
from specdiff.tui.widgets.legend import LEGEND_ROWS

HELP_ROWS = (
    ("? / f1", "this help"),
    ("q / ctrl+q", "quit"),
    ("escape", "leave an input (or the open config bar) for the panes"),
    ("enter (in an input)", "run the pair; the keys go back to the panes"),
    ("r", "run again; over a replay, press twice (the model loads)"),
    ("x", "stop both lanes"),
    ("d", "jump to the fork (both panes)"),
    ("w", "why? the fork autopsy: setting, layer, operation (w or escape stops, closes)"),
    ("n / p", "next / previous near tie (the shaded tokens before the fork), current lane"),
    ("← / →", "previous / next token"),
    ("space (replay)", "pause / resume; at the end, play it again"),
    ("← / → (replay, paused)", "hide / show one token; the panel follows it"),
    ("l", "switch the current lane (a / b): its pane is framed"),
    ("a", "aligned view: the shared prefix folded, the two branches stacked"),
    ("click a token", "select it: the panel shows its top-k in both lanes"),
    ("+ / -", "let the panel take more / less of the screen (it takes what it needs, up to that)"),
    ("c (under 100 columns)", "open the config bar: prompt, pair, max tokens, overrides"),
    ("ctrl+o", "read the prompt box as raw text or as a JSON messages list (a conversation)"),
    ("e", "write the HTML report of what is on screen; the status names the file"),
    ("s", "save the run as a session file"),
    ("t", "next theme"),
    ("ctrl+p", "command palette: every action by name"),
)

END_ROW = "escape, ? or q closes · ↑/↓, page up/down, home/end scroll"
"""The first and the last line of help: a test scrolls until the last is in view."""
GLOSSARY_ROWS: tuple[tuple[str, str], ...] = tuple(
    (term.name, term.definition) for term in GLOSSARY
)
"""(word, what it means in plain words) for the help's glossary page, after the marks:
the same definitions `specdiff run` and the documentation quote."""


def _table(title: str, headers: tuple[str, str], rows: tuple[tuple[str, str], ...]) -> Table:
    table = Table(title=title, box=None, expand=False, title_justify="left")
    table.add_column(headers[0], style="bold", no_wrap=True)
    table.add_column(headers[1])
    for key, does in rows:
        table.add_row(key, does)
    return table


class HelpScreen(ModalScreen[None]):
    """Every binding and every mark, in one scrolling box."""

    BINDINGS = [
        Binding("escape", "dismiss", "close"),
        Binding("question_mark", "dismiss", "close"),
        Binding("f1", "dismiss", "close"),
        Binding("q", "dismiss", "close"),
    ]

    def __init__(self, glossary: tuple[tuple[str, str], ...] = GLOSSARY_ROWS) -> None:
        super().__init__()
        self.glossary = glossary
        self.box = VerticalScroll(id="help-box")

    def compose(self) -> ComposeResult:
        with self.box:
            yield Static(Text(END_ROW, style="bold"), id="help-start")
            yield Static(_table("specdiff keys", ("key", "does"), HELP_ROWS))
            yield Static(_table("what the panes show", ("mark", "means"), LEGEND_ROWS))
            if self.glossary:
                yield Static(_table("words used here", ("word", "means"), self.glossary))
            yield Static(Text(END_ROW, style="dim italic"), id="help-end")

    def on_mount(self) -> None:
        # the box takes the keys: arrows, page up/down and home/end scroll it
        self.box.focus()

    async def action_dismiss(self, result: None = None) -> None:
        self.dismiss(result)
