"""One prompt decoded alongside other sequences in the same batches.

A server decodes each request in a batch with whatever else is running; the batch's size
and the places its sequences take in a shared KV memory change which kernels run and in
which order their sums are added. `BatchedLane` reproduces that in-process: the prompt of
interest is sequence 0, decoded greedily while `companions` other prompts (each its own
sequence) are decoded in the same llama_decode calls.

`BatchedLane.run_continuous` batches the runs themselves, as a busy server does: up to
`1 + max_companions` runs of one prompt are in flight in the shared KV memory, and a run
that ends frees its sequence for the next run, which takes the prompt's cells (decoded
once) and decodes its tokens in the next calls beside the others' next tokens. A
thousand runs then cost about as many decode calls as tokens per run times runs divided
by the batch, not one call per token per run.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from specdiff.engine.llama.context import Context, ModelPool, Offload, Row
from specdiff.engine.llama.probe import trusted_repack
from specdiff.engine.models import Progress, resolve_model
from specdiff.engine.topk import TopK
from specdiff.errors import PromptError
from specdiff.lanes import Lane
from specdiff.steps import Candidate, TokenStep

MAX_SEQUENCES = 256
"""llama.cpp's LLAMA_MAX_SEQ: sequence ids one context can hold."""


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


RunEnded = Callable[[int, BatchedRun], None]
"""A run of `run_continuous` as it ends: its number (the order it entered) and its steps."""


@dataclass
class _InFlight:
    """One run decoding in `run_continuous`: its KV sequence and its next row."""

    number: int
    sequence: int
    run: BatchedRun
    position: int
    """Where its last decoded token sits: its next token goes one further."""
    token: int = -1
    """The token it decodes next (its last pick)."""
    began: float = field(default_factory=time.perf_counter)


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
        self.sequences = 1 + max_companions
        # run_continuous decodes its prompt once into one more sequence, whose cells every
        # run then shares (as a server's prompt cache does), unless every sequence id
        # llama.cpp allows is already a run's
        shares = 1 < self.sequences < MAX_SEQUENCES
        self._prefix_sequence = self.sequences if shares else None
        if self.sequences + shares > lane.n_ubatch:
            # llama.cpp asserts (and aborts the process) making such a context
            raise PromptError(
                f"{self.sequences} sequences in one context need n_ubatch of at least "
                f"{self.sequences + shares}; n_ubatch is {lane.n_ubatch}: raise n_ubatch "
                "(--lane n_ubatch=N) or lower --batch / --companions"
            )
        self.lane = lane
        self.cancel = cancel or threading.Event()
        self._own_pool = pool is None
        self.pool = pool or ModelPool()
        path = resolve_model(lane.model, lane.quant, lane.threads, progress)
        repack = trusted_repack("a", lane, path, progress)
        self.model = self.pool.get(path, repack.on, Offload.of(lane))
        # one KV memory for all sequences, as a server's shared cache: where a sequence's
        # cells land depends on its neighbours
        try:
            self.context = Context(self.model, lane, self.cancel, self.sequences + shares)
        except BaseException:
            if self._own_pool:
                self.pool.close()
            raise
        self.topk = TopK(lane.top_k)
        self.model_path = path

    def tokenize(self, text: str) -> list[int]:
        return self.model.tokenize(text)

    def run(
        self, prompt: Sequence[int], companions: Sequence[Sequence[int]], max_tokens: int
    ) -> BatchedRun:
        """Greedy decoding of `prompt` (sequence 0) with each companion prompt decoded in
        the same calls, prompts first, then one token per sequence per call."""
        prompts = [list(prompt), *[list(c) for c in companions]]
        self._check(prompts, max_tokens)
        context, model = self.context, self.model
        context.clear()
        outcome = BatchedRun(len(companions))
        began = time.perf_counter()
        entries: list[Row] = [
            (token, position, sequence)
            for sequence, tokens in enumerate(prompts)
            for position, token in enumerate(tokens)
        ]
        context.decode_rows(entries)
        # each sequence's next token comes from the row of its last decoded token
        ends = itertools.accumulate(len(tokens) for tokens in prompts)
        rows = {sequence: end - 1 for sequence, end in enumerate(ends)}
        positions = {sequence: len(tokens) for sequence, tokens in enumerate(prompts)}
        while True:
            entries = []
            for sequence, row_index in rows.items():
                row = context.row(row_index)
                if sequence == 0:
                    step = self._step(row, len(outcome.steps), len(rows))
                    outcome.steps.append(step)
                    token = step.token_id
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
            context.decode_rows(entries)
            rows = {sequence: i for i, (_, _, sequence) in enumerate(entries)}

    def run_continuous(
        self, prompt: Sequence[int], runs: int, max_tokens: int, on_end: RunEnded
    ) -> None:
        """`runs` greedy decodes of `prompt`, up to one per sequence at once, each
        handed to `on_end` as it ends. Runs enter a few per decode call (one, unless
        the batch outnumbers the steps of a run), so the runs stand at different steps
        and a run's neighbours change as others end.

        With a sequence id to spare, the prompt is decoded once, as a plain lane decodes
        it, and every run takes its cells and its first pick from that decode (as a
        server's prompt cache serves a prompt it has seen): the runs share the prompt
        and differ from their first generated row on, which each decodes beside the
        others. Without one (a batch of 1, or llama.cpp's 256 sequences) each run
        decodes the whole prompt in rows of its own."""
        entering = self._entering(max_tokens)
        self._check_continuous(len(prompt), max_tokens)
        context = self.context
        context.clear()
        prefix = self._shared_prompt(prompt)
        free = list(range(self.sequences - 1, -1, -1))
        flying: list[_InFlight] = []
        entered = 0

        def end(flight: _InFlight) -> None:
            context.drop_sequence(flight.sequence)
            free.append(flight.sequence)
            on_end(flight.number, flight.run)

        while flying or entered < runs:
            rows: list[Row] = [(f.token, f.position, f.sequence) for f in flying]
            wanted = [True] * len(rows)
            joining: list[_InFlight] = []
            for _ in range(min(len(free), runs - entered, entering)):
                newcomer = _InFlight(entered, free.pop(), BatchedRun(0), len(prompt) - 1)
                entered += 1
                if prefix is None:
                    rows += [(token, i, newcomer.sequence) for i, token in enumerate(prompt)]
                    wanted += [False] * (len(prompt) - 1) + [True]
                    flying.append(newcomer)
                    continue
                shared, first_row = prefix
                context.share_prefix(shared, newcomer.sequence, len(prompt))
                if self._advance(newcomer, first_row, 1, max_tokens):
                    end(newcomer)  # a one-token run, or one the prompt's pick ends
                else:
                    joining.append(newcomer)  # its first pick is a row of the next call
            if rows:
                self._decode_flying(rows, wanted, flying, max_tokens, end)
            flying += joining

    def _shared_prompt(self, prompt: Sequence[int]) -> tuple[int, np.ndarray] | None:
        """The sequence holding the decoded prompt, and the logits its last token gave;
        None without a sequence to spare (each run then decodes the prompt itself)."""
        if self._prefix_sequence is None:
            return None
        self.context.decode_chunks(prompt, 0, self._prefix_sequence)
        # copied: the next decode overwrites llama.cpp's
        return self._prefix_sequence, np.array(self.context.row(-1))

    def _decode_flying(
        self,
        rows: list[Row],
        wanted: list[bool],
        flying: list[_InFlight],
        max_tokens: int,
        end: Callable[[_InFlight], None],
    ) -> None:
        """Decode one call's rows and advance each run in flight by its row; a run that
        has ended leaves `flying` and goes to `end`, in turn."""
        self.context.decode_rows(rows, wanted)
        # the rows that asked for logits: one per run, a newcomer's at its prompt's end
        outputs = [index for index, flag in enumerate(wanted) if flag]
        width = len(flying)
        for output, flight in zip(outputs, list(flying)):
            if self._advance(flight, self.context.row(output), width, max_tokens):
                flying.remove(flight)
                end(flight)

    def _advance(self, flight: _InFlight, row: np.ndarray, width: int, max_tokens: int) -> bool:
        """Take a run's next step from its logits row; True when the run has ended."""
        run = flight.run
        step = self._step(row, len(run.steps), width)
        run.steps.append(step)
        run.widths.append(width)
        run.companions = max(run.companions, width - 1)
        if self.model.is_end_of_generation(step.token_id) or len(run.steps) >= max_tokens:
            run.seconds = time.perf_counter() - flight.began
            return True
        flight.token = step.token_id
        flight.position += 1
        return False

    def _entering(self, max_tokens: int) -> int:
        """Runs that enter in one call: as many as end per call once the batch is full
        (a run lasts up to max_tokens calls), so the batch stays full."""
        return -(-self.sequences // max_tokens)

    def _check_continuous(self, prompt_tokens: int, max_tokens: int) -> None:
        """Every run in flight must have its KV cells, and a call its rows."""
        entering = self._entering(max_tokens)
        if self._prefix_sequence is not None:
            # each call holds one row per run in flight; the prompt's cells are shared
            rows, needed = self.sequences, prompt_tokens + self.sequences * max_tokens
            crowd = f"{self.sequences} runs in flight"
        else:
            rows = entering * prompt_tokens + self.sequences - entering
            needed = self.sequences * (prompt_tokens + max_tokens)
            crowd = (
                f"{entering} prompts of {prompt_tokens} tokens beside "
                f"{self.sequences - entering} runs"
            )
        if rows > self.lane.n_batch:
            raise PromptError(
                f"{crowd} need {rows} rows in one batch; "
                f"n_batch is {self.lane.n_batch}: raise n_batch or lower --batch"
            )
        if needed > self.lane.n_ctx:
            raise PromptError(
                f"{self.sequences} runs in flight of up to {prompt_tokens} + {max_tokens} "
                f"tokens need {needed} KV cells; n_ctx is {self.lane.n_ctx}: raise n_ctx "
                "(--lane n_ctx=N) or lower --batch or --max-tokens"
            )

    def _check(self, prompts: list[list[int]], max_tokens: int) -> None:
        """The sequences must fit the context: one batch for the prompts, and a KV cell
        for every token."""
        if len(prompts) > self.sequences:
            raise PromptError(
                f"{len(prompts) - 1} companions, but the context holds {self.sequences - 1}"
            )
        prompt_tokens = sum(len(p) for p in prompts)
        if prompt_tokens > self.lane.n_batch:
            raise PromptError(
                f"the prompt and its companions hold {prompt_tokens} tokens; "
                f"they must fit one batch of n_batch={self.lane.n_batch}"
            )
        needed = prompt_tokens + max_tokens * len(prompts)
        if needed > self.lane.n_ctx:
            raise PromptError(
                f"{len(prompts)} sequences of up to {max_tokens} tokens need {needed} KV "
                f"cells; n_ctx is {self.lane.n_ctx}: raise n_ctx or lower --max-tokens"
            )

    def _step(self, row: np.ndarray, index: int, width: int) -> TokenStep:
        ids, logits = self.topk(row)
        piece = self.model.piece
        return TokenStep(
            lane="a",
            index=index,
            token_id=ids[0],
            piece=piece(ids[0]),
            top=tuple(Candidate(i, v, piece(i)) for i, v in zip(ids, logits)),
            drafted=False,
            verify_width=width,
            timestamp=time.perf_counter(),
        )

    def close(self) -> None:
        self.context.close()
        if self._own_pool:
            self.pool.close()

    def __enter__(self) -> BatchedLane:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
