"""The run controls: prompt box (raw text or a JSON messages list), pair picker, max
tokens, Run and Stop, each lane's overrides, and the one-line config bar that stands in
for them on a narrow screen.

The controls read and check what is typed; what a run is, they leave to the screen. They
post what the user asked for (`RunRequested`, `StopRequested`, `PairChosen`) as typed
messages, so nothing outside reaches into their fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass, replace
from typing import NamedTuple

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.widgets import Button, Input, Select, Static

from specdiff.chat import (
    Conversation,
    looks_like_messages,
    one_message,
    shown_prompt,
    typed_messages,
)
from specdiff.errors import SpecdiffError
from specdiff.lanes import Pair, apply_overrides, headline, override_words, parse_overrides
from specdiff.safe_text import from_one_line, on_one_line, visible
from specdiff.tui.options import CompareOptions
from specdiff.tui.widgets.line import Line

TEXT, MESSAGES = "text", "messages"
"""The prompt box's two modes, named as its toggle shows them."""
PAIR_OPTION_WIDTH = 58
"""The pair picker's rows: the name, then what the pair compares, cut to fit."""


def pair_option(name: str, pair: Pair) -> Text:
    """A row of the pair picker: the name, then what the pair compares, on one line."""
    row = Text(visible(name), style="bold", no_wrap=True, overflow="ellipsis")
    described = pair.description or f"{headline(pair.a, pair.b)} vs {headline(pair.b, pair.a)}"
    row.append(f"  {visible(described)}", style="dim")
    row.truncate(PAIR_OPTION_WIDTH, overflow="ellipsis")
    return row


class RunSettings(NamedTuple):
    """What the controls ask to run: the pair with each lane's overrides applied."""

    pair: Pair
    prompt: str
    max_tokens: int


class Controls(Vertical):
    """Everything a run is made of, as the user types it."""

    DEFAULT_CSS = "Controls { height: auto; }"

    class RunRequested(Message):
        """Run was pressed, or Enter in one of the fields: run what they say."""

    class StopRequested(Message):
        """Stop was pressed."""

    @dataclass
    class PromptModeChanged(Message):
        """The prompt box is read the other way now (ctrl+o, or its toggle)."""

        mode: str
        note: str
        """What the box is read as now, in words for the status line."""

    @dataclass
    class PairChosen(Message):
        """Another pair was picked."""

        name: str
        by_keyboard: bool
        """Picked from the focused picker (its list closed, the keys go back to the panes)."""

    def __init__(self, options: CompareOptions, **kwargs: str) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        prompt = options.prompt
        self.pairs: Mapping[str, Pair] = options.pairs
        self.pair_name = options.pair_name
        self.refused_pairs: Mapping[str, str] = options.refused_pairs
        self.initial_max_tokens = options.max_tokens
        self.initial_overrides: Mapping[str, str] = options.overrides
        # a prompt's kind is known (a session's, the command line's): never guessed from
        # its text, so a raw prompt that looks like JSON runs as the raw prompt it was
        self.prompt_mode = MESSAGES if isinstance(prompt, Conversation) else TEXT
        """How the prompt box is read: as raw text, or as a JSON messages list."""
        self._box_stands_for = (on_one_line(shown_prompt(prompt)), shown_prompt(prompt))
        """(what the box shows, the text it stands for): the box shows newlines and control
        characters as pictures (␤, ␛), read back when edited, and other unprintable
        characters as escapes, so while it is unedited it stands for the text itself."""
        self.config_bar = Line(id="config-bar")
        # the fields' first values are set as they are composed: an Input given a value
        # asks the running app to clear its selection
        self.prompt_box = Input(placeholder="prompt", id="prompt")
        self.mode_button = Button(
            self.prompt_mode,
            id="prompt-mode",
            tooltip="how the prompt box is read: raw text, or a JSON messages list "
            "(a conversation, which chat lanes format); ctrl+o switches",
        )
        self.pair_picker: Select[str] = Select(
            [(pair_option(name, pair), name) for name, pair in self.pairs.items()],
            value=self.pair_name,
            allow_blank=False,
            id="pair",
        )
        self.max_label = Static("max tokens", id="max-label")
        self.max_tokens_field = Input(type="integer", id="max-tokens", tooltip="max tokens")
        self.run_button = Button("Run", id="run", variant="primary")
        self.stop_button = Button("Stop", id="stop", variant="error")
        self.override_fields = {
            lane_id: Input(placeholder="key=value …", id=f"lane-{lane_id}-overrides")
            for lane_id in ("a", "b")
        }

    def compose(self) -> ComposeResult:
        self.prompt_box.value = self._box_stands_for[0]
        self.max_tokens_field.value = str(self.initial_max_tokens)
        for lane_id, field in self.override_fields.items():
            field.value = visible(self.initial_overrides.get(lane_id, ""))
        yield self.config_bar
        # one row where there is room; on a narrow screen the prompt gets a row of its
        # own, and the pair picker (whose list is wide) starts the second at the left
        with Horizontal(id="controls"):
            with Horizontal(id="prompt-row"):
                yield Static("prompt", classes="field-label")
                yield self.prompt_box
                yield self.mode_button
            with Horizontal(id="run-row"):
                yield self.pair_picker
                yield self.max_label
                yield self.max_tokens_field
                yield self.run_button
                yield self.stop_button
        with Horizontal(id="overrides"):
            for lane_id, field in self.override_fields.items():
                # a label of its own: a placeholder is gone once the field has a value
                yield Static(f"lane {lane_id} overrides", classes="field-label")
                yield field

    def on_mount(self) -> None:
        self.show_pair_name()
        self.show_config()

    def show_pair_name(self) -> None:
        """The closed picker shows the pair's name alone: its list says what each pair
        compares, and in the picker's width that text would cut the name."""
        pair = self.pair_picker
        # a Text, never markup: a shared session's pair may be named anything
        pair.query_one("SelectCurrent #label", Static).update(Text(visible(str(pair.value))))

    # -- what the user did

    @on(Button.Pressed, "#run")
    def run_pressed(self) -> None:
        self.post_message(self.RunRequested())

    @on(Button.Pressed, "#stop")
    def stop_pressed(self) -> None:
        self.post_message(self.StopRequested())

    @on(Input.Submitted)
    def field_submitted(self) -> None:
        self.post_message(self.RunRequested())

    @on(Select.Changed, "#pair")
    def pair_changed(self, event: Select.Changed) -> None:
        if self.is_mounted:
            self.show_pair_name()
            self.show_config()
            by_keyboard = self.screen.focused is event.select
            self.post_message(self.PairChosen(str(event.value), by_keyboard))

    @on(Button.Pressed, "#prompt-mode")
    def prompt_mode_pressed(self) -> None:
        self.toggle_prompt_mode()

    # -- what the fields say

    def show_config(self) -> None:
        """The one-line config bar of a narrow screen: prompt, pair and max tokens."""
        prompt = " ".join(self.prompt_box.value.split())
        pair = self.pair_picker.value
        max_tokens = self.max_tokens_field.value
        overrides = [
            f"{lane_id}: {value}"
            for lane_id, field in self.override_fields.items()
            if (value := field.value.strip())
        ]
        mode = [MESSAGES] if self.prompt_mode == MESSAGES else []
        parts = ["c config", str(pair), f"max {max_tokens}", *overrides, *mode, prompt]
        self.config_bar.set(visible(" · ".join(parts)))

    def box_text(self) -> str:
        """The prompt box's text: what an unedited box stands for, else what it holds."""
        value = self.prompt_box.value
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
        self.prompt_box.value = shown

    def toggle_prompt_mode(self) -> None:
        """Read the prompt box the other way (and post how it is read now). Plain text
        becomes a conversation of one user message, and a conversation of one user
        message becomes its text, so the prompt stays the same; anything else stays as
        typed."""
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
        self.mode_button.label = self.prompt_mode
        self.show_config()
        self.post_message(self.PromptModeChanged(self.prompt_mode, f"{note} (ctrl+o switches)"))

    def resolve_pair(self) -> RunSettings:
        """The run the fields ask for; a SpecdiffError names the field that is wrong."""
        prompt = self.box_prompt()
        raw = self.max_tokens_field.value.strip()
        try:
            max_tokens = int(raw)
        except ValueError:
            raise SpecdiffError(f"max tokens must be a whole number, got {raw!r}") from None
        if max_tokens < 1:
            raise SpecdiffError(f"max tokens must be at least 1, got {max_tokens}")
        name = str(self.pair_picker.value)
        if name in self.refused_pairs:
            raise SpecdiffError(self.refused_pairs[name])
        base = self.pairs[name]
        lanes = {}
        for lane_id, field in self.override_fields.items():
            typed = field.value
            try:
                # a value keeps its spaces: serve-pair's labels and a JSON request hold them
                overrides = parse_overrides(override_words(typed))
                lanes[lane_id] = apply_overrides(getattr(base, lane_id), overrides)
            except SpecdiffError as error:
                raise SpecdiffError(f"lane {lane_id} overrides: {error}") from None
        return RunSettings(replace(base, a=lanes["a"], b=lanes["b"]), prompt, max_tokens)

    def focus_prompt(self) -> None:
        """Put the cursor in the prompt box."""
        self.prompt_box.focus()

    # -- how they look

    def lock_for_replay(self, replaying: bool) -> None:
        """While a replay is shown, what would discard it (Run, Stop, the lanes'
        overrides) is disabled, so `r` asks first."""
        for widget in (self.run_button, self.stop_button, *self.override_fields.values()):
            widget.disabled = replaying

    def set_narrow(self, narrow: bool) -> None:
        # a narrow row gives the prompt the room of the label's second word
        self.max_label.update("max" if narrow else "max tokens")

    def set_running(self, running: bool) -> None:
        """A blinking cursor repaints its field twice a second, and while lanes stream
        every frame is CPU their decode threads lose; the cursor stays shown meanwhile."""
        for field in (self.prompt_box, self.max_tokens_field, *self.override_fields.values()):
            if field.has_focus or running:
                field.cursor_blink = not running
            else:
                # an unfocused field's timer would tick, unseen, until it is focused
                field.set_reactive(Input.cursor_blink, True)
