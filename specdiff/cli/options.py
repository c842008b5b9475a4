"""The option groups several commands take, each defined once so that its name, default
and help read the same in every command."""

from __future__ import annotations

import argparse

from specdiff.compare import DEFAULT_NEAR_TIE

DEFAULT_PAIR = "spec-vs-plain"
DEFAULT_MAX_TOKENS = 200


def add_lane_options(parser: argparse.ArgumentParser, one_pair: bool = True) -> None:
    """The pair and its overrides, as `common.resolve_pair` reads them."""
    if one_pair:
        parser.add_argument(
            "--pair", default=DEFAULT_PAIR, help=f"pair preset (default {DEFAULT_PAIR})"
        )
    parser.add_argument("--pairs", metavar="FILE", help="TOML file with more pairs ([pairs.NAME])")
    parser.add_argument("--model", help="GGUF path for both lanes (default: the bundled model)")
    for flag, whom in (("--lane-a", "lane A"), ("--lane-b", "lane B"), ("--both", "both lanes")):
        parser.add_argument(
            flag, action="append", default=[], metavar="KEY=VALUE", help=f"override {whom}"
        )


def add_prompt_options(
    parser: argparse.ArgumentParser, file_help: str = "read the prompt from FILE (- = stdin)"
) -> None:
    """--prompt or --prompt-file, as `common.read_prompt` reads them."""
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--prompt", help="the prompt text")
    source.add_argument("--prompt-file", metavar="FILE", help=file_help)


def add_request_options(parser: argparse.ArgumentParser) -> None:
    """Everything `common.read_request` reads: the pair, the prompt and the limits."""
    add_lane_options(parser)
    add_prompt_options(parser)
    parser.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS)
    add_near_tie(parser)


def add_near_tie(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--near-tie",
        type=float,
        default=DEFAULT_NEAR_TIE,
        help=f"margin below which a step counts as a near tie (default {DEFAULT_NEAR_TIE})",
    )


def add_quiet(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")


def add_json_summary(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print a JSON summary on stdout")


def add_stop(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


def add_model(parser: argparse.ArgumentParser) -> None:
    """One GGUF model, for the commands that run a single lane or server pair."""
    parser.add_argument("--model", help="GGUF path (default: the bundled model)")


def add_session_file(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("session", help="a session file (.jsonl)")


def add_replay_options(parser: argparse.ArgumentParser) -> None:
    """The theme and pace of a replay, as `replay.replay_file` reads them."""
    parser.add_argument("--theme", help="theme name")
    pace = parser.add_mutually_exclusive_group()
    pace.add_argument(
        "--speed",
        type=float,
        default=1.0,
        help="play at this multiple of the recorded pace (default 1)",
    )
    pace.add_argument("--instant", action="store_true", help="show the whole session at once")
