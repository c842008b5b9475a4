"""`specdiff replay`: a saved session in the TUI, at its recorded pace; no model is loaded."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from specdiff.cli import options
from specdiff.cli.common import Exit, Subcommands, add_command, config_theme
from specdiff.cli.session_arg import add_session_argument, session_path
from specdiff.errors import SpecdiffError
from specdiff.lanes import presets

if TYPE_CHECKING:
    from specdiff.sessions.store import Session, SessionStream
    from specdiff.tui.app import SpecdiffApp

REPLAY_FIRST_STEPS = 400
"""A paced replay opens once this many steps are read; the rest is read as it plays."""


def add_parser(commands: Subcommands) -> None:
    replay = add_command(
        commands, "replay", "open a saved session in the TUI (no model is loaded)", command_replay
    )
    add_session_argument(replay)
    options.add_replay_options(replay)


def command_replay(args: argparse.Namespace) -> int:
    return replay_file(session_path(args), args)


def open_for_replay(path: str | Path) -> tuple[Session, SessionStream]:
    """The session as far as its first steps, and the stream holding the rest, which the
    replay screen reads once it has painted them."""
    # deferred: the engine, session and report modules load only for the command that runs
    from specdiff.sessions.store import SessionStream

    stream = SessionStream(path)
    stream.read(REPLAY_FIRST_STEPS)
    stream.check()  # a bad line among the first steps: an error before the screen opens
    return stream.session, stream


def replay_file(path: str | Path, args: argparse.Namespace) -> int:
    """Replay the session at `path` with the theme and pace of `options.add_replay_options`."""
    session, stream = open_for_replay(path)
    try:
        app = replay_app(session, stream, args)
        app.run()
    finally:
        stream.close()
    if app.load_error is not None:
        raise SpecdiffError(app.load_error)
    return Exit.SAME


def replay_app(session: Session, stream: SessionStream, args: argparse.Namespace) -> SpecdiffApp:
    """The TUI showing `session`: its pair among the presets, runnable only when it names
    no server lanes or the user allowed them."""
    # deferred: the engine, session and report modules load only for the command that runs
    from specdiff.sessions.playback import check_speed

    # deferred: Textual loads only for the commands that open a screen
    from specdiff.tui.app import make_app

    speed = None if args.instant else check_speed(args.speed)
    known = presets()
    known[session.pair.name] = session.pair
    unsafe = session.pair.servers_named(session.path.name)
    refused = {} if unsafe is None or args.allow_servers else {session.pair.name: unsafe}
    return make_app(
        known,
        session.pair.name,
        session.prompt,
        session.header.max_tokens,
        theme_name=args.theme or config_theme(),
        autostart=False,
        session=session,
        replay_speed=speed,
        session_stream=stream,
        refused_pairs=refused,
        pause_at_fork=args.pause_at_fork,
        # the command line's replay says when it was recorded on another CPU
        compare_machine=True,
    )
