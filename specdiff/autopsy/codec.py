"""The autopsy's parts as JSON, and back: every field read through `FieldReader`,
which names the field that is wrong, since a saved autopsy may come from anyone.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from specdiff.autopsy.records import (
    MAX_NAME,
    MAX_TRIALS,
    AutopsyError,
    ForkMargin,
    SettingTrial,
    TensorDifference,
)
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
        "kv_history": tensor.kv_history,
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


class FieldReader:
    """Typed reads of one JSON object, each failure naming the field."""

    def __init__(self, data: object, where: str) -> None:
        if not isinstance(data, Mapping):
            raise AutopsyError(f"{where}: expected an object, got {type(data).__name__}")
        self.data = data
        self.where = where

    def _get(self, key: str) -> object:
        if key not in self.data:
            raise AutopsyError(f"{self.where}: missing field {key!r}")
        return self.data[key]

    def _bad(self, key: str, wanted: str) -> AutopsyError:
        return AutopsyError(f"{self.where}: field {key!r} must be {wanted}")

    def text(self, key: str) -> str:
        value = self._get(key)
        if not isinstance(value, str) or len(value) > MAX_NAME * 10:
            raise self._bad(key, "text")
        return value

    def optional_text(self, key: str) -> str | None:
        return None if self._get(key) is None else self.text(key)

    def integer(self, key: str) -> int:
        value = self._get(key)
        if not isinstance(value, int) or isinstance(value, bool):
            raise self._bad(key, "a whole number")
        return value

    def optional_integer(self, key: str) -> int | None:
        return None if self._get(key) is None else self.integer(key)

    def number(self, key: str) -> float:
        value = self._get(key)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise self._bad(key, "a number")
        return float(value)

    def unbounded(self, key: str) -> float:
        """A number, or null for one JSON cannot hold (a difference beyond any scale)."""
        return math.inf if self._get(key) is None else self.number(key)

    def boolean(self, key: str) -> bool:
        value = self._get(key)
        if not isinstance(value, bool):
            raise self._bad(key, "true or false")
        return value

    def flag(self, key: str) -> bool:
        """A boolean that records saved before it existed lack: false there."""
        return key in self.data and self.boolean(key)

    def optional(self, key: str) -> object:
        return self._get(key)

    def _list(self, key: str, limit: int) -> Sequence[object]:
        value = self._get(key)
        if not isinstance(value, list) or len(value) > limit:
            raise self._bad(key, f"a list of at most {limit}")
        return value

    def items(self, key: str, limit: int) -> list[FieldReader]:
        return [FieldReader(item, f"{self.where}.{key}") for item in self._list(key, limit)]

    def texts(self, key: str) -> list[str]:
        values = self._list(key, MAX_TRIALS)
        if not all(isinstance(v, str) for v in values):
            raise self._bad(key, "a list of text")
        return [str(v) for v in values]

    def integers(self, key: str) -> list[int]:
        values = self._list(key, 8)
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            raise self._bad(key, "a list of whole numbers")
        return [v for v in values if isinstance(v, int)]

    def numbers(self, key: str) -> list[float]:
        values = self._list(key, 8)
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            raise self._bad(key, "a list of numbers")
        return [float(v) for v in values if isinstance(v, (int, float))]


def pair_of(values: Sequence[T], key: str) -> tuple[T, T]:
    """The two values of a field that holds a pair (widths, probabilities)."""
    if len(values) != 2:
        raise AutopsyError(f"autopsy: field {key!r} must hold two values")
    return values[0], values[1]


def trial_from(record: FieldReader) -> SettingTrial:
    return SettingTrial(
        setting=record.text("setting"),
        key=record.text("key"),
        value=record.text("value"),
        scope=record.text("scope"),
        fork=record.optional_integer("fork"),
        tokens_a=record.integer("tokens_a"),
        tokens_b=record.integer("tokens_b"),
        speed_a=record.number("speed_a"),
        speed_b=record.number("speed_b"),
        error=record.optional_text("error"),
        cached=record.boolean("cached"),
    )


def tensor_from(record: FieldReader) -> TensorDifference:
    return TensorDifference(
        name=record.text("name"),
        layer=record.optional_integer("layer"),
        op=record.text("op"),
        shape_a=tuple(record.integers("shape_a")),
        shape_b=tuple(record.integers("shape_b")),
        identical=record.boolean("identical"),
        max_abs=record.unbounded("max_abs"),
        rel_l2=record.unbounded("rel_l2"),
        kv_history=record.flag("kv_history"),
    )


def margin_from(record: FieldReader) -> ForkMargin:
    return ForkMargin(
        token_a=record.integer("token_a"),
        token_b=record.integer("token_b"),
        piece_a=record.text("piece_a"),
        piece_b=record.text("piece_b"),
        probability_a=pair_of(record.numbers("probability_a"), "probability_a"),
        probability_b=pair_of(record.numbers("probability_b"), "probability_b"),
        margin=record.number("margin"),
        shift=record.number("shift"),
        logits_max_abs=record.number("logits_max_abs"),
    )
