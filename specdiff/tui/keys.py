"""The compare screen's keys, in the order a narrow footer keeps them (it cuts from the
right). A table of its own, so the screen's module holds behaviour, not forty lines of
key names."""

from __future__ import annotations

from textual.binding import Binding, BindingType

# Help and quit (the app's actions) come first, so that a narrow footer, which cuts
# from the right, keeps them: a screen's keys are listed before the app's. Escape,
# which leaves an input (it never stops a run: x does), is shown only while an input
# has focus.
SCREEN_BINDINGS: list[BindingType] = [
    Binding("question_mark", "app.help", "help"),
    Binding("f1", "app.help", "help"),
    Binding("q", "app.quit", "quit"),
    # ctrl+q is shown only while an input has focus (where q types a q)
    Binding("ctrl+q", "app.quit_from_input", "quit"),
    Binding("escape", "panes", "panes"),
    Binding("r", "run", "run"),
    Binding("x", "stop", "stop"),
    Binding("x", "stop_replay", "stop", show=False),
    Binding("d", "go('fork')", "fork"),
    Binding("w", "explain", "why?"),
    # tried when escape has no input to leave: it stops or closes the fork autopsy
    Binding("escape", "explain(True)", "close autopsy", show=False),
    Binding("n", "go('next_tie')", "next tie"),
    Binding("p", "go('previous_tie')", "prev tie"),
    Binding("left", "move(-1)", "←", show=False),
    Binding("right", "move(1)", "→", show=False),
    # space: one of the three at a time (Replay.space_action), named for what it does
    Binding("space", "toggle_pause", "pause"),
    Binding("space", "resume_replay", "resume"),
    Binding("space", "replay_again", "replay"),
    Binding("l", "go('other_lane')", "lane"),
    Binding("a", "toggle_aligned", "aligned"),
    Binding("c", "configure", "config"),
    Binding("e", "export", "report"),
    Binding("s", "save", "save"),
    Binding("t", "app.next_theme", "theme"),
    Binding("plus,equals_sign", "panel_share(1)", "panel +", show=False),
    Binding("minus", "panel_share(-1)", "panel -", show=False),
    # a ctrl key: it must work while the prompt box has focus, where letters type
    Binding("ctrl+o", "toggle_prompt_mode", "text/messages", show=False),
]
