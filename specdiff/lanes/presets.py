"""The built-in pairs: the comparisons the field argues about, each two lanes that differ
in the one thing its name says. A declarative table, built on call.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from specdiff.errors import LaneConfigError, did_you_mean
from specdiff.lanes.model import Lane, Pair


def _lane(**overrides: Any) -> Lane:
    return Lane(**overrides)


SERVER_A = "http://127.0.0.1:8080"
SERVER_B = "http://127.0.0.1:8081"


def presets() -> dict[str, Pair]:
    """The built-in pairs. Built on call so that each takes the current default threads."""
    return {**_drafting_presets(), **_arithmetic_presets(), **_server_presets()}


def _drafting_presets() -> dict[str, Pair]:
    """The pairs in which lane a drafts tokens and verifies them."""
    return {
        "spec-vs-plain": Pair(
            "spec-vs-plain",
            _lane(speculation="ngram"),
            _lane(),
            "prompt-lookup n-gram speculation vs plain greedy decoding",
        ),
        "draft-vs-plain": Pair(
            "draft-vs-plain",
            _lane(speculation="draft"),
            _lane(),
            "draft-model speculation (default draft: the model itself) vs plain",
        ),
        "lenient-vs-plain": Pair(
            "lenient-vs-plain",
            _lane(speculation="ngram", spec_accept="lenient:1.0"),
            _lane(),
            "n-gram speculation accepting drafts within 1 logit of the best (lossy) vs plain",
        ),
    }


def _arithmetic_presets() -> dict[str, Pair]:
    """The pairs that decode the same tokens with the arithmetic grouped or done
    differently: batches, cached prefixes, weights, threads, devices."""
    return {
        "cache-vs-fresh": Pair(
            "cache-vs-fresh",
            _lane(prefix="cached"),
            _lane(),
            "a prompt prefix decoded in an earlier call (a cache hit) vs the whole prompt at once",
        ),
        "ubatch": Pair(
            "ubatch",
            _lane(),
            _lane(n_batch=2, n_ubatch=2),
            "prompt decoded in batches of 512 vs batches of 2",
        ),
        "quant": Pair(
            "quant",
            _lane(),
            _lane(quant="q8_0"),
            "the model as it is (Q4_K_M by default) vs requantized to Q8_0",
        ),
        "threads": Pair(
            "threads",
            _lane(threads=1, threads_batch=1),
            _lane(threads=2, threads_batch=2),
            "1 thread vs 2 threads",
        ),
        "gpu-vs-cpu": Pair(
            "gpu-vs-cpu",
            _lane(gpu_layers=-1),
            _lane(),
            "every layer offloaded to the GPU vs none (CPU only); needs a llama-cpp-python "
            "built with CUDA, Metal or Vulkan",
        ),
    }


def _server_presets() -> dict[str, Pair]:
    """The built-in pairs whose lanes are servers."""
    return {
        "servers": Pair(
            "servers",
            _lane(backend="server", endpoint=SERVER_A),
            _lane(backend="server", endpoint=SERVER_B),
            "two OpenAI-compatible servers (set them: --lane-a endpoint=URL --lane-b endpoint=URL)",
        ),
        "server-cache-vs-fresh": Pair(
            "server-cache-vs-fresh",
            _lane(backend="server", api="llama-server", endpoint=SERVER_A, prefix="cached"),
            _lane(backend="server", api="llama-server", endpoint=SERVER_A),
            "one llama-server: cache_prompt after a priming request with half the prompt vs "
            "no prompt cache",
        ),
    }


def unknown_pair(name: str, known: Iterable[str]) -> LaneConfigError:
    names = sorted(known)
    return LaneConfigError(
        f"unknown pair {name!r}; {did_you_mean(name, names)}known pairs: {', '.join(names)}"
    )
