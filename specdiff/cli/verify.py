"""`specdiff verify`: re-run a session's lanes and compare token ids step by step."""

from __future__ import annotations

import argparse
import sys

from specdiff.cli import options
from specdiff.cli.common import Exit, Status, Subcommands, add_command
from specdiff.errors import SpecdiffError
from specdiff.safe_text import visible


def add_parser(commands: Subcommands) -> None:
    verify = add_command(
        commands,
        "verify",
        "re-run a session's lanes and compare token ids step by step",
        command_verify,
    )
    options.add_session_file(verify)
    options.add_quiet(verify)
    options.add_allow_servers(verify)


def command_verify(args: argparse.Namespace) -> int:
    """Exit 0 when every recorded token comes out again, 1 at the first that does not."""
    # deferred: the engine, session and report modules load only for the command that runs
    from specdiff.engine.worker import PairWorker
    from specdiff.sessions.store import load_session
    from specdiff.sessions.verify import (
        drift_lines,
        environment_changes,
        first_drift,
        likely_cause,
        recorded_fork_lines,
    )

    session = load_session(args.session)
    header = session.header
    pair = session.pair
    unsafe = pair.servers_named(session.path.name)
    if unsafe and not args.allow_servers:
        raise SpecdiffError(unsafe)
    status = Status(sys.stderr, not args.quiet)
    with PairWorker(pair, status.message) as runner:
        status.message(f"re-running {pair.name} from {session.path.name}")
        result = runner.run(
            session.prompt,
            header.max_tokens,
            header.stop,
            teacher_forced=header.teacher_forced,
        )
        executed = runner.executed()
    if result.crashed:
        # a re-run that died says nothing about drift: report the crash, not a length change
        for line in result.error_lines():
            print(f"specdiff: error: {visible(line)}", file=sys.stderr)
        return Exit.BAD_INPUT
    drift = first_drift(session, {"a": result.a.token_ids, "b": result.b.token_ids})
    # the recorded build, system info and file name are what the session file says
    changes = [visible(change) for change in environment_changes(header, result.build, executed)]
    name = visible(session.path.name)
    if drift is None:
        total = len(session.steps["a"]) + len(session.steps["b"])
        print(f"verified: all {total} recorded steps came out again ({name})")
        for line in recorded_fork_lines(session):
            print(f"  {line}")
        for change in changes:
            print(f"  note: {change}")
        return Exit.SAME
    for line in drift_lines(session, drift, {"a": result.a.steps, "b": result.b.steps}):
        print(line)
    print(
        "what changed since the recording: "
        + ("; ".join(changes) if changes else "nothing in build, system info or model hashes")
    )
    cause = likely_cause(header.build, result.build, header.executed, executed)
    if cause is not None:
        print(f"likely cause: {visible(cause)}")
    return Exit.DIFFERENT
