"""`specdiff suite`: run pairs over a set of prompts into a report folder, headless; a
stopped suite continues with --resume."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from specdiff.cli import options
from specdiff.cli.cluster import add_ray_options, check_ray_options, suite_runners
from specdiff.cli.common import (
    ArgumentError,
    Exit,
    Status,
    Subcommands,
    add_command,
    check_limits,
    known_pairs,
    resolve_pair,
)
from specdiff.cli.suite_shards import add_shard_options, given_shard, record_shard
from specdiff.errors import printable
from specdiff.grading import DEFAULT_TIMEOUT as DEFAULT_GRADE_TIMEOUT
from specdiff.grading import MAX_TIMEOUT as MAX_GRADE_TIMEOUT
from specdiff.lanes import BOUNDS, Lane, Pair
from specdiff.prompts import SETS
from specdiff.suite import MAX_CONCURRENCY

if TYPE_CHECKING:
    from specdiff.suite.outcome import SuiteOutcome, SuiteReport
    from specdiff.suite.progress import Progress
    from specdiff.suite.prompts import SuitePrompt
    from specdiff.suite.settings import SuiteSettings
    from specdiff.suite.shards import Shard

LOG_SECONDS = 60.0
"""How often a suite whose stderr is no terminal logs its progress figures."""
PROMPTS_HELP = (
    "JSONL file ({id, prompt, max_tokens?, stop?, tests+entry_point | answer(s) | "
    "answer_regex?} a line), folder of .txt files, or a bundled set: " + ", ".join(SETS)
)


def add_parser(commands: Subcommands) -> None:
    suite = add_command(
        commands,
        "suite",
        "run pairs over a set of prompts into a report folder, headless",
        command_suite,
    )
    suite.add_argument(
        "prompts",
        nargs="?",
        metavar="PROMPTS",
        help=PROMPTS_HELP,
    )
    options.add_lane_options(suite, one_pair=False)
    suite.add_argument(
        "--pair",
        action="append",
        dest="pair_names",
        metavar="PAIR",
        help=f"pair to run (repeatable; default {options.DEFAULT_PAIR})",
    )
    options.add_max_tokens(suite, default=None)
    suite.add_argument(
        "--report",
        metavar="DIR",
        help="the report folder (default: a new one here named for the set, the pairs and "
        "the time, e.g. suite-open-spec-vs-plain-20261207T0530Z)",
    )
    options.add_near_tie(suite)
    add_variant_options(suite)
    options.add_stop(suite)
    add_grading_options(suite)
    add_load_options(suite)
    add_ray_options(suite)
    add_shard_options(suite)
    suite.add_argument("--resume", action="store_true", help="continue a stopped suite in DIR")
    suite.add_argument("--force", action="store_true", help="replace the report in DIR")
    options.add_allow_servers(suite)
    suite.add_argument(
        "--skip-bad", action="store_true", help="run the good prompts when some lines are bad"
    )
    options.add_quiet(suite)


def add_variant_options(suite: argparse.ArgumentParser) -> None:
    """What each run measures beside the plain pair: teacher forcing and its KL pass,
    the noise-floor control, and a variant of each pair per weight type or prompt length."""
    options.add_teacher_forced(suite)
    suite.add_argument(
        "--no-kld",
        action="store_true",
        help="with --teacher-forced: skip the full-vocabulary KL divergence pass (it "
        "evaluates every finished run once more in both lanes, about a run's time each)",
    )
    options.add_control(suite)
    suite.add_argument(
        "--quants",
        metavar="LIST",
        help="run each pair once per weight type, e.g. base,q8_0,f16 (base = the model as is)",
    )
    suite.add_argument(
        "--prompt-lengths",
        metavar="LIST",
        help="run each pair once per token length, e.g. 128,512: every prompt padded to it "
        "with fixed filler text before it (a longer prompt is skipped at that length)",
    )


def add_load_options(suite: argparse.ArgumentParser) -> None:
    suite.add_argument(
        "--concurrency",
        type=options.whole_number(1, MAX_CONCURRENCY),
        metavar="N",
        help="server lanes: up to N prompts in flight per lane, each lane's requests "
        "independent (default 1; recorded, since the split rate depends on the load)",
    )
    low, high = BOUNDS["retries"]
    suite.add_argument(
        "--max-retries",
        type=options.whole_number(low, high),
        metavar="N",
        help="server lanes: how often one request is sent again after a 429/503 or a "
        "failed endpoint (sets each server lane's retries key)",
    )


def add_grading_options(suite: argparse.ArgumentParser) -> None:
    suite.add_argument(
        "--grade",
        action="store_true",
        help="grade each lane's text with its prompt's grader; prompts with tests run "
        "model-written code, each in a sandboxed python subprocess",
    )
    suite.add_argument(
        "--no-exec",
        action="store_true",
        help="grade answers and patterns only: run no model-written code (implies --grade)",
    )
    suite.add_argument(
        "--grade-timeout",
        type=options.finite_number(0, above=True, high=MAX_GRADE_TIMEOUT),
        metavar="SECONDS",
        help=f"how long a graded program may run (default {DEFAULT_GRADE_TIMEOUT:g})",
    )
    suite.add_argument(
        "--limit",
        type=options.whole_number(1, 1_000_000),
        metavar="N",
        help="run only the first N prompts (of --ids)",
    )
    suite.add_argument(
        "--ids", metavar="LIST", help="run only the prompts with these ids, e.g. a,b,c"
    )


def command_suite(args: argparse.Namespace) -> int:
    """Exit 0 when every run finished; 1 when some lane failed or crashed, a pair would not
    load, or no run finished at all (with the reason); 130 when stopped."""
    # deferred: the engine, session and report modules load only for the command that runs
    from specdiff.suite.folder import prepare_report_dir, write_settings
    from specdiff.suite.runner import FinishedRun, SuiteRun

    check_limits(args.max_tokens, args.near_tie)
    check_ray_options(args)
    given, prompts, skipped = given_suite(args)
    report_dir = chosen_report_dir(args.report, args.resume, given)
    shard = given_shard(args, report_dir)
    allowed = args.allow_servers  # the server lanes a suite.json names, on a resume
    settings = prepare_report_dir(report_dir, given, prompts, args.resume, args.force, allowed)
    if given is None:
        resumed_concurrency(args.concurrency, settings, report_dir)
    if prompts is None:
        prompts, skipped = recorded_prompts(settings, report_dir, args.skip_bad)
    check_ray_load(args, settings)
    write_settings(report_dir, settings, prompts)
    record_shard(report_dir, shard, settings, prompts)
    status = Status(sys.stderr, not args.quiet)
    announce(status, settings, prompts, skipped, report_dir, shard)
    log = ProgressLog(status)

    def on_finished(run: FinishedRun) -> None:
        # a terminal shows the progress line; a log (stderr redirected) gets a line a run
        if not status.live:
            status.message(run.line())

    cancel, drain = threading.Event(), threading.Event()
    with suite_runners(args, cancel, status.message) as runners, draining_interrupts(drain, cancel):
        runner = SuiteRun(
            settings,
            prompts,
            report_dir,
            skipped,
            log.show,
            status.message,
            cancel,
            on_finished,
            drain,
            score_kld=not args.no_kld,
            runners=runners,
            shard=shard,
        )
        outcome = runner.run()
    status.done()
    return suite_exit(outcome, report_dir)


def recorded_prompts(
    settings: SuiteSettings, report_dir: Path, skip_bad: bool
) -> tuple[list[SuitePrompt], list[str]]:
    """A resume without PROMPTS: the prompts suite.json names, checked against it."""
    from specdiff.suite.folder import read_suite_file
    from specdiff.suite.prompts import load_suite_prompts, select_prompts
    from specdiff.suite.settings import check_resume

    prompts, skipped = load_suite_prompts(settings.source, skip_bad)
    prompts = select_prompts(prompts, settings.ids, settings.limit, settings.source)
    check_resume(read_suite_file(report_dir), None, prompts, report_dir)
    return prompts, skipped


def check_ray_load(args: argparse.Namespace, settings: SuiteSettings) -> None:
    """--ray runs its units side by side on actors; --concurrency (server lanes' requests
    in flight from this process) does not go with it."""
    if args.ray is not None and settings.concurrency > 1:
        raise ArgumentError(
            "--ray runs units side by side on its actors (--ray-actors); drop --concurrency"
        )


def chosen_report_dir(report: str | None, resume: bool, given: SuiteSettings | None) -> Path:
    """The folder --report names, else a new one in the working folder named for what
    the suite runs (`given`); a --resume must name the folder it continues."""
    if report is not None:
        return Path(report).expanduser()
    if resume or given is None:
        raise ArgumentError("--resume continues a suite in its folder: name it with --report DIR")
    pairs = [pair.name for pair in given.pairs]
    # relative, so that what is printed (and a --resume hint) reads short
    return new_report_dir(Path(), given.source, pairs, datetime.now(timezone.utc))


def new_report_dir(where: Path, source: str, pairs: Sequence[str], now: datetime) -> Path:
    """suite-SET-PAIRS-TIME in `where`, a folder not there yet (a second suite started in
    the same minute gets -2, -3, ...): a default that never lands on another report."""
    # deferred: the session store loads only for the command that runs
    from specdiff.sessions.store import safe_name

    prompt_set = source if source in SETS else safe_name(Path(source).stem or "prompts")
    shown = list(pairs) if len(pairs) <= 3 else [*pairs[:2], f"{len(pairs) - 2}-more"]
    stamp = now.astimezone(timezone.utc).strftime("%Y%m%dT%H%MZ")
    name = f"suite-{prompt_set}-{'+'.join(safe_name(pair) for pair in shown)}-{stamp}"
    folder, count = where / name, 1
    while folder.exists():
        count += 1
        folder = where / f"{name}-{count}"
    return folder


def suite_exit(outcome: SuiteOutcome, report_dir: Path) -> int:
    """Write the reports, print the summary and say why the suite ended as it did."""
    from specdiff.reports.suite import write_reports
    from specdiff.suite.outcome import outcome_json

    data = outcome_json(outcome)
    try:
        print_summary(data, write_reports(report_dir, data))
    finally:
        outcome.ledger.close()
    if outcome.cancelled:
        print(
            f"specdiff: stopped after {data['finished']} of {data['jobs']} runs; continue "
            f"with: specdiff suite --resume --report {report_dir}",
            file=sys.stderr,
        )
        return Exit.INTERRUPTED
    why = outcome.nothing_ran()
    if why is not None:
        print(f"specdiff: no run of the suite finished: {printable(why, 400)}", file=sys.stderr)
        return Exit.DIFFERENT
    failed = sum(pair["summary"]["failed"] + pair["summary"]["crashed"] for pair in data["pairs"])
    return Exit.DIFFERENT if failed or outcome.unloaded else Exit.SAME


def resumed_concurrency(given: int | None, settings: SuiteSettings, report_dir: Path) -> None:
    """A --resume without PROMPTS runs at the stopped suite's concurrency: another one
    given is refused, as is one a hand-edited suite.json sets for an in-process lane."""
    from specdiff.suite.folder import read_suite_file
    from specdiff.suite.settings import check_concurrency, check_same_concurrency

    if given is not None:
        check_same_concurrency(read_suite_file(report_dir), given, report_dir)
    check_concurrency(settings)


@contextlib.contextmanager
def draining_interrupts(drain: threading.Event, cancel: threading.Event) -> Iterator[None]:
    """The first Ctrl+C lets the runs in flight finish and starts no new one; the second
    stops those runs where they are; a third leaves at once."""

    def on_interrupt(_signum: int, _frame: object) -> None:
        if cancel.is_set():
            raise KeyboardInterrupt
        (cancel if drain.is_set() else drain).set()

    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class ProgressLog:
    """The progress line rewritten on a terminal; on a log (stderr redirected), the same
    figures once the first run has ended, then a line a minute."""

    def __init__(self, status: Status) -> None:
        self.status = status
        self.logged_at: float | None = None

    def show(self, progress: Progress) -> None:
        if self.status.live:
            self.status.bar(progress.fraction, progress_figures(progress))
            return
        now = time.monotonic()
        due = self.logged_at is None or now - self.logged_at >= LOG_SECONDS
        if due and progress.run_jobs:
            self.logged_at = now
            self.status.message(f"suite: {progress_figures(progress)}")


def announce(
    status: Status,
    settings: SuiteSettings,
    prompts: list[SuitePrompt],
    skipped: list[str],
    report_dir: Path,
    shard: Shard | None = None,
) -> None:
    """What the suite will do, before the first run: skipped lines, the size of the work,
    and that model-written code runs where it does."""
    from specdiff.suite.settings import budget_words

    for problem in skipped:
        status.message(f"skipped: {problem}")
    variants = settings.variants()
    status.message(
        f"suite: {len(prompts)} prompts x {len(variants)} pair"
        f"{'s' if len(variants) > 1 else ''} ({', '.join(v[0] for v in variants)}), up to "
        f"{budget_words(settings.budget_range(prompts))} tokens per lane"
        + ("" if shard is None else f", shard {shard} of the runs")
        + f" -> {report_dir}"
    )
    if settings.executes_code(prompts):
        # deferred: the sandbox module loads only for a graded suite
        from specdiff.grading.sandbox import current_confinement

        status.message(
            f"grading runs model-written code: each program in {current_confinement().describe()}"
        )


def given_suite(
    args: argparse.Namespace,
) -> tuple[SuiteSettings | None, list[SuitePrompt] | None, list[str]]:
    """The settings, prompts and skipped lines the command names; (None, None, []) for a
    --resume without PROMPTS, which takes all of them from the stopped suite."""
    # deferred: the engine, session and report modules load only for the command that runs
    from specdiff.control import refuse_uncontrollable
    from specdiff.suite.lengths import check_room
    from specdiff.suite.prompts import load_suite_prompts, select_prompts
    from specdiff.suite.settings import SuiteSettings, check_concurrency, check_quants

    if args.prompts is None:
        if not args.resume:
            raise ArgumentError("give the prompts: a JSONL file, a folder of .txt or a bundled set")
        refuse_run_options(args)
        return None, None, []
    known = known_pairs(args)
    names = args.pair_names or [options.DEFAULT_PAIR]
    settings = SuiteSettings(
        source=args.prompts,
        pairs=with_retries(
            [resolve_pair(args, known, name) for name in dict.fromkeys(names)], args.max_retries
        ),
        max_tokens=args.max_tokens or options.DEFAULT_MAX_TOKENS,
        near_tie=args.near_tie,
        teacher_forced=args.teacher_forced,
        quants=check_quants(args.quants.split(",")) if args.quants else (),
        stop=tuple(args.stop),
        grade=args.grade or args.no_exec,
        no_exec=args.no_exec,
        grade_timeout=(DEFAULT_GRADE_TIMEOUT if args.grade_timeout is None else args.grade_timeout),
        limit=args.limit,
        ids=prompt_ids(args.ids),
        concurrency=args.concurrency or 1,
        control=args.control,
        prompt_lengths=given_lengths(args.prompt_lengths),
    )
    check_room(settings.prompt_lengths, settings.pairs, settings.max_tokens)
    check_concurrency(settings)
    for pair in settings.pairs if settings.control else ():
        refuse_uncontrollable(pair)
    prompts, skipped = load_suite_prompts(args.prompts, args.skip_bad)
    prompts = select_prompts(prompts, settings.ids, settings.limit, args.prompts)
    check_graders(settings, prompts)
    return settings, prompts, skipped


def given_lengths(value: str | None) -> tuple[int, ...]:
    from specdiff.suite.lengths import parse_prompt_lengths

    return () if value is None else parse_prompt_lengths(value)


def with_retries(pairs: list[Pair], retries: int | None) -> tuple[Pair, ...]:
    """The pairs with --max-retries as every server lane's request budget."""
    if retries is None:
        return tuple(pairs)
    if not any("server" in (pair.a.backend, pair.b.backend) for pair in pairs):
        raise ArgumentError("--max-retries sets server lanes' retries, and no lane is a server's")

    def budgeted(lane: Lane) -> Lane:
        return replace(lane, retries=retries) if lane.backend == "server" else lane

    return tuple(replace(pair, a=budgeted(pair.a), b=budgeted(pair.b)) for pair in pairs)


def prompt_ids(value: str | None) -> tuple[str, ...]:
    if value is None:
        return ()
    ids = tuple(dict.fromkeys(part.strip() for part in value.split(",") if part.strip()))
    if not ids:
        raise ArgumentError("--ids needs at least one prompt id, e.g. --ids a,b")
    return ids


def check_graders(settings: SuiteSettings, prompts: list[SuitePrompt]) -> None:
    """Refuse --grade where no prompt could be graded, before anything is written."""
    if not settings.grade:
        return
    if settings.teacher_forced:
        raise ArgumentError(
            "--grade with --teacher-forced: lane b is fed lane a's tokens, so both lanes' "
            "texts are a's; drop one of them"
        )
    graded = [p for p in prompts if p.grader is not None]
    if not graded:
        raise ArgumentError(
            f"--grade needs prompts that carry a grader (tests, answer, answers or "
            f"answer_regex); {printable(settings.source, 200)} has none: drop --grade"
        )
    if settings.no_exec and all(p.grader.executes for p in graded if p.grader):
        raise ArgumentError(
            f"--no-exec grades answers and patterns only, and the prompts of "
            f"{printable(settings.source, 200)} carry tests: drop --no-exec to run them"
        )
    if settings.executes_code(prompts):
        # refused here, before the report folder is touched, where programs would run
        # as root; deferred: the sandbox loads only where programs run
        from specdiff.grading.sandbox import current_confinement

        current_confinement()


def refuse_run_options(args: argparse.Namespace) -> None:
    """Without PROMPTS, --resume takes every run option from the stopped suite: one given
    here would be ignored, so it is refused."""
    given_options = [
        name
        for name, value in (
            ("--pair", args.pair_names),
            ("--max-tokens", args.max_tokens),
            ("--quants", args.quants),
            ("--prompt-lengths", args.prompt_lengths),
            ("--teacher-forced", args.teacher_forced or None),
            ("--control", args.control or None),
            ("--stop", args.stop),
            ("--grade", args.grade or None),
            ("--no-exec", args.no_exec or None),
            ("--grade-timeout", args.grade_timeout),
            ("--limit", args.limit),
            ("--ids", args.ids),
            ("--max-retries", args.max_retries),
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


def progress_figures(progress: Progress) -> str:
    """`12/164 (7%) · 3 in flight · 0.52 prompts/s · 180 tokens/s · ETA 4m05s`."""
    from specdiff.suite.progress import duration

    def rate(value: float | None, unit: str, digits: int) -> str:
        return f"… {unit}" if value is None else f"{value:.{digits}f} {unit}"

    return (
        f"{progress.job}/{progress.jobs} ({progress.fraction:.0%}) · {progress.in_flight} in "
        f"flight · {rate(progress.prompts_per_second, 'prompts/s', 2)} · "
        f"{rate(progress.tokens_per_second, 'tokens/s', 0)} · ETA "
        f"{duration(progress.eta_seconds)} · {progress.label} {progress.prompt_id}"
    )


def print_summary(data: SuiteReport, paths: list[Path]) -> None:
    """A line per pair (identical runs, pass@1 and McNemar when graded, fork classes,
    speed, flips, failures, crashes), then where the report is."""
    from specdiff.reports.suite import backoff_text, left_out_text, paired_line
    from specdiff.reports.suite_kld import kld_line
    from specdiff.safe_text import visible

    for pair in data["pairs"]:
        summary = pair["summary"]
        label = visible(pair["label"])
        ran = summary["prompts"] - summary["failed"] - summary["crashed"]
        failures = [f"{summary[kind]} {kind}" for kind in ("failed", "crashed") if summary[kind]]
        if not ran:
            # "identical 0 of 0" would read as a result
            print(f"{label}: " + ", ".join(["no run finished", *failures]))
            continue
        parts = [f"{label}: {paired_line(summary)}"]
        if summary["speedup"]:
            parts.append(f"speed a/b {summary['speedup']:.2f}x")
        teacher = summary.get("teacher_forced")
        if teacher:
            parts.append(f"teacher-forced flips {teacher['flips']} of {teacher['steps']} steps")
        load = f"concurrency {summary.get('concurrency', 1)}"
        print(" · ".join([*parts, load, *failures]))
        for note in (left_out_text(summary), backoff_text(summary), kld_line(summary.get("kld"))):
            if note:
                print(f"  {visible(note, 400)}")
    print(f"report: {paths[2]} (also {', '.join(p.name for p in paths if p != paths[2])})")
