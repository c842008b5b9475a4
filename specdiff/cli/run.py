"""`specdiff run`: both lanes of a pair on one prompt, headless; exit 1 when they fork."""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from specdiff.chat import (
    EXAMPLE,
    MAX_CONVERSATION_CHARS,
    ChatError,
    conversation,
    mixed_note,
    read_messages,
    unformatted_note,
)
from specdiff.cli import options
from specdiff.cli.common import (
    Exit,
    Status,
    Subcommands,
    add_command,
    note_unread_keys,
    read_request,
    text_columns,
    wants_colour,
)
from specdiff.compare import run_fork_index
from specdiff.control import refuse_uncontrollable
from specdiff.errors import SpecdiffError
from specdiff.files import read_limited
from specdiff.glossary import glossary_text
from specdiff.lanes import Pair
from specdiff.safe_text import styled_terminal_text, unguarded, visible
from specdiff.steps import TokenStep

if TYPE_CHECKING:
    from specdiff.engine.worker import PairWorker
    from specdiff.reports.text import Layout
    from specdiff.results import PairResult
    from specdiff.sessions.store import SessionWriter

Handler = Callable[[int, FrameType | None], Any] | int | None
"""A signal's handler as `signal.getsignal` gives it: a function, SIG_DFL or SIG_IGN."""


def add_parser(commands: Subcommands) -> None:
    run = add_command(
        commands, "run", "run both lanes of a pair on a prompt, headless", command_run
    )
    # the words the run's text uses, defined where --help is the first place one looks
    run.formatter_class = argparse.RawDescriptionHelpFormatter
    run.epilog = (
        "Output: on a terminal, wrapped to its width and coloured (NO_COLOR=1 turns\n"
        "colour off, FORCE_COLOR=1 on); in a pipe or file, plain: texts wrapped at 100\n"
        "columns, a sentence a line. Exit 0 identical, 1 forked, 2 a lane failed.\n\n"
        "Stopping: Ctrl+C (SIGINT) or SIGTERM stops both lanes where they are; the\n"
        "summary covers the tokens produced and a --save session is finished, marked\n"
        "stopped. Exit 130 after Ctrl+C, 143 after SIGTERM (128 + the signal, as a\n"
        "shell reports a process the signal ended). A second one leaves at once, and\n"
        "a --save session then stays NAME.jsonl.partial.\n\n"
        "terms:\n" + glossary_text(78)
    )
    options.add_request_options(run)
    options.add_chat_options(run)
    options.add_stop(run)
    options.add_teacher_forced(run)
    options.add_control(run)
    options.add_json_summary(run)
    options.add_quiet(run)
    run.add_argument(
        "--forecast",
        type=options.whole_number(1, 1000),
        metavar="K",
        help="also list the K steps most likely to fork, read from lane a's margins",
    )
    run.add_argument(
        "--save", action="store_true", help="write the run as a session file as it streams"
    )
    run.add_argument(
        "--sessions-dir", help="where --save writes (default: ./sessions or the user data dir)"
    )


def command_run(args: argparse.Namespace) -> int:
    """Exit 0 when the lanes agree, 1 when they fork, 2 when a lane failed; 130 when
    Ctrl+C stopped the run, 143 when SIGTERM did."""
    _, pair, prompt = read_chat_request(args)
    if args.control:
        refuse_uncontrollable(pair)
    notes = [mixed_note(pair.a, pair.b), unformatted_note(prompt, pair.a, pair.b)]
    for note in notes:
        if note is not None:
            print(f"specdiff: note: {note}", file=sys.stderr)
    note_unread_keys((("a", pair.a), ("b", pair.b)))
    with stop_requests(threading.Event()) as stops:
        try:
            result, writer = run_pair(args, pair, prompt, stops)
            if writer is not None:
                saved = writer.finish(result.summary())
                print(f"specdiff: saved session {visible(str(saved))}", file=sys.stderr)
            show_result(result, args.json, args.forecast)
            code = exit_code(result, stops.signum)
            stops.pass_on()
            return code
        except Stopped as stop:
            print(f"specdiff: {stop_words(stop.signum)}", file=sys.stderr)
            return 128 + stop.signum


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
"""The signals that stop a run in order; the exit status is 128 + the signal."""


class Stopped(KeyboardInterrupt):
    """A stop signal that came when the run could not end in order: before it was
    under way, or a second time. Raised as Ctrl+C raises KeyboardInterrupt, so that
    whatever cleans up after Ctrl+C cleans up after it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def stop_words(signum: int | None) -> str:
    """How the run was stopped, in the words of the line on stderr."""
    if signum in (None, signal.SIGINT):
        return "interrupted"
    return f"stopped by {signal.Signals(signum).name}"


@dataclass
class StopRequests:
    """Ctrl+C (SIGINT) and SIGTERM, handled alike while `specdiff run` runs.

    Before the run is under way a stop leaves at once, as the signal alone would. From
    then on (its session file about to start, with --save) the first asks the lanes to
    stop, so the run ends in order: the summary covers the tokens produced, and the
    session is finished and marked stopped. A second one leaves at once."""

    cancel: threading.Event
    signum: int | None = None
    """The signal that stopped the run in order; None while none has."""
    under_way: bool = False
    previous: dict[int, Handler] = field(default_factory=dict)
    """Each signal's handler before the run took it."""

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.under_way and self.signum is None:
            self.signum = signum
            self.cancel.set()
            return
        # Python's own Ctrl+C handler raises KeyboardInterrupt; a command that runs this
        # one (serve-pair) has its own; the default ends the process, as Stopped does
        handler = self.previous.get(signum)
        if callable(handler):
            handler(signum, frame)
        elif handler == signal.SIG_IGN and not self.under_way:
            return  # ignored until the run is under way, as it was before it was taken
        raise Stopped(signum)

    def pass_on(self) -> None:
        """Once a run a stop ended is saved and shown, a handler of the command running
        this one (serve-pair stops its servers) still hears of the stop."""
        if self.signum is None:
            return
        handler = self.previous.get(self.signum)
        if callable(handler) and handler is not signal.default_int_handler:
            handler(self.signum, None)


@contextlib.contextmanager
def stop_requests(cancel: threading.Event) -> Iterator[StopRequests]:
    """StopRequests in charge of SIGINT and SIGTERM while the block runs."""
    stops = StopRequests(cancel)
    for signum in STOP_SIGNALS:
        handler = signal.getsignal(signum)
        stops.previous[signum] = signal.SIG_DFL if handler is None else handler
        signal.signal(signum, stops)
    try:
        yield stops
    finally:
        for taken, previous in stops.previous.items():
            # a handler that took over meanwhile (serve-pair ignoring a second stop while
            # it stops its servers) stays
            if signal.getsignal(taken) is stops:
                signal.signal(taken, previous)


@dataclass
class StepProgress:
    """What each step arriving does: counted on the progress line, and saved where the
    run writes a session."""

    status: Status
    max_tokens: int
    writer: SessionWriter | None = None
    counts: dict[str, int] = field(default_factory=lambda: {"a": 0, "b": 0})

    def __call__(self, step: TokenStep) -> None:
        self.counts[step.lane] += 1
        if self.writer is not None:
            self.writer.step(step)
        self.status.update(
            f"generating: lane a {self.counts['a']}/{self.max_tokens} · "
            f"lane b {self.counts['b']}/{self.max_tokens} tokens"
        )


def run_pair(
    args: argparse.Namespace, pair: Pair, prompt: str, stops: StopRequests
) -> tuple[PairResult, SessionWriter | None]:
    """The pair run in a worker process, with its session writer when --save asks for
    one (its footer not yet written). A stop once the prompt is read ends the run in
    order (`StopRequests`): one before the first token leaves a run of no tokens."""
    # deferred: the engine and session modules load only for the command that runs
    from specdiff.engine.worker import PairWorker

    status = Status(sys.stderr, not args.quiet)
    progress = StepProgress(status, args.max_tokens)
    with PairWorker(pair, status.message, stops.cancel) as runner:
        tokens = runner.tokenize(prompt)
        status.message(f"running {pair.name} on a {len(tokens)}-token prompt")
        # from here a stop cannot leave the session file unfinished
        stops.under_way = True
        if args.save:
            progress.writer = start_session(args, runner, pair, prompt, tokens)
            status.message(f"saving to {progress.writer.partial}")
        try:
            result = runner.run(
                prompt,
                args.max_tokens,
                args.stop,
                args.near_tie,
                progress,
                args.teacher_forced,
                args.control,
            )
        except SpecdiffError:
            if progress.writer is not None:
                progress.writer.abandon()
            raise
        status.done()
    return result, progress.writer


def show_result(result: PairResult, as_json: bool, forecast_top: int | None) -> None:
    """The run on stdout: its JSON, or its text for a terminal or a file."""
    from specdiff.reports.text import format_result, result_json  # deferred, as above

    forecast = forecast_parts(result, forecast_top)
    if as_json:
        json.dump(result_json(result) | forecast[0], sys.stdout, indent=1)
        sys.stdout.write("\n")
    elif stopped_before_first_token(result):
        print_text(stopped_early_text(result, terminal_layout()))
    else:
        print_text(format_result(result, terminal_layout(), forecast[1]))


def stopped_before_first_token(result: PairResult) -> bool:
    # the summary is worked out only for a stopped run: the others never are this
    return result.cancelled and result.summary().stopped_before_first_token


def stopped_early_text(result: PairResult, layout: Layout) -> str:
    """A run stopped before either lane produced a token: no comparison to show (the
    full report would call two empty texts identical)."""
    return "\n".join(
        [
            f"pair {visible(result.pair.name)}: {visible(result.pair.description)}".rstrip(": "),
            f"prompt: {len(result.prompt_tokens)} tokens, max {result.max_tokens} new",
            layout.paint("warn", "STOPPED BEFORE ANY TOKEN")
            + ": neither lane produced a token, so nothing was compared.",
        ]
    )


def terminal_layout() -> Layout:
    """The run's text as stdout can show it: a terminal's width and colour, or plain
    100-column text for a file or a pipe."""
    from specdiff.reports.styles import Paint
    from specdiff.reports.text import Layout

    columns = text_columns(sys.stdout)
    paint = Paint(wants_colour(sys.stdout))
    if columns is None:
        return Layout(paint=paint)
    return Layout(width=max(columns, 40), paint=paint, wrap_sentences=True)


def print_text(text: str) -> None:
    """Text with specdiff's own colour written past the guard (which would escape it),
    every other control character escaped here instead."""
    from specdiff.reports.styles import SEQUENCES

    stream = unguarded(sys.stdout)
    stream.write(styled_terminal_text(text, SEQUENCES) + "\n")
    stream.flush()


def forecast_parts(result: PairResult, top: int | None) -> tuple[dict[str, object], list[str]]:
    """--forecast's JSON entry and text lines; nothing without it."""
    if top is None:
        return {}, []
    # deferred: the forecast loads only for the runs that ask for it
    from specdiff.forecast import forecast, forecast_json, forecast_lines, model_for

    steps = result.a.steps
    fork = run_fork_index(steps, result.b.steps, result.teacher_forced)
    made = forecast(steps, top, model_for(result.pair.name))
    return {"forecast": forecast_json(made, fork)}, forecast_lines(made, steps, fork)


def read_chat_request(args: argparse.Namespace) -> tuple[dict[str, Pair], Pair, str]:
    """`read_request`, with the prompt as --messages and --system make it: a
    conversation, or the prompt read as it is. Two sources of the prompt are refused
    before either is read: stdin can be read once, and a terminal's would wait for it."""
    if args.messages is not None and (args.prompt is not None or args.prompt_file):
        raise ChatError("give the prompt once: --messages, or --prompt / --prompt-file")
    known, pair, prompt = read_request(args)
    if args.messages is not None:
        prompt = read_messages(*_messages_source(args.messages))
    return known, pair, conversation(prompt, args.system)


def _messages_source(value: str) -> tuple[str, str]:
    """--messages JSON itself, or the text of the file (- = stdin) it names; with the
    words that name it in messages."""
    if not value.strip():
        raise ChatError(f"--messages is empty; give a JSON list like {EXAMPLE}, or a file")
    if value.lstrip().startswith(("[", "{")) or _is_json_scalar(value):
        return value, "--messages"
    where = "--messages on stdin" if value == "-" else f"--messages file {visible(value, 120)}"
    limit = 4 * MAX_CONVERSATION_CHARS  # the longest conversation, every character 4 bytes
    try:
        if value == "-":
            raw = sys.stdin.buffer.read(limit + 1)
            if len(raw) > limit:
                raise ValueError(f"is larger than {limit:,} bytes")
        else:
            raw = read_limited(Path(value).expanduser(), limit)
        return raw.decode("utf-8"), where
    except FileNotFoundError:
        raise ChatError(f"{where} not found; give a file or the JSON list itself") from None
    except OSError as error:
        raise ChatError(f"cannot read {where}: {error.strerror}") from None
    except UnicodeDecodeError:
        raise ChatError(f"{where} is not UTF-8 text") from None
    except ValueError as error:
        raise ChatError(f"{where} {error}; give a messages list") from None


def _is_json_scalar(value: str) -> bool:
    """A JSON string, true, false or null: meant as the messages themselves (and refused
    as no list), not as a file's name."""
    stripped = value.strip()
    if stripped in ("null", "true", "false"):
        return True
    if not stripped.startswith('"'):
        return False
    try:
        json.loads(stripped)
    except ValueError:
        return False
    return True


def start_session(
    args: argparse.Namespace, runner: PairWorker, pair: Pair, prompt: str, tokens: list[int]
) -> SessionWriter:
    """A session file with its header written, once the input is known to be good."""
    # deferred: the engine, session and report modules load only for the command that runs
    from specdiff.sessions.header import SessionHeader
    from specdiff.sessions.store import SessionWriter

    runner.check(tokens, args.max_tokens)  # bad input leaves no file
    # one time names the file and dates the header, which the list shows
    created = datetime.now(timezone.utc).isoformat(timespec="seconds")
    writer = SessionWriter(args.sessions_dir, pair.name, prompt, started=created)
    writer.header(
        SessionHeader(
            pair=pair,
            prompt=prompt,
            prompt_token_ids=tuple(tokens),
            max_tokens=args.max_tokens,
            stop=tuple(args.stop),
            executed=runner.executed(),
            build=runner.build,
            created=created,
            teacher_forced=args.teacher_forced,
        )
    )
    return writer


def exit_code(result: PairResult, stopped_by: int | None = None) -> int:
    """The run's exit code, with a line on stderr for a stop or a failed lane;
    `stopped_by`, the signal that stopped the run."""
    if result.cancelled:
        covers = (
            "before any token, so nothing was compared"
            if stopped_before_first_token(result)
            else "the summary covers the tokens produced"
        )
        print(f"specdiff: {stop_words(stopped_by)}; {covers}", file=sys.stderr)
        return 128 + (stopped_by or signal.SIGINT)
    errors = result.error_lines()
    if errors:
        for error in errors:
            print(f"specdiff: error: {visible(error)}", file=sys.stderr)
        return Exit.BAD_INPUT
    differ = not result.comparison.identical
    if result.teacher_forced:
        # lane b was fed lane a's tokens, so the ids agree by construction: a flip differs
        differ = run_fork_index(result.a.steps, result.b.steps, True) is not None
    return Exit.DIFFERENT if differ else Exit.SAME
