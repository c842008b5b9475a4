"""The checks every field of a session file passes on its way in: a type, a range, a
bounded size. A hostile or damaged file fails one of them with a ValueError naming the
field; nothing past them needs to check again. The bounds are here too: a line 4 MiB,
free-form values 8 levels deep, logits within 1e9, top-k lists 4,096.
"""

from __future__ import annotations

import math
from typing import Any

from specdiff.sessions.format import LANE_IDS

MAX_TOKEN_ID = (1 << 31) - 1
"""llama.cpp's token ids are int32."""
MAX_INDEX = 1 << 24
MAX_PROMPT_TOKENS = 1 << 20
"""A lane's largest n_ctx: no prompt that ran is longer."""
MAX_CANDIDATES = 4096
"""top_k is at most 1024; a server may add the chosen token to its own list."""
MAX_LOGIT = 1e9
"""Far beyond any logit or log-probability a model gives (tens), and small enough that a
margin (the difference of two) stays finite."""
MAX_PIECE_BYTES = 4096
"""A token's text at most: the longest in any vocabulary is a few hundred bytes (runs of
spaces or symbols), while a megabyte piece stalls every view that draws it."""
MAX_NESTING = 8
"""How deep a free-form value (a server's identity, extra request fields) may nest."""
MAX_ITEMS = 1024
"""How many entries a free-form object or list may hold."""
GRADERS = ("tests", "answer", "regex")
"""How a lane's text is graded: a prompt's tests executed, an exact answer, a pattern."""
MAX_GRADE_REASON = 500
"""A grade's reason is one short line (an exception's name, a timeout, a signal)."""
MAX_SOURCE_CHARS = 200
"""A step's `source` ("rescored by llama-server /completion") is one short phrase."""
MAX_NEAR_TIE = 1e6
"""A near-tie threshold beyond any margin a model gives (logits run to tens)."""


# --- field checks ---------------------------------------------------------------------


def check_int(value: object, what: str, low: int, high: int) -> int:
    if type(value) is not int or not low <= value <= high:
        raise ValueError(f"{what} must be a whole number from {low} to {high}, got {value!r:.60}")
    return value


def check_float(value: object, what: str) -> float:
    """A finite number: a real run writes no NaN or infinity, and either would travel on
    into timings, margins and probabilities that no reader expects."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what} must be a number, got {value!r:.60}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{what} must be a finite number, got {number}")
    return number


def check_text(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{what} must be text, got {value!r:.60}")
    return value


def check_bool(value: object, what: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{what} must be true or false, got {value!r:.60}")
    return value


def check_object(value: object, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{what} must be an object, got {value!r:.60}")
    return value


def check_list(value: object, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise ValueError(f"{what} must be a list, got {value!r:.60}")
    return value


def per_lane(value: object, what: str) -> tuple[Any, Any]:
    if not isinstance(value, list) or len(value) != 2:
        raise ValueError(f"{what} must be a two-item list (lane a, lane b), got {value!r:.60}")
    return value[0], value[1]


def lanes_of(value: object, what: str) -> dict[str, dict[str, Any]]:
    """{"a": {...}, "b": {...}}: both lanes' tables."""
    table = check_object(value, what)
    return {lane_id: check_object(table.get(lane_id), f"{what}.{lane_id}") for lane_id in LANE_IDS}


def check_plain(value: object, what: str, depth: int = 0) -> Any:
    """A JSON value nobody computes with (a server's identity, extra request fields):
    bounded in depth and size, numbers finite, so every reader can show it."""
    if depth > MAX_NESTING:
        raise ValueError(f"{what} is nested deeper than {MAX_NESTING} levels")
    if isinstance(value, (dict, list)) and len(value) > MAX_ITEMS:
        raise ValueError(f"{what} holds more than {MAX_ITEMS} entries")
    if isinstance(value, dict):
        return {key: check_plain(item, f"{what}.{key}", depth + 1) for key, item in value.items()}
    if isinstance(value, list):
        return [check_plain(item, what, depth + 1) for item in value]
    if isinstance(value, float):
        return check_float(value, what)
    return value
