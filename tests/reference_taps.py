"""An independent reference for specdiff's tensor taps, using only llama-cpp-python's
low-level API (and ctypes for the three ggml calls it does not wrap).

It loads the model, decodes the prompt in one batch, picks the greedy token, decodes
that token alone with llama.cpp's eval callback on, and prints, as JSON, the exact sum
(math.fsum) of every value of each named tensor of that one-token decode: the same
step specdiff's plain lane computes as its step 1. One token wide, a tensor *is* the
token's column, so no layout knowledge is shared with specdiff.

    python3 tests/reference_taps.py MODEL REPACK THREADS PROMPT NAME...

REPACK (on or off) is whether llama.cpp's repacked CPU kernels load: the lane's choice,
which a CPU whose repacked kernels crash (AMX Xeons) turns off.
"""

from __future__ import annotations

import ctypes
import json
import math
import sys
from pathlib import Path

import llama_cpp
import llama_cpp.llama_cpp as lib


def main() -> None:
    model_path, repack, threads, prompt, *names = sys.argv[1:]
    wanted = set(names)
    base = Path(llama_cpp.__file__).parent / "lib"
    ggml = ctypes.CDLL(str(sorted(base.glob("libggml-base.*"))[0]))
    ggml.ggml_get_name.restype = ctypes.c_char_p
    ggml.ggml_get_name.argtypes = [ctypes.c_void_p]
    ggml.ggml_nbytes.restype = ctypes.c_size_t
    ggml.ggml_nbytes.argtypes = [ctypes.c_void_p]
    ggml.ggml_backend_tensor_get.restype = None
    ggml.ggml_backend_tensor_get.argtypes = [
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_size_t,
    ]
    sums: dict[str, float] = {}
    recording = [False]

    def on_node(tensor: int, ask: bool, _user: int) -> bool:
        if not recording[0]:
            return not ask
        name = ggml.ggml_get_name(tensor).decode()
        if ask:
            return name in wanted
        size = ggml.ggml_nbytes(tensor)
        data = (ctypes.c_float * (size // 4))()
        ggml.ggml_backend_tensor_get(tensor, data, 0, size)
        sums[name] = math.fsum(data)  # the last one of a repeated name, as specdiff keeps
        return True

    callback = lib.ggml_backend_sched_eval_callback(on_node)
    lib.llama_backend_init()
    model_params = lib.llama_model_default_params()
    model_params.use_extra_bufts = repack == "on"
    model = lib.llama_model_load_from_file(model_path.encode(), model_params)
    params = lib.llama_context_default_params()
    params.n_ctx, params.n_batch, params.n_ubatch = 4096, 512, 512
    params.n_threads = params.n_threads_batch = int(threads)
    params.flash_attn_type = 0
    params.cb_eval = callback
    context = lib.llama_init_from_model(model, params)
    vocab = lib.llama_model_get_vocab(model)
    text = prompt.encode()
    tokens = (lib.llama_token * (len(text) + 8))()
    count = lib.llama_tokenize(vocab, text, len(text), tokens, len(text) + 8, True, True)
    batch = lib.llama_batch_get_one(tokens, count)
    assert lib.llama_decode(context, batch) == 0
    n_vocab = lib.llama_vocab_n_tokens(vocab)
    row = lib.llama_get_logits_ith(context, -1)
    first = max(range(n_vocab), key=lambda i: (row[i], -i))
    recording[0] = True
    one = (lib.llama_token * 1)(first)
    assert lib.llama_decode(context, lib.llama_batch_get_one(one, 1)) == 0
    recording[0] = False
    print(json.dumps({"token": first, "sums": sums}))
    lib.llama_free(context)
    lib.llama_model_free(model)


if __name__ == "__main__":
    main()
