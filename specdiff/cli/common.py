"""What several commands share: exit codes, the one-line argument error, the progress
line, reading a pair and a prompt from the options, and the Ctrl+C that stops a run."""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import re
import signal
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from enum import IntEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, TypeAlias

from specdiff.config import config_value
from specdiff.errors import LaneConfigError, PromptError, SpecdiffError, did_you_mean
from specdiff.lanes import (
    Lane,
    Pair,
    PairSet,
    apply_overrides,
    load_pairs_file,
    parse_overrides,
    presets,
    unknown_pair,
    unread_keys,
)
from specdiff.prompts import DEFAULT_PROMPT
from specdiff.safe_text import ELLIPSIS, unguarded, visible

if TYPE_CHECKING:
    from _typeshed import SupportsWrite


class Exit(IntEnum):
    """specdiff's exit codes."""

    SAME = 0
    """The lanes agree (or the command did what it was asked)."""
    DIFFERENT = 1
    FAILED = 1
    """A lane failed, or the output could not be written to the end (full disk, closed pipe)."""
    BAD_INPUT = 2
    """One line on stderr says what, with no traceback."""
    INTERRUPTED = 130


Subcommands: TypeAlias = "argparse._SubParsersAction[CommandParser]"
"""What each command module's `add_parser` adds its parser to."""


RunCommand = Callable[[list[str]], int]
"""specdiff's entry point, `main`: the command line a command may run another command
through (serve-pair runs run, live or suite). The parser gives it to every handler as
`args.run_command`, so that no command module imports the package that lists it."""


class ArgumentError(SpecdiffError):
    """The command line itself is wrong."""


class CommandParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        # argparse exits with its own usage dump; specdiff's rule is one line and exit 2.
        raise ArgumentError(f"{with_suggestion(message)} (see: {self.prog} --help)")

    def _print_message(self, message: str, file: SupportsWrite[str] | None = None) -> None:
        # argparse ignores a failed write, so `--help > /dev/full` exited 0 having
        # written nothing; raised, main() reports it like any other lost output
        if message:
            (file or sys.stderr).write(message)


_INVALID_CHOICE = re.compile(r"invalid choice: '(?P<value>[^']*)' \(choose from (?P<choices>.*)\)$")


def with_suggestion(message: str) -> str:
    """argparse's "invalid choice: 'suit' (choose from 'run', ...)" with the nearest
    choice named first, as specdiff's own unknown-name errors do."""
    match = _INVALID_CHOICE.search(message)
    if match is None:
        return message
    choices = re.findall(r"'([^']*)'", match.group("choices"))
    hint = did_you_mean(match.group("value"), choices)
    return message.replace("(choose from", f"({hint}choose from", 1) if hint else message


def is_terminal(stream: TextIO) -> bool:
    """Whether `stream` is a terminal (a closed or replaced stream is not)."""
    try:
        return stream.isatty()
    except (AttributeError, ValueError, OSError):
        return False


def terminal_columns(stream: TextIO) -> int | None:
    """The width of the terminal `stream` writes to; None where it writes to none."""
    if not is_terminal(stream):
        return None
    try:
        return os.get_terminal_size(stream.fileno()).columns or None
    except (AttributeError, ValueError, OSError):
        return None


def wants_colour(stream: TextIO) -> bool:
    """Colour on a terminal, never in a file or a pipe: NO_COLOR (any value) turns it
    off everywhere, FORCE_COLOR (any value but 0) turns it on even into a pipe
    (https://no-color.org, https://force-color.org); a dumb terminal gets none."""
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR", "0") not in ("", "0"):
        return True
    return is_terminal(stream) and os.environ.get("TERM") != "dumb"


def fitted(text: str, width: int) -> str:
    """`text` cut to `width` characters with an ellipsis: a redrawn line that wraps
    leaves a copy of itself on every redraw."""
    return text if len(text) <= width else text[: max(width - len(ELLIPSIS), 0)] + ELLIPSIS


MIN_TEXT_COLUMNS = 40
"""The narrowest a command's text is laid out for: below it a line holds too few words
to read, and the terminal's own wrapping is no worse."""


def text_columns(stream: TextIO) -> int | None:
    """The width a command's text is laid out for on `stream`: its terminal's (at least
    MIN_TEXT_COLUMNS); None in a file or a pipe, where each line stays whole for grep.
    The one rule every command's text output follows (`run`'s layout included)."""
    columns = terminal_columns(stream)
    return None if columns is None else max(columns, MIN_TEXT_COLUMNS)


_GLUED = re.compile(r"(?<=[\s(])'( +)|(?<=\w) = (?=\w)")
"""Where a line must not break: inside a quoted token's leading spaces (`' and'`) and
around the `=` of `AVX2 = 1`."""
_NO_BREAK = "\u00a0"
_INDENT = re.compile(r"[ ]*")


def wrapped_line(line: str, columns: int) -> list[str]:
    """`line` broken at spaces to fit `columns` (the last column left free: a line that
    fills it makes some terminals add an empty one), its later rows under its own
    indent; never inside a quoted token, and a word longer than a row (a path) whole."""
    if len(line) < columns:
        return [line]
    indent = _INDENT.match(line)
    lead = indent.group() if indent else ""
    if len(lead) > columns // 2:
        lead = ""  # a deep indent would leave too few columns for the words
    # a no-break space stands in while wrapping: text shown here went through
    # `visible`, which escapes any the text held itself
    glued = _GLUED.sub(lambda match: match.group().replace(" ", _NO_BREAK), line)
    rows = textwrap.wrap(
        glued,
        columns - 1,
        subsequent_indent=lead,
        break_on_hyphens=False,
        break_long_words=False,
        drop_whitespace=True,
    )
    if rows and line.startswith(lead) and not rows[0].startswith(lead):
        rows[0] = lead + rows[0]
    return [row.replace(_NO_BREAK, " ") for row in rows] or [line]


def wrapped_text(text: str, columns: int | None) -> str:
    """`text` with each line wider than `columns` wrapped at word breaks (`wrapped_line`);
    unchanged where `columns` is None (a file or a pipe)."""
    if columns is None:
        return text
    return "\n".join(row for line in text.split("\n") for row in wrapped_line(line, columns))


def for_terminal(text: str, stream: TextIO | None = None) -> str:
    """`text` laid out for stdout (or `stream`): wrapped to its terminal's width, or
    unchanged in a file or a pipe."""
    return wrapped_text(text, text_columns(stream if stream is not None else sys.stdout))


class WrappingStream:
    """A text stream that holds each line until it ends, then writes it wrapped to
    `columns` (`wrapped_line`) to the stream underneath."""

    def __init__(self, stream: TextIO, columns: int) -> None:
        self.stream = stream
        self.columns = columns
        self.pending = ""

    def write(self, text: str) -> int:
        lines = (self.pending + text).split("\n")
        self.pending = lines.pop()
        for line in lines:
            self.stream.write(wrapped_text(line, self.columns) + "\n")
        return len(text)

    def flush(self) -> None:
        if self.pending:
            self.stream.write(wrapped_text(self.pending, self.columns))
            self.pending = ""
        self.stream.flush()

    def __getattr__(self, name: str) -> Any:
        # isatty, fileno, encoding, buffer: those of the stream underneath
        return getattr(self.stream, name)


Command = Callable[[argparse.Namespace], int]


def text_output(command: Command) -> Command:
    """A command whose printed lines are wrapped to the terminal's width while it runs
    (`text_columns`); in a file or a pipe its output is left as it is."""

    @functools.wraps(command)
    def wrapped(args: argparse.Namespace) -> int:
        columns = text_columns(sys.stdout)
        if columns is None:
            return command(args)
        saved = sys.stdout
        stream = WrappingStream(saved, columns)
        sys.stdout = stream  # type: ignore[assignment]
        try:
            return command(args)
        finally:
            stream.flush()
            sys.stdout = saved

    return wrapped


BAR_CELLS = 24
"""A progress bar's cells where the terminal is wide enough for it and its figures."""


def bar_line(fraction: float, figures: str, columns: int | None) -> str:
    """`[███░░░] figures`: the bar shrinks to leave the figures room in `columns` (to 8
    cells), then the line is cut to fit; full size where the width is unknown."""
    cells = BAR_CELLS
    if columns is not None:
        cells = max(8, min(BAR_CELLS, columns - 1 - len(figures) - 3))
    filled = round(cells * min(max(fraction, 0.0), 1.0))
    line = f"[{'█' * filled}{'░' * (cells - filled)}] {figures}"
    return line if columns is None else fitted(line, columns - 1)


class Status:
    """One progress line on stderr, rewritten in place on a terminal (never wider
    than it, so it never wraps), and never redrawn anywhere else.

    Its messages quote workers, servers and paths, so each is shown with `visible`;
    the carriage return that rewrites the line is its own, written under the guard
    that escapes control characters in everything else."""

    def __init__(self, stream: TextIO, enabled: bool) -> None:
        self.stream = unguarded(stream)
        self.enabled = enabled
        self.live = enabled and is_terminal(stream)
        self._last = 0.0
        self._width = 0

    @property
    def columns(self) -> int | None:
        """The terminal's width now (a resize takes effect at the next redraw)."""
        return terminal_columns(self.stream) if self.live else None

    def bar(self, fraction: float, figures: str) -> None:
        """A progress bar sized to the terminal."""
        self.update(bar_line(fraction, figures, self.columns))

    def message(self, text: str) -> None:
        if not self.enabled:
            return
        text = visible(text)
        if self.live:
            self.stream.write("\r" + text.ljust(self._width) + "\n")
            self._width = 0
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def update(self, text: str) -> None:
        if not self.live:
            return
        now = time.monotonic()
        if now - self._last < 0.1:
            return
        self._last = now
        text = visible(text)
        columns = self.columns
        if columns is not None:
            text = fitted(text, columns - 1)
        self.stream.write("\r" + text.ljust(self._width))
        self._width = len(text)
        self.stream.flush()

    def done(self) -> None:
        if self.live and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
            self._width = 0


def add_command(
    commands: Subcommands,
    name: str,
    help: str,
    handler: Callable[[argparse.Namespace], int],
) -> argparse.ArgumentParser:
    """The parser of one command, which `main` dispatches to `handler`."""
    parser = commands.add_parser(name, help=help)
    parser.set_defaults(handler=handler)
    return parser


def command_parser(add_parser: Callable[[Subcommands], None]) -> argparse.ArgumentParser:
    """One command's parser alone, built afresh by its module's `add_parser`: for a
    command that reads another's options (serve-pair) without touching the parser
    `main` shares, whose defaults must stay as they are."""
    holder = CommandParser(prog="specdiff")
    commands = holder.add_subparsers(parser_class=CommandParser)
    add_parser(commands)
    (parser,) = commands.choices.values()
    return parser


def note_unread_keys(lanes: Iterable[tuple[str, Lane | None]]) -> None:
    """Say, one note a lane, which server keys an in-process lane was given: nothing
    reads them there, and a user who set endpoint= meant a server (backend=server)."""
    for lane_id, lane in lanes:
        unread = [] if lane is None else unread_keys(lane)
        if unread:
            verb = "is" if len(unread) == 1 else "are"
            print(
                f"specdiff: note: lane {lane_id} runs in-process, where {', '.join(unread)} "
                f"{verb} not read (server lanes only: backend=server)",
                file=sys.stderr,
            )


def check_limits(max_tokens: int | None, near_tie: float) -> None:
    """The token budget and near-tie threshold every decoding command refuses alike."""
    if max_tokens is not None and max_tokens < 1:
        raise PromptError(f"--max-tokens must be at least 1, got {max_tokens}")
    if near_tie < 0:
        raise ArgumentError(f"--near-tie must not be negative, got {near_tie}")


def known_pairs(args: argparse.Namespace) -> PairSet:
    """The presets, plus the pairs of --pairs FILE (without the presets its [defaults]
    cannot apply to, which are refused when chosen)."""
    known = presets()
    if not args.pairs:
        return PairSet(known)
    loaded = load_pairs_file(args.pairs, known)
    known.update(loaded)
    for name in loaded.refused:
        known.pop(name, None)
    return PairSet(known, loaded.refused)


def resolve_pair(args: argparse.Namespace, known: dict[str, Pair], name: str | None = None) -> Pair:
    """The named pair (default --pair) with --both, --model, --lane-a and --lane-b applied."""
    name = name or args.pair
    if isinstance(known, PairSet) and name in known.refused:
        raise LaneConfigError(known.refused[name])
    if name not in known:
        raise unknown_pair(name, known)
    pair = known[name]
    both = parse_overrides(args.both)
    if args.model:
        both.setdefault("model", args.model)
    lanes = {}
    for lane_id, own in (("a", args.lane_a), ("b", args.lane_b)):
        try:
            lanes[lane_id] = apply_overrides(
                apply_overrides(getattr(pair, lane_id), both), parse_overrides(own)
            )
        except LaneConfigError as error:
            raise LaneConfigError(f"lane {lane_id}: {error}") from None
    return replace(pair, a=lanes["a"], b=lanes["b"])


def read_request(args: argparse.Namespace) -> tuple[dict[str, Pair], Pair, str]:
    """What `run` and `live` both take: checked limits, the pairs, the pair, the prompt."""
    check_limits(args.max_tokens, args.near_tie)
    known = known_pairs(args)
    return known, resolve_pair(args, known), read_prompt(args)


def read_prompt(args: argparse.Namespace) -> str:
    """--prompt, else --prompt-file (- = stdin), else the default prompt; never empty."""
    prompt: str
    if args.prompt is not None:
        prompt = args.prompt
    elif args.prompt_file == "-":
        try:
            prompt = sys.stdin.buffer.read().decode("utf-8")
        except UnicodeDecodeError:
            raise PromptError("the prompt on stdin is not UTF-8 text") from None
    elif args.prompt_file:
        prompt = _read_prompt_file(Path(args.prompt_file).expanduser())
    else:
        prompt = DEFAULT_PROMPT
    if not prompt.strip():
        raise PromptError("the prompt is empty; give some text (--prompt or --prompt-file)")
    return prompt


def _read_prompt_file(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PromptError(f"prompt file not found: {path}") from None
    except UnicodeDecodeError:
        raise PromptError(f"prompt file {path} is not UTF-8 text") from None
    except OSError as error:
        raise PromptError(f"cannot read prompt file {path}: {error.strerror}") from None


def config_theme() -> str | None:
    """`theme = "NAME"` from the user config file, if there is one."""
    return config_value("theme")


@contextlib.contextmanager
def interrupt_sets(cancel: threading.Event) -> Iterator[None]:
    """The first Ctrl+C asks the lanes to stop (llama.cpp aborts a long decode between
    graph nodes) so the summary still covers what was produced; a second one raises."""

    def on_interrupt(_signum: int, _frame: object) -> None:
        if cancel.is_set():
            raise KeyboardInterrupt
        cancel.set()

    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
