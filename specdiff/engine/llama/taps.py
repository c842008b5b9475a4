"""Tensor taps: one row's column of every node of one llama_decode call's graph, read
through llama.cpp's eval callback, and a lane's decode replayed up to a step to take them.

Why the eval callback and not a second implementation of the model: the point is to
see what *this* build's kernels computed, on this CPU, with the lane's settings. The
high-level ``Llama()`` does not set ``cb_eval``, so the context is made with
``llama_init_from_model`` (``Context(eval_callback=...)``). llama.cpp asks the
callback about every graph node (``ask=True``); a node the callback wants is computed
up to it and handed over (``ask=False``), and only then does the graph go on, so
tapping splits the computation but changes no arithmetic (a test checks this bit for
bit).

Why a replay: the logits of a step depend on how that step was computed (the width of
the verify batch, the ubatch it fell into, what the KV memory held), so the taps are
taken by running the lane's own decode loop (``LocalLane.generate``) again up to the
step, with the callback armed for the one llama_decode call whose output row holds it.
The first pass, on a context with no callback, finds that call and row and keeps its
logits; the second, on a context with the callback, takes the tensors. So part 2 costs
two decodes of the prefix per lane.

Which column: a tensor of a decode holds one column per token of its ubatch (the token
dimension is ne[1] for [n_embd, tokens] tensors and ne[2] for the per-head [head_dim,
heads, tokens] ones, told apart by their extents, since one name may be both: Qcur-0 is
flat out of its matrix multiply and per head after the reshape); a batch wider than
n_ubatch is computed as several graphs, in order; and the last layer keeps only the rows
that asked for logits, so its tensors after attention are indexed among those. The
tapped ``result_output`` column must equal the row's logits bit for bit, which checks
that the column was the right one.

Why every node and not a list of names: the first tensor that differs must be the first
in the graph's own order, and it is often one no list foresaw: attention's scores
(``kq``), softmax and weighted sum (``kqv``), an unnamed projection, or the KV memory
itself. The K and V caches are tapped at their writes (SET_ROWS, whose tensor is the
whole cache after this call's rows went in): the row reads the cells of positions 0 to
its own, so those are copied, cell by cell in position order, and the cells written by
earlier llama_decode calls (the history the step inherits, not computes) are counted
so that a difference there can be told apart. Cells stand for positions only in a
memory that holds one sequence, where llama.cpp fills them in order and frees them from
the end; with several sequences the caches and scores are left out. A quantized KV
cache is left out too (its blocks are no float column).
"""

from __future__ import annotations

import ctypes
import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from specdiff.engine.base import EngineError
from specdiff.engine.llama.context import Context, LoadedModel, ModelPool, Row
from specdiff.engine.llama.lane import LocalLane
from specdiff.engine.runtime import llama
from specdiff.lanes import Lane, LaneId
from specdiff.steps import TokenStep

GGML_TYPE_F32 = 0
GGML_TYPE_F16 = 1
FLOAT_TYPES = {GGML_TYPE_F32: np.float32, GGML_TYPE_F16: np.float16}
PER_HEAD = frozenset({"Qcur", "Kcur", "Vcur", "Qcur_normed", "Kcur_normed", "Vcur_normed"})
"""Tensors laid out [head_dim, heads, tokens] once reshaped (flat [n, tokens] as a
matrix multiply's output, under the same name)."""
TAPPED = frozenset(
    {
        "inp_embd",
        "inp_scaled",
        "attn_norm",
        *PER_HEAD,
        "kqv_out",
        "attn_out",
        "attn_post_norm",
        "sa_out",
        "ffn_inp",
        "ffn_norm",
        "ffn_up",
        "ffn_gate",
        "ffn_geglu",
        "ffn_swiglu",
        "ffn_gelu",
        "ffn_silu",
        "ffn_out",
        "ffn_post_norm",
        "l_out",
        "result_norm",
        "result_output",
    }
)
"""The per-token activations llama.cpp's graphs name (Gemma 3's and the llama-like
families'): a narrower tap than every node, for comparing costs."""
TOKENS_SECOND = frozenset({"kq", "kq_soft_max", "kqv"})
"""Attention's per-head tensors laid out [cells or head_dim, tokens, heads]."""
OVER_CELLS = frozenset({"kq", "kq_soft_max"})
"""Attention scores: one value per KV cell, of which the row reads those up to its own."""
_LAYERED = re.compile(r"^(.*)-(\d+)$")
_CACHE = re.compile(r"^(cache_[kv]_l(\d+))\b")
_UNNAMED = re.compile(r"^node_\d+")


def split_name(name: str) -> tuple[str, int | None]:
    """("ffn_out", 0) for "ffn_out-0" and for its view "ffn_out-0 (view)", ("cache_k_l3",
    3) for a KV cache; ("result_norm", None) for a tensor of no layer."""
    cache = _CACHE.match(name)
    if cache is not None:
        return cache.group(1), int(cache.group(2))
    match = _LAYERED.match(name.split(" (")[0])  # "Kcur-0 (view)" is of layer 0
    if match is None:
        return name, None
    return match.group(1), int(match.group(2))


def cache_name(name: str) -> str | None:
    """ "cache_v_l3" for ggml's "cache_v_l3 (reshaped) (view)"; None for no cache."""
    match = _CACHE.match(name)
    return None if match is None else match.group(1)


class _Ggml:
    """The few ggml calls the taps need, from libggml-base beside llama.cpp's library."""

    def __init__(self) -> None:
        import llama_cpp  # deferred: only a worker process loads llama.cpp

        folder = Path(llama_cpp.__file__).parent / "lib"
        candidates = sorted(folder.glob("libggml-base.*")) + sorted(folder.glob("ggml-base.*"))
        if not candidates:
            raise EngineError(f"libggml-base not found in {folder}; reinstall llama-cpp-python")
        lib = ctypes.CDLL(str(candidates[0]))
        for name, result, arguments in (
            ("ggml_get_name", ctypes.c_char_p, [ctypes.c_void_p]),
            ("ggml_op_desc", ctypes.c_char_p, [ctypes.c_void_p]),
            ("ggml_nbytes", ctypes.c_size_t, [ctypes.c_void_p]),
            ("ggml_is_contiguous", ctypes.c_bool, [ctypes.c_void_p]),
            (
                "ggml_backend_tensor_get",
                None,
                [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t],
            ),
        ):
            function = getattr(lib, name)
            function.restype = result
            function.argtypes = arguments
        self.lib = lib

    @staticmethod
    def header(tensor: int) -> tuple[int, tuple[int, int, int, int]]:
        """(type, ne) from the head of struct ggml_tensor: an int enum, a pointer, then
        int64 ne[4]; ggml.h has kept this layout since the backend rework (2023)."""
        kind = ctypes.c_int32.from_address(tensor).value
        extents = (ctypes.c_int64 * 4).from_address(tensor + 16)
        return kind, (extents[0], extents[1], extents[2], extents[3])


_GGML: list[_Ggml] = []


def ggml() -> _Ggml:
    if not _GGML:
        _GGML.append(_Ggml())
    return _GGML[0]


@dataclass(frozen=True)
class TappedTensor:
    """One named tensor's values for the tapped row, as this build computed them."""

    name: str
    occurrence: int
    """How many tensors of this name came before it in the graph (0 for the first)."""
    op: str
    shape: tuple[int, ...]
    """The whole tensor's extents, ne[0] first, as ggml gives them."""
    values: np.ndarray
    """The row's column, float32, flattened; for a KV cache, the cells the row reads,
    in position order, each cell's values together."""
    layer: int | None = None
    """From the name, or for an unnamed node the layer whose named nodes came before it."""
    history: int = 0
    """How many leading values are KV cells that earlier llama_decode calls wrote."""

    @property
    def key(self) -> tuple[str, int]:
        return self.name, self.occurrence


@dataclass(frozen=True)
class RowTarget:
    """Which llama_decode call and row to tap, and the layout of that call."""

    call: int
    row: int
    flags: tuple[bool, ...]
    """Which rows of the call asked for logits."""
    n_ubatch: int
    start: int = 0
    """The position of the call's first row: KV cells below it were written earlier."""
    position: int = 0
    """The row's position: it reads the KV cells of positions 0 to this."""
    one_sequence: bool = True
    """The KV memory holds one sequence, so its cells stand in position order."""

    @property
    def ubatch(self) -> int:
        return self.row // self.n_ubatch

    @property
    def column(self) -> int:
        return self.row % self.n_ubatch

    @property
    def width(self) -> int:
        start = self.ubatch * self.n_ubatch
        return min(self.n_ubatch, len(self.flags) - start)

    @property
    def output_column(self) -> int:
        start = self.ubatch * self.n_ubatch
        return sum(self.flags[start : self.row])

    @property
    def outputs(self) -> int:
        start = self.ubatch * self.n_ubatch
        return sum(self.flags[start : start + self.width])


class Taps:
    """An eval callback that, once armed for a row, copies that row's column of every
    node of its graph whose layout it knows; disarmed, it asks for nothing."""

    def __init__(self, names: frozenset[str] | None = None) -> None:
        self.names = names
        """Base names to tap; None: every node."""
        self.target: RowTarget | None = None
        self.tensors: list[TappedTensor] = []
        self.failure: str | None = None
        self._graph = -1
        self._first_name: str | None = None
        self._seen: dict[str, int] = {}
        self._layer: int | None = None
        self._cache_cells: dict[int, int] = {}
        # llama.cpp holds only the C pointer: this object must outlive the context
        self.callback = llama().ggml_backend_sched_eval_callback(self._on_node)

    def arm(self, target: RowTarget) -> None:
        self.target = target
        self.tensors = []
        self.failure = None
        self._graph = -1
        self._first_name = None
        self._seen = {}
        self._layer = None
        self._cache_cells = {}

    def disarm(self) -> None:
        self.target = None

    def _on_node(self, tensor: int, ask: bool, _user: int) -> bool:
        target = self.target
        if target is None:
            return not ask  # asked: nothing wanted; handed over: go on computing
        try:
            name = (ggml().lib.ggml_get_name(tensor) or b"").decode("utf-8", "replace")
            if ask:
                return self._wanted(name, target)
            self._take(tensor, name, target)
        except Exception as error:  # an exception cannot cross into C: keep it for later
            self.failure = f"{type(error).__name__}: {error}"
        return True

    def _wanted(self, name: str, target: RowTarget) -> bool:
        if name and (self._first_name is None or name == self._first_name):
            # the first named node of each graph: a batch wider than n_ubatch is
            # computed as several graphs, one per ubatch, in order
            self._first_name = name
            self._graph += 1
            self._seen = {}
            self._layer = None
        base, _ = split_name(name)
        return self._graph == target.ubatch and (self.names is None or base in self.names)

    def _take(self, tensor: int, name: str, target: RowTarget) -> None:
        occurrence = self._seen.get(name, 0)
        self._seen[name] = occurrence + 1
        base, layer = split_name(name)
        if layer is not None:
            self._layer = layer
        elif _UNNAMED.match(name):
            layer = self._layer  # an unnamed node belongs to the layer being built
        kind, extents = ggml().header(tensor)
        functions = ggml().lib
        op = (functions.ggml_op_desc(tensor) or b"").decode("utf-8", "replace")
        if kind not in FLOAT_TYPES or not functions.ggml_is_contiguous(tensor):
            return
        if cache_name(name) is not None:
            self._take_cache(tensor, name, op, kind, extents, target, occurrence)
            return
        column = _column_of(base, extents, target)
        if column is None:
            return  # a layout these taps do not know: left out, not guessed
        axis, index, cells = column
        whole = _read(tensor, kind, 0, int(functions.ggml_nbytes(tensor)))
        whole = whole.reshape(extents[3], extents[2], extents[1], extents[0])
        values = whole[:, index, :, :] if axis == 2 else whole[:, :, index, :cells]
        flat = np.ascontiguousarray(values).ravel()
        self.tensors.append(TappedTensor(name, occurrence, op, extents, flat, layer))

    def _take_cache(
        self,
        tensor: int,
        name: str,
        op: str,
        kind: int,
        extents: tuple[int, int, int, int],
        target: RowTarget,
        occurrence: int,
    ) -> None:
        """A KV cache write: the cells of positions 0 to the row's, [cell][value]."""
        clean, layer = split_name(name)
        if op != "SET_ROWS" or not target.one_sequence or layer is None:
            return  # the cache's views only repeat what its write holds
        cells = target.position + 1
        if extents[0] > 1:  # rows of one cell each: K, or V as flash attention keeps it
            self._cache_cells[layer] = extents[1]
            if cells > extents[1]:
                return
            row = extents[0] * np.dtype(FLOAT_TYPES[kind]).itemsize
            values = _read(tensor, kind, 0, cells * row)
            width = extents[0]
        else:  # V transposed: each value's cells together, as many cells as K has
            size = self._cache_cells.get(layer)
            if size is None or cells > size:
                return
            width = extents[1] // size
            values = _strided(tensor, kind, width, size, cells)
        history = min(target.start, cells) * width
        self.tensors.append(TappedTensor(clean, occurrence, op, extents, values, layer, history))


def _column_of(
    base: str, extents: tuple[int, int, int, int], target: RowTarget
) -> tuple[int, int, int] | None:
    """(token axis, the row's index along it, how many of ne[0] to keep) for a tensor of
    the tapped graph, or None for a layout not known."""
    if base in TOKENS_SECOND:
        axis = 1
        cells = target.position + 1 if base in OVER_CELLS else extents[0]
        if base in OVER_CELLS and (not target.one_sequence or cells > extents[0]):
            return None
    else:
        # [n, tokens] or, per head, [head_dim, heads, tokens]: a per-head tensor of one
        # token has heads where a flat one has its token, so the extents decide
        rows = (target.width, target.outputs)
        flat = extents[2] == 1 and extents[3] == 1 and extents[1] in rows
        axis, cells = (1 if flat else 2), extents[0]
    if extents[axis] == target.width:
        return axis, target.column, cells
    if extents[axis] == target.outputs:
        return axis, target.output_column, cells
    return None


def _read(tensor: int, kind: int, offset: int, size: int) -> np.ndarray:
    """`size` bytes of a tensor from `offset`, as float32."""
    dtype = FLOAT_TYPES[kind]
    buffer = np.empty(size // np.dtype(dtype).itemsize, dtype=dtype)
    ggml().lib.ggml_backend_tensor_get(tensor, buffer.ctypes.data, offset, size)
    return buffer.astype(np.float32, copy=False)


def _strided(tensor: int, kind: int, width: int, size: int, cells: int) -> np.ndarray:
    """The first `cells` cells of a transposed cache ([value][cell], `size` cells a
    value), as [cell][value]: one read per value, not the whole cache."""
    itemsize = np.dtype(FLOAT_TYPES[kind]).itemsize
    rows = [
        _read(tensor, kind, value * size * itemsize, cells * itemsize) for value in range(width)
    ]
    return np.ascontiguousarray(np.stack(rows).T).ravel()


class _CountingContext(Context):
    """A Context that numbers its llama_decode calls and, given taps, arms them for one
    of them. Without taps it has no eval callback at all, as a lane's own context."""

    def __init__(
        self, taps: Taps | None, model: LoadedModel, lane: Lane, cancel: threading.Event
    ) -> None:
        super().__init__(model, lane, cancel, eval_callback=taps.callback if taps else None)
        self.taps = taps
        self.calls: list[tuple[bool, ...]] = []
        """Each call's logits flags, in order."""
        self.positions: tuple[int, ...] = ()
        """The last call's rows' positions."""
        self.one_sequence = True
        """Every row so far was of sequence 0, in a memory made for one."""
        self.armed_for: RowTarget | None = None

    def decode_rows(self, rows: Sequence[Row], all_logits: bool | Sequence[bool] = True) -> None:
        flags = [
            bool(all_logits) if isinstance(all_logits, bool) else bool(all_logits[i])
            for i in range(len(rows))
        ]
        flags[-1] = True
        call = len(self.calls)
        self.calls.append(tuple(flags))
        self.positions = tuple(position for _, position, _ in rows)
        self.one_sequence &= self.sequences == 1 and all(seq == 0 for _, _, seq in rows)
        taps, target = self.taps, self.armed_for
        if taps is not None and target is not None and target.call == call:
            taps.arm(target)
        try:
            super().decode_rows(rows, all_logits)
        finally:
            if taps is not None:
                taps.disarm()


@dataclass
class StepTaps:
    """One lane's view of one step: its logits untapped and tapped, and the tensors."""

    lane_id: LaneId
    step_index: int
    target: RowTarget
    logits: np.ndarray
    """The step's logits from the untapped pass."""
    tapped_logits: np.ndarray
    tensors: list[TappedTensor] = field(default_factory=list)
    token_id: int = -1
    piece: bytes = b""
    seconds: tuple[float, float] = (0.0, 0.0)
    """Wall time of the untapped pass and of the tapped one."""

    @property
    def neutral(self) -> bool:
        """Tapping changed no bit of the logits."""
        return self.logits.tobytes() == self.tapped_logits.tobytes()

    def tensor(self, name: str) -> TappedTensor | None:
        found = [t for t in self.tensors if t.name == name]
        return found[-1] if found else None


def tap_step(
    lane: Lane,
    lane_id: LaneId,
    prompt: str | Sequence[int],
    max_tokens: int,
    step_index: int,
    pool: ModelPool,
    cancel: threading.Event | None = None,
    names: frozenset[str] | None = None,
) -> StepTaps:
    """Replay `lane`'s greedy decode of `prompt` (text, formatted as the lane formats
    it, or token ids; with the run's `max_tokens`: the
    token budget bounds the drafts, so the verify batches) to step `step_index`, twice:
    once to find the llama_decode call and row that hold the step, once tapping it
    (every node its layout is known for, or only those of base `names`)."""
    cancel = cancel or threading.Event()
    local = LocalLane(lane, lane_id, pool, cancel=cancel)
    taps = Taps(names)
    try:
        tokens = local.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        logits, step, target, untapped = _find_step(local, tokens, max_tokens, step_index)
        context = _CountingContext(taps, local.model, lane, cancel)
        local.context = context
        context.armed_for = target
        began = time.perf_counter()
        tapped, again, _ = _replay(local, tokens, max_tokens, step_index)
        tapped_seconds = time.perf_counter() - began
        if taps.failure is not None:
            raise EngineError(f"reading a tensor failed: {taps.failure}")
        if again.token_id != step.token_id or len(context.calls) - 1 != target.call:
            raise EngineError(
                f"lane {lane_id} did not decode step {step_index} the same way twice; "
                "a nondeterministic setting cannot be traced"
            )
        result = StepTaps(
            lane_id,
            step_index,
            target,
            logits,
            tapped,
            list(taps.tensors),
            step.token_id,
            step.piece,
        )
        result.seconds = (untapped, tapped_seconds)
        return _output_checked(result)
    finally:
        local.close()


def _output_checked(result: StepTaps) -> StepTaps:
    """`result`, once its tapped output tensor is seen to be the logits it produced."""
    output = result.tensor("result_output")
    if output is None or output.values.tobytes() != result.tapped_logits.tobytes():
        raise EngineError(
            f"lane {result.lane_id}'s tapped output does not match its logits at step "
            f"{result.step_index}: this model's graph layout is not one the taps understand"
        )
    return result


def _find_step(
    local: LocalLane, tokens: Sequence[int], max_tokens: int, step_index: int
) -> tuple[np.ndarray, TokenStep, RowTarget, float]:
    """The first pass: the step's logits, the step, the decode call and row that hold it,
    and the pass's wall time. It runs with no callback at all (llama.cpp would call one
    at every node of every decode), so its logits are the lane's own, untouched by taps;
    the lane is left without a context, for the tapped pass's."""
    local.context.close()
    counting = _CountingContext(None, local.model, local.lane, local.cancel)
    local.context = counting
    began = time.perf_counter()
    logits, step, row_index = _replay(local, tokens, max_tokens, step_index)
    seconds = time.perf_counter() - began
    flags, positions = counting.calls[-1], counting.positions
    row = row_index if row_index >= 0 else len(flags) - 1
    target = RowTarget(
        len(counting.calls) - 1,
        row,
        flags,
        int(counting.executed["n_ubatch"]),
        start=min(positions),
        position=positions[row],
        one_sequence=counting.one_sequence,
    )
    counting.close()
    return logits, step, target, seconds


def _replay(
    local: LocalLane, prompt: Sequence[int], max_tokens: int, step_index: int
) -> tuple[np.ndarray, TokenStep, int]:
    """Run the lane to `step_index`; that step's logits (a copy), step and output row."""
    generator = iter(local.generate(list(prompt), max_tokens))
    try:
        for step in generator:
            if step.index == step_index:
                row_index = local.output_row(step_index)
                if row_index is None:
                    break
                logits = np.array(local.context.row(row_index), copy=True)
                return logits, step, row_index
    finally:
        close = getattr(generator, "close", None)  # a generator: ends the lane's loop now
        if close is not None:
            close()
    raise EngineError(f"lane {local.lane_id} stopped before step {step_index}")
