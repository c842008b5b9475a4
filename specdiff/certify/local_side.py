"""The certify battery's in-process side: the bundled (or given) model loaded here, where
every condition a property is about can be made and shown.

A batch is built as repeat builds one (`BatchedLane`: sequences sharing one KV memory,
so each decode call holds several rows); the cache and speculation pairs run as `run`
runs them (`PairRun`), which reports the prefix tokens it reused and the drafts it
accepted. The engine loads only in the worker process, so its imports are deferred.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from specdiff.certify.records import Compared, Proof
from specdiff.certify.sides import (
    SHARED_PREFIX,
    BareClient,
    CacheOutcome,
    Progress,
    Settings,
    Timeline,
)
from specdiff.errors import PromptError
from specdiff.lanes import Lane, Pair
from specdiff.steps import TokenStep

if TYPE_CHECKING:
    from specdiff.results import PairResult


class LocalSide:
    """The bundled (or given) model in-process: batches of sequences in one KV memory,
    as repeat builds them; the cache and speculation pairs as run runs them."""

    def __init__(
        self, lane: Lane, settings: Settings, progress: Progress, cancel: threading.Event
    ) -> None:
        # deferred: the engine loads in the worker process only
        from specdiff.engine.llama.batched import BatchedLane
        from specdiff.engine.llama.context import ModelPool
        from specdiff.engine.llama.probe import trust_kernels

        self.lane = replace(lane, speculation="none", prefix="fresh")
        self.progress = progress
        self.cancel = cancel
        self.timeline = Timeline()
        self.pool = ModelPool()
        trust_kernels(Pair("certify", self.lane, self.lane), progress)
        width = settings.width
        room = max(self.lane.n_ctx, width * (settings.max_tokens + 256))
        self.lane = replace(self.lane, n_ctx=room, n_ubatch=max(self.lane.n_ubatch, width + 2))
        self.batched = BatchedLane(self.lane, width - 1, self.pool, progress, cancel)
        self.base = lane

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "in-process",
            "lane": self.base.as_dict(),
            "model": self.batched.model_path.name,
            "executed": self.batched.context.executed,
        }

    def alone(self, prompt: str, max_tokens: int) -> list[TokenStep]:
        with self.timeline.request() as counted:
            run = self.batched.run(self.batched.tokenize(prompt), [], max_tokens)
            counted[0] = len(run.steps)
        return run.steps

    def together(
        self, prompts: Sequence[str], max_tokens: int, wanted: Sequence[int]
    ) -> tuple[dict[int, list[TokenStep]], Proof]:
        tokens = [self.batched.tokenize(p) for p in prompts]
        found: dict[int, list[TokenStep]] = {}
        widths: list[int] = []
        for place in wanted:
            others = tokens[:place] + tokens[place + 1 :]
            with self.timeline.request() as counted:
                run = self.batched.run(tokens[place], others, max_tokens)
                counted[0] = len(run.steps)
            found[place] = run.steps
            widths.append(max(run.widths, default=1))
        widest = min(widths)
        shown = widest >= 2
        how = (
            f"every decode call held up to {widest} sequences (the prompts shared each batch)"
            if shown
            else "no decode call held more than one sequence"
        )
        facts = {
            "rows_per_decode_call": max(widths),
            # in-process the prompt read is always sequence 0, its neighbours after it
            "sequence_of_the_prompt": 0,
        }
        return found, Proof(shown, how, facts)

    def cold_and_warm(self, question: str, max_tokens: int) -> CacheOutcome | str:
        warm = replace(self.base, prefix="cached", prefix_text=SHARED_PREFIX, speculation="none")
        cold = replace(self.base, prefix="fresh", speculation="none")
        result = self._pair(
            Pair("cache-vs-fresh", warm, cold), SHARED_PREFIX + question, max_tokens
        )
        prefix = result.a.prefix_tokens
        proof = Proof(
            prefix > 0,
            f"the warm run decoded {prefix} prefix tokens in an earlier call and reused them"
            if prefix > 0
            else "the warm run reused no prefix",
            {"prefix_tokens": prefix},
        )
        return result.b.steps, result.a.steps, proof

    def forced(self, prompt: str, steps: Sequence[TokenStep]) -> list[TokenStep] | str:
        if not steps:
            return "the decode produced no token"
        batched = self.batched
        tokens = batched.tokenize(prompt)
        history = [*tokens, *(s.token_id for s in steps[:-1])]
        if len(history) > self.lane.n_batch:
            return f"prompt and tokens ({len(history)}) exceed one n_batch ({self.lane.n_batch})"
        with self.timeline.request() as counted:
            batched.context.clear()
            batched.context.decode_rows([(t, p, 0) for p, t in enumerate(history)], True)
            forced = [
                batched._step(batched.context.row(len(tokens) - 1 + i), i, len(history))
                for i in range(len(steps))
            ]
            counted[0] = len(forced)
        return forced

    def speculation(
        self, prompts: Sequence[str], max_tokens: int
    ) -> tuple[list[Compared], Proof] | str:
        speculative = (
            self.base if self.base.speculative else replace(self.base, speculation="ngram")
        )
        plain = replace(self.base, speculation="none", prefix="fresh")
        pairs, accepted = [], 0
        for number, prompt in enumerate(prompts, 1):
            result = self._pair(Pair("spec-vs-plain", speculative, plain), prompt, max_tokens)
            pairs.append(
                Compared(f"prompt {number} plain vs speculative", result.b.steps, result.a.steps)
            )
            accepted += result.a.accepted
        proof = Proof(
            accepted > 0,
            f"{accepted} drafted tokens were accepted ({speculative.speculation} speculation)"
            if accepted
            else "no drafted token was accepted",
            {"accepted": accepted, "speculation": speculative.speculation},
        )
        return pairs, proof

    def _pair(self, pair: Pair, prompt: str, max_tokens: int) -> PairResult:
        from specdiff.engine.pairrun import PairRun  # deferred, as in __init__

        runner = PairRun(pair, self.progress, self.cancel, self.pool)
        try:
            with self.timeline.request() as counted:  # the run, not the lanes' opening
                result = runner.run(prompt, max_tokens)
                counted[0] = len(result.a.steps) + len(result.b.steps)
        finally:
            runner.close()
        for outcome in (result.a, result.b):
            if outcome.error:
                raise PromptError(f"lane {outcome.lane_id} failed: {outcome.error}")
        return result

    def against_bare_client(self, max_tokens: int) -> BareClient:
        return BareClient()  # in-process, no request goes over HTTP

    def close(self) -> None:
        self.batched.close()
        self.pool.close()
