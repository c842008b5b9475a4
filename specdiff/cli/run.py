"""`specdiff run`: both lanes of a pair on one prompt, headless; exit 1 when they fork."""

from __future__ import annotations

import argparse
import json
import sys
import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

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
    interrupt_sets,
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
    """Exit 0 when the lanes agree, 1 when they fork, 2 when a lane failed, 130 when stopped."""
    _, pair, prompt = read_chat_request(args)
    if args.control:
        refuse_uncontrollable(pair)
    notes = [mixed_note(pair.a, pair.b), unformatted_note(prompt, pair.a, pair.b)]
    for note in notes:
        if note is not None:
            print(f"specdiff: note: {note}", file=sys.stderr)
    note_unread_keys((("a", pair.a), ("b", pair.b)))
    result, writer = run_pair(args, pair, prompt)
    if writer is not None:
        saved = writer.finish(result.summary())
        print(f"specdiff: saved session {visible(str(saved))}", file=sys.stderr)
    show_result(result, args.json, args.forecast)
    return exit_code(result)


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
    args: argparse.Namespace, pair: Pair, prompt: str
) -> tuple[PairResult, SessionWriter | None]:
    """The pair run in a worker process, with its session writer when --save asks for
    one (its footer not yet written)."""
    # deferred: the engine and session modules load only for the command that runs
    from specdiff.engine.worker import PairWorker

    status = Status(sys.stderr, not args.quiet)
    cancel = threading.Event()
    progress = StepProgress(status, args.max_tokens)
    with PairWorker(pair, status.message, cancel) as runner:
        tokens = runner.tokenize(prompt)
        status.message(f"running {pair.name} on a {len(tokens)}-token prompt")
        if args.save:
            progress.writer = start_session(args, runner, pair, prompt, tokens)
            status.message(f"saving to {progress.writer.partial}")
        try:
            with interrupt_sets(cancel):
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
    else:
        print_text(format_result(result, terminal_layout(), forecast[1]))


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
    writer = SessionWriter(args.sessions_dir, pair.name, prompt)
    writer.header(
        SessionHeader(
            pair=pair,
            prompt=prompt,
            prompt_token_ids=tuple(tokens),
            max_tokens=args.max_tokens,
            stop=tuple(args.stop),
            executed=runner.executed(),
            build=runner.build,
            created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            teacher_forced=args.teacher_forced,
        )
    )
    return writer


def exit_code(result: PairResult) -> int:
    """The run's exit code, with a line on stderr for a stop or a failed lane."""
    if result.cancelled:
        print("specdiff: interrupted; the summary covers the tokens produced", file=sys.stderr)
        return Exit.INTERRUPTED
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
