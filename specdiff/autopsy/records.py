"""The autopsy's parts: one SettingTrial per run of the settings sweep, one
TensorDifference per tensor compared at the fork step, the growth per layer and the
two picks' margin. Numbers and names only, never arrays or engine objects.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from specdiff.errors import SpecdiffError

SCHEMA = 1
LAST_BITS = 1e-5
"""A relative L2 difference below this is rounding in the last bits of float32 (whose
own step is 1.2e-7 relative), not a different computation."""
MAX_TRIALS = 1000
MAX_TENSORS = 100_000
MAX_NAME = 200
DRAFT_KEY = "spec_draft_n_max"
"""The key of a trial that ran the speculative server with another draft length."""


class AutopsyError(SpecdiffError):
    """An autopsy cannot be made, or a saved one cannot be read."""


class AutopsyInterrupted(AutopsyError):
    """Ctrl+C stopped the autopsy before it had anything to report."""


@dataclass(frozen=True)
class SettingTrial:
    """One run of the pair with one setting moved: whether the lanes still fork."""

    setting: str
    """What was changed, in words: "repack off (both lanes)"."""
    key: str
    """The lane key changed ("" for the run as given)."""
    value: str
    scope: str
    """"as given", "lane b" (moved toward lane a) or "both lanes" (a kernel switch)."""
    fork: int | None
    """The first token at which the lanes differ; None when they agree throughout."""
    tokens_a: int
    """Tokens lane a generated in this run: a run stops once its lanes fork (its answer
    is known there), so a forked trial's count ends at the fork."""
    tokens_b: int
    speed_a: float
    """Tokens per second after the first token."""
    speed_b: float
    error: str | None = None
    cached: bool = False
    """Read from the cache of an earlier explain of the same prompt and settings."""

    @property
    def identical(self) -> bool:
        return self.error is None and self.fork is None and self.tokens_a == self.tokens_b

    @property
    def outcome(self) -> str:
        if self.error is not None:
            return "failed"
        if self.fork is not None:
            return f"forks at {self.fork}"
        if self.tokens_a != self.tokens_b:
            return f"lengths differ ({self.tokens_a} vs {self.tokens_b})"
        return "identical"


@dataclass(frozen=True)
class TensorDifference:
    """One named tensor of the fork step, lane a's column against lane b's."""

    name: str
    layer: int | None
    """The layer the tensor belongs to; None for the input and the output head."""
    op: str
    """The ggml operation that computed it (MUL_MAT, ADD, RMS_NORM, ...)."""
    shape_a: tuple[int, ...]
    shape_b: tuple[int, ...]
    identical: bool
    """Bit for bit, raw bytes compared before any arithmetic."""
    max_abs: float
    """The largest absolute difference of one value."""
    rel_l2: float
    """|a - b| / |a| over the column (Euclidean norms)."""
    kv_history: bool = False
    """A KV cache whose difference lies in cells earlier llama_decode calls wrote (in
    both lanes): history the step reads, not anything it computed."""


@dataclass(frozen=True)
class LayerGrowth:
    """How far apart the lanes are at the output of one layer."""

    layer: int
    max_abs: float
    rel_l2: float


@dataclass(frozen=True)
class ForkMargin:
    """The two picks at the fork step, as each lane scored them."""

    token_a: int
    token_b: int
    piece_a: str
    piece_b: str
    probability_a: tuple[float, float]
    """Lane a's probabilities of (its pick, lane b's pick)."""
    probability_b: tuple[float, float]
    """Lane b's probabilities of (lane a's pick, its pick)."""
    margin: float
    """Lane a's logit of its pick minus its logit of lane b's pick."""
    shift: float
    """How much that gap moved between the lanes: lane a's gap minus lane b's. Above
    the margin, the order of the two picks flipped."""
    logits_max_abs: float
    """The largest difference of one logit between the lanes at the step."""

    @property
    def margin_used(self) -> float:
        """The share of lane a's margin the difference used up (1 or more: flipped)."""
        return self.shift / self.margin if self.margin > 0 else math.inf
