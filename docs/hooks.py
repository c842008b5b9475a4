"""MkDocs hook: the CLI reference page, written from specdiff's own argparse parser while
the site builds.

A reference typed by hand drifts from the options it describes; this one is the text of
`specdiff COMMAND --help` for every command and subcommand, taken from
`specdiff.cli.build_parser()` at build time, so it cannot. It is never committed:
`mkdocs build` and `mkdocs serve` make it, and tests/test_docs.py checks it against the
real `--help` output.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from typing import Any

REFERENCE_PAGE = "reference/cli.md"
HELP_COLUMNS = 80
"""argparse wraps help at the terminal's width; a fixed width keeps the page the same
wherever it is built."""

INTRO = f"""# CLI reference

Every command and its options, as `specdiff COMMAND --help` prints them in a terminal
{HELP_COLUMNS} columns wide. This page is generated from specdiff's own parser each time
the site is built, so it always matches the installed code. `specdiff` alone (or with
options only) is `specdiff live`, the TUI. Exit codes: 0 the lanes agree, 1 they differ,
2 bad input, 130 interrupted (see [what `specdiff run` prints](../guide/run.md#exit-codes)).
"""


def command_parsers(
    parser: argparse.ArgumentParser, words: tuple[str, ...] = ("specdiff",)
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """The parser of every command and subcommand, depth first, in `--help` order, each
    with the words that name it (`("specdiff", "sessions", "open")`)."""
    yield words, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, subparser in action.choices.items():
                yield from command_parsers(subparser, (*words, name))


def help_text(parser: argparse.ArgumentParser, columns: int = HELP_COLUMNS) -> str:
    """What `--help` prints for this parser in a terminal `columns` wide."""
    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(columns)
    try:
        return parser.format_help()
    finally:
        if previous is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = previous


def reference_markdown() -> str:
    """The whole CLI reference page."""
    # imported here, not at the top, so that MkDocs can load this file (and a test can
    # read its constants) before anything of specdiff is imported
    from specdiff.cli import build_parser

    sections = [INTRO]
    for words, parser in command_parsers(build_parser()):
        level = "#" * min(len(words) + 1, 4)
        sections.append(f"{level} {' '.join(words)}\n\n```text\n{help_text(parser)}```\n")
    return "\n".join(sections)


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    files.append(File.generated(config, REFERENCE_PAGE, content=reference_markdown()))
    return files
