"""Thin wrappers over llama.cpp's model and context handles.

Each wrapper registers a handle's free call the moment the handle exists, so one
``close()`` (an ExitStack, as llama-cpp-python's ``_internals`` does) releases whatever
was made, in reverse order, also when construction failed halfway.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import numpy as np

from specdiff.engine.base import Cancelled, EngineError, LaneCapabilities
from specdiff.engine.gguf import GGUFInfo, read_gguf
from specdiff.engine.models import sha256_file
from specdiff.engine.runtime import (
    backend_devices,
    check_offload,
    clear_errors,
    last_error,
    llama,
    supports_gpu_offload,
    take_offloaded,
)
from specdiff.errors import ModelError
from specdiff.lanes import Lane, LaneId


class Placement(TypedDict):
    """Where a model's layers went, as a lane's executed table records it."""

    gpu_layers: int
    main_gpu: int
    split_mode: str
    gpu_offload: bool
    layers_offloaded: int
    layers_total: int
    devices: list[dict[str, Any]]


class AppliedSettings(Placement):
    """A context's settings as llama.cpp applied them (it may round n_ctx or n_ubatch),
    and where its model's layers went."""

    n_ctx: int
    n_batch: int
    n_ubatch: int
    threads: int
    threads_batch: int
    flash_attn: str
    type_k: str
    type_v: str
    repack: bool


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
_SPLIT_MODES = {"none": 0, "layer": 1, "row": 2}
"""enum llama_split_mode, in llama.h."""

Row = tuple[int, int, int]
"""One batch row: (token, position, sequence)."""


@dataclass(frozen=True)
class RepackChoice:
    """Whether a lane's model runs with llama.cpp's repacked CPU kernels, and why: the
    note goes into the lane's executed record, since the numerics differ."""

    on: bool
    note: str


_DECIDED: dict[tuple[Path, str, int], RepackChoice] = {}
"""Choices a kernel probe made in this process, by (model file, lane's repack, n_ubatch)."""


@dataclass(frozen=True)
class Offload:
    """Where a model's layers go: how many to the GPUs (-1 = all), which GPU leads, and
    how several GPUs share them. Part of what identifies a loaded model, since the same
    file offloaded and not computes with other kernels."""

    gpu_layers: int = 0
    main_gpu: int = 0
    split_mode: str = "layer"

    @classmethod
    def of(cls, lane: Lane) -> Offload:
        return cls(lane.gpu_layers, lane.main_gpu, lane.split_mode)


CPU_ONLY = Offload()


def decide_repack(path: Path, lane: Lane, choice: RepackChoice) -> None:
    """Record what a probe decided for lanes like `lane` on the model at `path`."""
    _DECIDED[(path.resolve(), lane.repack, lane.n_ubatch)] = choice


def repack_decided(lane: Lane, path: Path) -> bool:
    """Whether a kernel probe in this process has decided for lanes like `lane`."""
    return (path.resolve(), lane.repack, lane.n_ubatch) in _DECIDED


def repack_choice(lane: Lane, path: Path) -> RepackChoice:
    """What the lane's model at `path` runs with: a probe's decision if one was made,
    else what the lane asks for (auto meaning llama.cpp's default, on)."""
    decided = _DECIDED.get((path.resolve(), lane.repack, lane.n_ubatch))
    if decided is not None:
        return decided
    if lane.repack == "auto":
        return RepackChoice(True, "repack on (auto: not probed)")
    return RepackChoice(lane.repack == "on", f"repack {lane.repack}")


class LoadedModel:
    """One llama_model in memory, shared by every lane that uses the same file."""

    def __init__(self, path: Path, repack: bool, offload: Offload = CPU_ONLY) -> None:
        self.path = path
        self.repack = repack
        self.offload = offload
        self.info: GGUFInfo = read_gguf(path)
        lib = llama()
        params = lib.llama_model_default_params()
        params.n_gpu_layers = offload.gpu_layers
        params.main_gpu = offload.main_gpu
        params.split_mode = _SPLIT_MODES[offload.split_mode]
        params.use_extra_bufts = repack
        clear_errors()
        take_offloaded()  # a line left from an earlier load must not be read as this one's
        pointer = lib.llama_model_load_from_file(str(path).encode(), params)
        if not pointer:
            reason = last_error() or "llama.cpp could not load it"
            raise ModelError(f"cannot load model {path}: {reason}")
        self._resources = ExitStack()
        self._resources.callback(lib.llama_model_free, pointer)
        self.pointer = pointer
        self.vocab = lib.llama_model_get_vocab(pointer)
        self.n_vocab = int(lib.llama_vocab_n_tokens(self.vocab))
        self.placement = self._placement(take_offloaded())
        self._pieces: dict[int, bytes] = {}
        self._sha256: str | None = None

    def _placement(self, reported: tuple[int, int] | None) -> Placement:
        """Where the layers went, for the executed record: llama.cpp's own count where it
        logged one, else what it does with the request (it counts the output layer as one
        more, and offloads nothing without a GPU device)."""
        supported = supports_gpu_offload()
        if reported is not None:
            offloaded, total = reported
        else:
            total = int(llama().llama_model_n_layer(self.pointer)) + 1
            asked = total if self.offload.gpu_layers < 0 else self.offload.gpu_layers
            offloaded = min(asked, total) if supported else 0
        return {
            "gpu_layers": self.offload.gpu_layers,
            "main_gpu": self.offload.main_gpu,
            "split_mode": self.offload.split_mode,
            "gpu_offload": supported,
            "layers_offloaded": offloaded,
            "layers_total": total,
            "devices": backend_devices(),
        }

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
        for _ in range(2):  # the second pass has the room the first one asked for
            buffer = (lib.llama_token * capacity)()
            count = lib.llama_tokenize(
                self.vocab, data, len(data), buffer, capacity, add_special, True
            )
            if count >= 0:
                return list(buffer[:count])
            capacity = -count
        raise EngineError(f"tokenization failed ({count})")

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

    def bos(self) -> int:
        return int(llama().llama_vocab_bos(self.vocab))

    def is_end_of_generation(self, token_id: int) -> bool:
        return bool(llama().llama_vocab_is_eog(self.vocab, token_id))

    def close(self) -> None:
        self._resources.close()
        self.pointer = None


class ModelPool:
    """Loads each (file, repack, offload) once; lanes of a pair share the weights, not
    the KV."""

    def __init__(self) -> None:
        self._models: dict[tuple[Path, bool, Offload], LoadedModel] = {}

    def get(self, path: Path, repack: bool, offload: Offload = CPU_ONLY) -> LoadedModel:
        key = (path.resolve(), repack, offload)
        model = self._models.get(key)
        if model is None:
            # also where a lane loads outside a pair's worker (repeat, tests): GPU layers
            # a CPU build cannot place are refused, not quietly kept on the CPU
            check_offload(offload.gpu_layers, "a lane")
            model = LoadedModel(key[0], repack, offload)
            self._models[key] = model
        return model

    def close(self) -> None:
        for model in self._models.values():
            model.close()
        self._models.clear()


class PooledLane(LaneCapabilities):
    """What every backend's constructor does first: it keeps its settings and its
    cancel event, and takes its weights (a server lane: its tokenizer) from the pool
    it is given, or from one of its own that it closes with itself."""

    def __init__(
        self,
        lane: Lane,
        lane_id: LaneId,
        pool: ModelPool | None,
        cancel: threading.Event | None,
    ) -> None:
        self.lane = lane
        self.lane_id: LaneId = lane_id
        self.cancel = cancel or threading.Event()
        self._own_pool = pool is None
        self.pool = pool or ModelPool()

    def _close_pool(self) -> None:
        """The pool's weights, where the pool is this lane's own."""
        if self._own_pool:
            self.pool.close()


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
    """A llama_context with one reusable batch; decode calls report their failures.

    `sequences` > 1 puts that many sequences in one unified KV memory, as a server's
    shared cache does."""

    def __init__(
        self,
        model: LoadedModel,
        lane: Lane,
        cancel: threading.Event,
        sequences: int = 1,
        eval_callback: Any = None,
    ) -> None:
        """`eval_callback`: a ggml_backend_sched_eval_callback for llama.cpp to call at
        each graph node (specdiff.engine.llama.taps); the caller keeps it alive."""
        lib = llama()
        self.model = model
        self.lane = lane
        self.cancel = cancel
        self.sequences = sequences
        self.n_vocab = model.n_vocab
        # Stops a long prompt decode between graph nodes when the user cancels. Installed
        # only around prompt decodes: llama.cpp calls it once per graph node (~450 per
        # token here) and each call takes the GIL, which a UI thread would then contend for.
        self._abort = lib.ggml_abort_callback(lambda _data: cancel.is_set())
        self._no_abort = lib.ggml_abort_callback()
        with ExitStack() as resources:  # frees what was made if a later step fails
            clear_errors()
            params = context_params(lane, sequences)
            if eval_callback is not None:
                params.cb_eval = eval_callback
            pointer = lib.llama_init_from_model(model.pointer, params)
            if not pointer:
                reason = last_error() or "llama.cpp could not create it"
                raise EngineError(f"cannot create a context for {model.path.name}: {reason}")
            resources.callback(lib.llama_free, pointer)
            self.pointer = pointer
            self.memory = lib.llama_get_memory(pointer)
            self.batch = lib.llama_batch_init(lane.n_batch, 0, sequences)
            resources.callback(lib.llama_batch_free, self.batch)
            self.executed = self._applied()
            self._resources = resources.pop_all()

    def _applied(self) -> AppliedSettings:
        """The settings as llama.cpp applied them (it may round n_ctx or n_ubatch)."""
        lib, pointer, lane = llama(), self.pointer, self.lane
        return {
            "n_ctx": int(lib.llama_n_ctx(pointer)),
            "n_batch": int(lib.llama_n_batch(pointer)),
            "n_ubatch": int(lib.llama_n_ubatch(pointer)),
            "threads": int(lib.llama_n_threads(pointer)),
            "threads_batch": int(lib.llama_n_threads_batch(pointer)),
            "flash_attn": lane.flash_attn,
            "type_k": lane.type_k,
            "type_v": lane.type_v,
            "repack": self.model.repack,
            **self.model.placement,
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

    def drop_sequence(self, sequence: int) -> None:
        """Free every KV cell of `sequence`, so that a new sequence can take its id."""
        llama().llama_memory_seq_rm(self.memory, sequence, -1, -1)

    def share_prefix(self, source: int, target: int, end: int) -> None:
        """Give `target` the KV cells of `source` at positions before `end`: in a unified
        memory the cells are shared, not copied."""
        llama().llama_memory_seq_cp(self.memory, source, target, 0, end)

    def decode(
        self, tokens: Sequence[int], start: int, all_logits: bool, sequence: int = 0
    ) -> None:
        """Decode tokens of `sequence` at positions start.. in one call; logits on the
        last row, or on every row."""
        rows = [(token, start + i, sequence) for i, token in enumerate(tokens)]
        self.decode_rows(rows, all_logits)

    def decode_rows(self, rows: Sequence[Row], all_logits: bool | Sequence[bool] = True) -> None:
        """One llama_decode call of (token, position, sequence) rows; logits on the last
        row, or on every row, or on the rows a sequence of flags marks."""
        if self.cancel.is_set():
            raise Cancelled("cancelled")
        batch = self.batch
        batch.n_tokens = len(rows)
        for i, (token, position, sequence) in enumerate(rows):
            batch.token[i] = token
            batch.pos[i] = position
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = sequence
            batch.logits[i] = all_logits if isinstance(all_logits, bool) else all_logits[i]
        batch.logits[len(rows) - 1] = True
        status = llama().llama_decode(self.pointer, batch)
        if status == 2 and self.cancel.is_set():
            raise Cancelled("cancelled")
        if status != 0:
            hint = "the KV memory may be too small: raise n_ctx"
            reason = last_error() or (hint if self.sequences > 1 else "no reason given")
            raise EngineError(
                f"llama_decode failed with status {status} at position {rows[0][1]} ({reason})"
            )

    def decode_chunks(self, tokens: Sequence[int], start: int, sequence: int = 0) -> int:
        """Decode a long sequence in n_batch chunks (cancellable inside a chunk); returns
        the last chunk's width."""
        lib = llama()
        width = 0
        lib.llama_set_abort_callback(self.pointer, self._abort, None)
        try:
            for offset in range(0, len(tokens), self.lane.n_batch):
                chunk = tokens[offset : offset + self.lane.n_batch]
                self.decode(chunk, start + offset, all_logits=False, sequence=sequence)
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
        self._resources.close()
        self.pointer = None
