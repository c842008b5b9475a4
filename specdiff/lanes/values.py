"""The values a lane key may take: the words each one accepts, the bounds of each number,
and the few rules a single value is checked by on its own.

Kept apart from the Lane record so that the endpoint checks, the overrides and the
record itself all read one table of what is allowed.
"""

from __future__ import annotations

import math
import os
import re
from typing import Literal, get_args

from specdiff.errors import LaneConfigError

LaneId = Literal["a", "b"]
"""A lane of a pair: "a" (the configuration under test) or "b" (the one it is compared with)."""
# the lane keys that take one of a few words: the type says which, CHOICES checks them
Backend = Literal["local", "server"]
Api = Literal["completions", "chat", "llama-server"]
FlashAttn = Literal["off", "on", "auto"]
Speculation = Literal["none", "ngram", "draft"]
PrefixMode = Literal["fresh", "cached"]
Repack = Literal["auto", "on", "off"]
SplitMode = Literal["none", "layer", "row"]
Rescore = Literal["auto", "off"]
KV_TYPES = ("f16", "f32", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")
QUANT_TYPES = ("", "f16", "bf16", "q8_0", "q6_k", "q5_k_m", "q4_k_m", "q4_0")
CHOICES: dict[str, tuple[str, ...]] = {
    "backend": get_args(Backend),
    "api": get_args(Api),
    "flash_attn": get_args(FlashAttn),
    "type_k": KV_TYPES,
    "type_v": KV_TYPES,
    "speculation": get_args(Speculation),
    "prefix": get_args(PrefixMode),
    "quant": QUANT_TYPES,
    "repack": get_args(Repack),
    "split_mode": get_args(SplitMode),
    "rescore": get_args(Rescore),
}
REPACK_WORDS = {
    **dict.fromkeys(("true", "1", "yes", "on"), "on"),
    **dict.fromkeys(("false", "0", "no", "off"), "off"),
    "auto": "auto",
}
"""What `repack=` may say: on/off in any of the ways a boolean is written, or auto."""
# inclusive bounds of integer fields
BOUNDS: dict[str, tuple[int, int]] = {
    "n_ctx": (16, 1 << 20),
    "n_batch": (1, 1 << 16),
    "n_ubatch": (1, 1 << 16),
    "threads": (1, 1024),
    "threads_batch": (0, 1024),
    "gpu_layers": (-1, 1 << 16),
    "main_gpu": (0, 255),
    "spec_ngram": (1, 32),
    "spec_ngram_min": (1, 32),
    "spec_drafts": (1, 64),
    "spec_align": (1, 64),
    "prefix_tokens": (0, 1 << 20),
    "top_k": (2, 1024),
    "timeout": (1, 3600),
    "retries": (0, 10),
}
MAX_SERVER_FLAGS = 400
"""server_flags is a launch line quoted beside a result, not a file."""
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def default_threads() -> int:
    """All cores this process may run on: what llama.cpp's own tools default to."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def bad_type(key: str, value: object, wanted: str) -> LaneConfigError:
    shown = repr(value)
    if len(shown) > 80:  # an array or table from a file can be any size
        shown = shown[:77] + "..."
    return LaneConfigError(f"lane key {key!r} must be {wanted}, got {shown}")


MAX_ACCEPT_TOLERANCE = 100.0
"""Far beyond any logit gap that matters: every draft in the top few is accepted."""
ACCEPT_FORMS = (
    "exact or lenient:DELTA (DELTA a number of logits above 0 and at most 100, e.g. lenient:1.0)"
)


def accept_tolerance(spec_accept: str) -> float | None:
    """The DELTA of ``lenient:DELTA``, None for ``exact``; raises LaneConfigError naming
    the accepted forms for anything else."""
    if spec_accept == "exact":
        return None
    word, _, number = spec_accept.partition(":")
    try:
        tolerance = float(number) if word == "lenient" else math.nan
    except ValueError:
        tolerance = math.nan
    # NaN fails both comparisons, so "nan", "inf" and non-numbers are refused here
    if not 0 < tolerance <= MAX_ACCEPT_TOLERANCE:
        raise LaneConfigError(
            f"lane key 'spec_accept' must be {ACCEPT_FORMS}, got {spec_accept!r:.80}"
        )
    return tolerance
