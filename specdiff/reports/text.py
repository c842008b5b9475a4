"""A pair run as text for a terminal, or as JSON for machines.

Every number printed carries what it needs to be read: the generation length with
the fork index, the lane configuration with the speed, the build with the result.
Every string may come from a shared session or a server: one-line fields go through
`visible`, lane text through `terminal_text`, so none holds a control character.
"""

from __future__ import annotations

import dataclasses
import re
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from specdiff.chat import Conversation
from specdiff.compare import (
    DEFAULT_SPLIT_THRESHOLD,
    Comparison,
    Fork,
    LaneAtFork,
    PickView,
    run_fork,
    run_fork_verdict,
    teacher_flips,
)
from specdiff.control import control_sentence
from specdiff.fork_words import (
    ForkExplanation,
    counted,
    fork_explanation,
    run_fork_explanation,
    run_fork_sentence,
    verdict_description,
)
from specdiff.glossary import terms_footer
from specdiff.lanes import Lane, differences, headline
from specdiff.reports.styles import PLAIN, Paint
from specdiff.results import LaneOutcome, PairResult
from specdiff.safe_text import terminal_text, visible
from specdiff.sessions.format import CRASHED
from specdiff.steps import TokenStep, text_of


def piece_text(piece: bytes) -> str:
    """A token as a quoted literal, so spaces, newlines and broken bytes stay visible."""
    return repr(piece.decode("utf-8", "replace"))


def pick_text(view: PickView, pieces: dict[int, bytes]) -> str:
    """A pick as one lane scored it: token, logit, rank and probability where known."""
    token = piece_text(pieces.get(view.token_id, b"?"))
    if view.logit is None:
        return f"{token} outside top-k"
    probability = f", p {view.probability:.3f}" if view.probability is not None else ""
    return f"{token} {view.logit:.3f} (#{view.rank}{probability})"


def _lane_line(outcome: LaneOutcome, other: LaneOutcome) -> str:
    # led by what differs: describe() alone reads "plain" for both lanes of `threads`
    parts = [
        f"lane {outcome.lane_id}  {visible(headline(outcome.lane, other.lane)):<40}",
        f"{len(outcome.steps):>4} tokens",
        f"{outcome.tokens_per_second:6.1f} tok/s",
    ]
    if outcome.acceptance is not None:
        parts.append(f"acceptance {outcome.acceptance:.0%} ({outcome.accepted}/{outcome.drafted})")
    if outcome.prefix_tokens:
        parts.append(f"cached prefix {outcome.prefix_tokens} tokens")
    if outcome.stop_reason == CRASHED:
        parts.append("CRASHED (below)")
    elif outcome.error:
        parts.append(f"ERROR: {visible(outcome.error)}")
    return "  ".join(parts)


PIPED_WIDTH = 100
"""The width lane text wraps to where stdout is no terminal (a file, a pipe, a test)."""

SHOWN_LINES = 12
"""Wrapped lines of one lane's text printed before the rest is counted, not shown: a
continuation after a fork often repeats itself for dozens of lines, and the fork and
why it happened must stay on the screen."""


@dataclass(frozen=True)
class Layout:
    """How a run is printed: the width to wrap to, colour or none, and how many lines
    of lane text to show."""

    width: int = PIPED_WIDTH
    paint: Paint = PLAIN
    shown_lines: int = SHOWN_LINES
    wrap_sentences: bool = False
    """Wrap the explanation too (a terminal); a pipe keeps each sentence on one line."""


def _wrapped(text: str, width: int) -> list[str]:
    """Lane text, escaped, wrapped at word breaks to `width` columns less the indent."""
    lines = []
    for line in terminal_text(text).splitlines() or [""]:
        # 4 columns of indent, and the last column left free: a line that fills it
        # makes some terminals wrap an empty line after it
        lines.extend(textwrap.wrap(line, max(width - 5, 20)) or [""])
    return lines


_GLUED = re.compile(r"(?<=[\s(])'( +)|(?<=\w) = (?=\w)")
"""Where a sentence must not break: inside a quoted token's leading spaces (`' and'`)
and around the `=` of `AVX2 = 1`."""
_NO_BREAK = "\u00a0"


def _wrap(line: str, width: int, indent: str) -> list[str]:
    """`line` wrapped to fit `width` columns, later lines under `indent`, never inside a
    quoted token. A no-break space stands in while wrapping: every line here has been
    through `visible`, which escapes any the text held itself."""
    glued = _GLUED.sub(lambda match: match.group().replace(" ", _NO_BREAK), line)
    parts = textwrap.wrap(glued, width - 1, subsequent_indent=indent, break_on_hyphens=False)
    return [part.replace(_NO_BREAK, " ") for part in parts] or [line]


def _capped(
    text: str, layout: Layout, keep: str = "head", first: str = "", more: str = ""
) -> list[str]:
    """Lane text indented, at most `layout.shown_lines` lines: the first ones (`keep`
    "head") or the last ("tail", the text leading into the fork), with a line saying
    how many were left out. `first`, a token at the start, is highlighted."""
    lines = _wrapped(text, layout.width)
    cut = len(lines) - layout.shown_lines
    if keep == "head" and first:
        shown = terminal_text(first)
        if lines and shown.strip() and lines[0].startswith(shown):
            lines[0] = layout.paint("fork", shown) + lines[0][len(shown) :]
    out = ["    " + line for line in lines]
    if cut <= 0:
        return out
    note = layout.paint("dim", f"    … {counted(cut, 'more line')}{more}")
    if keep == "head":
        return [*out[: layout.shown_lines], note]
    note = layout.paint("dim", f"    … {counted(cut, 'earlier line')}")
    return [note, *out[-layout.shown_lines :]]


def _prompt_sizes(result: PairResult) -> str:
    """The prompt's length: one count where both lanes decode the same ids, else each
    lane's (a chat lane formats the prompt with its template, a raw lane does not)."""
    formatted = {
        lane_id: outcome.executed.get("chat_prompt", {}).get("token_ids")
        for lane_id, outcome in (("a", result.a), ("b", result.b))
    }
    if not any(formatted.values()):
        return f"{len(result.prompt_tokens)} tokens"
    sizes = []
    for lane_id, ids in formatted.items():
        if ids:
            sizes.append(f"lane {lane_id} {len(ids)} tokens formatted")
        elif lane_id == "a":  # result.prompt_tokens are lane a's ids
            sizes.append(f"lane a {len(result.prompt_tokens)} tokens raw")
        else:
            sizes.append("lane b raw text")
    if formatted["a"] and formatted["a"] == formatted["b"]:
        return f"{len(formatted['a'])} tokens formatted, the same in both lanes"
    return ", ".join(sizes) + " (two different prompts)"


TERMS = ("logit", "margin", "near tie", "fork class", "acceptance", "forecast")
"""The glossary's words the run text may use, defined in a footer where it does."""


def format_result(result: PairResult, layout: Layout = Layout(), extra: Sequence[str] = ()) -> str:
    """The run for a person: the lanes, the verdict, why the lanes forked and the text
    on either side, the build, any `extra` lines (a forecast); ended by the terms it
    used."""
    body = [*run_lines(result, layout), *extra]
    if layout.wrap_sentences:
        body = [part for line in body for part in _fit(line, layout.width)]
    plain = "\n".join(body)
    return "\n".join([*body, "", *terms_footer(plain, TERMS, layout.width)]).rstrip("\n")


def _fit(line: str, width: int) -> list[str]:
    """A line too wide for the terminal, wrapped at word breaks under its own indent
    (the terminal would cut it mid-word); a styled line is left as it is, its width
    being more than its length."""
    if len(line) < width or "\x1b" in line:
        return [line]
    return _wrap(line, width, " " * (len(line) - len(line.lstrip(" "))) + "    ")


def run_lines(result: PairResult, layout: Layout = Layout()) -> list[str]:
    comparison = result.comparison
    a, b = result.a, result.b
    out = [
        f"pair {visible(result.pair.name)}: {visible(result.pair.description)}".rstrip(": "),
        f"prompt: {_prompt_sizes(result)}, max {result.max_tokens} new",
        _lane_line(a, b),
        _lane_line(b, a),
    ]
    changed = differences(a.lane, b.lane)
    if changed:
        out.append(
            "lanes differ in: "
            + ", ".join(f"{k} ({a.lane.shown(k)!r} vs {b.lane.shown(k)!r})" for k in changed)
        )
    if result.speedup is not None:
        out.append(f"speed a/b: {result.speedup:.2f}x")
    out.append("")
    fork = comparison.fork
    if result.cancelled:
        out.append("cancelled before the end; what follows covers the tokens produced")
    if result.crashed:
        out.append(layout.paint("bad", f"CRASHED: {visible(result.error_lines()[0])}"))
        out.append("what follows covers the tokens produced before the crash")
    if result.teacher_forced:
        out.extend(_teacher_forced_lines(result, layout))
    elif fork is None:
        out.extend(_no_fork_lines(result, layout))
    else:
        out.extend(_fork_lines(result, fork, layout))
    control = control_sentence(result.summary())
    if control is not None:
        out.append(control)
    out.append("")
    out.extend(_executed_lines(result))
    return out


def _no_fork_lines(result: PairResult, layout: Layout) -> list[str]:
    comparison = result.comparison
    a, b = result.a, result.b
    if result.crashed:
        verdict = (
            f"NO FORK in the tokens produced before the crash (lane a {comparison.length_a}, "
            f"lane b {comparison.length_b})."
        )
    elif comparison.identical:
        verdict = (
            layout.paint("good", "IDENTICAL")
            + f": both lanes produced the same {comparison.length_a} tokens."
        )
    else:
        verdict = (
            f"SAME TOKENS, DIFFERENT LENGTHS: a stopped after {comparison.length_a}, "
            f"b after {comparison.length_b} ({visible(str(a.stop_reason or a.error))} / "
            f"{visible(str(b.stop_reason or b.error))})."
        )
    lines = [verdict, *_capped(text_of(a.steps), layout), _near_ties(comparison)]
    if comparison.identical and not result.crashed and not result.teacher_forced:
        lines.append(_where_forks_are(result))
    return lines


def _where_forks_are(result: PairResult) -> str:
    """What to try after an identical run: a fork needs a near tie that the lanes'
    arithmetic flips, and where that happens depends on the prompt and the CPU."""
    return (
        "no fork: no near tie flipped on this prompt here. How often this pair forks "
        f"over a prompt set: specdiff suite open --pair {visible(result.pair.name)}; further on "
        f"in this text: --max-tokens {2 * max(result.max_tokens, 1)}"
    )


def _near_ties(comparison: Comparison) -> str:
    return (
        f"near ties (margin < {comparison.near_tie_threshold}): "
        f"{len(comparison.near_ties_a)} in lane a, {len(comparison.near_ties_b)} in lane b"
    )


def _executed_lines(result: PairResult) -> list[str]:
    """The build, and per lane the model and settings as they were applied."""
    build = result.build
    out = [
        f"executed: llama-cpp-python {build.get('llama_cpp_python')} · llama.cpp "
        f"{build.get('llama_cpp_build')} · {build.get('cpu')}",
        f"  {build.get('system_info')}",
    ]
    for outcome in (result.a, result.b):
        ex = outcome.executed
        if ex.get("backend") == "server":
            server = ex.get("server", {})
            name = ", ".join(str(m) for m in server.get("models", [])) or "model not reported"
            build_info = f" · build {server['build_info']}" if "build_info" in server else ""
            out.append(
                f"  lane {outcome.lane_id}: server {ex.get('endpoint')} ({ex.get('api')} API)"
                f" · {name}{build_info} · {determinism_note(outcome.lane)}"
            )
            if unrescored_note(ex):
                out.append(f"  lane {outcome.lane_id}: {unrescored_note(ex)}")
            continue
        out.append(
            f"  lane {outcome.lane_id}: {ex.get('quantization')} {ex.get('model_path')} "
            f"sha256 {str(ex.get('model_sha256'))[:12]} · threads {ex.get('threads')}/"
            f"{ex.get('threads_batch')} · batch {ex.get('n_batch')} · ubatch {ex.get('n_ubatch')}"
            f" · flash_attn {ex.get('flash_attn')} · kv {ex.get('type_k')}/{ex.get('type_v')}"
            f" · {ex.get('repack_choice') or ('repack on' if ex.get('repack') else 'repack off')}"
            f" · n_ctx {ex.get('n_ctx')}{_offload_note(ex)}"
        )
    # the build, model ids and paths are what a server or a session says they are
    return [visible(line) for line in out]


def _offload_note(executed: dict[str, Any]) -> str:
    """Where a lane that asked for GPU layers put them, and on which GPU; "" for a lane
    that ran on the CPU alone."""
    if not executed.get("gpu_layers"):
        return ""
    gpus = [
        str(device.get("description") or device.get("name"))
        for device in executed.get("devices") or []
        if isinstance(device, dict) and device.get("type") in ("gpu", "igpu")
    ]
    on = f" ({', '.join(gpus)})" if gpus else ""
    return (
        f" · {executed.get('layers_offloaded')}/{executed.get('layers_total')} layers on "
        f"the GPU{on}"
    )


def _fork_lines(result: PairResult, fork: Fork, layout: Layout) -> list[str]:
    comparison = result.comparison
    a, b = result.a, result.b
    length = max(comparison.length_a, comparison.length_b)
    paint = layout.paint
    lines = [
        paint("bad", "DIVERGED") + f" at token {fork.index} of {length} generated "
        f"(a: {paint('fork', piece_text(fork.piece_a))}, "
        f"b: {paint('fork', piece_text(fork.piece_b))}).",
        "shared text:",
        *_capped(text_of(a.steps[: fork.index]), layout, keep="tail"),
    ]
    lines.extend(_why_lines(result, fork, layout))
    lines.append(
        f"near ties before the fork (margin < {comparison.near_tie_threshold}): "
        f"lane a {len(comparison.near_ties_a)}, lane b {len(comparison.near_ties_b)}"
        + (f" (a at {_short(comparison.near_ties_a)})" if comparison.near_ties_a else "")
    )
    after = comparison.after_fork
    if after is not None:
        lines.append(f"after the fork: {after.similarity:.0%} similar (Indel)")
    for outcome in (a, b):
        rest = outcome.steps[fork.index :]
        lines.append(f"lane {outcome.lane_id} continues from the fork:")
        first = rest[0].piece.decode("utf-8", "replace") if rest else ""
        more = " (the whole text: --json, or --save and specdiff export)"
        lines.extend(_capped(text_of(rest), layout, first=first, more=more))
    return lines


def explanation_lines(explanation: ForkExplanation, layout: Layout = Layout()) -> list[str]:
    """`why:` with the plain words, then the same in logits, dimmed, beneath it; each
    wrapped to the terminal with a hanging indent, or one line each for a pipe."""
    head = f"why: {explanation.label}: {explanation.plain}"
    lines = [head]
    if explanation.detail is not None:
        lines.append(f"  in logits: {explanation.detail}")
    if not layout.wrap_sentences:
        return [lines[0], *(layout.paint("dim", line) for line in lines[1:])]
    wrapped = _wrap(head, layout.width, "     ")
    for line in lines[1:]:
        wrapped.extend(layout.paint("dim", part) for part in _wrap(line, layout.width, "     "))
    return wrapped


def _why_lines(result: PairResult, fork: Fork, layout: Layout = Layout()) -> list[str]:
    """Both lanes at the fork, why they forked and its class."""
    a, b = result.a, result.b
    pieces = {fork.token_a: fork.piece_a, fork.token_b: fork.piece_b}
    lines = [
        _fork_view(lane_id, view, pieces) + rescored_note(outcome.steps, fork.index)
        for lane_id, view, outcome in (("a", fork.a, a), ("b", fork.b, b))
    ]
    verdict = run_fork_verdict(
        a.steps, b.steps, result.teacher_forced, result.comparison.near_tie_threshold
    )
    if verdict is not None:
        explanation = fork_explanation(fork, verdict, teacher_forced=result.teacher_forced)
        lines.extend(explanation_lines(explanation, layout))
        lines.append(f"fork class: {verdict_description(verdict)}")
    return lines


def _teacher_forced_lines(result: PairResult, layout: Layout) -> list[str]:
    """A teacher-forced run: lane b was fed lane a's tokens, so the two agree token for
    token by construction; what tells is the first flip, where b's own argmax differs."""
    a, b = result.a, result.b
    forced = min(len(a.steps), len(b.steps))
    flips = teacher_flips(a.steps, b.steps)
    fork = run_fork(a.steps, b.steps, teacher_forced=True)
    if fork is None:
        fed = counted(forced, "token")
        head = (
            layout.paint("good", "NO FLIP")
            + f": fed lane a's {fed}, lane b's own argmax agreed at each."
        )
        return [head, *_capped(text_of(a.steps), layout), _near_ties(result.comparison)]
    return [
        layout.paint("bad", "FLIPPED")
        + f" at token {fork.index} of {forced} teacher-forced: fed lane a's tokens, lane "
        f"b's own argmax was {piece_text(fork.piece_b)} where a picked "
        f"{piece_text(fork.piece_a)}; {counted(len(flips), 'flip')} in all "
        f"({len(flips) / forced:.1%}).",
        "shared text:",
        *_capped(text_of(a.steps[: fork.index]), layout, keep="tail"),
        *_why_lines(result, fork, layout),
        _near_ties(result.comparison),
        "lane a continues (lane b fed it):",
        *_capped(text_of(a.steps[fork.index :]), layout),
    ]


def rescored_note(steps: Sequence[TokenStep], index: int) -> str:
    """A note such as " · rescored by ..." where the step at `index` holds numbers that
    did not come from the step that picked it (an accepted draft a server gave no
    probabilities)."""
    source = steps[index].source if index < len(steps) else ""
    return f" · {visible(source, 200)}" if source else ""


def unrescored_note(executed: dict[str, Any]) -> str:
    """Where a server lane's accepted drafts were left without margins (a rescoring
    request failed, a draft fell outside the top-k): how many, and why; "" otherwise."""
    rescoring = executed.get("rescoring") or {}
    skipped = rescoring.get("skipped") or 0
    if not skipped:
        return ""
    total = skipped + (rescoring.get("rescored") or 0)
    reasons = "; ".join(rescoring.get("reasons") or []) or "no reason recorded"
    return visible(
        f"{skipped} of {total} accepted drafts not rescored, their margins unknown: {reasons}",
        400,
    )


def determinism_note(lane: Lane) -> str:
    """A server lane's determinism setup as its lane states it: what the server was
    launched with, since greedy requests (temperature 0) alone do not make a server
    give the same tokens twice (batching and caching change its kernels)."""
    if lane.server_flags:
        return f"server launched with: {visible(lane.server_flags, 400)}"
    return (
        "server's determinism setup not stated (server_flags); temperature 0 alone does "
        "not make a server deterministic"
    )


def _fork_view(lane_id: str, view: LaneAtFork, pieces: dict[int, bytes]) -> str:
    return (
        f"  lane {lane_id}: margin {view.margin:.3f} · own pick {pick_text(view.own, pieces)} · "
        f"other pick {pick_text(view.other, pieces)}"
    )


def _short(indices: tuple[int, ...], limit: int = 12) -> str:
    shown = ", ".join(str(i) for i in indices[:limit])
    return shown + (", ..." if len(indices) > limit else "")


def _lane_json(outcome: LaneOutcome) -> dict[str, Any]:
    return {
        "lane": outcome.lane.as_dict(),
        "description": outcome.lane.describe(),
        "executed": outcome.executed,
        "tokens": len(outcome.steps),
        "token_ids": outcome.token_ids,
        "text": text_of(outcome.steps),
        "margins": [round(step.margin, 5) for step in outcome.steps],
        "drafted_steps": [step.index for step in outcome.steps if step.drafted],
        "rescored_steps": [step.index for step in outcome.steps if step.source],
        "tokens_per_second": round(outcome.tokens_per_second, 3),
        "first_token_seconds": round(outcome.first_token_seconds, 4),
        "seconds": round(outcome.seconds, 4),
        "drafted": outcome.drafted,
        "accepted": outcome.accepted,
        "acceptance": outcome.acceptance,
        "verify_calls": outcome.verify_calls,
        "prefix_tokens": outcome.prefix_tokens,
        "stop_reason": outcome.stop_reason,
        "error": outcome.error,
    }


def _explanation_json(result: PairResult) -> dict[str, Any] | None:
    """The verdict's parts: its label, the plain words, and the numbers in logits."""
    explanation = run_fork_explanation(
        result.a.steps,
        result.b.steps,
        result.teacher_forced,
        result.comparison.near_tie_threshold,
    )
    return None if explanation is None else dataclasses.asdict(explanation)


def fork_json(fork: Fork | None) -> dict[str, Any] | None:
    """The fork record as JSON-ready data, pieces decoded to text."""
    if fork is None:
        return None
    data = dataclasses.asdict(fork)
    data["piece_a"] = fork.piece_a.decode("utf-8", "replace")
    data["piece_b"] = fork.piece_b.decode("utf-8", "replace")
    return data


def result_json(result: PairResult) -> dict[str, Any]:
    """The run's RunSummary (what its session footer holds), and the details beside it."""
    comparison = result.comparison
    after = comparison.after_fork
    summary = result.summary().to_json()
    del summary["type"]
    return summary | {
        "pair": result.pair.name,
        "description": result.pair.description,
        "started": result.started,
        "prompt": result.prompt,
        "messages": result.prompt.to_json() if isinstance(result.prompt, Conversation) else None,
        "prompt_token_ids": result.prompt_tokens,
        "max_tokens": result.max_tokens,
        "stop": result.stop,
        "teacher_forced": result.teacher_forced,
        # teacher-forced, the ids agree by construction: the fork is the first flip
        "fork": fork_json(
            run_fork(result.a.steps, result.b.steps, True)
            if result.teacher_forced
            else comparison.fork
        ),
        "verdict": run_fork_sentence(
            result.a.steps, result.b.steps, result.teacher_forced, comparison.near_tie_threshold
        ),
        "explanation": _explanation_json(result),
        "near_tie_threshold": comparison.near_tie_threshold,
        "fork_class": summary.get("fork_class"),
        "split_threshold": DEFAULT_SPLIT_THRESHOLD,
        "near_ties_before_fork": {
            "a": list(comparison.near_ties_a),
            "b": list(comparison.near_ties_b),
        },
        "after_fork": None
        if after is None
        else {"similarity": after.similarity, "opcodes": [list(op) for op in after.opcodes]},
        "speedup_a_over_b": result.speedup,
        "lanes_differ_in": differences(result.a.lane, result.b.lane),
        "lanes": {"a": _lane_json(result.a), "b": _lane_json(result.b)},
        "build": result.build,
    }
