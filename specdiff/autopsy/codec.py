"""The autopsy's parts as JSON, and back: every field read through `file_values.Fields`,
checked finite and within its range, and named when it is wrong, since a saved autopsy
may come from anyone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from specdiff.autopsy.records import (
    MAX_NAME,
    MAX_TENSORS,
    ForkMargin,
    LayerGrowth,
    SettingTrial,
    TensorDifference,
)
from specdiff.file_values import MAX_TOKENS, Fields
from specdiff.json_numbers import finite_or_null

T = TypeVar("T")


def trial_json(trial: SettingTrial) -> dict[str, Any]:
    return {
        "setting": trial.setting,
        "key": trial.key,
        "value": trial.value,
        "scope": trial.scope,
        "identical": trial.identical,
        "outcome": trial.outcome,
        "fork": trial.fork,
        "tokens_a": trial.tokens_a,
        "tokens_b": trial.tokens_b,
        "speed_a": trial.speed_a,
        "speed_b": trial.speed_b,
        "error": trial.error,
        "cached": trial.cached,
    }


def tensor_json(tensor: TensorDifference) -> dict[str, Any]:
    return {
        "name": tensor.name,
        "layer": tensor.layer,
        "op": tensor.op,
        "shape_a": list(tensor.shape_a),
        "shape_b": list(tensor.shape_b),
        "identical": tensor.identical,
        "max_abs": finite_or_null(tensor.max_abs),
        "rel_l2": finite_or_null(tensor.rel_l2),
        # only where true: a record saved before it was written reads back unchanged
        **({"kv_history": True} if tensor.kv_history else {}),
    }


def margin_json(margin: ForkMargin) -> dict[str, Any]:
    return {
        "token_a": margin.token_a,
        "token_b": margin.token_b,
        "piece_a": margin.piece_a,
        "piece_b": margin.piece_b,
        "probability_a": list(margin.probability_a),
        "probability_b": list(margin.probability_b),
        "margin": margin.margin,
        "shift": margin.shift,
        "margin_used": finite_or_null(margin.margin_used),
        "logits_max_abs": margin.logits_max_abs,
    }


MAX_TEXT = MAX_NAME * 10
"""A name, setting or note in a saved autopsy: far longer than any specdiff writes."""
MAX_TOKEN_ID = (1 << 31) - 1
"""llama.cpp's token ids are int32."""
MAX_GAP = 2e9
"""A difference of two logits, each within a session file's bound of 1e9."""


def pair_of(values: Sequence[T], record: Fields, key: str) -> tuple[T, T]:
    """The two values of a field that holds a pair (widths, probabilities)."""
    if len(values) != 2:
        raise record.refusal(key, "hold two values")
    return values[0], values[1]


def trial_from(record: Fields) -> SettingTrial:
    return SettingTrial(
        setting=record.text("setting", MAX_TEXT),
        key=record.text("key", MAX_TEXT),
        value=record.text("value", MAX_TEXT),
        scope=record.text("scope", MAX_TEXT),
        fork=record.optional_whole("fork", 0, MAX_TOKENS),
        tokens_a=record.whole("tokens_a", 0, MAX_TOKENS),
        tokens_b=record.whole("tokens_b", 0, MAX_TOKENS),
        speed_a=record.number("speed_a", low=0),
        speed_b=record.number("speed_b", low=0),
        error=record.optional_text("error", MAX_TEXT),
        cached=record.flag("cached"),
    )


def tensor_from(record: Fields) -> TensorDifference:
    return TensorDifference(
        name=record.text("name", MAX_TEXT),
        layer=record.optional_whole("layer", 0, MAX_TENSORS),
        op=record.text("op", MAX_TEXT),
        shape_a=tuple(record.wholes("shape_a", 8)),
        shape_b=tuple(record.wholes("shape_b", 8)),
        identical=record.flag("identical"),
        max_abs=record.unbounded("max_abs", low=0),
        rel_l2=record.unbounded("rel_l2", low=0),
        # false in records saved before it was written
        kv_history="kv_history" in record.data and record.flag("kv_history"),
    )


def growth_from(record: Fields) -> LayerGrowth:
    return LayerGrowth(
        layer=record.whole("layer", 0, MAX_TENSORS),
        max_abs=record.number("max_abs", low=0),
        rel_l2=record.unbounded("rel_l2", low=0),
    )


def margin_from(record: Fields) -> ForkMargin:
    return ForkMargin(
        token_a=record.whole("token_a", 0, MAX_TOKEN_ID),
        token_b=record.whole("token_b", 0, MAX_TOKEN_ID),
        piece_a=record.text("piece_a", MAX_TEXT),
        piece_b=record.text("piece_b", MAX_TEXT),
        probability_a=pair_of(record.numbers("probability_a", 8, 0, 1), record, "probability_a"),
        probability_b=pair_of(record.numbers("probability_b", 8, 0, 1), record, "probability_b"),
        margin=record.number("margin", -MAX_GAP, MAX_GAP),
        shift=record.number("shift", -2 * MAX_GAP, 2 * MAX_GAP),
        logits_max_abs=record.number("logits_max_abs", 0, MAX_GAP),
    )
