"""The option groups several commands take, each defined once so that its name, default
and help read the same in every command; and the number types every numeric option is
read with, so that nan, inf, a negative count or a budget no context could hold is
refused on the command line, in one line, before any work."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path

from specdiff.cli.common import ArgumentError
from specdiff.compare import DEFAULT_NEAR_TIE
from specdiff.errors import SpecdiffError
from specdiff.files import NotRegularFile, check_replaceable, write_text_atomic
from specdiff.lanes import BOUNDS
from specdiff.safe_text import first_surrogate

DEFAULT_PAIR = "spec-vs-plain"
DEFAULT_MAX_TOKENS = 200
MAX_TOKENS_LIMIT = BOUNDS["n_ctx"][1]
"""No lane's context holds more tokens than this, so no budget may ask for more."""


def whole_number(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: a whole number from low to high, both included."""

    def read(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be from {low} to {high}, got {value}")
        return value

    return read


def finite_number(
    low: float, above: bool = False, high: float = math.inf
) -> Callable[[str], float]:
    """An argparse type: a finite number at least low (above low, when `above`), and at
    most high."""
    wanted = f"a finite number {'above' if above else 'of at least'} {low:g}"
    if high < math.inf:
        wanted += f" and at most {high:g}"

    def read(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {text!r}") from None
        if not math.isfinite(value) or not low <= value <= high or above and value == low:
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {text.strip()}")
        return value

    return read


def utf8_text(text: str) -> str:
    """An argparse type: text that is UTF-8. A shell passes bytes as they are, and Python
    keeps the ones that are not UTF-8 as lone surrogates, which no tokenizer, session or
    report can hold."""
    position = first_surrogate(text)
    if position is not None:
        raise argparse.ArgumentTypeError(
            f"is not UTF-8 text ({text[position]!r} at position {position}); "
            "pass UTF-8, e.g. from a UTF-8 file"
        )
    return text


def model_path(text: str) -> str:
    """An argparse type: a GGUF path. An empty one (an unset shell variable) is refused,
    not read as the bundled model."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty; give a GGUF path, or leave --model out")
    return utf8_text(text)


def check_output_file(path: Path, option: str) -> None:
    """Refused before any work: a file that could not be written once the work is done
    (a folder, a device or a pipe in its place, or a folder that does not exist)."""
    try:
        check_replaceable(path)
    except NotRegularFile as error:
        raise ArgumentError(f"{option}: {error}") from None
    if not path.parent.is_dir():
        raise ArgumentError(
            f"{option}: folder {path.parent} does not exist; create it or name another file"
        )


def write_output_file(path: Path, text: str, option: str) -> None:
    """Write a report checked by check_output_file; a failure that only the write itself
    shows (a full disk, a folder removed meanwhile) is one line, not a traceback."""
    try:
        write_text_atomic(path, text)
    except OSError as error:
        raise SpecdiffError(f"{option}: cannot write {path}: {error.strerror}") from None


token_budget = whole_number(1, MAX_TOKENS_LIMIT)
"""--max-tokens: at least one token, at most what the largest context holds."""
thread_count = whole_number(0, BOUNDS["threads"][1])
"""--threads: 0 for the default, else how many."""
context_size = whole_number(*BOUNDS["n_ctx"])
"""--ctx-size: what a lane's n_ctx allows."""
run_count = whole_number(1, 100_000)
"""repeat -n: every run's tokens are kept for the summary, so not without end."""
companion_count = whole_number(0, 255)
"""repeat --companions: llama.cpp holds at most 256 sequences in one batch."""
concurrency = whole_number(1, 1024)
"""repeat --concurrency: requests in flight at once."""


def add_lane_options(parser: argparse.ArgumentParser, one_pair: bool = True) -> None:
    """The pair and its overrides, as `common.resolve_pair` reads them."""
    if one_pair:
        parser.add_argument(
            "--pair", default=DEFAULT_PAIR, help=f"pair preset (default {DEFAULT_PAIR})"
        )
    parser.add_argument("--pairs", metavar="FILE", help="TOML file with more pairs ([pairs.NAME])")
    parser.add_argument(
        "--model", type=model_path, help="GGUF path for both lanes (default: the bundled model)"
    )
    for flag, whom in (("--lane-a", "lane A"), ("--lane-b", "lane B"), ("--both", "both lanes")):
        parser.add_argument(
            flag, action="append", default=[], metavar="KEY=VALUE", help=f"override {whom}"
        )


def add_prompt_options(
    parser: argparse.ArgumentParser, file_help: str = "read the prompt from FILE (- = stdin)"
) -> None:
    """--prompt or --prompt-file, as `common.read_prompt` reads them."""
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--prompt", type=utf8_text, help="the prompt text")
    source.add_argument("--prompt-file", metavar="FILE", help=file_help)


def add_chat_options(parser: argparse.ArgumentParser) -> None:
    """--system and --messages, as `run.read_chat_request` reads them: the prompt as a
    conversation, which chat lanes (lane key chat, or a server's api=chat) format."""
    parser.add_argument(
        "--system",
        type=utf8_text,
        metavar="TEXT",
        help="a system message before the prompt (the prompt becomes a conversation)",
    )
    parser.add_argument(
        "--messages",
        metavar="FILE|JSON",
        help='the prompt as a JSON messages list, e.g. \'[{"role": "user", "content": "Hi"}]\', '
        "or a file holding one (- = stdin)",
    )


def add_request_options(parser: argparse.ArgumentParser) -> None:
    """Everything `common.read_request` reads: the pair, the prompt and the limits."""
    add_lane_options(parser)
    add_prompt_options(parser)
    add_max_tokens(parser)
    add_near_tie(parser)


def add_max_tokens(
    parser: argparse.ArgumentParser, default: int | None = DEFAULT_MAX_TOKENS
) -> None:
    """--max-tokens; a default of None lets a stored setting (a resumed suite) decide."""
    parser.add_argument(
        "--max-tokens",
        type=token_budget,
        default=default,
        help=f"tokens per lane (default {DEFAULT_MAX_TOKENS if default is None else default})",
    )


def add_near_tie(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--near-tie",
        type=finite_number(0.0),
        default=DEFAULT_NEAR_TIE,
        help=f"margin below which a step counts as a near tie (default {DEFAULT_NEAR_TIE})",
    )


def add_teacher_forced(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--teacher-forced",
        action="store_true",
        help="feed lane b lane a's tokens: count the steps whose argmax flips",
    )


def add_control(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--control",
        action="store_true",
        help="also run lane a again, cold, and label a fork that a vs a' shows too as the "
        "noise floor",
    )


def add_quiet(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")


def add_json_summary(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print a JSON summary on stdout")


def add_stop(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--stop", action="append", default=[], type=utf8_text, help="stop string (repeatable)"
    )


def add_model(parser: argparse.ArgumentParser) -> None:
    """One GGUF model, for the commands that run a single lane or server pair."""
    parser.add_argument("--model", type=model_path, help="GGUF path (default: the bundled model)")


def add_session_file(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("session", help="a session file (.jsonl)")


def add_allow_servers(parser: argparse.ArgumentParser) -> None:
    """A session file names its lanes, server lanes included: contacting the endpoints
    and reading the key variable a shared file names takes the user's word."""
    parser.add_argument(
        "--allow-servers",
        action="store_true",
        help="re-run server lanes a session file or a suite's suite.json names (the file "
        "picks the endpoint and the key variable; only for files you trust)",
    )


def add_replay_options(parser: argparse.ArgumentParser) -> None:
    """The theme and pace of a replay, as `replay.replay_file` reads them."""
    parser.add_argument("--theme", help="theme name")
    add_allow_servers(parser)
    pace = parser.add_mutually_exclusive_group()
    pace.add_argument(
        "--speed",
        # below a hundredth of the recorded pace a replay only looks frozen
        type=finite_number(0.01),
        default=1.0,
        help=(
            "a multiple of the recorded pace: 4 plays four times faster, 0.25 four times "
            "slower; 0.01 or more (default 1). A pause over 3 s in the recording plays as "
            "3 s, before the multiple"
        ),
    )
    pace.add_argument("--instant", action="store_true", help="show the whole session at once")
    parser.add_argument(
        "--pause-at-fork",
        action="store_true",
        help="pause the replay once both lanes show the fork's token (space resumes)",
    )
