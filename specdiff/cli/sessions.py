"""`specdiff sessions`: the saved sessions in a folder, a line each, or one of them replayed."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specdiff.cli import options
from specdiff.cli.common import CommandParser, Exit, Subcommands, add_command
from specdiff.cli.replay import replay_file
from specdiff.safe_text import visible

if TYPE_CHECKING:
    from specdiff.sessions.catalog import SessionInfo


def add_parser(commands: Subcommands) -> None:
    sessions = add_command(
        commands, "sessions", "list the saved sessions, or open one", command_sessions
    )
    sessions.add_argument(
        "--sessions-dir",
        help="the folder to list, with its subfolders two levels down (a suite's report "
        "folder works; default: ./sessions or the user data dir)",
    )
    sessions.add_argument("--json", action="store_true", help="one JSON object per session")
    session_commands = sessions.add_subparsers(dest="sessions_command", parser_class=CommandParser)
    listing = session_commands.add_parser("list", help="a line per session (the default)")
    listing.add_argument("--json", action="store_true", default=argparse.SUPPRESS)
    opening = session_commands.add_parser(
        "open", help="replay a listed session: its number in the list or its file name"
    )
    opening.add_argument("reference", metavar="NUMBER|NAME")
    options.add_replay_options(opening)


def command_sessions(args: argparse.Namespace) -> int:
    # deferred: the engine, session and report modules load only for the command that runs
    from specdiff.sessions.catalog import resolve_in, scan_sessions
    from specdiff.sessions.store import sessions_dir

    directory = sessions_dir(args.sessions_dir).absolute()
    listing = scan_sessions(directory)
    infos = listing.sessions
    if args.sessions_command == "open":
        return replay_file(resolve_in(directory, args.reference, infos), args)
    for link in listing.skipped:
        # on stderr, so that --json stays a session a line
        where = visible(str(link.path.relative_to(directory)))
        print(f"specdiff: note: skipped {where}: {link.why}", file=sys.stderr)
    if args.json:
        for info in infos:
            # ASCII: control characters in a shared file stay escapes on the terminal
            print(json.dumps(session_json(info), ensure_ascii=True))
    else:
        print_listing(directory, infos)
    return Exit.SAME


FOLDER_WIDTH = 40
"""The widest the folder column grows: a suite's sessions/PAIR fits, a deep path is cut."""


def print_listing(directory: Path, infos: list[SessionInfo]) -> None:
    if not infos:
        print(
            f"no sessions in {visible(str(directory))} or its subfolders "
            "(save one with `specdiff run --save` or `s` in the TUI)"
        )
        return
    # a suite's sessions lie in a folder per pair: the column appears where one does
    width = min(FOLDER_WIDTH, max(len(visible(info.folder)) for info in infos))
    folders = width > 0
    folder_head = f"{'folder':<{width}}  " if folders else ""
    # as wide as its widest entry ("stopped before any token" is the longest)
    verdict = max(12, *(len(info.diverged) for info in infos))
    print(f"sessions in {visible(str(directory))}:")
    print(
        f"{'#':>3}  {folder_head}{'date (UTC)':<16}  {'pair':<16}  "
        f"{'diverged at':<{verdict}}  {'tokens':>9}  prompt"
    )
    for number, info in enumerate(infos, 1):
        folder = f"{visible(info.folder or '.', width):<{width}}  " if folders else ""
        if info.problem is not None:
            print(
                f"{number:>3}  {folder}{visible(info.path.name)}: unreadable "
                f"({visible(info.problem)})"
            )
            continue
        tokens = "/".join("?" if n is None else str(n) for n in info.generated or (None,))
        prompt = visible(" ".join(info.prompt.split()), limit=40)
        print(
            f"{number:>3}  {folder}{visible(info.when, 16):<16}  {visible(info.pair, 16):<16}  "
            f"{info.diverged:<{verdict}}  {tokens:>9}  {prompt}"
        )
    print("open one with: specdiff sessions open NUMBER (or replay, verify, export its file)")


def session_json(info: SessionInfo) -> dict[str, Any]:
    return {
        "path": str(info.path),
        "folder": info.folder,
        "created": info.created,
        "pair": info.pair,
        "prompt": info.prompt,
        "partial": info.partial,
        "identical": info.identical,
        "stopped_before_first_token": info.stopped_before_first_token,
        "cancelled": info.cancelled,
        "fork_index": info.fork_index,
        "generated": list(info.generated) if info.generated else None,
        "problem": info.problem,
    }
