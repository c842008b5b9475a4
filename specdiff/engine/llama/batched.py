"""One prompt decoded alongside other sequences in the same batches.

A server decodes each request in a batch with whatever else is running; the batch's size
and the places its sequences take in a shared KV memory change which kernels run and in
which order their sums are added. `BatchedLane` reproduces that in-process: the prompt of
interest is sequence 0, decoded greedily while `companions` other prompts (each its own
sequence) are decoded in the same llama_decode calls.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from specdiff.engine.base import Cancelled, EngineError
from specdiff.engine.llama.lane import ModelPool, context_params
from specdiff.engine.models import Progress, resolve_model
from specdiff.engine.runtime import clear_errors, last_error, llama
from specdiff.engine.topk import TopK
from specdiff.errors import PromptError
from specdiff.lanes import Lane
from specdiff.steps import Candidate, TokenStep


def _quiet(_: str) -> None:
    return None


@dataclass
class BatchedRun:
    """Sequence 0's steps, decoded next to `companions` other sequences."""

    companions: int
    steps: list[TokenStep] = field(default_factory=list)
    widths: list[int] = field(default_factory=list)
    """Rows in each generation decode call (1 + the companions still generating)."""
    seconds: float = 0.0

    @property
    def token_ids(self) -> list[int]:
        return [step.token_id for step in self.steps]


class BatchedLane:
    """A lane's model with a context holding up to 1 + max_companions sequences in one
    unified KV memory (as a server's shared cache does)."""

    def __init__(
        self,
        lane: Lane,
        max_companions: int,
        pool: ModelPool | None = None,
        progress: Progress = _quiet,
        cancel: threading.Event | None = None,
    ) -> None:
        if lane.speculation != "none" or lane.prefix != "fresh":
            raise PromptError(
                "repeat runs a plain lane (speculation=none, prefix=fresh); "
                "drop the speculation / prefix settings"
            )
        self.lane = lane
        self.cancel = cancel or threading.Event()
        self._own_pool = pool is None
        self.pool = pool or ModelPool()
        path = resolve_model(lane.model, lane.quant, lane.threads, progress)
        self.model = self.pool.get(path, lane.repack)
        self.sequences = 1 + max_companions
        lib = llama()
        # one KV memory for all sequences, as a server's shared cache: where a sequence's
        # cells land depends on its neighbours
        params = context_params(lane, self.sequences)
        clear_errors()
        self.pointer = lib.llama_init_from_model(self.model.pointer, params)
        if not self.pointer:
            reason = last_error() or "llama.cpp could not create it"
            self.close()
            raise EngineError(f"cannot create a context for {path.name}: {reason}")
        self.memory = lib.llama_get_memory(self.pointer)
        self.batch = lib.llama_batch_init(lane.n_batch, 0, self.sequences)
        self.topk = TopK(lane.top_k)
        self.model_path = path

    def tokenize(self, text: str) -> list[int]:
        return self.model.tokenize(text)

    def _decode(self, entries: Sequence[tuple[int, int, int]]) -> None:
        """One llama_decode call of (token, position, sequence) rows, logits on all."""
        if self.cancel.is_set():
            raise Cancelled("cancelled")
        batch = self.batch
        batch.n_tokens = len(entries)
        for i, (token, position, sequence) in enumerate(entries):
            batch.token[i] = token
            batch.pos[i] = position
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = sequence
            batch.logits[i] = True
        status = llama().llama_decode(self.pointer, batch)
        if status != 0:
            raise EngineError(
                f"llama_decode failed with status {status} "
                f"({last_error() or 'the KV memory may be too small: raise n_ctx'})"
            )

    def _row(self, index: int) -> np.ndarray:
        pointer = llama().llama_get_logits_ith(self.pointer, index)
        if not pointer:
            raise EngineError(f"llama.cpp has no logits for row {index}")
        return np.ctypeslib.as_array(pointer, shape=(self.model.n_vocab,))

    def run(
        self, prompt: Sequence[int], companions: Sequence[Sequence[int]], max_tokens: int
    ) -> BatchedRun:
        """Greedy decoding of `prompt` (sequence 0) with each companion prompt decoded in
        the same calls, prompts first, then one token per sequence per call."""
        if len(companions) >= self.sequences:
            raise PromptError(
                f"{len(companions)} companions, but the context holds {self.sequences - 1}"
            )
        prompts = [list(prompt), *[list(c) for c in companions]]
        if sum(len(p) for p in prompts) > self.lane.n_batch:
            raise PromptError(
                f"the prompt and its companions hold {sum(len(p) for p in prompts)} tokens; "
                f"they must fit one batch of n_batch={self.lane.n_batch}"
            )
        needed = sum(len(p) for p in prompts) + max_tokens * len(prompts)
        if needed > self.lane.n_ctx:
            raise PromptError(
                f"{len(prompts)} sequences of up to {max_tokens} tokens need {needed} KV "
                f"cells; n_ctx is {self.lane.n_ctx}: raise n_ctx or lower --max-tokens"
            )
        llama().llama_memory_clear(self.memory, True)
        outcome = BatchedRun(len(companions))
        began = time.perf_counter()
        entries = [
            (token, position, sequence)
            for sequence, tokens in enumerate(prompts)
            for position, token in enumerate(tokens)
        ]
        self._decode(entries)
        # each sequence's next token comes from the row of its last decoded token
        rows = {}
        offset = 0
        for sequence, tokens in enumerate(prompts):
            offset += len(tokens)
            rows[sequence] = offset - 1
        positions = {sequence: len(tokens) for sequence, tokens in enumerate(prompts)}
        model = self.model
        while True:
            entries = []
            for sequence, row_index in rows.items():
                row = self._row(row_index)
                if sequence == 0:
                    ids, logits = self.topk(row)
                    token = ids[0]
                    outcome.steps.append(
                        TokenStep(
                            lane="a",
                            index=len(outcome.steps),
                            token_id=token,
                            piece=model.piece(token),
                            top=tuple(
                                Candidate(i, v, model.piece(i)) for i, v in zip(ids, logits)
                            ),
                            drafted=False,
                            verify_width=len(rows),
                            timestamp=time.perf_counter(),
                        )
                    )
                    if model.is_end_of_generation(token) or len(outcome.steps) >= max_tokens:
                        outcome.seconds = time.perf_counter() - began
                        return outcome
                else:
                    token = int(row.argmax())
                    if model.is_end_of_generation(token):
                        continue  # this companion is done: the batch shrinks, as a server's
                entries.append((token, positions[sequence], sequence))
                positions[sequence] += 1
            outcome.widths.append(len(entries))
            self._decode(entries)
            rows = {sequence: i for i, (_, _, sequence) in enumerate(entries)}

    def close(self) -> None:
        lib = llama()
        if getattr(self, "batch", None) is not None:
            lib.llama_batch_free(self.batch)
            self.batch = None
        if getattr(self, "pointer", None):
            lib.llama_free(self.pointer)
            self.pointer = None
        if self._own_pool:
            self.pool.close()

    def __enter__(self) -> BatchedLane:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
