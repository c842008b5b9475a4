"""`specdiff serve-pair`: two local llama-servers (speculative and plain) for the length of
one run, live or suite command pointed at them.

The servers run in their own sessions (a Ctrl+C for the command must not reach them),
so nothing but specdiff stops them: Ctrl+C, SIGTERM and SIGHUP (a closed terminal) all
unwind the command and stop both servers before specdiff exits."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from specdiff.cli import certify, explain, live, options, run, suite
from specdiff.cli.common import (
    ArgumentError,
    RunCommand,
    Status,
    Subcommands,
    add_command,
    command_parser,
)
from specdiff.lanes import MAX_SERVER_FLAGS
from specdiff.safe_text import visible

if TYPE_CHECKING:
    from specdiff.engine.server.process import LlamaServer

INNER_COMMANDS: dict[str, Callable[[Subcommands], None]] = {
    "run": run.add_parser,
    "live": live.add_parser,
    "suite": suite.add_parser,
    "certify": certify.add_parser,
    "explain": explain.add_parser,
}
"""The commands serve-pair runs on its servers, each with what adds its parser."""
SERVE_PAIR_COMMANDS = tuple(INNER_COMMANDS)
MAX_DRAFT = 256
"""The most tokens --draft-max may ask a server to draft per step."""
SECRET_OPTION = re.compile(r"key|token|secret|passw", re.IGNORECASE)
"""A server option whose value a session must not keep: --api-key, --hf-token, ..."""
PATH_OPTIONS = frozenset({"--api-key-file", "--ssl-key-file", "--ssl-cert-file"})
"""Secret-bearing options whose value is a file's path, kept: the file is not read."""
MASK = "***"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
"""Signals that end serve-pair as Ctrl+C does; the exit status is 128 + the signal."""


class StopSignal(SystemExit):
    """SIGTERM or SIGHUP arrived: unwinds whatever runs (a SystemExit passes through the
    command's own error handling and through asyncio) to where the servers are stopped."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signal_name = signal.Signals(signum).name


@contextlib.contextmanager
def stop_signals_unwind() -> Iterator[None]:
    """While the block runs, SIGTERM and SIGHUP raise StopSignal once; a second one
    during the cleanup that follows is ignored, so the servers are always stopped."""

    def on_signal(signum: int, _frame: object) -> None:
        for stop in STOP_SIGNALS:
            signal.signal(stop, signal.SIG_IGN)
        raise StopSignal(signum)

    previous = {stop: signal.signal(stop, on_signal) for stop in STOP_SIGNALS}
    try:
        yield
    finally:
        for stop, handler in previous.items():
            signal.signal(stop, handler)


def add_parser(commands: Subcommands) -> None:
    serve = add_command(
        commands,
        "serve-pair",
        "start two local llama-servers (speculative vs plain), run a command on them, stop them",
        command_serve_pair,
    )
    options.add_model(serve)
    serve.add_argument("--llama-server", metavar="PATH", help="the llama-server binary")
    serve.add_argument(
        "--spec-type",
        default="ngram-simple",
        help="server a's speculation: any type the llama-server's --help lists, e.g. "
        "ngram-simple (default), ngram-mod, draft-simple, draft-mtp; comma-separated for several",
    )
    serve.add_argument(
        "--draft-model",
        metavar="PATH",
        help="the draft GGUF for server a's draft-* speculation",
    )
    serve.add_argument(
        "--draft-max",
        type=options.whole_number(1, MAX_DRAFT),
        metavar="N",
        help="the most tokens server a drafts per step (llama-server's --spec-draft-n-max)",
    )
    serve.add_argument(
        "--ctx-size", type=options.context_size, default=4096, help="each server's context"
    )
    serve.add_argument(
        "--threads",
        type=options.thread_count,
        default=0,
        help="threads per server (default: half the cores)",
    )
    serve.add_argument(
        "--server-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="one more argument for both servers (repeatable)",
    )
    for lane_id, which in (("a", "the speculative server"), ("b", "the plain server")):
        serve.add_argument(
            f"--server-arg-{lane_id}",
            action="append",
            default=[],
            metavar="ARG",
            help=f"one more argument for {which} only (repeatable; --server-arg-{lane_id}=-X "
            "for one that starts with a dash)",
        )
    serve.add_argument(
        "inner",
        nargs=argparse.REMAINDER,
        metavar="COMMAND ...",
        help="run (default), live, suite, certify or explain, with their options; the lanes "
        "point at the servers",
    )


def inner_command(inner: list[str]) -> list[str]:
    """The command to run on the servers: `run` when none is named."""
    command = inner[1:] if inner[:1] == ["--"] else list(inner)
    if not command or command[0].startswith("-"):
        command = ["run", *command]
    if command[0] not in SERVE_PAIR_COMMANDS:
        raise ArgumentError(
            f"serve-pair runs one of {', '.join(SERVE_PAIR_COMMANDS)}, not {command[0]!r}"
        )
    return command


def speculation_arguments(args: argparse.Namespace, binary: Path) -> list[str]:
    """Server a's speculation as this llama-server build spells it: the type checked
    against the ones its --help lists, the draft options under the names it accepts."""
    from specdiff.engine.server.process import spec_types, usable_option  # deferred, as below

    check_spec_types(args.spec_type, spec_types(binary))
    draft = draft_model_given(args)
    arguments = ["--spec-type", args.spec_type]
    drafts = (
        ("--draft-model", draft, ("--spec-draft-model", "--model-draft")),
        ("--draft-max", args.draft_max, ("--spec-draft-n-max", "--draft-max")),
    )
    for option, value, names in drafts:
        if value is None:
            continue
        flag = usable_option(binary, *names)
        if flag is None:
            raise ArgumentError(f"this llama-server takes no {option} (none of {', '.join(names)})")
        arguments += [flag, str(value)]
    return arguments


def check_spec_types(spec_type: str, known: Sequence[str]) -> None:
    """--spec-type: speculation types separated by commas, each once, each one the
    llama-server build lists (when it lists any)."""
    kinds = spec_type.split(",")
    if "" in (kind.strip() for kind in kinds):
        raise ArgumentError(
            f"--spec-type '{visible(spec_type, 60)}' has an empty entry; give types "
            "separated by commas, e.g. ngram-simple or ngram-mod,ngram-simple"
        )
    if "none" in kinds:
        raise ArgumentError(
            "--spec-type none would make server a plain as well; name a speculation type "
            f"({', '.join(k for k in known if k != 'none') or 'e.g. ngram-simple'})"
        )
    repeated = sorted({kind for kind in kinds if kinds.count(kind) > 1})
    if repeated:
        raise ArgumentError(f"--spec-type lists {visible(repeated[0], 60)} twice; name it once")
    for kind in kinds:
        if known and kind not in known:
            raise ArgumentError(
                f"--spec-type '{visible(kind, 60)}' is not one this llama-server knows; "
                f"it lists {', '.join(known)}"
            )


def draft_model_given(args: argparse.Namespace) -> Path | None:
    """--draft-model's file, checked; None when it is left out."""
    if args.draft_model is None:
        return None
    if not args.draft_model.strip():
        raise ArgumentError("--draft-model is empty; give the draft GGUF's path, or leave it out")
    draft = Path(args.draft_model).expanduser()
    if not draft.is_file():
        raise ArgumentError(
            f"--draft-model {visible(str(draft), 120)} is not a file; give a GGUF's path"
        )
    if not any(kind.startswith("draft") for kind in args.spec_type.split(",")):
        raise ArgumentError(
            f"--draft-model is read only by a draft --spec-type (e.g. draft-simple); "
            f"--spec-type {visible(args.spec_type, 60)} drafts without a model"
        )
    check_draft_model(draft)
    return draft


def check_draft_model(path: Path) -> None:
    """Refuse a draft model that is no readable GGUF before a server is started for it:
    the server would only say "failed to read magic" after loading the target model."""
    from specdiff.engine.gguf import read_gguf  # deferred, as the engine is
    from specdiff.errors import ModelError

    try:
        read_gguf(path)
    except ModelError as error:
        raise ArgumentError(f"--draft-model: {error}") from None


def masked_arguments(arguments: list[str]) -> list[str]:
    """A server's arguments as a session may keep them: the value after (or joined by
    `=` to) an option whose name speaks of a key, token, secret or password is ***,
    except where it is a file's path (PATH_OPTIONS)."""
    masked: list[str] = []
    hide_next = False
    for argument in arguments:
        if hide_next and not argument.startswith("-"):
            masked.append(MASK)
            hide_next = False
            continue
        name, joined, _ = argument.partition("=")
        secret = (
            argument.startswith("-")
            and name not in PATH_OPTIONS
            and SECRET_OPTION.search(name) is not None
        )
        masked.append(f"{name}={MASK}" if secret and joined else argument)
        hide_next = secret and not joined
    return masked


def command_serve_pair(args: argparse.Namespace) -> int:
    """Start server a (speculative) and server b (plain) on loopback, run the command with
    `--pair servers` pointed at them, and stop both whatever happens."""
    # deferred: the engine, session and report modules load only for the command that runs
    from specdiff.engine.server.process import find_llama_server, stop_servers

    command = inner_command(args.inner)
    check_server_arguments(args)
    given = keys_given_to_both(command)
    # from the first child process on (finding the binary runs `llama-server --help`), a
    # stop signal unwinds: a probe child dies with subprocess.run, servers in the finally
    # the inner command's --quiet silences the servers' start lines too
    status = Status(sys.stderr, "--quiet" not in command)
    servers: list[LlamaServer] = []
    with stop_signals_unwind():
        try:
            binary = find_llama_server(args.llama_server)
            environment = server_environment(binary)
            servers += _servers(args, status, binary)
            restart = None
            if command[0] == "explain":
                restart = _draft_restart(args, status, binary, environment, servers)
            return _serve(
                args.run_command,
                command,
                args.spec_type,
                given,
                environment,
                status,
                servers[0],
                servers[1],
                restart=restart,
            )
        except StopSignal as stop:
            status.message(f"{stop.signal_name}: stopping both llama-servers")
            return int(stop.code)  # type: ignore[arg-type]
        finally:
            try:
                # a signal now must not cut the stopping short: the handler ignores any
                # after the first, and this ignores the first when it comes this late
                for stop_signal in STOP_SIGNALS:
                    signal.signal(stop_signal, signal.SIG_IGN)
            finally:
                stop_servers(servers)


_MODEL_OPTIONS = "-m --model -mu --model-url -hf -hfr --hf-repo -hff --hf-file -dr --docker-repo"
_DRAFT_OPTIONS = "-md --model-draft --spec-draft-model --spec-draft-hf -hfd -hfrd --hf-repo-draft"
_SPECULATION = "give server a's speculation as serve-pair --spec-type TYPE (server b is plain)"
RESERVED_SERVER_OPTIONS = {
    "--port": "serve-pair gives each server a free loopback port itself",
    "--host": "serve-pair's servers listen on loopback (127.0.0.1) only",
    **dict.fromkeys(_MODEL_OPTIONS.split(), "give the GGUF as serve-pair --model PATH"),
    **dict.fromkeys(("--models-dir", "--models-preset"), "serve-pair serves one --model PATH"),
    **dict.fromkeys(("--spec-type", "--spec-default"), _SPECULATION),
    **dict.fromkeys(_DRAFT_OPTIONS.split(), "give the draft GGUF as serve-pair --draft-model PATH"),
    **dict.fromkeys(
        ("--draft-max", "--draft", "--draft-n", "--spec-draft-n-max"),
        "give it as serve-pair --draft-max N",
    ),
}
"""Server options serve-pair sets itself or cannot honour: given again in --server-arg*,
llama-server would take the last (a port specdiff is not polling, a speculation the
lane's label does not name)."""


def check_server_arguments(args: argparse.Namespace) -> None:
    for option in ("--server-arg", "--server-arg-a", "--server-arg-b"):
        for argument in getattr(args, option[2:].replace("-", "_")):
            name = argument.partition("=")[0]
            if name in RESERVED_SERVER_OPTIONS:
                raise ArgumentError(
                    f"{option} {visible(name, 40)}: {RESERVED_SERVER_OPTIONS[name]}; drop it"
                )


GIVEN_ON_EVERY_COMMAND_LINE = ("--port", "--host", "-m", "--model")
"""Options serve-pair passes to both servers itself, which win over a LLAMA_ARG_*
variable for the same option (llama.cpp reads the command line after the environment)."""
ENVIRONMENT_OPTIONS = {"LLAMA_ARG_SPEC_TYPE": ["--spec-type"]}
"""Known without the binary's help, for a build whose --help gives nothing."""


def server_environment(binary: Path) -> list[str]:
    """The LLAMA_ARG_* variables set here, which reach both servers as their options:
    refused for an option serve-pair sets itself (LLAMA_ARG_SPEC_TYPE would make server
    b speculate too), else kept as VAR=value words for the lanes' server_flags, a secret's
    value masked."""
    from specdiff.engine.server.process import _help_entries, server_help

    options_of: dict[str, list[str]] = {k: list(v) for k, v in ENVIRONMENT_OPTIONS.items()}
    for name, entry in _help_entries(server_help(binary)).items():
        found = re.search(r"\(env: (LLAMA_ARG_\w+)\)", entry)
        if found is not None:
            options_of.setdefault(found[1], []).append(name)
    words = []
    for variable in sorted(os.environ):
        if not variable.startswith("LLAMA_ARG_"):
            continue
        names = options_of.get(variable, [])
        reserved = [
            name
            for name in names
            if name in RESERVED_SERVER_OPTIONS and name not in GIVEN_ON_EVERY_COMMAND_LINE
        ]
        if reserved:
            option = max(reserved, key=len)  # --model, not -m
            raise ArgumentError(
                f"{variable} is set, and it gives both servers {option}: "
                f"{RESERVED_SERVER_OPTIONS[option]}; unset it"
            )
        secret = any(SECRET_OPTION.search(name) for name in [variable, *names])
        value = MASK if secret else visible(os.environ[variable], 60)
        words.append(f"{variable}={value}")
    return words


def _servers(args: argparse.Namespace, status: Status, binary: Path) -> list[LlamaServer]:
    """Server a (speculative) and server b (plain), not yet started."""
    from specdiff.engine.models import base_model_path
    from specdiff.engine.server.process import LlamaServer

    model = base_model_path(args.model or "default", status.message)
    threads = args.threads or max(1, (os.cpu_count() or 2) // 2)
    common = ["--ctx-size", str(args.ctx_size), "--threads", str(threads), "--parallel", "1"]
    common += args.server_arg
    speculative = LlamaServer(
        binary, model, [*common, *speculation_arguments(args, binary), *args.server_arg_a]
    )
    plain = LlamaServer(binary, model, [*common, *args.server_arg_b])
    return [speculative, plain]


def _draft_restart(
    args: argparse.Namespace,
    status: Status,
    binary: Path,
    environment: list[str],
    servers: list[LlamaServer],
) -> explain.DraftRestart:
    """For explain's draft-length sweep: start server a again drafting at most k tokens
    (the one started before it stopped first, bar the first, which the pair as given
    uses), its URL and launch line returned. Each joins `servers`, so it is stopped
    whatever happens."""
    from specdiff.engine.server.process import ServerProcessError, stop_servers

    started: list[LlamaServer] = []

    def restart(length: int) -> tuple[str, str]:
        stop_servers(started)
        moved = argparse.Namespace(**{**vars(args), "draft_max": length})
        server = _servers(moved, status, binary)[0]
        servers.append(server)
        started.append(server)
        status.message(f"starting llama-server a drafting at most {length} on {server.url}")
        try:
            server.start()
        except ServerProcessError as error:
            raise ServerProcessError(f"server a (draft length {length}): {error}") from None
        check_speculates(server, args.spec_type)
        return server.url, launch_line(server, environment)

    return restart


def launch_line(server: LlamaServer, environment: list[str]) -> str:
    """The launch line, which no server reports of itself, kept beside the result: the
    arguments first, so a long variable cannot cut the speculation off the line."""
    launch = [*masked_arguments(list(server.arguments)), *environment]
    return visible(" ".join(launch), MAX_SERVER_FLAGS)


_UNSET = object()
SERVER_ROLES = {"a": "speculative", "b": "plain"}


def keys_given_to_both(command: list[str]) -> set[str]:
    """The lane keys the inner command's --both sets, read by its own parser (so an
    abbreviation such as --bot counts). serve-pair sets its own per lane, and a lane's
    own setting beats --both: for these it leaves its own out, so that --both api=chat
    is what both lanes get. Refused before any server starts: another pair, a pairs
    file, a resumed suite (each start has new ports), an endpoint of the user's own."""
    from specdiff.lanes import parse_overrides

    # a parser of its own: the shared one must keep its defaults; argparse leaves an
    # attribute the namespace already holds alone unless the option is given (suite's
    # --pair appends to a list)
    parser = command_parser(INNER_COMMANDS[command[0]])
    unset = argparse.Namespace(pair=_UNSET, pair_names=None)
    inner = parser.parse_args(command[1:], namespace=unset)
    chosen = [getattr(inner, name, _UNSET) for name in ("pair", "pair_names")]
    if any(value is not _UNSET and value is not None for value in chosen):
        raise ArgumentError(
            "serve-pair compares its two servers (the pair servers); drop --pair (to run "
            "another pair on servers of your own, use run --pair NAME with endpoints)"
        )
    if command[0] == "explain":
        explain.check_serve_pair_options(inner)
    if getattr(inner, "pairs", None):
        raise ArgumentError("serve-pair compares its two servers; drop --pairs")
    if getattr(inner, "resume", False):
        raise ArgumentError(
            "serve-pair starts its servers on new ports each time, so a suite it ran cannot "
            "be resumed; to resume suites, start the servers yourself and run suite --pair "
            "servers --lane-a endpoint=URL --lane-b endpoint=URL"
        )
    for option in ("--both", "--lane-a", "--lane-b"):
        if "endpoint" in parse_overrides(getattr(inner, option[2:].replace("-", "_"))):
            raise ArgumentError(
                f"{option} endpoint: serve-pair points the lanes at the servers it starts; "
                "drop it (to compare servers of your own, use run --pair servers)"
            )
    return set(parse_overrides(inner.both))


def check_speculates(server: LlamaServer, spec_type: str) -> None:
    """Server a must speculate: llama-server logs a speculation it cannot set up (a
    draft type without its draft model) and serves without it, and the pair would
    compare plain with plain under a speculative label."""
    import httpx

    failed = [line for line in server.errors if "specul" in line.lower()]
    try:
        slots = httpx.get(f"{server.url}/slots", timeout=10).json()
        speculative = [slot["speculative"] for slot in slots]
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        # no /slots (--no-slots, an older build): its own log line is the word on it
        if not failed:
            return
        evidence = "it logged that speculation failed"
    else:
        if not speculative or any(value is not False for value in speculative):
            return
        evidence = "its /slots say speculative: false"
    logged = " ".join((failed or server.errors or [""])[-1].split())
    said = f": it logged {visible(logged, 200)}" if logged else ""
    fix = (
        "give the draft GGUF with --draft-model PATH"
        if spec_type.startswith("draft") and spec_type != "draft-mtp"
        else "check the --spec-type and its options"
    )
    raise ArgumentError(
        f"llama-server a serves without speculation although started with --spec-type "
        f"{visible(spec_type, 60)} ({evidence}){said}; {fix}"
    )


def _serve(
    main: RunCommand,
    command: list[str],
    spec_type: str,
    given: set[str],
    environment: list[str],
    status: Status,
    speculative: LlamaServer,
    plain: LlamaServer,
    restart: explain.DraftRestart | None = None,
) -> int:
    """Start both servers and run the command with its lanes pointed at them."""
    from specdiff.engine.server.process import ServerProcessError  # deferred, as above

    for name, server in (("a", speculative), ("b", plain)):
        status.message(f"starting llama-server {name} on {server.url}")
        try:
            server.start()
        except ServerProcessError as error:
            raise ServerProcessError(f"server {name} ({SERVER_ROLES[name]}): {error}") from None
    check_speculates(speculative, spec_type)
    own = {
        "a": {"api": "llama-server", "label": f"llama-server --spec-type {spec_type}"},
        "b": {"api": "llama-server", "label": "llama-server plain"},
    }
    lanes = ["--pair", "servers"]
    facts: list[str] = []
    for lane_id, server in (("a", speculative), ("b", plain)):
        settings = {"endpoint": server.url, **own[lane_id]}
        if not server.repack:  # started with --no-repack: the header records it
            settings["repack"] = "false"
        settings["server_flags"] = launch_line(server, environment)
        for key, value in settings.items():
            if key not in given:
                lanes += [f"--lane-{lane_id}", f"{key}={value}"]
        if not server.repack and "repack" in given:
            # what the server ran with is a fact, not a setting --both may replace
            facts.append(f"--lane-{lane_id}")
            facts.append("repack=false")
    if restart is not None:
        return explain.explain_on_servers([*lanes, *command[1:], *facts], restart)
    return main([command[0], *lanes, *command[1:], *facts])
