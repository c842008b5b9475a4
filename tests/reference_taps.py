"""An independent reference for specdiff's tensor taps, using only llama-cpp-python's
low-level API (and ctypes for the few ggml calls it does not wrap).

Two questions, two modes. Both decode the prompt (in chunks of N_BATCH with n_ubatch
N_UBATCH, as a plain lane does), then greedy tokens one at a time, and trace one
one-token decode with llama.cpp's eval callback on. One token wide, a tensor *is* the
token's column, so no layout knowledge is shared with specdiff.

    python3 tests/reference_taps.py MODEL REPACK THREADS PROMPT NAME...

prints, as JSON, the exact sum (math.fsum) of every value of each named tensor of the
decode that makes step 1 (the greedy token's own decode, n_batch and n_ubatch 512).

    python3 tests/reference_taps.py --graph MODEL REPACK THREADS N_BATCH N_UBATCH STEP PROMPT

prints, for the decode that makes step STEP (at least 1), every node of its graph in
the order llama.cpp computes them: ggml's name, operation and a hash of all the node's
bytes, whatever its type (a KV cache write holds the whole cache, every cell), and the
tokens of steps 0 to STEP.

REPACK (on or off) is whether llama.cpp's repacked CPU kernels load: the lane's choice,
which a CPU whose repacked kernels crash (AMX Xeons) turns off.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import llama_cpp
import llama_cpp.llama_cpp as lib
import numpy as np


def ggml_library() -> Any:
    base = Path(llama_cpp.__file__).parent / "lib"
    ggml = ctypes.CDLL(str(sorted(base.glob("libggml-base.*"))[0]))
    for name, result, arguments in (
        ("ggml_get_name", ctypes.c_char_p, [ctypes.c_void_p]),
        ("ggml_op_desc", ctypes.c_char_p, [ctypes.c_void_p]),
        ("ggml_nbytes", ctypes.c_size_t, [ctypes.c_void_p]),
        (
            "ggml_backend_tensor_get",
            None,
            [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t],
        ),
    ):
        function = getattr(ggml, name)
        function.restype = result
        function.argtypes = arguments
    return ggml


def read_bytes(ggml: Any, tensor: int) -> bytes:
    size = ggml.ggml_nbytes(tensor)
    data = (ctypes.c_char * size)()
    ggml.ggml_backend_tensor_get(tensor, data, 0, size)
    return bytes(data)


class Decoder:
    """The model and one context whose eval callback calls `on_node` while recording."""

    def __init__(
        self, model_path: str, repack: str, threads: int, n_batch: int, n_ubatch: int
    ) -> None:
        self.recording = False
        self.on_node: Callable[[int, bool], bool] = lambda _tensor, ask: not ask
        self.callback = lib.ggml_backend_sched_eval_callback(self._node)
        lib.llama_backend_init()
        model_params = lib.llama_model_default_params()
        model_params.use_extra_bufts = repack == "on"
        self.model = lib.llama_model_load_from_file(model_path.encode(), model_params)
        params = lib.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_ubatch = 4096, n_batch, n_ubatch
        params.n_threads = params.n_threads_batch = threads
        params.flash_attn_type = 0
        params.cb_eval = self.callback
        self.n_batch = n_batch
        self.context = lib.llama_init_from_model(self.model, params)
        self.vocab = lib.llama_model_get_vocab(self.model)

    def _node(self, tensor: int, ask: bool, _user: int) -> bool:
        return self.on_node(tensor, ask) if self.recording else not ask

    def tokenize(self, prompt: str) -> list[int]:
        text = prompt.encode()
        tokens = (lib.llama_token * (len(text) + 8))()
        count = lib.llama_tokenize(self.vocab, text, len(text), tokens, len(text) + 8, True, True)
        return list(tokens[:count])

    def decode(self, tokens: list[int]) -> int:
        """Decode `tokens` in chunks of n_batch; the greedy pick of the last row."""
        for offset in range(0, len(tokens), self.n_batch):
            chunk = tokens[offset : offset + self.n_batch]
            array = (lib.llama_token * len(chunk))(*chunk)
            assert lib.llama_decode(self.context, lib.llama_batch_get_one(array, len(chunk))) == 0
        n_vocab = lib.llama_vocab_n_tokens(self.vocab)
        row = np.ctypeslib.as_array(lib.llama_get_logits_ith(self.context, -1), (n_vocab,))
        return int(np.argmax(row))  # the first of equal maxima: the lowest id, as specdiff

    def close(self) -> None:
        lib.llama_free(self.context)
        lib.llama_model_free(self.model)


def sums_mode(model_path: str, repack: str, threads: str, prompt: str, names: list[str]) -> None:
    ggml, wanted, sums = ggml_library(), set(names), {}

    def on_node(tensor: int, ask: bool) -> bool:
        name = ggml.ggml_get_name(tensor).decode()
        if ask:
            return name in wanted
        data = np.frombuffer(read_bytes(ggml, tensor), dtype=np.float32)
        sums[name] = math.fsum(data.tolist())  # the last of a repeated name, as specdiff
        return True

    decoder = Decoder(model_path, repack, int(threads), 512, 512)
    decoder.on_node = on_node
    first = decoder.decode(decoder.tokenize(prompt))
    decoder.recording = True
    decoder.decode([first])
    decoder.recording = False
    print(json.dumps({"token": first, "sums": sums}))
    decoder.close()


def graph_mode(arguments: list[str]) -> None:
    model_path, repack, threads, n_batch, n_ubatch, step_text, prompt = arguments
    step = int(step_text)
    assert step >= 1, "step 0 is the prompt's own decode, not one token wide"
    ggml, nodes = ggml_library(), []

    def on_node(tensor: int, ask: bool) -> bool:
        if not ask:
            name = ggml.ggml_get_name(tensor).decode("utf-8", "replace")
            op = ggml.ggml_op_desc(tensor).decode("utf-8", "replace")
            nodes.append([name, op, hashlib.sha256(read_bytes(ggml, tensor)).hexdigest()])
        return True

    decoder = Decoder(model_path, repack, int(threads), int(n_batch), int(n_ubatch))
    decoder.on_node = on_node
    tokens = [decoder.decode(decoder.tokenize(prompt))]
    while len(tokens) <= step:
        decoder.recording = len(tokens) == step
        tokens.append(decoder.decode([tokens[-1]]))
    decoder.recording = False
    print(json.dumps({"tokens": tokens, "nodes": nodes}))
    decoder.close()


def main() -> None:
    if sys.argv[1] == "--graph":
        graph_mode(sys.argv[2:])
    else:
        model_path, repack, threads, prompt, *names = sys.argv[1:]
        sums_mode(model_path, repack, threads, prompt, names)


if __name__ == "__main__":
    main()
