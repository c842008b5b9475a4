"""What the certify battery asks of an engine, whichever engine answers: the `Side`
interface, the settings both sides size themselves by, and the timeline of requests the
cost is computed from.

The battery's procedures know only this interface, so the verdict logic never knows
whether a server or the in-process engine answered; `local_side` and `server_side`
implement it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from specdiff.certify.records import Compared, Proof
from specdiff.errors import PromptError
from specdiff.steps import TokenStep

Progress = Callable[[str], None]

SHARED_PREFIX = (
    "You are a careful assistant. Answer in plain words, one short paragraph, and say "
    "when you are not sure. Context: the town library opens at nine, closes at six, and "
    "lends books for three weeks; the reading room is quiet and has forty seats.\n"
)
"""The prefix the cache property primes: long enough that a hit covers many tokens."""


def quiet(_: str) -> None:
    return None


@dataclass(frozen=True)
class Settings:
    runs: int = 4
    """Run to run: how often the same request is sent."""
    batch: int = 4
    """Batch size N: prompts sent together."""
    fillers: int = 8
    """Needle: filler prompts sent with it."""
    needle_trials: int = 2
    max_tokens: int = 48
    seed: int = 0
    properties: tuple[str, ...] = ()

    @property
    def width(self) -> int:
        """The most requests the battery has in flight at once."""
        return max(self.batch, self.fillers + 1)

    def check(self) -> None:
        if self.runs < 1:
            raise PromptError(f"-n must be at least 1, got {self.runs}")
        if self.batch < 2:
            raise PromptError(f"--batch-size must be at least 2 to batch, got {self.batch}")
        if self.fillers < 1:
            raise PromptError(f"--fillers must be at least 1, got {self.fillers}")
        if self.max_tokens < 1:
            raise PromptError(f"--max-tokens must be at least 1, got {self.max_tokens}")

    def as_dict(self) -> dict[str, Any]:
        return {
            "runs": self.runs,
            "batch": self.batch,
            "fillers": self.fillers,
            "needle_trials": self.needle_trials,
            "max_tokens": self.max_tokens,
            "seed": self.seed,
            "properties": list(self.properties),
        }


class Timeline:
    """Every request's time span, for the cost and the overhead figures."""

    def __init__(self) -> None:
        self.spans: list[tuple[float, float]] = []
        self.tokens = 0
        self.guard = threading.Lock()

    @contextmanager
    def request(self) -> Iterator[list[int]]:
        counted = [0]
        began = time.perf_counter()
        try:
            yield counted
        finally:
            with self.guard:
                self.spans.append((began, time.perf_counter()))
                self.tokens += counted[0]


CacheOutcome = tuple[list[TokenStep], list[TokenStep], Proof]
"""A cold run, a warm run, and whether the warm one was shown to hit the cache."""


@dataclass(frozen=True)
class BareClient:
    """One request sent by a bare HTTP client and the same through a lane, timed; no
    seconds where there is no bare client (in-process); where the server's answer to
    the bare client was no measurement, what was wrong with it instead."""

    seconds: float | None = None
    through_specdiff_seconds: float | None = None
    tokens: int = 0
    fault: str = ""

    def as_cost(self) -> dict[str, Any]:
        """The certificate's cost fields: the timing, or the fault in its place."""
        if self.fault:
            return {"bare_client_fault": self.fault}
        if self.seconds is None:
            return {}
        return {
            "bare_client_seconds": self.seconds,
            "through_specdiff_seconds": self.through_specdiff_seconds,
            "bare_client_tokens": self.tokens,
        }


class Side(Protocol):
    """What the battery asks of an engine; each method returns steps (and evidence)."""

    timeline: Timeline

    def describe(self) -> dict[str, Any]:
        """What was certified, for the certificate's subject."""
        ...

    def alone(self, prompt: str, max_tokens: int) -> list[TokenStep]:
        """The prompt decoded with nothing else in flight."""
        ...

    def together(
        self, prompts: Sequence[str], max_tokens: int, wanted: Sequence[int]
    ) -> tuple[dict[int, list[TokenStep]], Proof]:
        """The prompts decoded at once; the steps of those at the `wanted` places."""
        ...

    def cold_and_warm(self, question: str, max_tokens: int) -> CacheOutcome | str:
        """The same prompt with its cache emptied and with its prefix cached; or why not."""
        ...

    def forced(self, prompt: str, steps: Sequence[TokenStep]) -> list[TokenStep] | str:
        """Each step's position scored with the prompt and the earlier tokens forced in
        one prefill; or why it cannot be."""
        ...

    def speculation(
        self, prompts: Sequence[str], max_tokens: int
    ) -> tuple[list[Compared], Proof] | str:
        """Each prompt plain and speculative, and whether drafts were accepted; or why
        speculation cannot be compared."""
        ...

    def against_bare_client(self, max_tokens: int) -> BareClient:
        """One request sent by a bare HTTP client and the same through a lane, timed."""
        ...

    def close(self) -> None: ...
