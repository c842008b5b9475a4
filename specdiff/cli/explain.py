"""`specdiff explain`: the fork autopsy. Which setting, which layer and which operation
made two lanes fork, for a saved session or a pair and prompt given as `run` takes them.

The work runs in a worker process (`call_in_worker`), as every decoding command's
does, so a native crash in a kernel ends the command with one line and llama.cpp
never loads in this process.

Server lanes get part 1 only (a server offers no eval callback to trace layers with).
Under `serve-pair`, part 1 is a sweep of the speculative server's draft length: serve-pair
hands `explain_on_servers` a way to start that server again drafting at most k tokens,
and each draft length is one run of the pair.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from specdiff.autopsy import (
    Autopsy,
    AutopsyError,
    AutopsyInterrupted,
    missing_model,
    save_beside,
)
from specdiff.cli import options
from specdiff.cli.common import (
    ArgumentError,
    Exit,
    Status,
    Subcommands,
    add_command,
    command_parser,
    fitted,
    interrupt_sets,
    note_unread_keys,
    text_columns,
    wrapped_text,
)
from specdiff.cli.run import read_chat_request
from specdiff.compare import DEFAULT_NEAR_TIE
from specdiff.errors import ModelError, SpecdiffError
from specdiff.lanes import Pair
from specdiff.safe_text import visible

if TYPE_CHECKING:  # the engine loads only for the command that runs
    from specdiff.engine.server_autopsy import DraftRestart

DEFAULT_MAX_RUNS = 8
"""The pair as given, its one differing setting, and the six kernel switches."""
DEFAULT_EXPLAIN_TOKENS = 100
MAX_DRAFT_LENGTH = 256


def draft_lengths(text: str) -> tuple[int, ...]:
    """An argparse type: draft lengths separated by commas, each from 1 to 256, once."""
    words = [word.strip() for word in text.split(",")]
    if not any(words):
        raise argparse.ArgumentTypeError("is empty; give draft lengths such as 1,2,4")
    lengths = []
    for word in words:
        if not word.isdigit() or not 1 <= int(word) <= MAX_DRAFT_LENGTH:
            raise argparse.ArgumentTypeError(
                f"must be whole numbers from 1 to {MAX_DRAFT_LENGTH} separated by commas, "
                f"got {visible(word, 20)!r}"
            )
        if int(word) in lengths:
            raise argparse.ArgumentTypeError(f"lists {int(word)} twice; give it once")
        lengths.append(int(word))
    return tuple(lengths)


def add_parser(commands: Subcommands) -> None:
    explain = add_command(
        commands,
        "explain",
        "trace a fork to the setting, the layer and the operation that caused it",
        command_explain,
    )
    explain.add_argument(
        "session", nargs="?", help="a session file (.jsonl) to explain; else the pair options"
    )
    options.add_lane_options(explain)
    options.add_prompt_options(explain)
    options.add_chat_options(explain)
    explain.add_argument(
        "--max-tokens",
        type=options.token_budget,
        default=None,
        help=f"tokens per lane in each run (default {DEFAULT_EXPLAIN_TOKENS}; a session: its own)",
    )
    # a run's near-tie threshold marks steps and changes no token: nothing here reads it
    explain.set_defaults(near_tie=DEFAULT_NEAR_TIE)
    explain.add_argument(
        "--max-runs",
        type=options.whole_number(1, 100),
        default=DEFAULT_MAX_RUNS,
        help=f"runs of the pair the settings sweep may make, the first included "
        f"(default {DEFAULT_MAX_RUNS})",
    )
    explain.add_argument(
        "--no-cache",
        action="store_true",
        help="run every setting again, not reading or writing the cache of earlier runs",
    )
    explain.add_argument(
        "--draft-lengths",
        type=draft_lengths,
        metavar="LIST",
        help="under serve-pair: the speculative server's draft lengths to try, e.g. 1,2,4 "
        "(default 1,2,4,8, as --max-runs allows)",
    )
    explain.add_argument(
        "--svg", metavar="FILE", help="also write the per-layer growth chart as SVG to FILE"
    )
    explain.add_argument(
        "--save",
        action="store_true",
        help="with a session file: also write the autopsy beside it (NAME.autopsy.json), "
        "where the TUI's w key finds it in a replay without loading the model",
    )
    options.add_json_summary(explain)
    options.add_quiet(explain)
    options.add_allow_servers(explain)


def command_explain(args: argparse.Namespace) -> int:
    """Exit 0 with the autopsy (or with nothing to explain), 2 on bad input."""
    # deferred: the engine and report modules load only for the command that runs
    from specdiff.engine.autopsy import explain_pair, refuse_servers
    from specdiff.engine.models import cache_dir
    from specdiff.engine.worker import call_in_worker

    if args.save and args.session is None:
        raise SpecdiffError("--save writes beside a session file: give one, or leave --save out")
    pair, prompt, max_tokens = read_target(args)
    note_unread_keys((("a", pair.a), ("b", pair.b)))
    if pair.a.backend == "server" or pair.b.backend == "server":
        refuse_in_process_options(args)
        return explain_servers(args, pair, prompt, max_tokens, None)
    if args.draft_lengths is not None:
        raise ArgumentError(
            "--draft-lengths restarts the speculative server, so it needs servers specdiff "
            "starts: specdiff serve-pair explain --draft-lengths LIST (in-process lanes "
            "try a draft length among their settings)"
        )
    refuse_servers(pair)
    svg = Path(args.svg).expanduser() if args.svg else None
    if svg is not None:
        options.check_output_file(svg, "--svg")
    status = Status(sys.stderr, not args.quiet)
    cancel = threading.Event()
    cache = None if args.no_cache else str(cache_dir() / "explain")
    try:
        with interrupt_sets(cancel):
            autopsy = call_in_worker(
                explain_pair,
                (pair, prompt, max_tokens, args.max_runs, cache),
                {"progress": lambda stage: status.message(stage.line())},
                cancel,
                doing="explaining the fork",
            )
    except AutopsyInterrupted:
        status.done()
        print("specdiff: interrupted", file=sys.stderr)
        return Exit.INTERRUPTED
    status.done()
    # the engine's record names no lanes: how they computed earlier rows comes from them
    put_out(args, autopsy.with_lanes(pair.a, pair.b), svg)
    return Exit.SAME


def put_out(args: argparse.Namespace, autopsy: Autopsy, svg: Path | None) -> None:
    """The growth chart and the record beside the session where asked, then the
    autopsy printed."""
    from specdiff.reports.autopsy import growth_svg  # deferred, as above

    if svg is not None and not autopsy.nothing_to_explain:
        options.write_output_file(svg, growth_svg(autopsy), "--svg")
    if args.save:
        saved = save_beside(Path(args.session).expanduser(), autopsy)
        if not args.quiet:
            print(f"specdiff: autopsy saved as {visible(str(saved), 160)}", file=sys.stderr)
    show(autopsy, args.json)


def show(autopsy: Autopsy, as_json: bool) -> None:
    if as_json:
        json.dump(autopsy.to_json(), sys.stdout, indent=1, ensure_ascii=True, allow_nan=False)
        sys.stdout.write("\n")
    else:
        print(autopsy_text(autopsy, text_columns(sys.stdout)))


def autopsy_text(autopsy: Autopsy, columns: int | None) -> str:
    """The autopsy as explain prints it: the report, then what its short names mean,
    laid out for `columns` (None: a file or a pipe, where the report keeps its lines)."""
    from specdiff.reports.autopsy import format_autopsy  # deferred, as above

    lines = format_autopsy(autopsy).split("\n")
    legend = autopsy.legend()
    if legend:
        lines += ["", "Words", *(f"   {entry}" for entry in legend)]
    if columns is not None:
        lines = narrow_settings_table(cause_on_one_line(lines), autopsy, columns)
    return wrapped_text("\n".join(lines), columns)


def narrow_settings_table(lines: list[str], autopsy: Autopsy, columns: int) -> list[str]:
    """The report's settings table, where it is wider than `columns`, as three columns
    that fit: the setting (cut with an ellipsis), the outcome and both lanes' speeds in
    one cell; a table row wrapped by the width would read as two rows."""
    rows = [index for index, line in enumerate(lines) if line.startswith("   setting ")]
    if not rows or len(autopsy.trials) + 1 > len(lines) - rows[0]:
        return lines
    start, end = rows[0], rows[0] + len(autopsy.trials) + 1
    if max(len(line) for line in lines[start:end]) < columns:
        return lines
    cells = [("setting", "outcome", "tok/s a/b")]
    for trial in autopsy.trials:
        outcome = trial.outcome + (" (cached)" if trial.cached else "")
        if trial.error is not None:
            outcome = "failed"
        cells.append(
            (visible(trial.setting, 80), outcome, f"{trial.speed_a:.1f}/{trial.speed_b:.1f}")
        )
    outcome_width = max(len(row[1]) for row in cells)
    speed_width = max(len(row[2]) for row in cells)
    setting_width = max(8, columns - 1 - 3 - outcome_width - speed_width - 4)
    table = [
        f"   {fitted(setting, setting_width):<{setting_width}}  {outcome:<{outcome_width}}  "
        f"{speeds:>{speed_width}}".rstrip()
        for setting, outcome, speeds in cells
    ]
    return [*lines[:start], *table, *lines[end:]]


CAUSE_HEADING = "3. Cause"


def cause_on_one_line(lines: list[str]) -> list[str]:
    """The report's cause paragraph (wrapped for a wide page) as one line again, so that
    it is wrapped once, to the terminal's width, not cut into long and short rows."""
    if CAUSE_HEADING not in lines:
        return lines
    start = lines.index(CAUSE_HEADING) + 1
    end = start
    while (
        end < len(lines) and lines[end].startswith("   ") and not lines[end].startswith("   note:")
    ):
        end += 1
    paragraph = " ".join(line.strip() for line in lines[start:end])
    return [*lines[:start], *(["   " + paragraph] if paragraph else []), *lines[end:]]


def explain_on_servers(argv: list[str], restart: DraftRestart) -> int:
    """`explain` as serve-pair runs it: `argv` with the lanes pointed at its servers, and
    `restart` to start the speculative one again with another draft length."""
    args = command_parser(add_parser).parse_args(argv)
    check_serve_pair_options(args)
    pair, prompt, max_tokens = read_target(args)
    return explain_servers(args, pair, prompt, max_tokens, restart)


def check_serve_pair_options(args: argparse.Namespace) -> None:
    """What serve-pair explain refuses, checked before its servers start."""
    if args.session is not None:
        raise ArgumentError(
            "serve-pair explain runs a prompt on the servers it starts; give --prompt, "
            "not a session file"
        )
    if args.svg:
        raise ArgumentError(SVG_NEEDS_PART2)


def refuse_in_process_options(args: argparse.Namespace) -> None:
    """What server lanes started elsewhere cannot do: part 2's chart, or a draft-length
    sweep, which restarts a server specdiff started."""
    if args.svg:
        raise ArgumentError(SVG_NEEDS_PART2)
    if args.draft_lengths is not None:
        raise ArgumentError(
            "--draft-lengths restarts the speculative server, so it needs servers specdiff "
            "starts: specdiff serve-pair explain --draft-lengths LIST"
        )


SVG_NEEDS_PART2 = (
    "--svg draws part 2's per-layer growth, which needs in-process lanes (a server offers "
    "no eval callback); drop --svg"
)


def explain_servers(
    args: argparse.Namespace,
    pair: Pair,
    prompt: str,
    max_tokens: int,
    restart: DraftRestart | None,
) -> int:
    """Part 1 for server lanes (`ServerSweep`), its autopsy printed. Part 2 is left out
    with one line saying why."""
    from specdiff.engine.server_autopsy import ServerSweep  # deferred, as above

    sweep = ServerSweep(pair, prompt, max_tokens, args.max_runs, restart, args.draft_lengths)
    status = Status(sys.stderr, not args.quiet)
    cancel = threading.Event()
    try:
        with interrupt_sets(cancel):
            autopsy = sweep.run(lambda stage: status.message(stage.line()), cancel)
    except AutopsyInterrupted:
        status.done()
        print("specdiff: interrupted", file=sys.stderr)
        return Exit.INTERRUPTED
    status.done()
    print(f"specdiff: {autopsy.part2_note}", file=sys.stderr)
    show(autopsy.with_lanes(pair.a, pair.b), args.json)
    return Exit.SAME


def read_target(args: argparse.Namespace) -> tuple[Pair, str, int]:
    """The pair, prompt and token budget: from the session file, or from the options."""
    if args.session is None:
        if args.max_tokens is None:
            args.max_tokens = DEFAULT_EXPLAIN_TOKENS
        _, pair, prompt = read_chat_request(args)
        return pair, prompt, args.max_tokens
    from specdiff.sessions.store import load_session  # deferred: only a session needs it

    given = [flag for flag, value in _pair_options(args) if value]
    if given:
        raise SpecdiffError(
            f"give a session file or {', '.join(given)}, not both: a session names its pair "
            "and prompt"
        )
    session = load_session(args.session)
    pair = session.pair
    unsafe = pair.servers_named(session.path.name)
    if unsafe and not args.allow_servers:
        raise SpecdiffError(unsafe)
    missing = missing_model(pair)
    if missing is not None:
        lane_id, path = missing
        raise ModelError(
            f"{visible(session.path.name)}: lane {lane_id}'s model file "
            f"{visible(str(path), 160)} is missing; put it back there, or run "
            "explain with --pair and --model"
        )
    if session.header.teacher_forced:
        raise SpecdiffError(
            f"{visible(session.path.name)} is teacher-forced (lane b was fed lane a's "
            "tokens); explain re-runs both lanes free, so explain that pair with --pair "
            "and --prompt instead"
        )
    if session.header.stop:
        # the sweep decodes to the budget: a stop string that ended the recording
        # earlier would hide a fork the re-run then finds
        print(
            f"specdiff explain: note: {visible(session.path.name)} had stop strings; "
            "the re-runs decode to the token budget without them",
            file=sys.stderr,
        )
    max_tokens = args.max_tokens or session.header.max_tokens
    if max_tokens < 1:
        raise AutopsyError(f"{visible(session.path.name)}: the session's token budget is 0")
    return pair, session.prompt, max_tokens


def _pair_options(args: argparse.Namespace) -> list[tuple[str, object]]:
    return [
        ("--prompt", args.prompt),
        ("--prompt-file", args.prompt_file),
        ("--messages", args.messages),
        ("--system", args.system),
        ("--pairs", args.pairs),
        ("--model", args.model),
        ("--lane-a", args.lane_a),
        ("--lane-b", args.lane_b),
        ("--both", args.both),
        ("--pair", args.pair != options.DEFAULT_PAIR),
    ]
