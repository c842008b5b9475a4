"""The checks every field of a session file passes on its way in: a type, a range, a
bounded size. They are `file_values`' checks, the ones every file specdiff reads back
passes, so a hostile or damaged file fails one of them with a ValueError (a BadValue)
naming the field; nothing past them needs to check again. The session's own bounds are
here: a line 4 MiB, free-form values 8 levels deep, logits within 1e9, top-k lists 4,096.
"""

from __future__ import annotations

from typing import Any

from specdiff.file_values import (
    MAX_TOKENS,
    BadValue,
    finite_number,
    flag,
    json_list,
    json_object,
    shown,
    text,
    whole_number,
)
from specdiff.sessions.format import LANE_IDS

MAX_TOKEN_ID = (1 << 31) - 1
"""llama.cpp's token ids are int32."""
MAX_INDEX = MAX_TOKENS
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
# The shared reader's checks, under the names the session records read with.

check_int = whole_number
check_float = finite_number
"""A finite number: a real run writes no NaN or infinity, and either would travel on
into timings, margins and probabilities that no reader expects."""
check_text = text
check_bool = flag
check_object = json_object
check_list = json_list


def per_lane(value: object, what: str) -> tuple[Any, Any]:
    if not isinstance(value, list) or len(value) != 2:
        raise BadValue(f"{what} must be a two-item list (lane a, lane b), got {shown(value)}")
    return value[0], value[1]


def lanes_of(value: object, what: str) -> dict[str, dict[str, Any]]:
    """{"a": {...}, "b": {...}}: both lanes' tables."""
    table = check_object(value, what)
    return {lane_id: check_object(table.get(lane_id), f"{what}.{lane_id}") for lane_id in LANE_IDS}


def check_plain(value: object, what: str, depth: int = 0) -> Any:
    """A JSON value nobody computes with (a server's identity, extra request fields):
    bounded in depth and size, numbers finite, so every reader can show it."""
    if depth > MAX_NESTING:
        raise BadValue(f"{what} is nested deeper than {MAX_NESTING} levels")
    if isinstance(value, (dict, list)) and len(value) > MAX_ITEMS:
        raise BadValue(f"{what} holds more than {MAX_ITEMS} entries")
    if isinstance(value, dict):
        return {key: check_plain(item, f"{what}.{key}", depth + 1) for key, item in value.items()}
    if isinstance(value, list):
        return [check_plain(item, what, depth + 1) for item in value]
    if isinstance(value, float):
        return check_float(value, what)
    return value
