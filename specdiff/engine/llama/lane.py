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
  accept drafts while the row's argmax equals the next draft, emit the target's own
  token at the first mismatch (or after all), and remove the rejected positions
  from the KV memory.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from specdiff.engine.base import Cancelled, EngineError, Generation
from specdiff.engine.gguf import GGUFInfo, read_gguf
from specdiff.engine.llama.drafts import Drafter, ModelDrafter, NgramDrafter
from specdiff.engine.models import Progress, resolve_model, sha256_file
from specdiff.engine.runtime import clear_errors, last_error, llama
from specdiff.engine.topk import TopK, logsumexp, rank_of
from specdiff.errors import ModelError, PromptError
from specdiff.lanes import Lane
from specdiff.steps import Candidate, Probe, TokenStep

_KV_TYPES = {
    "f32": 0,
    "f16": 1,
    "q4_0": 2,
    "q4_1": 3,
    "q5_0": 6,
    "q5_1": 7,
    "q8_0": 8,
    "iq4_nl": 20,
    "bf16": 30,
}
_FLASH_ATTN = {"auto": -1, "off": 0, "on": 1}


def _quiet(_: str) -> None:
    return None


class LoadedModel:
    """One llama_model in memory, shared by every lane that uses the same file."""

    def __init__(self, path: Path, repack: bool) -> None:
        self.path = path
        self.repack = repack
        self.info: GGUFInfo = read_gguf(path)
        lib = llama()
        params = lib.llama_model_default_params()
        params.n_gpu_layers = 0
        params.use_extra_bufts = repack
        clear_errors()
        pointer = lib.llama_model_load_from_file(str(path).encode(), params)
        if not pointer:
            reason = last_error() or "llama.cpp could not load it"
            raise ModelError(f"cannot load model {path}: {reason}")
        self.pointer = pointer
        self.vocab = lib.llama_model_get_vocab(pointer)
        self.n_vocab = int(lib.llama_vocab_n_tokens(self.vocab))
        self._pieces: dict[int, bytes] = {}
        self._sha256: str | None = None

    @property
    def sha256(self) -> str:
        if self._sha256 is None:
            self._sha256 = sha256_file(self.path)
        return self._sha256

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        """Token ids of `text`; `add_special` puts the BOS token first, as for a prompt."""
        lib = llama()
        data = text.encode("utf-8")
        capacity = len(data) + 8
        buffer = (lib.llama_token * capacity)()
        count = lib.llama_tokenize(
            self.vocab, data, len(data), buffer, capacity, add_special, True
        )
        if count < 0:
            capacity = -count
            buffer = (lib.llama_token * capacity)()
            count = lib.llama_tokenize(
                self.vocab, data, len(data), buffer, capacity, add_special, True
            )
        if count < 0:
            raise EngineError(f"tokenization failed ({count})")
        return list(buffer[:count])

    def piece(self, token_id: int) -> bytes:
        cached = self._pieces.get(token_id)
        if cached is not None:
            return cached
        lib = llama()
        buffer = ctypes.create_string_buffer(64)
        length = lib.llama_token_to_piece(self.vocab, token_id, buffer, 64, 0, True)
        if length < 0:
            buffer = ctypes.create_string_buffer(-length)
            length = lib.llama_token_to_piece(self.vocab, token_id, buffer, -length, 0, True)
        value = buffer.raw[: max(length, 0)]
        self._pieces[token_id] = value
        return value

    def is_end_of_generation(self, token_id: int) -> bool:
        return bool(llama().llama_vocab_is_eog(self.vocab, token_id))

    def close(self) -> None:
        if self.pointer:
            llama().llama_model_free(self.pointer)
            self.pointer = None


class ModelPool:
    """Loads each (file, repack) once; lanes of a pair share the weights, not the KV."""

    def __init__(self) -> None:
        self._models: dict[tuple[Path, bool], LoadedModel] = {}

    def get(self, path: Path, repack: bool) -> LoadedModel:
        key = (path.resolve(), repack)
        model = self._models.get(key)
        if model is None:
            model = LoadedModel(key[0], repack)
            self._models[key] = model
        return model

    def close(self) -> None:
        for model in self._models.values():
            model.close()
        self._models.clear()


def context_params(lane: Lane, sequences: int = 1) -> Any:
    """llama_context_params for a lane; several sequences share one KV memory."""
    params = llama().llama_context_default_params()
    params.n_ctx = lane.n_ctx
    params.n_batch = lane.n_batch
    params.n_ubatch = lane.n_ubatch
    params.n_seq_max = sequences
    params.kv_unified = sequences > 1
    params.n_threads = lane.threads
    params.n_threads_batch = lane.threads_batch or lane.threads
    params.flash_attn_type = _FLASH_ATTN[lane.flash_attn]
    params.type_k = _KV_TYPES[lane.type_k]
    params.type_v = _KV_TYPES[lane.type_v]
    params.no_perf = True
    return params


class Context:
    """A llama_context with one reusable batch; decode calls report their failures."""

    def __init__(self, model: LoadedModel, lane: Lane, cancel: threading.Event) -> None:
        lib = llama()
        self.model = model
        self.lane = lane
        params = context_params(lane)
        # Stops a long prompt decode between graph nodes when the user cancels. Installed
        # only around prompt decodes: llama.cpp calls it once per graph node (~450 per
        # token here) and each call takes the GIL, which a UI thread would then contend for.
        self._abort = lib.ggml_abort_callback(lambda _data: cancel.is_set())
        self._no_abort = lib.ggml_abort_callback()
        clear_errors()
        pointer = lib.llama_init_from_model(model.pointer, params)
        if not pointer:
            reason = last_error() or "llama.cpp could not create it"
            raise EngineError(f"cannot create a context for {model.path.name}: {reason}")
        self.pointer = pointer
        self.memory = lib.llama_get_memory(pointer)
        self.batch = lib.llama_batch_init(lane.n_batch, 0, 1)
        self.n_vocab = model.n_vocab
        self.cancel = cancel
        self.executed = {
            "n_ctx": int(lib.llama_n_ctx(pointer)),
            "n_batch": int(lib.llama_n_batch(pointer)),
            "n_ubatch": int(lib.llama_n_ubatch(pointer)),
            "threads": int(lib.llama_n_threads(pointer)),
            "threads_batch": int(lib.llama_n_threads_batch(pointer)),
            "flash_attn": lane.flash_attn,
            "type_k": lane.type_k,
            "type_v": lane.type_v,
            "repack": model.repack,
        }

    def clear(self) -> None:
        llama().llama_memory_clear(self.memory, True)

    def remove_from(self, position: int) -> None:
        """Drop every KV entry at `position` and after; llama.cpp may refuse, so check."""
        if not llama().llama_memory_seq_rm(self.memory, 0, position, -1):
            raise EngineError(
                f"llama.cpp could not remove KV positions from {position} on "
                "(partial removal unsupported for this model's memory)"
            )

    def decode(self, tokens: Sequence[int], start: int, all_logits: bool) -> None:
        """Decode tokens at positions start.. in one call; logits on the last row, or on
        every row."""
        if self.cancel.is_set():
            raise Cancelled("cancelled")
        count = len(tokens)
        batch = self.batch
        batch.n_tokens = count
        for i, token in enumerate(tokens):
            batch.token[i] = token
            batch.pos[i] = start + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = all_logits
        batch.logits[count - 1] = True
        status = llama().llama_decode(self.pointer, batch)
        if status == 2 and self.cancel.is_set():
            raise Cancelled("cancelled")
        if status != 0:
            raise EngineError(
                f"llama_decode failed with status {status} at position {start} "
                f"({last_error() or 'no reason given'})"
            )

    def decode_chunks(self, tokens: Sequence[int], start: int) -> int:
        """Decode a long sequence in n_batch chunks (cancellable inside a chunk); returns
        the last chunk's width."""
        lib = llama()
        width = 0
        lib.llama_set_abort_callback(self.pointer, self._abort, None)
        try:
            for offset in range(0, len(tokens), self.lane.n_batch):
                chunk = tokens[offset : offset + self.lane.n_batch]
                self.decode(chunk, start + offset, all_logits=False)
                width = len(chunk)
        finally:
            lib.llama_set_abort_callback(self.pointer, self._no_abort, None)
        return width

    def row(self, index: int) -> np.ndarray:
        """Logits of output row `index` of the last decode (-1 = the last), a view."""
        pointer = llama().llama_get_logits_ith(self.pointer, index)
        if not pointer:
            raise EngineError(f"llama.cpp has no logits for row {index}")
        return np.ctypeslib.as_array(pointer, shape=(self.n_vocab,))

    def close(self) -> None:
        lib = llama()
        if self.batch is not None:
            lib.llama_batch_free(self.batch)
            self.batch = None
        if self.pointer:
            lib.llama_free(self.pointer)
            self.pointer = None


class LocalLane:
    """One lane of the in-process engine: a model, a context, and a decode loop."""

    def __init__(
        self,
        lane: Lane,
        lane_id: str = "a",
        pool: ModelPool | None = None,
        progress: Progress = _quiet,
        cancel: threading.Event | None = None,
    ) -> None:
        self.lane = lane
        self.lane_id = lane_id
        self.cancel = cancel or threading.Event()
        self._own_pool = pool is None
        self.pool = pool or ModelPool()
        self.model_path = resolve_model(lane.model, lane.quant, lane.threads, progress)
        self.model = self.pool.get(self.model_path, lane.repack)
        self.context = Context(self.model, lane, self.cancel)
        self.drafter: Drafter | None = None
        self.draft_path: Path | None = None
        try:
            self._make_drafter(lane, progress)
        except BaseException:
            self.context.close()  # the lane never existed: free its KV memory now
            raise
        self.topk = TopK(lane.top_k)
        self.generation = Generation()
        self._rows: dict[int, int] = {}

    def _make_drafter(self, lane: Lane, progress: Progress) -> None:
        if lane.speculation == "ngram":
            self.drafter = NgramDrafter(
                lane.spec_ngram,
                lane.spec_ngram_min,
                lane.spec_drafts,
                lane.spec_adaptive,
                lane.spec_align,
            )
        elif lane.speculation == "draft":
            self.draft_path = (
                resolve_model(lane.draft_model, "", lane.threads, progress)
                if lane.draft_model
                else self.model_path
            )
            draft_info = read_gguf(self.draft_path)
            check_same_vocabulary(self.model.info, draft_info)
            draft_model = self.pool.get(self.draft_path, lane.repack)
            self.drafter = ModelDrafter(
                Context(draft_model, lane, self.cancel),
                lane.spec_drafts,
                lane.spec_adaptive,
                lane.spec_align,
            )

    # -- what a session or report needs to know about this lane ------------------------
    def executed(self) -> dict[str, Any]:
        record: dict[str, Any] = {
            "model_path": str(self.model_path),
            "model_sha256": self.model.sha256,
            "model_size": self.model.info.file_size,
            "quantization": self.model.info.quantization,
            "architecture": self.model.info.architecture,
            **self.context.executed,
        }
        if self.draft_path is not None:
            record["draft_model_path"] = str(self.draft_path)
            record["draft_model_sha256"] = sha256_file(self.draft_path)
        return record

    def tokenize(self, text: str) -> list[int]:
        return self.model.tokenize(text)

    def check_prompt(self, prompt: Sequence[int], max_tokens: int) -> None:
        n_ctx = self.lane.n_ctx
        if len(prompt) >= n_ctx:
            raise PromptError(
                f"the prompt is {len(prompt)} tokens, longer than lane {self.lane_id}'s n_ctx "
                f"({n_ctx}); shorten it or raise n_ctx (--both n_ctx={len(prompt) + max_tokens})"
            )
        if len(prompt) + max_tokens > n_ctx:
            raise PromptError(
                f"the prompt ({len(prompt)} tokens) plus --max-tokens {max_tokens} does not fit "
                f"lane {self.lane_id}'s n_ctx ({n_ctx}); lower --max-tokens or raise n_ctx"
            )

    def prefix_length(self, prompt: Sequence[int]) -> int:
        """How many prompt tokens the earlier call decodes in prefix-cached mode."""
        lane = self.lane
        if lane.prefix_text:
            prefix = self.tokenize(lane.prefix_text)
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
    ) -> Iterator[TokenStep]:
        """Greedy decoding of `prompt`, one TokenStep per generated token.

        With `forced` (teacher forcing) the lane continues with those tokens instead of
        its own picks, so each step's distribution is computed on another lane's text:
        a step's `token_id` is the forced token, `top[0]` is still this lane's argmax,
        and a forced token outside the top-k comes with a probe (its logit and rank).
        The lane stops where `forced` ends."""
        if max_tokens < 1:
            raise PromptError(f"--max-tokens must be at least 1, got {max_tokens}")
        if not prompt:
            raise PromptError("the prompt is empty; give some text")
        self.check_prompt(prompt, max_tokens)
        context = self.context
        drafter = self.drafter
        generation = self.generation = Generation(prompt_tokens=len(prompt))
        context.clear()
        if drafter is not None:
            drafter.reset()

        if forced is not None:
            max_tokens = min(max_tokens, len(forced))
            if max_tokens < 1:
                return
        if self.lane.prefix == "cached":
            cached = self.prefix_length(prompt)
            generation.prefix_tokens = cached
            context.decode_chunks(prompt[:cached], 0)
            width = context.decode_chunks(prompt[cached:], cached)
        else:
            width = context.decode_chunks(prompt, 0)
        history = list(prompt)
        n_past = len(prompt)  # tokens in the KV memory
        text = bytearray()
        max_stop = max((len(s) for s in stop), default=0)
        emitted = 0
        rows = [-1]  # output rows of the last decode to read, in order
        drafts: list[int] = []
        batch_length = 0  # 0: the rows come from the prompt decode
        piece = self.model.piece

        while True:
            self._rows = {}
            accepted = 0
            for position, row_index in enumerate(rows):
                row = context.row(row_index)
                ids, logits = self.topk(row)
                token = ids[0] if forced is None else forced[emitted]
                drafted = position < len(drafts) and drafts[position] == token
                probes: tuple[Probe, ...] = ()
                if token not in ids:
                    logit, rank = rank_of(row, token)
                    probes = (Probe(token, logit, rank),)
                step = TokenStep(
                    lane=self.lane_id,
                    index=emitted,
                    token_id=token,
                    piece=piece(token),
                    top=tuple(Candidate(i, v, piece(i)) for i, v in zip(ids, logits)),
                    drafted=drafted,
                    verify_width=width,
                    timestamp=time.perf_counter(),
                    probes=probes,
                )
                self._rows[emitted] = row_index
                history.append(token)
                text += step.piece
                emitted += 1
                if drafted:
                    generation.accepted += 1
                yield step
                reason = self._stop_reason(token, emitted, max_tokens, text, stop, max_stop)
                if reason:
                    generation.stop_reason = reason
                    return
                if not drafted:
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

            room = min(
                max_tokens - emitted - 1,  # drafts past the budget would be thrown away
                self.lane.n_ctx - n_past - 1,
                self.lane.n_batch - 1,  # one llama_decode call holds at most n_batch tokens
            )
            drafts = drafter.propose(history, room) if drafter is not None and room > 0 else []
            if drafts:
                generation.drafted += len(drafts)
                generation.verify_calls += 1
            batch = [history[-1], *drafts]
            context.decode(batch, n_past, all_logits=bool(drafts))
            batch_length = width = len(batch)
            rows = list(range(batch_length)) if drafts else [-1]

    def _stop_reason(
        self,
        token: int,
        emitted: int,
        max_tokens: int,
        text: bytearray,
        stop: Sequence[bytes],
        max_stop: int,
    ) -> str:
        if self.model.is_end_of_generation(token):
            return "eos"
        if stop:
            tail = bytes(text[-(max_stop + 64) :])
            if any(s in tail for s in stop):
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
        if self._own_pool:
            self.pool.close()


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
