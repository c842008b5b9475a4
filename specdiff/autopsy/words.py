"""The autopsy in words: llama.cpp's tensor names and operations as a reader knows
them, and what a sweep of draft lengths says about a fork.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from specdiff.autopsy.records import DRAFT_KEY, SettingTrial
from specdiff.lanes import Lane
from specdiff.safe_text import visible


def draft_verdict(trials: Sequence[SettingTrial]) -> str | None:
    """What a sweep of the speculative server's draft length says, in one sentence;
    None when no trial ran one. A fork at the same token whatever the server drafts
    cannot come from which drafts it accepted and rolled back (that changes with the
    draft length): the verify batch's arithmetic rounded differently."""
    if not any(trial.key == DRAFT_KEY for trial in trials):
        return None
    ran = [t for t in trials if t.key == DRAFT_KEY and t.error is None]
    if len(ran) < 2:
        return (
            "Fewer than two draft lengths ran, so the sweep cannot tell a numerics fork from "
            "the accept/rollback logic; give more draft lengths or a larger --max-runs."
        )
    lengths = ", ".join(t.value for t in ran)
    forked = [t for t in ran if t.fork is not None]
    positions = sorted({t.fork for t in forked if t.fork is not None})
    if not forked:
        if all(t.identical for t in ran):
            return f"The lanes agree at every draft length tried ({lengths})."
        return (
            f"No draft length tried ({lengths}) makes the lanes pick differently; they "
            "differ only in length."
        )
    if len(forked) == len(ran) and len(positions) == 1:
        return (
            f"The fork stays at token {positions[0]} at every draft length tried ({lengths}): "
            "a numerics fork (the verify batch's arithmetic), not the accept/rollback logic."
        )
    where = "; ".join(f"{t.outcome} with draft length {t.value}" for t in ran)
    if len(forked) < len(ran):
        return (
            f"The fork disappears at some draft lengths ({where}): whether the lanes part "
            "depends on what the speculative server drafts and accepts, not on one fixed "
            "rounding difference."
        )
    return (
        f"The fork moves with the draft length ({where}): where it lands depends on what "
        "the speculative server drafts and accepts (the accept/rollback path, or the width "
        "of the batches it verifies), not on one fixed rounding difference."
    )


_TENSOR_WORDS = {
    "inp_embd": "the token embedding",
    "inp_scaled": "the scaled token embedding",
    "attn_norm": "attention input norm",
    "Qcur": "attention query",
    "Qcur_normed": "normalised attention query",
    "Kcur": "attention key",
    "Kcur_normed": "normalised attention key",
    "Vcur": "attention value",
    "kq": "attention scores",
    "kq_soft_max": "attention weights (the softmax of its scores)",
    "kqv": "attention's weighted sum of values",
    "kqv_out": "attention output",
    "attn_out": "attention output projection",
    "attn_post_norm": "attention output norm",
    "sa_out": "sum after attention",
    "ffn_inp": "feed-forward input",
    "ffn_norm": "feed-forward input norm",
    "ffn_up": "feed-forward up projection",
    "ffn_gate": "feed-forward gate projection",
    "ffn_geglu": "feed-forward gated activation",
    "ffn_swiglu": "feed-forward gated activation",
    "ffn_out": "feed-forward output",
    "ffn_post_norm": "feed-forward output norm",
    "l_out": "output",
    "result_norm": "the final norm",
    "result_output": "the output logits",
}
_OP_WORDS = {
    "MUL_MAT": "the matrix multiply",
    "ADD": "the addition",
    "MUL": "the multiplication",
    "RMS_NORM": "the RMS normalisation",
    "NORM": "the normalisation",
    "SCALE": "the scaling",
    "ROPE": "the rotary position encoding",
    "SOFT_MAX": "the softmax",
    "GET_ROWS": "the row lookup",
    "SET_ROWS": "the write into the KV cache",
    "FLASH_ATTN_EXT": "flash attention",
    "GLU": "the gated activation",
    "GEGLU": "the gated activation",
    "CPY": "the copy",
    "CONT": "the copy",
}


KV_HISTORY = "KV history"
"""Beside a first differing tensor whose difference earlier decode calls wrote."""
KV_HISTORY_LEGEND = (
    f"{KV_HISTORY}: the difference lies in KV cache entries earlier decode calls wrote "
    "(in both lanes), history this step reads, not anything it computed."
)

DATA_MOVES = frozenset({"CONT", "CPY", "RESHAPE", "VIEW", "PERMUTE", "TRANSPOSE", "DUP"})
"""Operations that move values without arithmetic."""


_CACHE = re.compile(r"^cache_([kv])_l\d+$")
_UNNAMED = re.compile(r"^node_\d+$")


def made_before(name: str) -> str:
    """What made a difference that a data move (a copy, a reshape) only carried."""
    if name.startswith("kqv_out"):
        # a record saved before attention's inner tensors were tapped names none of them
        return "the attention before it (its scores, softmax and weighted sum)"
    return "the operation before it"


def tensor_words(name: str) -> str:
    """ "feed-forward output" for "ffn_out-0", "K cache" for "cache_k_l10 (view)"; the
    name itself for one not known."""
    bare = name.split(" (")[0]  # ggml names a view "Kcur-0 (view)"
    cache = _CACHE.match(bare)
    if cache is not None:
        return f"{cache.group(1).upper()} cache"
    if _UNNAMED.match(bare):
        return "an unnamed intermediate tensor"
    base = bare.rsplit("-", 1)[0] if bare.rsplit("-", 1)[-1].isdigit() else bare
    return _TENSOR_WORDS.get(base, visible(base, 60))


def op_words(op: str) -> str:
    """ "the matrix multiply" for MUL_MAT; "the X operation" for one not known."""
    return _OP_WORDS.get(op, f"the {visible(op, 30)} operation")


def percent(probability: float) -> str:
    """A pick's probability in a cause sentence: 39%, or 3.2e-04 below one percent."""
    return f"{probability:.0%}" if probability >= 0.01 else f"{probability:.1e}"


def relative_speed(trial: SettingTrial, baseline: SettingTrial | None) -> str:
    """How fast lane a ran with a setting, against the run as given; "" unknown."""
    if baseline is None or baseline.speed_a <= 0 or trial.speed_a <= 0:
        return ""
    return f" (lane a at {trial.speed_a / baseline.speed_a:.2f}x its speed)"


_OP_MEANINGS = {
    "CONT": "a copy of the tensor into one block of memory: it moves numbers, no arithmetic",
    "CPY": "a copy: it moves numbers, no arithmetic",
    "MUL_MAT": "a matrix multiply",
    "ADD": "an addition",
    "MUL": "a multiplication",
    "RMS_NORM": "a normalisation (dividing by the root mean square)",
    "NORM": "a normalisation",
    "SCALE": "a multiplication by one number",
    "ROPE": "the rotary position encoding",
    "SOFT_MAX": "the softmax (scores turned into weights that sum to 1)",
    "GET_ROWS": "a lookup of rows of a table (the token embedding)",
    "SET_ROWS": (
        "a write into the KV cache (the keys and values attention keeps for every "
        "position so far): it stores this call's rows beside those earlier calls wrote"
    ),
    "FLASH_ATTN_EXT": "flash attention (attention's scores, softmax and sum in one kernel)",
    "GLU": "the gated activation",
    "GEGLU": "the gated activation",
}


def op_meaning(op: str) -> str:
    """What a ggml operation name (MUL_MAT, CONT) stands for, for a reader who has never
    seen one; "" for one not known."""
    return _OP_MEANINGS.get(op, "")


def _batch_width(lane: Lane) -> int:
    """The most rows one decode call computes together: llama.cpp splits a batch of
    n_batch rows into micro-batches of n_ubatch."""
    return min(lane.n_batch, lane.n_ubatch)


def kv_history(a: Lane, b: Lane) -> str:
    """How the two lanes computed the rows before a step differently, in words (the keys
    and values those rows leave in the KV memory are what a later step's attention
    reads); "" where their settings name no such difference."""
    parts = []
    for this, other, lane_id, other_id in ((a, b, "a", "b"), (b, a, "b", "a")):
        if this.speculative and not other.speculative:
            parts.append(
                f"lane {lane_id} checked its drafted tokens up to {this.spec_drafts + 1} "
                f"at a time (speculation), lane {other_id} computed one token at a time"
            )
    if a.speculative and b.speculative and a.spec_drafts != b.spec_drafts:
        parts.append(
            f"lane a checked drafts up to {a.spec_drafts + 1} tokens at a time, lane b up "
            f"to {b.spec_drafts + 1}"
        )
    width_a, width_b = _batch_width(a), _batch_width(b)
    if width_a != width_b:
        parts.append(
            f"the prompt's tokens were computed up to {width_a} at a time in lane a and "
            f"{width_b} at a time in lane b, as their n_ubatch {a.n_ubatch} and "
            f"{b.n_ubatch} set"
        )
    for this, other, lane_id, other_id in ((a, b, "a", "b"), (b, a, "b", "a")):
        if this.prefix == "cached" and other.prefix != "cached":
            parts.append(
                f"lane {lane_id} computed the start of the prompt in a call of its own "
                f"(a cached prefix) and the rest after it, lane {other_id} the whole "
                "prompt in one call"
            )
    return "; ".join(parts)
