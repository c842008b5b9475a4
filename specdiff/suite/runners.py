"""What runs a pair's prompts: one at a time, a worker process (`PairWorker`), so that a
native crash ends one prompt's run and not the suite; with --concurrency, a `PairRun` in
a thread of this process per run in flight, so that the runs of one server lane share
its endpoint pool, and their tokenizers share one copy of the weights.

The engine is imported only once something runs, so the input checks before it stay
quick; an in-process lane's llama.cpp loads in the worker process only.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from specdiff.lanes import Pair
from specdiff.results import PairResult
from specdiff.steps import TokenStep

if TYPE_CHECKING:
    from specdiff.engine.llama.context import ModelPool
    from specdiff.engine.pairrun import PairRun
    from specdiff.engine.worker import PairWorker


class PairRunner(Protocol):
    """One pair loaded, running one prompt at a time: PairWorker's interface."""

    @property
    def build(self) -> dict[str, str]: ...

    def tokenize(self, prompt: str) -> list[int]: ...

    def check(self, tokens: Sequence[int], max_tokens: int) -> None: ...

    def executed(self) -> dict[str, dict[str, Any]]: ...

    def run(
        self,
        prompt: str,
        max_tokens: int,
        stop: Sequence[str] = (),
        near_tie: float = ...,
        on_step: Callable[[TokenStep], None] | None = None,
        teacher_forced: bool = False,
        control: bool = False,
    ) -> PairResult: ...

    def close(self) -> None: ...


class UnitRunners(Protocol):
    """What SuiteRun runs a pair's prompts on: up to `slots` runners at once, each made
    by `new` (PairWorker's interface), all of them ended by `release` once the pair's
    runs are over. `Runners` runs them on this machine; a cluster's runners elsewhere."""

    slots: int

    def new(self, pair: Pair, progress: Callable[[str], None]) -> PairRunner: ...

    def release(self) -> None: ...


class Runners:
    """Makes the runners of one suite, and holds the weights they share while a pair's
    runs are in flight."""

    def __init__(self, concurrency: int, cancel: threading.Event) -> None:
        self.concurrency = concurrency
        self.slots = concurrency
        self.cancel = cancel
        self._loading = threading.Lock()
        self._models: ModelPool | None = None
        """The weights the runs side by side share (their tokenizers), while they run."""

    def new(self, pair: Pair, progress: Callable[[str], None]) -> PairWorker | PairRun:
        """The runs side by side (server lanes only) are threads of this process, so each
        lane's runs share its endpoint pool; one at a time, a worker process."""
        # deferred: see the module's docstring
        from specdiff.engine.worker import PairWorker

        if self.concurrency == 1:
            return PairWorker(pair, progress, self.cancel)
        from specdiff.engine.pairrun import PairRun
        from specdiff.engine.server.pool import configure

        # each endpoint's connections, shared by the runs, are sized to the concurrency
        configure(concurrency=self.concurrency)
        from specdiff.engine.llama.context import ModelPool

        # one lane loads its tokenizer at a time (llama.cpp's loader is not to be raced),
        # and all load it from one pool: N copies of the weights would grow with N
        with self._loading:
            if self._models is None:
                self._models = ModelPool()
            return PairRun(pair, progress, self.cancel, self._models)

    def release(self) -> None:
        """Free the shared weights once a pair's runs are over."""
        if self._models is not None:
            self._models.close()
            self._models = None
