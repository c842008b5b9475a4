"""llama-server's own n-gram speculation against its own plain decoding, for
spec_speedup.py: one server per speculation type and one plain server, all started with
the settings of specdiff's lanes (threads, context, batch sizes, kernels), each asked for
the same greedy completion.

A completion is streamed so that its speed can be read two ways: the server's own
`timings.predicted_per_second`, and the rate its tokens reached this process, first to
last (as specdiff's own figure counts from its first token).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from specdiff.engine.server.process import (
    NO_REPACK,
    LlamaServer,
    find_llama_server,
    spec_types,
    stop_servers,
    usable_option,
)
from specdiff.lanes import Lane

PLAIN = "plain"
NGRAM_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")


@dataclass(frozen=True)
class Completion:
    """One greedy completion on a server: its token count and both speeds."""

    tokens: int
    server_tokens_per_second: float
    wall_tokens_per_second: float
    drafted: int
    accepted: int
    text: str


def lane_arguments(lane: Lane, repack: bool) -> list[str]:
    """llama-server options for the settings specdiff's lane decodes with."""
    arguments = [
        "--threads", str(lane.threads),
        "--threads-batch", str(lane.threads_batch or lane.threads),
        "--ctx-size", str(lane.n_ctx),
        "--batch-size", str(lane.n_batch),
        "--ubatch-size", str(lane.n_ubatch),
        "--flash-attn", lane.flash_attn,
        "--cache-type-k", lane.type_k,
        "--cache-type-v", lane.type_v,
        "--parallel", "1",
    ]  # fmt: skip
    return arguments if repack else [*arguments, NO_REPACK]


def known_types(binary: Path, wanted: list[str] | None) -> list[str]:
    """The n-gram types to measure: those asked for (or all of NGRAM_TYPES) that this
    llama-server lists."""
    listed = spec_types(binary)
    chosen = wanted or list(NGRAM_TYPES)
    return [kind for kind in chosen if not listed or kind in listed]


class ServerSet:
    """A plain llama-server and one per speculation type, started together."""

    def __init__(
        self, model: Path, lane: Lane, repack: bool, kinds: list[str], draft_max: int | None
    ) -> None:
        binary = find_llama_server()
        base = lane_arguments(lane, repack)
        extra: list[str] = []
        if draft_max is not None:
            extra = [usable_option(binary, "--spec-draft-n-max", "--draft-max") or "--draft-max"]
            extra.append(str(draft_max))
        self.servers = {PLAIN: LlamaServer(binary, model, base)}
        for kind in known_types(binary, kinds):
            self.servers[kind] = LlamaServer(binary, model, [*base, "--spec-type", kind, *extra])
        self.client = httpx.Client(timeout=600.0)

    @property
    def kinds(self) -> list[str]:
        return [name for name in self.servers if name != PLAIN]

    def __enter__(self) -> ServerSet:
        try:
            for server in self.servers.values():
                server.start()
        except BaseException:
            stop_servers(list(self.servers.values()))
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self.client.close()
        self.stop()

    def stop(self) -> None:
        stop_servers(list(self.servers.values()))

    def complete(self, name: str, prompt: str, tokens: int) -> Completion:
        """A greedy completion of `prompt` on server `name`, streamed and timed."""
        body = {
            "prompt": prompt,
            "n_predict": tokens,
            "temperature": 0,
            "cache_prompt": False,
            "stream": True,
        }
        url = f"{self.servers[name].url}/completion"
        first = last = 0.0
        pieces: list[str] = []
        final: dict[str, object] = {}
        with self.client.stream("POST", url, json=body) as response:
            response.raise_for_status()
            for line in response.iter_lines():
                if not line.startswith("data: "):
                    continue
                data = json.loads(line[6:])
                now = time.perf_counter()
                if data.get("content"):
                    first = first or now
                    last = now
                    pieces.append(data["content"])
                if data.get("stop"):
                    final = data
        return _completion(final, first, last, "".join(pieces))


def _completion(final: dict[str, object], first: float, last: float, text: str) -> Completion:
    timings = final.get("timings")
    if not isinstance(timings, dict):
        raise RuntimeError(f"llama-server's last chunk carried no timings: {final}")
    count = int(timings["predicted_n"])
    wall = (count - 1) / (last - first) if count > 1 and last > first else float("nan")
    return Completion(
        tokens=count,
        server_tokens_per_second=float(timings["predicted_per_second"]),
        wall_tokens_per_second=wall,
        drafted=int(timings.get("draft_n", 0)),
        accepted=int(timings.get("draft_n_accepted", 0)),
        text=text,
    )
