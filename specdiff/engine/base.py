"""What every lane backend shares: the interface PairRun drives, and the records a
generate() call leaves besides its steps.

A backend is the in-process llama.cpp lane (``engine.llama``) or a server lane
(``engine.server``); PairRun, the suite and the TUI see only this Protocol, so a new
backend is one new package that satisfies it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from specdiff.errors import SpecdiffError
from specdiff.lanes import Lane
from specdiff.steps import Probe, TokenStep


class EngineError(SpecdiffError):
    """llama.cpp or a server refused a call that should have worked."""


class Cancelled(Exception):
    """Generation was stopped on request.

    Not a SpecdiffError: it is a control signal, and every ``except SpecdiffError``
    that reports bad input must let it through."""


@dataclass
class Generation:
    """What one generate() call did besides yielding steps."""

    prompt_tokens: int = 0
    prefix_tokens: int = 0
    verify_calls: int = 0
    drafted: int = 0
    accepted: int = 0
    stop_reason: str = ""


class LaneBackend(Protocol):
    """One lane of a pair: loads its model or connects to its server in __init__, then
    generates greedily on as many prompts as asked."""

    lane: Lane
    lane_id: str
    generation: Generation
    """The current (or last) generate() call's counters, filled in as it runs."""

    def tokenize(self, text: str) -> list[int]: ...

    def check(self, tokens: Sequence[int], max_tokens: int) -> None:
        """Raise PromptError for a prompt that cannot run on this lane (context room,
        cached prefix), before anything decodes."""

    def generate(
        self,
        prompt: str,
        tokens: Sequence[int],
        max_tokens: int,
        stop: Sequence[bytes] = (),
        forced: Sequence[int] | None = None,
    ) -> Iterator[TokenStep]:
        """Yield one TokenStep per generated token; `forced` feeds these tokens instead of
        the lane's own picks (teacher forcing). Raises Cancelled when stopped."""

    def probe(self, index: int, token_ids: Sequence[int]) -> tuple[Probe, ...]:
        """Logit and rank of other tokens at step `index` (the fork); () if unknown."""

    def normalizer(self, index: int) -> float | None:
        """log-sum-exp of step `index`'s logits, where the backend can compute it."""

    def tokens_per_second(self, steps: Sequence[TokenStep]) -> float | None:
        """The backend's own speed figure for these steps, or None to time them."""

    def vocab_digest(self) -> str:
        """Identifies the vocabulary, so two lanes' token ids can be compared."""

    def executed(self) -> dict[str, Any]:
        """What actually ran: model file and hash, settings as applied, server identity."""

    def close(self) -> None: ...
