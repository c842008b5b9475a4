"""`specdiff certify`: check a deployment's claim that greedy decoding repeats, one
property at a time, and print a certificate with the evidence; exit 0 when every tested
property holds, 1 when one is broken, 2 on bad input, 3 when a property asked for
(--property, --require) could not be tested: a CI gate must not read that as a pass.

The battery runs in a worker process, which alone loads llama.cpp (the bundled model
in-process, or a server lane's tokenizer)."""

from __future__ import annotations

import argparse
import json
import sys
import threading
from pathlib import Path
from typing import Any

from specdiff.certify.records import PROPERTIES, check_properties
from specdiff.certify.sides import Settings
from specdiff.cli import options
from specdiff.cli.common import (
    ArgumentError,
    Exit,
    Status,
    Subcommands,
    add_command,
    for_terminal,
    interrupt_sets,
    known_pairs,
    note_unread_keys,
    resolve_pair,
)
from specdiff.errors import SpecdiffError
from specdiff.lanes import Lane, Pair, check_endpoints, without_credentials
from specdiff.safe_text import terminal_text, visible

MAX_ENDPOINTS = 2
"""The certified endpoint, and the one to compare it with (without the switch, or plain)."""
NOT_TESTED_EXIT = 3
"""The exit code where no property is broken but one asked for was not tested."""
EVERY_PROPERTY = "all"
"""--require's name for every property."""


def add_parser(commands: Subcommands) -> None:
    parser = add_command(
        commands,
        "certify",
        "check that greedy decoding repeats: run to run, batch size, load, cache, "
        "decode vs prefill, speculation",
        command_certify,
    )
    _add_subject_options(parser)
    _add_battery_options(parser)
    _add_output_options(parser)


def _add_subject_options(parser: argparse.ArgumentParser) -> None:
    """What is certified: a server (and one to compare it with), a pair, or the
    in-process engine with lane settings."""
    parser.add_argument(
        "--endpoint",
        action="append",
        default=[],
        metavar="URL",
        help="the server to certify; a second --endpoint is the same model without the "
        "deterministic switch (or without speculation), for the control and the cost "
        "(default: the in-process engine)",
    )
    parser.add_argument(
        "--pair", default=None, help="a pair preset whose lane a is certified, lane b compared"
    )
    options.add_lane_options(parser, one_pair=False)


def _add_battery_options(parser: argparse.ArgumentParser) -> None:
    """Which properties run, and how many requests each sends."""
    parser.add_argument(
        "--property",
        action="append",
        default=[],
        metavar="NAME",
        help=f"run only this property (repeatable): {', '.join(PROPERTIES)}; one that "
        f"cannot be tested exits {NOT_TESTED_EXIT}",
    )
    parser.add_argument(
        "--require",
        action="append",
        default=[],
        metavar="NAME",
        help=f"exit {NOT_TESTED_EXIT} unless this property is tested (repeatable; "
        f"'{EVERY_PROPERTY}' for every one run); without --property the default set runs "
        "and one that cannot be tested is reported, not failed",
    )
    parser.add_argument(
        "-n",
        "--runs",
        type=options.whole_number(1, 1000),
        default=4,
        help="run to run: how often the same request is sent (default 4)",
    )
    parser.add_argument(
        "--batch-size",
        type=options.whole_number(2, 64),
        default=4,
        help="batch size N: prompts sent together (default 4)",
    )
    parser.add_argument(
        "--fillers",
        type=options.whole_number(1, 127),
        default=8,
        help="needle: filler prompts of mixed lengths sent with it (default 8)",
    )
    options.add_max_tokens(parser, default=48)
    parser.add_argument("--seed", type=int, default=0, help="where the needle goes (default 0)")


def _add_output_options(parser: argparse.ArgumentParser) -> None:
    """What the certificate names beside its verdicts, and where it goes."""
    parser.add_argument(
        "--mode-flag",
        metavar="FLAG",
        help="the deterministic switch the certified server runs with (e.g. "
        "VLLM_BATCH_INVARIANT=1); with a second endpoint without it, the certificate also "
        "says what broke there",
    )
    parser.add_argument("--html", metavar="FILE", help="also write the certificate as HTML")
    options.add_json_summary(parser)
    options.add_quiet(parser)


def lanes_of(args: argparse.Namespace) -> tuple[Lane, Lane | None]:
    """The certified lane and the one it is compared with, if any."""
    if len(args.endpoint) > MAX_ENDPOINTS:
        raise ArgumentError(
            f"--endpoint given {len(args.endpoint)} times; give the certified server and at "
            "most one to compare it with"
        )
    if args.pair is not None and args.endpoint:
        raise ArgumentError("--pair names the lanes itself; drop --endpoint or --pair")
    for endpoint in args.endpoint:
        check_endpoints(endpoint)
    # --pairs FILE is read (and refused where it is missing or bad) even without --pair,
    # as run and explain do: a file given and silently ignored would certify other lanes
    known = known_pairs(args)
    if args.pair is not None:
        pair = resolve_pair(args, known, args.pair)
        return pair.a, pair.b
    if args.endpoint:
        first = args.endpoint[0]
        second = args.endpoint[-1]
        base = Pair(
            "certify",
            Lane(backend="server", endpoint=first),
            Lane(backend="server", endpoint=second),
            "",
        )
        pair = resolve_pair(args, {"certify": base}, "certify")
        return pair.a, pair.b if len(args.endpoint) == MAX_ENDPOINTS else None
    pair = resolve_pair(args, {"certify": Pair("certify", Lane(), Lane(), "")}, "certify")
    return pair.a, None


def command_certify(args: argparse.Namespace) -> int:
    settings = settings_of(args)
    lane, other = lanes_of(args)
    if lane.backend == "server" and other is not None and other.backend != "server":
        raise ArgumentError("the lane to compare with must be a server too")
    note_unread_keys((("a", lane), ("b", other)))
    if args.html is not None:
        options.check_output_file(Path(args.html), "--html")
    control = bool(args.mode_flag) and other is not None
    if args.mode_flag:
        lane = _with_flag(lane, args.mode_flag)
    status = Status(sys.stderr, not args.quiet)
    where = (
        "the in-process engine"
        if lane.backend != "server"
        # a URL's user:password is masked, as certify's JSON and repeat do
        else visible(without_credentials(lane.endpoint))
    )
    properties = settings.properties
    checked = properties[0] if len(properties) == 1 else f"{len(properties)} properties"
    status.message(f"certify: {checked} on {where}")
    data = _run_in_worker(status, (lane, settings, other, control))
    if data is None:
        return Exit.INTERRUPTED
    if args.mode_flag:
        data["subject"]["mode_flag"] = args.mode_flag
    return report(args, data)


def settings_of(args: argparse.Namespace) -> Settings:
    """The battery's settings from the command line, checked."""
    required = required_properties(args)
    settings = Settings(
        runs=args.runs,
        batch=args.batch_size,
        fillers=args.fillers,
        max_tokens=args.max_tokens,
        seed=args.seed,
        # a required property runs even where --property names only others
        properties=check_properties([*args.property, *required] if args.property else []),
    )
    settings.check()
    return settings


def required_properties(args: argparse.Namespace) -> tuple[str, ...]:
    """The properties that must be tested for exit 0: each --property, each --require
    (all of them for --require all)."""
    required = [name for name in args.require if name != EVERY_PROPERTY]
    if EVERY_PROPERTY in args.require:
        required += args.property or PROPERTIES
    return check_properties([*args.property, *required]) if args.property or required else ()


def _run_in_worker(
    status: Status, arguments: tuple[Lane, Settings, Lane | None, bool]
) -> dict[str, Any] | None:
    """The certificate the battery gave in a worker process; None where Ctrl+C stopped
    it (said on stderr)."""
    # deferred: the engine and the battery load only for the command that runs
    from specdiff.certify.battery import certify
    from specdiff.engine.worker import call_in_worker

    cancel = threading.Event()
    try:
        with interrupt_sets(cancel):
            data: dict[str, Any] = call_in_worker(
                certify,
                arguments,
                {"progress": status.message},
                cancel,
                doing="running the certify battery",
            )
    except SpecdiffError:
        if not cancel.is_set():
            raise
        # Ctrl+C reached the battery as a cancel, which the worker reports as its error
        status.done()
        print("specdiff: interrupted", file=sys.stderr)
        return None
    return data


def _with_flag(lane: Lane, flag: str) -> Lane:
    """The lane with the switch among what it was launched with (shown beside results)."""
    from dataclasses import replace

    flags = lane.server_flags
    return replace(lane, server_flags=f"{flags} {flag}".strip() if flag not in flags else flags)


def report(args: argparse.Namespace, data: dict[str, Any]) -> int:
    """Print the certificate (and write its HTML); the exit code from its verdicts."""
    # deferred: the report modules load once the battery is done
    from specdiff.reports.certificate import certificate_html, certificate_text

    if args.json:
        json.dump(data, sys.stdout, indent=1, ensure_ascii=True)
        sys.stdout.write("\n")
    else:
        print(for_terminal(terminal_text(certificate_text(data))))
    if args.html is not None:
        options.write_output_file(Path(args.html), certificate_html(data), "--html")
        if not args.quiet:
            print(f"certificate: {visible(args.html)}", file=sys.stderr)
    return exit_code(args, data)


def exit_code(args: argparse.Namespace, data: dict[str, Any]) -> int:
    """1 where a property is broken; else NOT_TESTED_EXIT where one that was asked for
    (required_properties) was not tested, said on stderr; else 0."""
    if any(p["verdict"] == "broken" for p in data["properties"]):
        return Exit.DIFFERENT
    required = set(required_properties(args))
    untested = [
        p["name"] for p in data["properties"] if p["name"] in required and p["verdict"] != "holds"
    ]
    if not untested:
        return Exit.SAME
    print(
        f"specdiff certify: asked for but not tested: {', '.join(untested)} (exit "
        f"{NOT_TESTED_EXIT}; the certificate says why)",
        file=sys.stderr,
    )
    return NOT_TESTED_EXIT
