"""The specdiff command line: one module per command, each holding its options beside its
handler; this one assembles them and turns errors into exit codes.

Exit codes: 0 the lanes agree, 1 they differ (or the output could not be written to
the end: a full disk, a closed pipe), 2 bad input (one line on stderr, no traceback),
130 interrupted.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Sequence

from specdiff import __version__
from specdiff.cli import (
    certify,
    doctor,
    explain,
    export,
    imports,
    live,
    models,
    proxy,
    repeat,
    replay,
    run,
    score,
    serve,
    serve_pair,
    sessions,
    suite,
    suite_merge,
    verify,
)
from specdiff.cli.common import CommandParser, Exit
from specdiff.errors import SpecdiffError
from specdiff.files import OutputLost, lost_output
from specdiff.lanes import LANE_KEYS
from specdiff.safe_text import guarded_output, visible

COMMANDS = (
    live,
    run,
    replay,
    sessions,
    verify,
    explain,
    export,
    suite,
    suite_merge,
    imports,
    proxy,
    score,
    repeat,
    certify,
    serve_pair,
    serve,
    models,
    doctor,
)
"""In the order `specdiff --help` lists them."""


@functools.cache
def build_parser() -> CommandParser:
    """Every command's options, built once a process: some 150 add_argument calls take
    ~5 ms, which a caller of main() in a loop paid on every call. Parsing leaves a
    parser as it found it."""
    parser = CommandParser(
        prog="specdiff",
        description="Why does the same prompt at temperature 0 give different text? "
        "Run two decoding configurations side by side and see where they fork.",
        epilog="lane keys: " + ", ".join(LANE_KEYS),
    )
    parser.add_argument("--version", action="version", version=f"specdiff {__version__}")
    parser.set_defaults(run_command=main)
    subcommands = parser.add_subparsers(dest="command", parser_class=CommandParser)
    for command in COMMANDS:
        command.add_parser(subcommands)
    return parser


@guarded_output()
def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        if (
            not arguments
            or arguments[0].startswith("--")
            and arguments[0] not in ("--help", "--version")
        ):
            # The bare command (with options) opens the TUI.
            arguments = ["live", *arguments]
        args = parser.parse_args(suite_merge.merge_arguments(arguments))
        handler = getattr(args, "handler", None)
        if handler is None:
            parser.print_help()
            return Exit.BAD_INPUT
        code = int(handler(args))
        # here, not at interpreter exit, where a full device or a closed pipe would end
        # in Python's own "Exception ignored" message and exit status 120
        sys.stdout.flush()
        return code
    except OutputLost as error:
        return output_lost(error)
    except SpecdiffError as error:
        say(f"specdiff: error: {visible(str(error))}")
        return Exit.BAD_INPUT
    except OSError as error:
        lost = lost_output(error)
        if lost is None:
            raise
        return output_lost(lost)
    except KeyboardInterrupt:
        say("specdiff: interrupted")
        return Exit.INTERRUPTED


def say(line: str) -> None:
    """One line on stderr, or nothing when stderr itself cannot be written."""
    with contextlib.suppress(OSError):
        print(line, file=sys.stderr, flush=True)


def output_lost(error: OutputLost) -> int:
    """Exit 1 with one line once output could not be written to the end. Whatever
    stdout still holds goes to the null device, as the Python documentation advises
    for a broken pipe, so that the flush at interpreter exit cannot fail again."""
    try:
        sys.stdout.flush()
    except OSError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    say(f"specdiff: error: {visible(str(error))}")
    return Exit.FAILED


if __name__ == "__main__":
    sys.exit(main())
