"""Where draft tokens come from: n-gram prompt lookup, or a small draft model.

A drafter proposes up to `room` tokens that continue the history; the target model
verifies them in one batch. Under exact verification (the default) drafters never
decide what is emitted: the target's greedy pick always wins, so a drafter can change
speed and batch widths (and so, through the kernels, the numbers), never the rule.
`Verification` is that rule, and its lenient form (``spec_accept=lenient:DELTA``)
breaks it on purpose: relaxed verification keeps a draft whose logit is within DELTA
of the row's maximum, so the emitted token is no longer always the argmax. That lane
exists to show what a real invariant break looks like beside numeric noise.
`make_drafter` builds the drafter a lane's settings ask for; a draft model gets a
context of its own from ``context``.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from specdiff.engine.gguf import GGUFInfo, read_gguf
from specdiff.engine.llama.context import Context, ModelPool, Offload, repack_choice
from specdiff.engine.models import Progress, resolve_model
from specdiff.errors import ModelError
from specdiff.lanes import Lane


class Drafter(Protocol):
    def reset(self) -> None: ...

    def propose(self, history: Sequence[int], room: int) -> list[int]: ...

    def feedback(self, proposed: int, accepted: int) -> None: ...

    def close(self) -> None: ...


class Verification:
    """Which token a verify row emits, given the target's argmax and the draft for it."""

    def __init__(self, tolerance: float | None = None) -> None:
        self.tolerance = tolerance
        """None: exact (argmax only); else how far below the maximum a kept draft may be."""

    def pick(self, row: np.ndarray, argmax: int, draft: int | None) -> int:
        if draft is None or draft == argmax or self.tolerance is None:
            return argmax
        if not 0 <= draft < row.shape[0]:
            return argmax
        return draft if row[draft] >= row[argmax] - self.tolerance else argmax


def verify_cost(width: int) -> float:
    """What a verify batch of `width` rows costs, in single-token decode steps.

    Each row with logits pays Gemma 3's 262,144-row output projection, so a batch is far
    from free: measured on Gemma 3 270M (AVX-512, repacked kernels) a single-token step
    took 12.6 ms, a batch of 2 rows 23 ms, 4 rows 31 ms, 8 rows 43 ms, 12 rows 59 ms, 16
    rows 66 ms. A fixed table, not a clock: the draft length must follow from the tokens
    alone, or the verify widths (and with them the numbers) would change from run to run.
    """
    return 1.0 if width <= 1 else 1.6 + 0.23 * width


def expected_tokens(drafts: int, rate: float) -> float:
    """Tokens a verify of `drafts` drafts emits on average when each draft is accepted
    with probability `rate` (given the ones before it were): the accepted run plus the
    target's own token."""
    if rate >= 1.0:
        return float(drafts + 1)
    return (1.0 - rate ** (drafts + 1)) / (1.0 - rate)


class DraftLength:
    """How many tokens to draft next: fixed, or adaptive.

    Verify widths are rounded down to a multiple of `align`: llama.cpp's CPU matmul
    kernels tile rows in groups (measured here on Gemma 3 270M: a verify batch of 4
    rows costs 38 ms, 5 rows 57 ms, 8 rows 58 ms), so a width just past a multiple pays
    for rows that rarely survive verification.

    Adaptive: a running estimate of how often a draft token is accepted picks, among
    the allowed widths, the one that promises the most tokens per unit of verify cost
    (`verify_cost`), or no draft at all where none beats a single-token step. A verify
    that drafts one token costs nearly two steps, so short drafts are only worth it when
    they are almost always right, and drafting stops after rejections until the drafter's
    proposals (still checked against what the target emits, see `observe`) come true
    again.
    """

    PRIOR = 0.8
    """The acceptance rate assumed before any draft was checked."""
    WEIGHT = 0.25
    """How much one checked draft token moves the running acceptance rate."""

    def __init__(self, maximum: int, adaptive: bool, align: int = 1) -> None:
        self.maximum = maximum
        self.adaptive = adaptive
        self.align = max(1, align)
        self.rate = self.PRIOR
        self._unchecked: tuple[int, int] | None = None
        """A proposal that was not verified: its position in the history and first token."""

    def reset(self) -> None:
        self.rate = self.PRIOR
        self._unchecked = None

    def hold_back(self, position: int, token: int) -> None:
        """The drafter proposed `token` for `position` but no draft was verified: check it
        against the target's own pick once the history reaches that far."""
        self._unchecked = (position, token)

    def check_held(self, history: Sequence[int]) -> None:
        """Score the proposal held back, if the history now holds its position."""
        if self._unchecked is not None and self._unchecked[0] < len(history):
            position, token = self._unchecked
            self.observe(history[position] == token)
        self._unchecked = None

    def widths(self, limit: int) -> list[int]:
        """The verify widths allowed up to `limit`: below `align` any, above it its
        multiples."""
        return [w for w in range(2, limit + 1) if w < self.align or w % self.align == 0]

    def wanted(self, room: int, available: int | None = None) -> int:
        count = min(room, self.maximum, available if available is not None else room)
        if not self.adaptive:
            allowed = self.widths(count + 1)
            return allowed[-1] - 1 if allowed else 0
        best, best_gain = 0, 1.0
        for width in self.widths(count + 1):
            gain = expected_tokens(width - 1, self.rate) / verify_cost(width)
            if gain > best_gain:
                best, best_gain = width - 1, gain
        return best

    def feedback(self, proposed: int, accepted: int) -> None:
        """A verify checked `proposed` drafts and accepted the first `accepted`."""
        for _ in range(accepted):
            self.observe(True)
        if accepted < proposed:
            self.observe(False)

    def observe(self, hit: bool) -> None:
        """One draft token checked against the target's pick, verified or not."""
        self.rate += self.WEIGHT * ((1.0 if hit else 0.0) - self.rate)


class NgramDrafter:
    """Prompt lookup: find the latest earlier occurrence of the history's last n tokens
    (n from `longest` down to `shortest`) and propose what followed it.

    The index of n-grams is updated incrementally, so a lookup costs O(longest) no
    matter how long the history is.
    """

    def __init__(
        self, longest: int, shortest: int, drafts: int = 4, adaptive: bool = True, align: int = 1
    ) -> None:
        self.longest = longest
        self.shortest = shortest
        self.length = DraftLength(drafts, adaptive, align)
        self.reset()

    def reset(self) -> None:
        # n -> {n-gram: end position (exclusive) of its latest occurrence}
        self._index: dict[int, dict[tuple[int, ...], int]] = {
            n: {} for n in range(self.shortest, self.longest + 1)
        }
        self._indexed_until = 0
        self.length.reset()

    def _index_up_to(self, history: Sequence[int], end: int) -> None:
        """Register every n-gram that ends before `end` (exclusive)."""
        for stop in range(max(self._indexed_until, 1), end):
            for n, table in self._index.items():
                if stop >= n:
                    table[tuple(history[stop - n : stop])] = stop
        self._indexed_until = max(self._indexed_until, end)

    def propose(self, history: Sequence[int], room: int) -> list[int]:
        size = len(history)
        # Index every n-gram but the current suffix itself, which must match an
        # earlier occurrence.
        self._index_up_to(history, size)
        self.length.check_held(history)
        for n in range(min(self.longest, size), self.shortest - 1, -1):
            found = self._index[n].get(tuple(history[size - n :]))
            if found is not None and found < size:
                wanted = self.length.wanted(room, size - found)
                if not wanted:
                    self.length.hold_back(size, history[found])
                return list(history[found : found + wanted])
        return []

    def feedback(self, proposed: int, accepted: int) -> None:
        self.length.feedback(proposed, accepted)

    def close(self) -> None:
        return None


class ModelDrafter:
    """Greedy drafts from a second model with the same vocabulary, in its own context.

    The draft context keeps the tokens it has seen; before each proposal it drops
    what the target rejected (checked removal) and decodes what it has not seen.
    """

    def __init__(
        self, context: Context, drafts: int = 4, adaptive: bool = True, align: int = 1
    ) -> None:
        self.context = context
        self.length = DraftLength(drafts, adaptive, align)
        self._seen: list[int] = []

    def reset(self) -> None:
        self.context.clear()
        self._seen = []
        self.length.reset()

    def propose(self, history: Sequence[int], room: int) -> list[int]:
        common = 0
        for seen, token in zip(self._seen, history):
            if seen != token:
                break
            common += 1
        # The last history token must be decoded again to get logits after it.
        common = min(common, len(history) - 1)
        if common < len(self._seen):
            self.context.remove_from(common)
            del self._seen[common:]
        self.context.decode_chunks(history[common:], common)
        self._seen.extend(history[common:])
        self.length.check_held(history)
        wanted = self.length.wanted(room)
        drafts: list[int] = []
        while True:
            token = int(self.context.row(-1).argmax())
            if not wanted:
                self.length.hold_back(len(history), token)
                return drafts
            drafts.append(token)
            if len(drafts) >= wanted:
                return drafts
            self.context.decode([token], len(self._seen), all_logits=False)
            self._seen.append(token)

    def feedback(self, proposed: int, accepted: int) -> None:
        self.length.feedback(proposed, accepted)

    def close(self) -> None:
        self.context.close()


def make_drafter(
    lane: Lane,
    model_path: Path,
    pool: ModelPool,
    cancel: threading.Event,
    progress: Progress,
) -> tuple[Drafter | None, Path | None]:
    """The drafter a lane's `speculation` asks for, and the draft model's file if any
    (the lane's own model at `model_path` when draft_model is not set)."""
    if lane.speculation == "ngram":
        drafter = NgramDrafter(
            lane.spec_ngram,
            lane.spec_ngram_min,
            lane.spec_drafts,
            lane.spec_adaptive,
            lane.spec_align,
        )
        return drafter, None
    if lane.speculation != "draft":
        return None, None
    path = (
        resolve_model(lane.draft_model, "", lane.threads, progress)
        if lane.draft_model
        else model_path
    )
    # the draft model runs with its lane's kernels and offload: a probe's verdict covers both
    repack, offload = repack_choice(lane, model_path).on, Offload.of(lane)
    check_same_vocabulary(pool.get(model_path, repack, offload).info, read_gguf(path))
    context = Context(pool.get(path, repack, offload), lane, cancel)
    return ModelDrafter(context, lane.spec_drafts, lane.spec_adaptive, lane.spec_align), path


def check_same_vocabulary(target: GGUFInfo, draft: GGUFInfo) -> None:
    """A draft model must speak the target's token ids, or its drafts mean nothing."""
    target_tokens, draft_tokens = target.tokens, draft.tokens
    if target.vocab_digest == draft.vocab_digest:
        return
    if len(target_tokens) != len(draft_tokens):
        detail = f"{len(draft_tokens)} tokens vs the target's {len(target_tokens)}"
    else:
        first = next(i for i, (x, y) in enumerate(zip(target_tokens, draft_tokens)) if x != y)
        detail = (
            f"token {first} is {draft_tokens[first]!r} vs the target's {target_tokens[first]!r}"
        )
    raise ModelError(
        f"draft model {draft.path} has a different vocabulary from {target.path.name} "
        f"({detail}); use a draft model of the same family"
    )
