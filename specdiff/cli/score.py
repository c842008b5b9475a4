"""`specdiff score`: one given text forced through both lanes of a pair, their full
distributions compared at every position (KL divergence, same top-1, flips), in the
units of llama-perplexity's ``--kl-divergence`` mode."""

from __future__ import annotations

import argparse
import json
import re
import sys
import threading
from pathlib import Path

from specdiff.cli import options
from specdiff.cli.common import Exit, Status, Subcommands, add_command, interrupt_sets, known_pairs
from specdiff.cli.common import resolve_pair as resolve_named_pair
from specdiff.errors import PromptError
from specdiff.files import read_limited
from specdiff.lanes import differences

DEFAULT_SCORE_PAIR = "quant"
DEFAULT_CHUNK = 512
"""llama-perplexity's default context."""
MAX_TEXT_BYTES = 16 << 20
SCORING_KEYS = frozenset(
    {"model", "quant", "n_batch", "n_ubatch", "threads", "threads_batch", "flash_attn"}
    | {"type_k", "type_v", "repack", "gpu_layers", "main_gpu", "split_mode"}
)
"""The lane keys a teacher-forced evaluation uses; speculation, prefix caching, chat
templates and sampling settings play no part in it."""
_LOOKS_LIKE_FILE = re.compile(r"^\S*(/|\.[A-Za-z][A-Za-z0-9]{0,4})$")
"""One word ending in a slash or a file extension: meant as a file, not as text. An
extension starts with a letter, so a number (3.14, v1.2) is text."""


def add_parser(commands: Subcommands) -> None:
    score = add_command(
        commands,
        "score",
        "force a text through both lanes and compare their distributions (KLD, same top-1)",
        command_score,
    )
    score.add_argument(
        "text",
        metavar="TEXT_OR_FILE",
        type=options.utf8_text,
        help="the text to score, or a UTF-8 file (- = stdin)",
    )
    score.add_argument(
        "--pair",
        default=DEFAULT_SCORE_PAIR,
        help=f"pair preset; lane a is the reference, as llama-perplexity's base "
        f"(default {DEFAULT_SCORE_PAIR})",
    )
    options.add_lane_options(score, one_pair=False)
    score.add_argument(
        "--n-ctx",
        type=options.context_size,
        default=DEFAULT_CHUNK,
        help=f"tokens per evaluated chunk, both lanes (default {DEFAULT_CHUNK})",
    )
    score.add_argument(
        "--like-perplexity",
        action="store_true",
        help="score as llama-perplexity --kl-divergence does: whole chunks only, the second "
        "half of each (default: every position)",
    )
    score.add_argument(
        "--flips",
        type=options.whole_number(0, 100_000),
        default=20,
        help="flips listed (default 20)",
    )
    options.add_json_summary(score)
    score.add_argument("--out", metavar="FILE", help="write the report (or --json) to FILE too")
    options.add_quiet(score)


def command_score(args: argparse.Namespace) -> int:
    """Exit 0 when both lanes' top-1 agree at every position, 1 when any flips, 130 when
    stopped."""
    # deferred: the engine and report modules load only once the input is known good
    from specdiff.scoring import check_scorable

    pair = resolve_named_pair(args, known_pairs(args))
    check_scorable(pair)
    text = read_text(args.text)
    out = Path(args.out).expanduser() if args.out else None
    if out is not None:
        options.check_output_file(out, "--out")
        if args.text != "-" and _same_file(out, Path(args.text).expanduser()):
            raise PromptError(
                f"--out {out} is the text being scored, which the report would replace; "
                "name another file"
            )
    from specdiff.engine.llama.score import score_text
    from specdiff.engine.worker import call_in_worker
    from specdiff.reports.score import format_score, score_json

    status = Status(sys.stderr, not args.quiet)
    if not set(differences(pair.a, pair.b)) & SCORING_KEYS:
        status.message(
            f"note: the lanes of {pair.name} differ only in what a teacher-forced "
            "evaluation does not use, so their distributions should agree"
        )
    cancel = threading.Event()
    convention = "perplexity" if args.like_perplexity else "all"
    with interrupt_sets(cancel):
        result = call_in_worker(
            score_text,
            (pair, text, args.n_ctx, convention),
            {"progress": status.message},
            cancel,
            doing="scoring the text",
            repack_off="--both repack=false",
        )
    status.done()
    if args.json:
        report = json.dumps(score_json(pair, result), indent=1, ensure_ascii=True) + "\n"
    else:
        report = format_score(pair, result, args.flips) + "\n"
    sys.stdout.write(report)
    if out is not None:
        options.write_output_file(out, report, "--out")
    if result.cancelled:
        return Exit.INTERRUPTED
    return Exit.DIFFERENT if result.flips() else Exit.SAME


def read_text(value: str) -> str:
    """The text itself, or that of the file (- = stdin) it names; never blank."""
    if not value.strip():
        # checked first: Path("") is the current folder, which exists
        raise PromptError("the text to score is empty; give some text or a file holding it")
    if value == "-":
        raw = sys.stdin.buffer.read(MAX_TEXT_BYTES + 1)
        if len(raw) > MAX_TEXT_BYTES:
            raise PromptError(f"the text on stdin is larger than {MAX_TEXT_BYTES:,} bytes")
        text = _decoded(raw, "the text on stdin")
    elif Path(value).expanduser().exists():
        text = _read_file(Path(value).expanduser())
    elif _LOOKS_LIKE_FILE.match(value):
        raise PromptError(
            f"text file not found: {value}; give an existing file, or the text itself"
        )
    else:
        text = value
    if not text.strip():
        raise PromptError("the text to score is empty; give some text or a file holding it")
    return text


def _read_file(path: Path) -> str:
    try:
        raw = read_limited(path, MAX_TEXT_BYTES)
    except OSError as error:
        raise PromptError(f"cannot read text file {path}: {error.strerror}") from None
    except ValueError as error:
        raise PromptError(f"text file {path} {error}; give a text file") from None
    return _decoded(raw, f"text file {path}")


def _decoded(raw: bytes, where: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise PromptError(f"{where} is not UTF-8 text") from None


def _same_file(first: Path, second: Path) -> bool:
    """Whether both paths name one existing file (through links or another spelling)."""
    try:
        return first.exists() and second.exists() and first.samefile(second)
    except OSError:
        return False
