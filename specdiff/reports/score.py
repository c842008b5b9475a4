"""`specdiff score`'s report: the KLD summary, same-top-1 share and flips as text, and
every scored position as JSON. Token text is the scored document's, so anything of it
that reaches the terminal is escaped (`visible`) and JSON is ASCII."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from specdiff.fork_words import counted
from specdiff.lanes import Pair, headline
from specdiff.reports.text import piece_text
from specdiff.safe_text import visible
from specdiff.scoring import PositionScore, ScoreResult

CONVENTION_NAMES = {
    "all": "every position",
    "perplexity": "llama-perplexity's convention: the second half of each whole chunk",
}


def format_score(pair: Pair, result: ScoreResult, flips_shown: int = 20) -> str:
    """The summary table, then the first `flips_shown` flips."""
    lines = [
        visible(
            f"specdiff score · pair {pair.name} · {result.tokens} tokens in chunks of "
            f"{result.chunk} ({CONVENTION_NAMES[result.convention]}) · {result.seconds:.1f} s"
        ),
        visible(f"  lane a (reference): {headline(pair.a, pair.b)}"),
        visible(f"  lane b:             {headline(pair.b, pair.a)}"),
    ]
    if result.cancelled:
        lines.append("  stopped on request: the figures cover the positions scored before")
    if not result.scores:
        lines.append("  no position was scored")
        return "\n".join(lines)
    summary = result.summary()
    lines += [
        f"  positions scored  {summary.positions}",
        "  KL(a||b)          "
        f"mean {summary.mean_kld:.6f} · median {summary.median_kld:.6f} · "
        f"p90 {summary.p90_kld:.6f} · p99 {summary.p99_kld:.6f} · max {summary.max_kld:.6f}",
        f"  same top-1        {summary.same_top_percent:.2f} % ({counted(summary.flips, 'flip')})",
        f"  perplexity        a {summary.perplexity_a:.4f} · b {summary.perplexity_b:.4f}",
    ]
    flips = result.flips()
    if flips:
        lines.append(
            "  flips (position: lane a's pick (its margin) -> lane b's pick (its margin), "
            "|Δlogit| of the text's token, KLD):"
        )
        lines += [f"    {_flip_line(flip, result.pieces)}" for flip in flips[:flips_shown]]
        if len(flips) > flips_shown:
            lines.append(f"    ... {len(flips) - flips_shown} more (--json lists every one)")
    return "\n".join(lines)


def _flip_line(flip: PositionScore, pieces: dict[int, bytes]) -> str:
    def shown(token: int) -> str:
        return visible(piece_text(pieces.get(token, b"?")))

    return (
        f"{flip.position}: {shown(flip.top_a)} ({flip.margin_a:.3f}) -> "
        f"{shown(flip.top_b)} ({flip.margin_b:.3f}), text's {shown(flip.token)} "
        f"|Δlogit| {flip.logit_delta:.3f}, KLD {flip.kld:.5f}"
    )


def score_json(pair: Pair, result: ScoreResult) -> dict[str, Any]:
    """Everything measured: the summary, every scored position, and the flips with the
    text of their tokens. Dump it with ensure_ascii=True."""
    summary = result.summary().as_dict() if result.scores else None
    positions = [{**asdict(score), "same_top": score.same_top} for score in result.scores]
    flips = [
        {
            **asdict(flip),
            "text": _decoded(result.pieces, flip.token),
            "pick_a": _decoded(result.pieces, flip.top_a),
            "pick_b": _decoded(result.pieces, flip.top_b),
        }
        for flip in result.flips()
    ]
    return {
        "pair": pair.name,
        # what each lane is, led by what differs: describe() alone reads "plain" for both
        # lanes of most scoring pairs, which differ in quantization or batch sizes
        "lanes": {"a": headline(pair.a, pair.b), "b": headline(pair.b, pair.a)},
        "tokens": result.tokens,
        "chunk": result.chunk,
        "convention": result.convention,
        "seconds": result.seconds,
        "cancelled": result.cancelled,
        "executed": result.executed,
        "summary": summary,
        "flips": flips,
        "positions": positions,
    }


def _decoded(pieces: dict[int, bytes], token: int) -> str:
    return pieces.get(token, b"").decode("utf-8", "replace")
