"""The help screen: every key binding and what each colour and mark in the panes means."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

HELP_ROWS = (
    ("enter (in the prompt) / r", "run the pair on the prompt / run again"),
    ("x / escape", "stop both lanes"),
    ("d", "jump to the fork (both panes)"),
    ("n / p", "next / previous near tie in the current lane"),
    ("← / →", "previous / next token"),
    ("space (replay)", "pause / resume; at the end, play it again"),
    ("← / → (replay, paused)", "hide / show one token; the panel follows it"),
    ("l", "switch the current lane (a / b)"),
    ("click a token", "select it: the panel shows its top-k in both lanes"),
    ("s", "save the run as a session file"),
    ("t", "next theme"),
    ("ctrl+p", "command palette: every action by name"),
    ("?", "this help"),
    ("q", "quit"),
)


class HelpScreen(ModalScreen[None]):
    """Every binding, in one place."""

    BINDINGS = [
        Binding("escape", "dismiss", "close"),
        Binding("question_mark", "dismiss", "close"),
        Binding("q", "dismiss", "close"),
    ]

    def compose(self) -> ComposeResult:
        table = Table(title="specdiff keys", box=None, expand=False)
        table.add_column("key", style="bold", no_wrap=True)
        table.add_column("does")
        for key, does in HELP_ROWS:
            table.add_row(key, does)
        with Vertical(id="help-box"):
            yield Static(table)
            yield Static(
                Text(
                    "Near ties: tokens whose top-1 minus top-2 logit is below the threshold "
                    "are shaded, darker for smaller margins. Underlined: accepted drafts. "
                    "The sparkline under each pane plots every step's margin.",
                    style="dim",
                )
            )
            yield Static(Text("escape closes", style="dim italic"))

    async def action_dismiss(self, result: None = None) -> None:
        self.dismiss(result)
