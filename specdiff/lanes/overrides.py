"""Lane keys set from the command line (``--lane-a n_ubatch=1``): `key=value` words
read into the field's type and applied to a lane.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from specdiff.errors import LaneConfigError
from specdiff.lanes.model import FIELD_TYPES, Lane, unknown_key
from specdiff.lanes.values import REPACK_WORDS, bad_type


def parse_value(key: str, text: str) -> Any:
    """Turn the text of a ``key=value`` override into the field's type."""
    if key not in FIELD_TYPES:
        raise unknown_key(key)
    expected = FIELD_TYPES[key]
    if key == "repack":
        word = REPACK_WORDS.get(text.strip().lower())
        if word is None:
            raise bad_type(key, text, "auto, on or off (true/false also work)")
        return word
    if expected is bool:
        lowered = text.strip().lower()
        if lowered in ("true", "1", "yes", "on"):
            return True
        if lowered in ("false", "0", "no", "off"):
            return False
        raise bad_type(key, text, "true or false")
    if expected is int:
        # int() also reads 1_000 and other scripts' digits; a lane value is ASCII digits
        if not _WHOLE_NUMBER.fullmatch(text.strip()):
            raise bad_type(key, text, "a whole number")
        return int(text.strip())
    return text


_WHOLE_NUMBER = re.compile(r"[+-]?[0-9]+", re.ASCII)


_NEXT_SETTING = re.compile(r"\s+(?=[A-Za-z_][A-Za-z0-9_]*=)")


def override_words(text: str) -> list[str]:
    """`key=value` settings typed on one line: a new one starts only where a word reads
    `key=`, so a value keeps its spaces, quotes and backslashes (a label, a JSON
    request, a Windows path) as typed."""
    return [word for word in _NEXT_SETTING.split(text.strip()) if word]


def parse_overrides(items: Iterable[str]) -> dict[str, Any]:
    """Parse CLI overrides like ``n_ubatch=1`` into typed values."""
    parsed: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise LaneConfigError(f"lane override {item!r} is not key=value, e.g. n_ubatch=2")
        parsed[key] = parse_value(key, text)
    return parsed


def apply_overrides(lane: Lane, overrides: Mapping[str, Any]) -> Lane:
    for key in overrides:
        if key not in FIELD_TYPES:
            raise unknown_key(key)
    return replace(lane, **overrides)
