"""The specdiff command line.

Exit codes: 0 the lanes agree, 1 they differ, 2 bad input (one line on stderr, no
traceback), 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

from specdiff import __version__
from specdiff.compare import DEFAULT_NEAR_TIE
from specdiff.errors import PromptError, SpecdiffError
from specdiff.lanes import (
    LANE_KEYS,
    Pair,
    apply_overrides,
    load_pairs_file,
    parse_overrides,
    presets,
    unknown_pair,
)
from specdiff.prompts import DEFAULT_PROMPT

DEFAULT_PAIR = "spec-vs-plain"
DEFAULT_MAX_TOKENS = 200

EXIT_SAME, EXIT_DIFFERENT, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130


class ArgumentError(SpecdiffError):
    """The command line itself is wrong."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        # argparse exits with its own usage dump; specdiff's rule is one line and exit 2.
        raise ArgumentError(f"{message} (see: {self.prog} --help)")


class Status:
    """One progress line on stderr, rewritten in place on a terminal."""

    def __init__(self, stream: TextIO, enabled: bool) -> None:
        self.stream = stream
        self.enabled = enabled
        self.live = enabled and stream.isatty()
        self._last = 0.0
        self._width = 0

    def message(self, text: str) -> None:
        if not self.enabled:
            return
        if self.live:
            self.stream.write("\r" + text.ljust(self._width) + "\n")
            self._width = 0
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def update(self, text: str) -> None:
        if not self.live:
            return
        now = time.monotonic()
        if now - self._last < 0.1:
            return
        self._last = now
        self.stream.write("\r" + text.ljust(self._width))
        self._width = len(text)
        self.stream.flush()

    def done(self) -> None:
        if self.live and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
            self._width = 0


def _add_lane_options(parser: argparse.ArgumentParser, one_pair: bool = True) -> None:
    if one_pair:
        parser.add_argument(
            "--pair", default=DEFAULT_PAIR, help=f"pair preset (default {DEFAULT_PAIR})"
        )
    parser.add_argument("--pairs", metavar="FILE", help="TOML file with more pairs ([pairs.NAME])")
    parser.add_argument("--model", help="GGUF path for both lanes (default: the bundled model)")
    parser.add_argument(
        "--lane-a", action="append", default=[], metavar="KEY=VALUE", help="override lane A"
    )
    parser.add_argument(
        "--lane-b", action="append", default=[], metavar="KEY=VALUE", help="override lane B"
    )
    parser.add_argument(
        "--both", action="append", default=[], metavar="KEY=VALUE", help="override both lanes"
    )


def _add_replay_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--theme", help="theme name")
    pace = parser.add_mutually_exclusive_group()
    pace.add_argument(
        "--speed",
        type=float,
        default=1.0,
        help="play at this multiple of the recorded pace (default 1)",
    )
    pace.add_argument("--instant", action="store_true", help="show the whole session at once")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="specdiff",
        description="Why does the same prompt at temperature 0 give different text? "
        "Run two decoding configurations side by side and see where they fork.",
        epilog="lane keys: " + ", ".join(LANE_KEYS),
    )
    parser.add_argument("--version", action="version", version=f"specdiff {__version__}")
    commands = parser.add_subparsers(dest="command", parser_class=_Parser)

    live = commands.add_parser(
        "live", help="the TUI: both lanes streaming side by side (the default command)"
    )
    run = commands.add_parser("run", help="run both lanes of a pair on a prompt, headless")
    for sub in (live, run):
        _add_lane_options(sub)
        source = sub.add_mutually_exclusive_group()
        source.add_argument("--prompt", help="the prompt text")
        source.add_argument(
            "--prompt-file", metavar="FILE", help="read the prompt from FILE (- = stdin)"
        )
        sub.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS)
        sub.add_argument(
            "--near-tie",
            type=float,
            default=DEFAULT_NEAR_TIE,
            help=f"margin below which a step counts as a near tie (default {DEFAULT_NEAR_TIE})",
        )
    run.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    run.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    run.add_argument("--quiet", action="store_true", help="no progress on stderr")
    run.add_argument(
        "--save", action="store_true", help="write the run as a session file as it streams"
    )
    run.add_argument(
        "--sessions-dir", help="where --save writes (default: ./sessions or the user data dir)"
    )
    live.add_argument("--theme", help="theme name (default: config file, else specdiff-dark)")
    live.add_argument("--sessions-dir", help="where `s` saves sessions")
    live.add_argument("--no-start", action="store_true", help="open without starting a run")

    replay = commands.add_parser(
        "replay", help="open a saved session in the TUI (no model is loaded)"
    )
    replay.add_argument("session", help="a session file (.jsonl)")
    _add_replay_options(replay)

    sessions = commands.add_parser("sessions", help="list the saved sessions, or open one")
    sessions.add_argument(
        "--sessions-dir", help="the folder to list (default: ./sessions or the user data dir)"
    )
    sessions.add_argument("--json", action="store_true", help="one JSON object per session")
    session_commands = sessions.add_subparsers(dest="sessions_command", parser_class=_Parser)
    listing = session_commands.add_parser("list", help="a line per session (the default)")
    listing.add_argument("--json", action="store_true", default=argparse.SUPPRESS)
    opening = session_commands.add_parser(
        "open", help="replay a listed session: its number in the list or its file name"
    )
    opening.add_argument("reference", metavar="NUMBER|NAME")
    _add_replay_options(opening)

    verify = commands.add_parser(
        "verify", help="re-run a session's lanes and compare token ids step by step"
    )
    verify.add_argument("session", help="a session file (.jsonl)")
    verify.add_argument("--quiet", action="store_true", help="no progress on stderr")

    export = commands.add_parser(
        "export", help="write a saved session as one self-contained report (md, html, json)"
    )
    export.add_argument("session", help="a session file (.jsonl)")
    export.add_argument(
        "--format", metavar="FORMAT", help="md, html or json (default: --output's suffix, else md)"
    )
    export.add_argument("--output", "-o", metavar="PATH", help="where to write (default: stdout)")
    export.add_argument("--force", action="store_true", help="overwrite an existing --output")
    export.add_argument(
        "--near-tie",
        type=float,
        default=DEFAULT_NEAR_TIE,
        help=f"margin below which a step counts as a near tie (default {DEFAULT_NEAR_TIE})",
    )

    suite = commands.add_parser(
        "suite", help="run pairs over a set of prompts into a report folder, headless"
    )
    suite.add_argument(
        "prompts",
        nargs="?",
        metavar="PROMPTS",
        help="JSONL file ({id, prompt, max_tokens?} a line), folder of .txt files, or a "
        "bundled set: " + ", ".join(bundled_sets()),
    )
    _add_lane_options(suite, one_pair=False)
    suite.add_argument(
        "--pair",
        action="append",
        dest="pair_names",
        metavar="PAIR",
        help=f"pair to run (repeatable; default {DEFAULT_PAIR})",
    )
    suite.add_argument(
        "--max-tokens", type=int, help=f"tokens per lane (default {DEFAULT_MAX_TOKENS})"
    )
    suite.add_argument("--report", required=True, metavar="DIR", help="the report folder")
    suite.add_argument(
        "--near-tie",
        type=float,
        default=DEFAULT_NEAR_TIE,
        help=f"margin below which a step counts as a near tie (default {DEFAULT_NEAR_TIE})",
    )
    suite.add_argument(
        "--teacher-forced",
        action="store_true",
        help="feed lane b lane a's tokens: count the steps whose argmax flips",
    )
    suite.add_argument(
        "--quants",
        metavar="LIST",
        help="run each pair once per weight type, e.g. base,q8_0,f16 (base = the model as is)",
    )
    suite.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    suite.add_argument("--resume", action="store_true", help="continue a stopped suite in DIR")
    suite.add_argument("--force", action="store_true", help="replace the report in DIR")
    suite.add_argument(
        "--skip-bad", action="store_true", help="run the good prompts when some lines are bad"
    )
    suite.add_argument("--quiet", action="store_true", help="no progress on stderr")

    repeat = commands.add_parser(
        "repeat", help="one prompt N times on one lane, beside other sequences in the batch"
    )
    source = repeat.add_mutually_exclusive_group()
    source.add_argument("--prompt", help="the prompt text")
    source.add_argument("--prompt-file", metavar="FILE", help="read the prompt from FILE")
    repeat.add_argument("-n", "--runs", type=int, default=8, help="how many runs (default 8)")
    repeat.add_argument(
        "--companions",
        type=int,
        default=3,
        help="run r shares its batches with r mod (K+1) other sequences (default K=3)",
    )
    repeat.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS)
    repeat.add_argument(
        "--endpoint",
        metavar="URL",
        help="repeat against a server (OpenAI-compatible, or --lane api=llama-server)",
    )
    repeat.add_argument(
        "--concurrency",
        type=int,
        default=4,
        help="with --endpoint: requests in flight at once (default 4)",
    )
    repeat.add_argument("--model", help="GGUF path (default: the bundled model)")
    repeat.add_argument(
        "--lane", action="append", default=[], metavar="KEY=VALUE", help="lane setting"
    )
    repeat.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    repeat.add_argument("--quiet", action="store_true", help="no progress on stderr")

    serve = commands.add_parser(
        "serve-pair",
        help="start two local llama-servers (speculative vs plain), run a command on them, "
        "stop them",
    )
    serve.add_argument("--model", help="GGUF path (default: the bundled model)")
    serve.add_argument("--llama-server", metavar="PATH", help="the llama-server binary")
    serve.add_argument(
        "--spec-type",
        default="ngram-simple",
        help="server a's speculation, llama-server's --spec-type (default ngram-simple)",
    )
    serve.add_argument("--ctx-size", type=int, default=4096, help="each server's context")
    serve.add_argument(
        "--threads", type=int, default=0, help="threads per server (default: half the cores)"
    )
    serve.add_argument(
        "--server-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="one more argument for both servers (repeatable)",
    )
    serve.add_argument(
        "inner",
        nargs=argparse.REMAINDER,
        metavar="COMMAND ...",
        help="run (default), live or suite, with their options; the lanes point at the servers",
    )

    models = commands.add_parser("models", help="list known models, or make variants")
    model_commands = models.add_subparsers(dest="models_command", parser_class=_Parser)
    model_commands.add_parser("list", help="list known models (the default)")
    variants = model_commands.add_parser(
        "variants", help="write requantized copies of a model into the cache"
    )
    variants.add_argument("--to", required=True, help="comma-separated types, e.g. f16,q8_0")
    variants.add_argument("--model", default="default", help="GGUF path (default: bundled)")
    variants.add_argument("--threads", type=int, default=0)
    return parser


def bundled_sets() -> tuple[str, ...]:
    from specdiff.prompts import SETS

    return SETS


def known_pairs(args: argparse.Namespace) -> dict[str, Pair]:
    """The presets, plus the pairs of --pairs FILE."""
    known = presets()
    if args.pairs:
        known.update(load_pairs_file(args.pairs, known))
    return known


def resolve_pair(args: argparse.Namespace, known: dict[str, Pair], name: str | None = None) -> Pair:
    name = name or args.pair
    if name not in known:
        raise unknown_pair(name, known)
    pair = known[name]
    both = parse_overrides(args.both)
    if args.model:
        both.setdefault("model", args.model)
    a = apply_overrides(apply_overrides(pair.a, both), parse_overrides(args.lane_a))
    b = apply_overrides(apply_overrides(pair.b, both), parse_overrides(args.lane_b))
    return replace(pair, a=a, b=b)


def read_request(args: argparse.Namespace) -> tuple[dict[str, Pair], Pair, str]:
    """What `run` and `live` both take: checked limits, the pairs, the pair, the prompt."""
    if args.max_tokens < 1:
        raise PromptError(f"--max-tokens must be at least 1, got {args.max_tokens}")
    if args.near_tie < 0:
        raise ArgumentError(f"--near-tie must not be negative, got {args.near_tie}")
    known = known_pairs(args)
    return known, resolve_pair(args, known), read_prompt(args)


def read_prompt(args: argparse.Namespace) -> str:
    if args.prompt is not None:
        prompt = args.prompt
    elif args.prompt_file == "-":
        try:
            prompt = sys.stdin.buffer.read().decode("utf-8")
        except UnicodeDecodeError:
            raise PromptError("the prompt on stdin is not UTF-8 text") from None
    elif args.prompt_file:
        path = Path(args.prompt_file).expanduser()
        try:
            prompt = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise PromptError(f"prompt file not found: {path}") from None
        except UnicodeDecodeError:
            raise PromptError(f"prompt file {path} is not UTF-8 text") from None
        except OSError as error:
            raise PromptError(f"cannot read prompt file {path}: {error.strerror}") from None
    else:
        prompt = DEFAULT_PROMPT
    if not prompt.strip():
        raise PromptError("the prompt is empty; give some text (--prompt or --prompt-file)")
    return prompt


@contextlib.contextmanager
def _interrupt_sets(cancel: threading.Event) -> Iterator[None]:
    """The first Ctrl+C asks the lanes to stop (llama.cpp aborts a long decode between
    graph nodes) so the summary still covers what was produced; a second one raises."""

    def on_interrupt(_signum: int, _frame: object) -> None:
        if cancel.is_set():
            raise KeyboardInterrupt
        cancel.set()

    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def command_run(args: argparse.Namespace) -> int:
    from specdiff.engine.pairrun import PairRun
    from specdiff.reports.text import format_result, result_json
    from specdiff.sessions.store import SessionWriter, footer_record, header_record

    _, pair, prompt = read_request(args)
    status = Status(sys.stderr, not args.quiet)
    cancel = threading.Event()
    counts = {"a": 0, "b": 0}

    writer: SessionWriter | None = None

    def on_step(step: Any) -> None:
        counts[step.lane] += 1
        if writer is not None:
            writer.step(step)
        status.update(
            f"generating: lane a {counts['a']}/{args.max_tokens} · "
            f"lane b {counts['b']}/{args.max_tokens} tokens"
        )

    with PairRun(pair, status.message, cancel) as runner:
        tokens = runner.tokenize(prompt)
        status.message(f"running {pair.name} on a {len(tokens)}-token prompt")
        if args.save:
            runner.check(tokens, args.max_tokens)  # bad input leaves no file
            writer = SessionWriter(args.sessions_dir, pair.name, prompt)
            writer.write(
                header_record(
                    pair,
                    prompt,
                    tokens,
                    args.max_tokens,
                    args.stop,
                    runner.executed(),
                    runner.build,
                    datetime.now(timezone.utc).isoformat(timespec="seconds"),
                )
            )
            status.message(f"saving to {writer.partial}")
        try:
            with _interrupt_sets(cancel):
                result = runner.run(prompt, args.max_tokens, args.stop, args.near_tie, on_step)
        except SpecdiffError:
            if writer is not None:
                writer.abandon()
            raise
        status.done()
    if writer is not None:
        saved = writer.finish(footer_record(result))
        print(f"specdiff: saved session {saved}", file=sys.stderr)
    if args.json:
        json.dump(result_json(result), sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print(format_result(result))
    if result.cancelled:
        print("specdiff: interrupted; the summary covers the tokens produced", file=sys.stderr)
        return EXIT_INTERRUPTED
    errors = [f"lane {o.lane_id}: {o.error}" for o in (result.a, result.b) if o.error]
    if errors:
        for error in errors:
            print(f"specdiff: error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return EXIT_SAME if result.comparison.identical else EXIT_DIFFERENT


def config_theme() -> str | None:
    """`theme = "NAME"` from the user config file, if there is one."""
    from specdiff.config import config_value

    return config_value("theme")


def command_live(args: argparse.Namespace) -> int:
    known, pair, prompt = read_request(args)
    known[pair.name] = pair
    from specdiff.tui.app import make_app

    app = make_app(
        known,
        pair.name,
        prompt,
        args.max_tokens,
        near_tie=args.near_tie,
        theme_name=args.theme or config_theme(),
        autostart=not args.no_start,
        sessions_dir=args.sessions_dir,
    )
    app.run()
    return 0


def command_replay(args: argparse.Namespace) -> int:
    return replay_file(args.session, args)


REPLAY_FIRST_STEPS = 400
"""A paced replay opens once this many steps are read; the rest is read as it plays."""


def open_for_replay(path: str | Path) -> tuple[Any, Any]:
    """The session as far as its first steps, and the stream holding the rest, which the
    replay screen reads once it has painted them."""
    from specdiff.sessions.store import SessionStream

    stream = SessionStream(path)
    stream.read(REPLAY_FIRST_STEPS)
    stream.check()  # a bad line among the first steps: an error before the screen opens
    return stream.session, stream


def replay_file(path: str | Path, args: argparse.Namespace) -> int:
    from specdiff.sessions.playback import check_speed

    speed = None if args.instant else check_speed(args.speed)
    session, stream = open_for_replay(path)
    try:
        known = presets()
        known[session.pair.name] = session.pair
        from specdiff.tui.app import make_app

        app = make_app(
            known,
            session.pair.name,
            session.prompt,
            int(session.header.get("max_tokens", DEFAULT_MAX_TOKENS)),
            theme_name=args.theme or config_theme(),
            autostart=False,
            session=session,
            replay_speed=speed,
            session_stream=stream,
        )
        app.run()
    finally:
        if stream is not None:
            stream.close()
    if app.load_error is not None:
        raise SpecdiffError(app.load_error)
    return 0


def command_verify(args: argparse.Namespace) -> int:
    """Exit 0 when every recorded token comes out again, 1 at the first that does not."""
    from specdiff.engine.pairrun import PairRun
    from specdiff.sessions.store import load_session

    session = load_session(args.session)
    header = session.header
    pair = session.pair
    status = Status(sys.stderr, not args.quiet)
    with PairRun(pair, status.message) as runner:
        status.message(f"re-running {pair.name} from {session.path.name}")
        result = runner.run(
            session.prompt,
            int(header["max_tokens"]),
            header.get("stop", []),
            teacher_forced=bool(header.get("teacher_forced", False)),
        )
        executed = runner.executed()
    drift = None
    for lane_id, outcome in (("a", result.a), ("b", result.b)):
        recorded = [step.token_id for step in session.steps[lane_id]]
        # a run that was stopped or killed is checked as far as it got
        stopped = session.partial or bool((session.footer or {}).get("cancelled"))
        fresh = outcome.token_ids[: len(recorded)] if stopped else outcome.token_ids
        for index, (old, new) in enumerate(zip(recorded, fresh)):
            if old != new:
                candidate = (index, lane_id, old, new)
                drift = candidate if drift is None or candidate < drift else drift
                break
        else:
            if len(recorded) != len(fresh):
                index = min(len(recorded), len(fresh))
                candidate = (index, lane_id, None, None)
                drift = candidate if drift is None or candidate < drift else drift
    changes = _environment_changes(header, runner_build=result.build, executed=executed)
    total = len(session.steps["a"]) + len(session.steps["b"])
    if drift is None:
        print(f"verified: all {total} recorded steps came out again ({session.path.name})")
        for change in changes:
            print(f"  note: {change}")
        return EXIT_SAME
    index, lane_id, old, new = drift
    if old is None:
        print(f"DRIFT at step {index} of lane {lane_id}: the lane stopped at another length")
    else:
        print(
            f"DRIFT at step {index} of lane {lane_id}: recorded token {old}, now {new} "
            f"({session.path.name})"
        )
    print(
        "what changed since the recording: "
        + ("; ".join(changes) if changes else "nothing in build, system info or model hashes")
    )
    return EXIT_DIFFERENT


def _environment_changes(
    header: dict[str, Any], runner_build: dict[str, str], executed: dict[str, dict[str, Any]]
) -> list[str]:
    changes = []
    recorded_build = header.get("build", {})
    for key in ("llama_cpp_build", "llama_cpp_python", "system_info", "cpu", "specdiff"):
        if recorded_build.get(key) != runner_build.get(key):
            changes.append(f"{key}: {recorded_build.get(key)!r} -> {runner_build.get(key)!r}")
    for lane_id in ("a", "b"):
        old = header.get("executed", {}).get(lane_id, {})
        new = executed.get(lane_id, {})
        for key in ("model_sha256", "threads", "n_batch", "n_ubatch", "repack"):
            if old.get(key) != new.get(key):
                changes.append(f"lane {lane_id} {key}: {old.get(key)!r} -> {new.get(key)!r}")
    return changes


def command_models(args: argparse.Namespace) -> int:
    from specdiff.engine.models import (
        VARIANT_FTYPES,
        base_model_path,
        known_models,
        make_variant,
    )

    status = Status(sys.stderr, True)
    if args.models_command == "variants":
        wanted = [part.strip().lower() for part in args.to.split(",") if part.strip()]
        unknown = [w for w in wanted if w not in VARIANT_FTYPES]
        if not wanted or unknown:
            raise ArgumentError(
                f"unknown variant {unknown[0] if unknown else args.to!r}; "
                f"choose from {', '.join(VARIANT_FTYPES)}"
            )
        base = base_model_path(args.model, status.message)
        threads = args.threads or os.cpu_count() or 1
        for quant in wanted:
            path = make_variant(base, quant, threads, status.message)
            print(path)
        return 0
    entries = known_models(status.message)
    print(f"{'role':<18} {'quant':<8} {'size':>9}  {'sha256':<12}  path")
    for entry in entries:
        print(
            f"{entry.role:<18} {entry.quantization:<8} {entry.size / 1e6:>7.1f}MB  "
            f"{entry.sha256[:12]}  {entry.path}"
        )
    return 0


def command_sessions(args: argparse.Namespace) -> int:
    from specdiff.sessions.catalog import list_sessions, resolve_in
    from specdiff.sessions.store import sessions_dir

    directory = sessions_dir(args.sessions_dir).absolute()
    infos = list_sessions(directory)
    if args.sessions_command == "open":
        return replay_file(resolve_in(directory, args.reference, infos), args)
    if args.json:
        for info in infos:
            print(json.dumps(_session_json(info), ensure_ascii=False))
        return EXIT_SAME
    if not infos:
        print(f"no sessions in {directory} (save one with `specdiff run --save` or `s` in the TUI)")
        return EXIT_SAME
    print(f"sessions in {directory}:")
    print(f"{'#':>3}  {'date (UTC)':<16}  {'pair':<16}  {'diverged at':<12}  {'tokens':>9}  prompt")
    for number, info in enumerate(infos, 1):
        if info.problem is not None:
            print(f"{number:>3}  {info.path.name}: unreadable ({info.problem})")
            continue
        tokens = "/".join(str(n) for n in info.generated) if info.generated else "?"
        prompt = " ".join(info.prompt.split())
        prompt = prompt if len(prompt) <= 40 else prompt[:39] + "…"
        print(
            f"{number:>3}  {info.when:<16}  {info.pair[:16]:<16}  {info.diverged:<12}  "
            f"{tokens:>9}  {prompt}"
        )
    print("open one with: specdiff sessions open NUMBER (or replay, verify, export its file)")
    return EXIT_SAME


def _session_json(info: Any) -> dict[str, Any]:
    return {
        "path": str(info.path),
        "created": info.created,
        "pair": info.pair,
        "prompt": info.prompt,
        "partial": info.partial,
        "identical": info.identical,
        "fork_index": info.fork_index,
        "generated": list(info.generated) if info.generated else None,
        "problem": info.problem,
    }


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "…"
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def command_suite(args: argparse.Namespace) -> int:
    """Exit 0 when every run finished, 1 when some lane failed, 130 when stopped."""
    from specdiff.reports.suite import write_reports
    from specdiff.suite import SuiteError
    from specdiff.suite.folder import prepare_report_dir, write_settings
    from specdiff.suite.prompts import load_suite_prompts
    from specdiff.suite.runner import SuiteRun
    from specdiff.suite.settings import SuiteSettings, check_quants
    from specdiff.suite.stats import outcome_json

    report_dir = Path(args.report).expanduser()
    if args.max_tokens is not None and args.max_tokens < 1:
        raise PromptError(f"--max-tokens must be at least 1, got {args.max_tokens}")
    if args.near_tie < 0:
        raise ArgumentError(f"--near-tie must not be negative, got {args.near_tie}")
    given: SuiteSettings | None = None
    prompts = None
    skipped: list[str] = []
    if args.prompts is not None:
        known = known_pairs(args)
        names = args.pair_names or [DEFAULT_PAIR]
        pairs = tuple(resolve_pair(args, known, name) for name in dict.fromkeys(names))
        given = SuiteSettings(
            source=args.prompts,
            pairs=pairs,
            max_tokens=args.max_tokens or DEFAULT_MAX_TOKENS,
            near_tie=args.near_tie,
            teacher_forced=args.teacher_forced,
            quants=check_quants(args.quants.split(",")) if args.quants else (),
            stop=tuple(args.stop),
        )
        prompts, skipped = load_suite_prompts(args.prompts, args.skip_bad)
    elif not args.resume:
        raise ArgumentError("give the prompts: a JSONL file, a folder of .txt or a bundled set")
    else:
        given_options = [
            name
            for name, value in (
                ("--pair", args.pair_names),
                ("--max-tokens", args.max_tokens),
                ("--quants", args.quants),
                ("--teacher-forced", args.teacher_forced or None),
                ("--stop", args.stop),
                ("--lane-a", args.lane_a),
                ("--lane-b", args.lane_b),
                ("--both", args.both),
                ("--model", args.model),
                ("--pairs", args.pairs),
            )
            if value
        ]
        if given_options:
            raise ArgumentError(
                f"--resume continues with the stopped suite's own settings; drop "
                f"{', '.join(given_options)} (or give PROMPTS and all options as before)"
            )
    settings = prepare_report_dir(report_dir, given, prompts, args.resume, args.force)
    if prompts is None:
        prompts, skipped = load_suite_prompts(settings.source, args.skip_bad)
        if settings.as_json(prompts)["prompts_sha256"] != json.loads(
            (report_dir / "suite.json").read_text(encoding="utf-8")
        ).get("prompts_sha256"):
            raise SuiteError(
                f"the prompts in {settings.source} changed since the suite in {report_dir} "
                "started; restore them or start a new report folder"
            )
    write_settings(report_dir, settings, prompts)
    status = Status(sys.stderr, not args.quiet)
    for problem in skipped:
        status.message(f"skipped: {problem}")
    variants = settings.variants()
    status.message(
        f"suite: {len(prompts)} prompts x {len(variants)} pair"
        f"{'s' if len(variants) > 1 else ''} ({', '.join(v[0] for v in variants)}), up to "
        f"{settings.max_tokens} tokens per lane -> {report_dir}"
    )

    def on_progress(progress: Any) -> None:
        filled = round(24 * progress.fraction)
        status.update(
            f"[{'█' * filled}{'░' * (24 - filled)}] {progress.fraction:4.0%} "
            f"{progress.job + 1}/{progress.jobs} {progress.label} {progress.prompt_id} "
            f"· ETA {_duration(progress.eta_seconds)}"
        )

    cancel = threading.Event()
    runner = SuiteRun(settings, prompts, report_dir, skipped, on_progress, status.message, cancel)
    with _interrupt_sets(cancel):
        outcome = runner.run()
    status.done()
    data = outcome_json(outcome)
    paths = write_reports(report_dir, data)
    for pair in data["pairs"]:
        summary = pair["summary"]
        ran = summary["prompts"] - summary["failed"]
        speed = f", speed a/b {summary['speedup']:.2f}x" if summary["speedup"] else ""
        teacher = summary.get("teacher_forced")
        flips = (
            f", teacher-forced flips {teacher['flips']} of {teacher['steps']} steps"
            if teacher
            else ""
        )
        print(
            f"{pair['label']}: identical {summary['identical']} of {ran}{speed}{flips}"
            + (f", {summary['failed']} failed" if summary["failed"] else "")
        )
    print(f"report: {paths[2]} (also {', '.join(p.name for p in paths if p != paths[2])})")
    if outcome.cancelled:
        print(
            f"specdiff: stopped after {data['finished']} of {data['jobs']} runs; continue "
            f"with: specdiff suite --resume --report {report_dir}",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    failed = sum(pair["summary"]["failed"] for pair in data["pairs"])
    return EXIT_DIFFERENT if failed else EXIT_SAME


def command_repeat(args: argparse.Namespace) -> int:
    """Exit 0 when every run gave the same tokens, 1 when they split, 130 when stopped."""
    from specdiff.lanes import Lane
    from specdiff.repeat import format_summary, repeat, repeat_server, summary

    settings = parse_overrides(args.lane)
    if args.model:
        settings.setdefault("model", args.model)
    if args.endpoint:
        settings.update(backend="server", endpoint=args.endpoint)
    lane = apply_overrides(Lane(), settings)
    prompt = read_prompt(args)
    status = Status(sys.stderr, not args.quiet)
    cancel = threading.Event()
    served = lane.backend == "server"
    if served:
        status.message(
            f"repeat: {args.runs} requests to {lane.endpoint}, {args.concurrency} at a time"
        )
    else:
        status.message(
            f"repeat: {args.runs} runs of a plain lane, each beside 0..{args.companions} "
            "other sequences"
        )

    def on_run(number: int, run: Any) -> None:
        beside = (
            f"{args.concurrency} in flight"
            if served
            else f"beside {run.companions} other sequence{'s' if run.companions != 1 else ''}"
        )
        status.message(f"run {number + 1}/{args.runs}: {len(run.steps)} tokens, {beside}")

    how = repeat_server if served else repeat
    with _interrupt_sets(cancel):
        result = how(
            lane,
            prompt,
            args.runs,
            args.concurrency if served else args.companions,
            args.max_tokens,
            on_run,
            status.message,
            cancel,
        )
    data = summary(result)
    if served:
        data["endpoint"] = lane.endpoint
        data["concurrency"] = args.concurrency
    if args.json:
        json.dump(data, sys.stdout, indent=1, ensure_ascii=False)
        sys.stdout.write("\n")
    else:
        print(format_summary(data))
    if result.cancelled:
        return EXIT_INTERRUPTED
    return EXIT_SAME if data["unique"] <= 1 else EXIT_DIFFERENT


SERVE_PAIR_COMMANDS = ("run", "live", "suite")


def command_serve_pair(args: argparse.Namespace) -> int:
    """Start server a (speculative) and server b (plain) on loopback, run the command with
    `--pair servers` pointed at them, and stop both whatever happens."""
    from specdiff.engine.models import base_model_path
    from specdiff.engine.server.process import LlamaServer, find_llama_server

    command = list(args.inner)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command or command[0].startswith("-"):
        command = ["run", *command]
    if command[0] not in SERVE_PAIR_COMMANDS:
        raise ArgumentError(
            f"serve-pair runs one of {', '.join(SERVE_PAIR_COMMANDS)}, not {command[0]!r}"
        )
    binary = find_llama_server(args.llama_server)
    status = Status(sys.stderr, True)
    model = base_model_path(args.model or "default", status.message)
    threads = args.threads or max(1, (os.cpu_count() or 2) // 2)
    common = ["--ctx-size", str(args.ctx_size), "--threads", str(threads), "--parallel", "1"]
    common += args.server_arg
    speculative = LlamaServer(binary, model, [*common, "--spec-type", args.spec_type])
    plain = LlamaServer(binary, model, common)
    try:
        for name, server in (("a", speculative), ("b", plain)):
            status.message(f"starting llama-server {name} on {server.url}")
            server.start()
        lanes = [
            "--pair", "servers",
            "--lane-a", f"endpoint={speculative.url}", "--lane-a", "api=llama-server",
            "--lane-a", f"label=llama-server --spec-type {args.spec_type}",
            "--lane-b", f"endpoint={plain.url}", "--lane-b", "api=llama-server",
            "--lane-b", "label=llama-server plain",
        ]  # fmt: skip
        return main([command[0], *lanes, *command[1:]])
    finally:
        for server in (speculative, plain):
            server.stop()


def command_export(args: argparse.Namespace) -> int:
    """Exit 0 once the report is written; it describes the session, it does not judge it."""
    from specdiff.reports.export import check_output, export_session, report_format, write_report
    from specdiff.sessions.store import load_session

    fmt = report_format(args.format, args.output)
    output = None if args.output in (None, "-") else Path(args.output).expanduser()
    if output is not None:
        check_output(output, args.force)  # refuse before the work of loading and rendering
    report = export_session(load_session(args.session), fmt, args.near_tie)
    if output is not None:
        write_report(report, output, args.force)
        print(f"specdiff: wrote {output}", file=sys.stderr)
        return EXIT_SAME
    binary = getattr(sys.stdout, "buffer", None)
    if binary is None:
        sys.stdout.write(report)
    else:
        # the report says it is UTF-8 (<meta charset>), whatever the terminal's encoding
        sys.stdout.flush()
        binary.write(report.encode("utf-8"))
        binary.flush()
    return EXIT_SAME


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
        args = parser.parse_args(arguments)
        if args.command == "models":
            return command_models(args)
        if args.command == "run":
            return command_run(args)
        if args.command == "live":
            return command_live(args)
        if args.command == "verify":
            return command_verify(args)
        if args.command == "replay":
            return command_replay(args)
        if args.command == "export":
            return command_export(args)
        if args.command == "sessions":
            return command_sessions(args)
        if args.command == "suite":
            return command_suite(args)
        if args.command == "repeat":
            return command_repeat(args)
        if args.command == "serve-pair":
            return command_serve_pair(args)
        parser.print_help()
        return EXIT_BAD_INPUT
    except SpecdiffError as error:
        print(f"specdiff: error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:
        # the reader went away (`specdiff run --json | head`): nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("specdiff: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
