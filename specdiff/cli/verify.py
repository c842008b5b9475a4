"""`specdiff verify`: re-run a session's lanes and compare token ids step by step."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from specdiff.cli import options
from specdiff.cli.common import Exit, Status, Subcommands, add_command, text_output
from specdiff.cli.session_arg import add_session_argument, session_path
from specdiff.errors import SpecdiffError
from specdiff.safe_text import visible

if TYPE_CHECKING:
    from specdiff.results import PairResult
    from specdiff.sessions.store import Session
    from specdiff.sessions.verify import Drift

Executed = dict[str, dict[str, Any]]
"""What each lane's run executed (the worker's record), by lane id."""


def add_parser(commands: Subcommands) -> None:
    verify = add_command(
        commands,
        "verify",
        "re-run a session's lanes and compare token ids step by step",
        command_verify,
    )
    add_session_argument(verify)
    options.add_quiet(verify)
    options.add_allow_servers(verify)


@text_output
def command_verify(args: argparse.Namespace) -> int:
    """Exit 0 when every recorded token comes out again, 1 at the first that does not."""
    # deferred: the engine, session and report modules load only for the command that runs
    from specdiff.sessions.store import load_session
    from specdiff.sessions.verify import environment_changes, first_drift

    session = load_session(session_path(args))
    unsafe = session.pair.servers_named(session.path.name)
    if unsafe and not args.allow_servers:
        raise SpecdiffError(unsafe)
    result, executed = rerun(session, args.quiet)
    if result.crashed:
        # a re-run that died says nothing about drift: report the crash, not a length change
        for line in result.error_lines():
            print(f"specdiff: error: {visible(line)}", file=sys.stderr)
        return Exit.BAD_INPUT
    drift = first_drift(session, {"a": result.a.token_ids, "b": result.b.token_ids})
    # the recorded build, system info and file name are what the session file says
    changes = environment_changes(session.header, result.build, executed)
    shown = [visible(change) for change in changes]
    if drift is None:
        print_verified(session, shown)
        return Exit.SAME
    print_drift(session, drift, result, executed, shown)
    return Exit.DIFFERENT


def rerun(session: Session, quiet: bool) -> tuple[PairResult, Executed]:
    """The session's pair run again on its prompt, and what each lane executed."""
    from specdiff.engine.worker import PairWorker  # deferred, as above

    header = session.header
    status = Status(sys.stderr, not quiet)
    with PairWorker(session.pair, status.message) as runner:
        status.message(f"re-running {session.pair.name} from {session.path.name}")
        result = runner.run(
            session.prompt,
            header.max_tokens,
            header.stop,
            teacher_forced=header.teacher_forced,
        )
        executed = runner.executed()
    return result, executed


def print_verified(session: Session, changes: list[str]) -> None:
    """Every recorded step came out again: the count, the recorded fork, what changed."""
    from specdiff.sessions.verify import recorded_fork_lines  # deferred, as above

    total = len(session.steps["a"]) + len(session.steps["b"])
    print(f"verified: all {total} recorded steps came out again ({visible(session.path.name)})")
    for line in recorded_fork_lines(session):
        print(f"  {line}")
    for change in changes:
        print(f"  note: {change}")


def print_drift(
    session: Session, drift: Drift, result: PairResult, executed: Executed, changes: list[str]
) -> None:
    """Where the re-run left the recording, what changed since, and the likely cause."""
    from specdiff.sessions.verify import drift_lines, likely_cause  # deferred, as above

    for line in drift_lines(session, drift, {"a": result.a.steps, "b": result.b.steps}):
        print(line)
    print(
        "what changed since the recording: "
        + ("; ".join(changes) if changes else "nothing in build, system info or model hashes")
    )
    header = session.header
    cause = likely_cause(header.build, result.build, header.executed, executed)
    if cause is not None:
        print(f"likely cause: {visible(cause)}")
