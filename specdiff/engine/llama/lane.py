"""The in-process backend: its own greedy decode loop on llama.cpp's low-level API.

Not ``llama_cpp.Llama.generate``: with a draft model it needs ``logits_all``, an
``n_ctx x n_vocab`` float32 buffer (2 GiB per lane for Gemma 3 at n_ctx 2048); it
gives no per-step batch width, no draft/accept record and no rollback check. Here
logits are requested only on the rows that are read, each decode call's width is
recorded, and every KV removal's return value is checked.

The loop for one lane:
- prompt: decoded in chunks of n_batch, logits on each chunk's last row (as
  ``Llama.eval`` does); in prefix-cached mode the prefix is decoded in a call of
  its own first, as an earlier turn of a conversation would have;
- plain step: decode the last token alone, read its row;
- speculative step: decode ``[last, d1..dk]`` in one batch with logits on every row,
  accept drafts while the row's argmax equals the next draft (or, under
  ``spec_accept=lenient:DELTA``, while the draft's logit is within DELTA of the row's
  maximum), emit the target's own token at the first mismatch (or after all), and
  remove the rejected positions from the KV memory.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence

from specdiff.chat import messages_of
from specdiff.engine.base import ChatPrompt, Generation, Prompt, Steps
from specdiff.engine.llama.context import (
    AppliedSettings,
    Context,
    ModelPool,
    Offload,
    PooledLane,
)
from specdiff.engine.llama.drafts import Verification, make_drafter
from specdiff.engine.llama.probe import trusted_repack
from specdiff.engine.llama.templates import ChatTemplate
from specdiff.engine.models import Progress, resolve_model, sha256_file
from specdiff.engine.topk import TopK, logsumexp, rank_of
from specdiff.errors import PromptError
from specdiff.lanes import Lane, LaneId
from specdiff.steps import Candidate, Probe, TokenStep


def _quiet(_: str) -> None:
    return None


class _StopText:
    """The text generated so far, searched for stop strings near its end."""

    def __init__(self, stop: Sequence[bytes]) -> None:
        self.stop = list(stop)
        self.reach = max((len(s) for s in stop), default=0) + 64
        self.text = bytearray()

    def add(self, piece: bytes) -> bool:
        """Append a step's bytes; True once a stop string has appeared."""
        if not self.stop:
            return False
        self.text += piece
        tail = bytes(self.text[-self.reach :])
        return any(s in tail for s in self.stop)


class _LocalTable(AppliedSettings):
    model_path: str
    model_sha256: str
    model_size: int
    quantization: str
    architecture: str
    repack_choice: str


class LocalExecuted(_LocalTable, total=False):
    """An in-process lane's executed table: its model, its context's settings as
    applied, and its chat template and draft model where it has them."""

    spec_accept: str
    chat_template: str
    chat_prompt: ChatPrompt
    draft_model_path: str
    draft_model_sha256: str


class LocalLane(PooledLane):
    """One lane of the in-process engine: a model, a context, and a decode loop."""

    def __init__(
        self,
        lane: Lane,
        lane_id: LaneId = "a",
        pool: ModelPool | None = None,
        progress: Progress = _quiet,
        cancel: threading.Event | None = None,
    ) -> None:
        super().__init__(lane, lane_id, pool, cancel)
        self.model_path = resolve_model(lane.model, lane.quant, lane.threads, progress)
        self.repack = trusted_repack(lane_id, lane, self.model_path, progress)
        self.model = self.pool.get(self.model_path, self.repack.on, Offload.of(lane))
        self.chat = ChatTemplate(self.model.pointer, lane.chat, lane_id) if lane.chat else None
        self.chat_prompt: ChatPrompt | None = None
        """A chat lane's last formatted prompt: its text and token ids."""
        self.context = Context(self.model, lane, self.cancel)
        try:
            self.drafter, self.draft_path = make_drafter(
                lane, self.model_path, self.pool, self.cancel, progress
            )
        except BaseException:
            self.context.close()  # the lane never existed: free its KV memory now
            raise
        self.topk = TopK(lane.top_k)
        self.verification = Verification(lane.accept_tolerance)
        self.generation = Generation()
        self._rows: dict[int, int] = {}
        """Step index -> the output row of the last decode that holds its logits."""

    # -- what a session or report needs to know about this lane ------------------------
    def executed(self) -> LocalExecuted:
        record: LocalExecuted = {
            "model_path": str(self.model_path),
            "model_sha256": self.model.sha256,
            "model_size": self.model.info.file_size,
            "quantization": self.model.info.quantization,
            "architecture": self.model.info.architecture,
            **self.context.executed,
            "repack_choice": self.repack.note,
        }
        if self.drafter is not None:
            record["spec_accept"] = self.lane.spec_accept
        if self.chat is not None:
            record["chat_template"] = self.chat.name
        if self.chat_prompt is not None:
            record["chat_prompt"] = self.chat_prompt.copy()
        if self.draft_path is not None:
            record["draft_model_path"] = str(self.draft_path)
            record["draft_model_sha256"] = sha256_file(self.draft_path)
        return record

    def vocab_digest(self) -> str:
        return self.model.info.vocab_digest

    def tokens_per_second(self, steps: Sequence[TokenStep]) -> float | None:
        return None  # the decode loop runs in the caller's thread: timing it is exact

    def tokenize(self, text: str) -> list[int]:
        """The prompt's token ids: a chat lane's after its template formats the
        conversation (a plain prompt as the one user message), which it keeps."""
        if self.chat is None:
            return self.model.tokenize(text)
        formatted = self.chat.render(messages_of(text))
        tokens = self.model.tokenize(formatted)
        self.chat_prompt = {"text": formatted, "token_ids": tokens}
        return tokens

    def check(self, tokens: Sequence[int], max_tokens: int) -> None:
        if max_tokens < 1:
            raise PromptError(f"--max-tokens must be at least 1, got {max_tokens}")
        if not tokens:
            raise PromptError("the prompt is empty; give some text")
        n_ctx = self.lane.n_ctx
        if len(tokens) >= n_ctx:
            raise PromptError(
                f"the prompt is {len(tokens)} tokens, longer than lane {self.lane_id}'s n_ctx "
                f"({n_ctx}); shorten it or raise n_ctx (--both n_ctx={len(tokens) + max_tokens})"
            )
        if len(tokens) + max_tokens > n_ctx:
            raise PromptError(
                f"the prompt ({len(tokens)} tokens) plus --max-tokens {max_tokens} does not fit "
                f"lane {self.lane_id}'s n_ctx ({n_ctx}); lower --max-tokens or raise n_ctx"
            )
        if self.lane.prefix == "cached":
            self.prefix_length(tokens)

    def prefix_length(self, prompt: Sequence[int]) -> int:
        """How many prompt tokens the earlier call decodes in prefix-cached mode."""
        lane = self.lane
        if lane.prefix_text:
            prefix = self.model.tokenize(lane.prefix_text)
            if list(prompt[: len(prefix)]) != prefix:
                raise PromptError(
                    "prefix_text does not tokenize as a prefix of the prompt; "
                    "use prefix_tokens or a prefix that ends on a token boundary"
                )
            count = len(prefix)
        elif lane.prefix_tokens:
            count = lane.prefix_tokens
        else:
            count = len(prompt) // 2
        if not 1 <= count < len(prompt):
            raise PromptError(
                f"a cached prefix of {count} tokens needs a prompt longer than that "
                f"(it is {len(prompt)} tokens); lengthen the prompt or lower prefix_tokens"
            )
        return count

    # -- the decode loop --------------------------------------------------------------
    def generate(
        self,
        prompt: Sequence[int],
        max_tokens: int,
        stop: Sequence[bytes] = (),
        forced: Sequence[int] | None = None,
    ) -> Steps:
        """Greedy decoding of `prompt`, one TokenStep per generated token.

        With `forced` (teacher forcing) the lane continues with those tokens instead of
        its own picks, so each step's distribution is computed on another lane's text:
        a step's `token_id` is the forced token, `top[0]` is still this lane's argmax,
        and a forced token outside the top-k comes with a probe (its logit and rank).
        The lane stops where `forced` ends.

        A Prompt is tokenized again from its text, so that each lane of a pair decodes
        the prompt as its own settings format it (one lane chat, the other raw text)."""
        if isinstance(prompt, Prompt):
            prompt = self.tokenize(prompt.text)
        self.check(prompt, max_tokens)
        self.generation = Generation(prompt_tokens=len(prompt))
        self.context.clear()
        if self.drafter is not None:
            self.drafter.reset()
        if forced is not None:
            max_tokens = min(max_tokens, len(forced))
            if max_tokens < 1:
                return
        width = self._decode_prompt(prompt)
        yield from self._decode_loop(list(prompt), width, max_tokens, _StopText(stop), forced)

    def _decode_prompt(self, prompt: Sequence[int]) -> int:
        """Decode the prompt (in prefix-cached mode the prefix first, in a call of its
        own, as an earlier turn would have); returns the last decode call's width."""
        context = self.context
        if self.lane.prefix != "cached":
            return context.decode_chunks(prompt, 0)
        cached = self.prefix_length(prompt)
        self.generation.prefix_tokens = cached
        context.decode_chunks(prompt[:cached], 0)
        return context.decode_chunks(prompt[cached:], cached)

    def _decode_loop(
        self,
        history: list[int],
        width: int,
        max_tokens: int,
        stop: _StopText,
        forced: Sequence[int] | None,
    ) -> Iterator[TokenStep]:
        """Emit a step per row of the last decode while its drafts are accepted, then
        decode the next batch: the last token alone, or with drafts to verify."""
        context, drafter, generation = self.context, self.drafter, self.generation
        n_past = len(history)  # tokens in the KV memory
        emitted = 0
        rows = [-1]  # output rows of the last decode to read, in order
        drafts: list[int] = []
        batch_length = 0  # 0: the rows come from the prompt decode
        while True:
            self._rows = {}
            accepted = 0
            for position, row_index in enumerate(rows):
                draft = drafts[position] if position < len(drafts) else None
                step = self._read_step(row_index, emitted, width, forced, draft)
                history.append(step.token_id)
                emitted += 1
                if step.drafted:
                    generation.accepted += 1
                yield step
                reason = self._stop_reason(step, emitted, max_tokens, stop)
                if reason:
                    generation.stop_reason = reason
                    return
                if not step.drafted:
                    break
                accepted += 1
            if batch_length:
                # The KV memory holds [last, d1..dk]: keep last and the accepted drafts.
                kept = 1 + accepted
                if kept < batch_length:
                    context.remove_from(n_past + kept)
                n_past += kept
            if drafter is not None and drafts:
                drafter.feedback(len(drafts), accepted)
            # drafts past the token budget would be thrown away
            drafts = self._propose(history, max_tokens - emitted - 1, n_past)
            batch = [history[-1], *drafts]
            context.decode(batch, n_past, all_logits=bool(drafts))
            batch_length = width = len(batch)
            rows = list(range(batch_length)) if drafts else [-1]

    def _read_step(
        self,
        row_index: int,
        index: int,
        width: int,
        forced: Sequence[int] | None,
        draft: int | None,
    ) -> TokenStep:
        """Step `index` from output row `row_index`: the lane's pick (or the forced
        token) with the top-k; `draft` is the token drafted for this row, if any."""
        row = self.context.row(row_index)
        ids, logits = self.topk(row)
        token = self.verification.pick(row, ids[0], draft) if forced is None else forced[index]
        probes: tuple[Probe, ...] = ()
        if token not in ids:
            logit, rank = rank_of(row, token)
            probes = (Probe(token, logit, rank),)
        self._rows[index] = row_index
        piece = self.model.piece
        return TokenStep(
            lane=self.lane_id,
            index=index,
            token_id=token,
            piece=piece(token),
            top=tuple(Candidate(i, v, piece(i)) for i, v in zip(ids, logits)),
            drafted=draft == token,
            verify_width=width,
            timestamp=time.perf_counter(),
            probes=probes,
        )

    def _propose(self, history: list[int], budget: int, n_past: int) -> list[int]:
        """Drafts to verify with the next decode, within the budget, the context and
        one llama_decode call (at most n_batch tokens)."""
        drafter = self.drafter
        room = min(budget, self.lane.n_ctx - n_past - 1, self.lane.n_batch - 1)
        drafts = drafter.propose(history, room) if drafter is not None and room > 0 else []
        if drafts:
            self.generation.drafted += len(drafts)
            self.generation.verify_calls += 1
        return drafts

    def _stop_reason(self, step: TokenStep, emitted: int, max_tokens: int, stop: _StopText) -> str:
        if self.model.is_end_of_generation(step.token_id):
            return "eos"
        if stop.add(step.piece):
            return "stop"
        if emitted >= max_tokens:
            return "length"
        return ""

    def probe(self, index: int, token_ids: Sequence[int]) -> tuple[Probe, ...]:
        """Logit and full-vocabulary rank of tokens at step `index`, if that step's logits
        are still in the context (the most recent decode)."""
        row_index = self._rows.get(index)
        if row_index is None:
            return ()
        row = self.context.row(row_index)
        probes = []
        for token_id in token_ids:
            if 0 <= token_id < row.shape[0]:
                logit, rank = rank_of(row, token_id)
                probes.append(Probe(token_id, logit, rank))
        return tuple(probes)

    def output_row(self, index: int) -> int | None:
        """The output row of the last decode that holds step `index`'s logits (-1 = its
        last row), or None once a later decode has replaced them."""
        return self._rows.get(index)

    def normalizer(self, index: int) -> float | None:
        """logsumexp of step `index`'s logits, if they are still in the context."""
        row_index = self._rows.get(index)
        if row_index is None:
            return None
        return logsumexp(self.context.row(row_index))

    def close(self) -> None:
        if self.drafter is not None:
            self.drafter.close()
        self.context.close()
        self._close_pool()
