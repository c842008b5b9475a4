"""`specdiff live`, the default command: the TUI with both lanes streaming side by side."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from specdiff.cli import options
from specdiff.cli.common import Exit, Subcommands, add_command, config_theme
from specdiff.cli.run import read_chat_request
from specdiff.control import refuse_uncontrollable

if TYPE_CHECKING:
    from specdiff.tui.app import SpecdiffApp


def add_parser(commands: Subcommands) -> None:
    live = add_command(
        commands,
        "live",
        "the TUI: both lanes streaming side by side (the default command)",
        command_live,
    )
    options.add_request_options(live)
    options.add_chat_options(live)
    options.add_control(live)
    live.add_argument("--theme", help="theme name (default: config file, else specdiff-dark)")
    live.add_argument("--sessions-dir", help="where `s` saves sessions")
    live.add_argument("--no-start", action="store_true", help="open without starting a run")


def command_live(args: argparse.Namespace) -> int:
    live_app(args).run()
    return Exit.SAME


def live_app(args: argparse.Namespace) -> SpecdiffApp:
    """The app the command line asks for, its prompt box holding the prompt, or with
    --messages / --system the conversation; bad input is refused before Textual loads."""
    known, pair, prompt = read_chat_request(args)
    if args.control:
        refuse_uncontrollable(pair)
    known[pair.name] = pair
    # deferred: Textual loads only for the commands that open a screen
    from specdiff.tui.app import make_app

    # what the command line changed, shown in the TUI's overrides fields (later words win)
    both = [*([f"model={args.model}"] if args.model else []), *args.both]
    overrides = {"a": " ".join([*both, *args.lane_a]), "b": " ".join([*both, *args.lane_b])}
    return make_app(
        known,
        pair.name,
        prompt,
        args.max_tokens,
        near_tie=args.near_tie,
        theme_name=args.theme or config_theme(),
        autostart=not args.no_start,
        sessions_dir=args.sessions_dir,
        overrides=overrides,
        control=args.control,
    )
