"""The certify battery's server side: one deployment behind an endpoint, reached through
server lanes (one per request in flight), and a probe that reads what the server says
of itself (/slots, /metrics, llama-server's timings) while they run.

A server's words are evidence only where they are consistent with what this client
did: a cache hit claimed for a request that could not have hit is not believed about
the others either. The engine (a lane's tokenizer) loads only in the worker process, so
its imports are deferred.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from specdiff.certify.evidence import (
    CACHE_HITS,
    RUNNING,
    first_of,
    metric_values,
    overlap,
    slots_processing,
)
from specdiff.certify.records import Compared, Proof
from specdiff.certify.sides import (
    SHARED_PREFIX,
    BareClient,
    CacheOutcome,
    Progress,
    Settings,
    Timeline,
)
from specdiff.lanes import Lane, without_credentials
from specdiff.prompts import DEFAULT_PROMPT
from specdiff.steps import TokenStep

if TYPE_CHECKING:
    from specdiff.engine.server.lane import ServerLane

POLL_SECONDS = 0.05
"""How often a server's /slots and /metrics are read while requests run together."""


class Watch:
    """Reads what the server says it runs, every POLL_SECONDS, while requests are in
    flight (a `with` block); the readings it got are in `seen`."""

    def __init__(self, read: Callable[[], tuple[str, int] | None]) -> None:
        self.read = read
        self.seen: list[tuple[str, int]] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._watch, name="certify-probe", daemon=True)

    def __enter__(self) -> Watch:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.done.set()
        self.thread.join(timeout=10)

    def _watch(self) -> None:
        while not self.done.is_set():
            try:
                reading = self.read()
            except Exception:  # a probe that fails shows nothing; the requests go on
                reading = None
            if reading is not None:
                self.seen.append(reading)
            self.done.wait(POLL_SECONDS)


def _running_proof(seen: Sequence[tuple[str, int]], reached: int) -> Proof:
    """Whether the server showed two of the requests sent together running at once."""
    facts: dict[str, Any] = {"in_flight_from_client": reached}
    if not seen:
        how = (
            f"the server shows no running-request count (/slots or /metrics), so that the "
            f"{reached} requests in flight shared a batch cannot be shown"
        )
        return Proof(False, how, facts)
    source = seen[0][0]
    most = max(count for _, count in seen)
    facts.update(server_running_most=most, source=source)
    shown = most >= 2
    how = (
        f"{source} showed {most} requests running at once ({reached} in flight from here)"
        if shown
        else f"{source} never showed two requests running at once ({reached} in flight "
        "from here)"
    )
    return Proof(shown, how, facts)


class ServerSide:
    """One deployment behind an endpoint: server lanes, one per request in flight, and a
    probe that reads what the server says of itself while they run."""

    def __init__(
        self,
        lane: Lane,
        settings: Settings,
        progress: Progress,
        cancel: threading.Event,
        other: Lane | None = None,
    ) -> None:
        # deferred: the engine loads in the worker process only
        from specdiff.engine.llama.context import ModelPool
        from specdiff.engine.server.client import ServerClient, read_api_key

        self.lane = replace(lane, prefix="fresh")
        self.other = other
        self.progress = progress
        self.cancel = cancel
        self.timeline = Timeline()
        self.pool = ModelPool()
        self.stack = ExitStack()
        try:
            self.lanes = [self._open(self.lane) for _ in range(settings.width)]
            self.probe = ServerClient(self.lane, read_api_key(self.lane, "a"))
            self.stack.callback(self.probe.close)
            self.flavor = self._flavor()
        except BaseException:
            self.close()
            raise

    def _open(self, lane: Lane) -> ServerLane:
        from specdiff.engine.server.lane import ServerLane  # deferred, as in __init__

        opened = ServerLane(lane, "a", self.pool, self.progress, self.cancel)
        self.stack.callback(opened.close)
        return opened

    def _flavor(self) -> str:
        """Which engine answers: llama-server (its /props), vLLM or SGLang (their
        metrics' names), else an OpenAI-compatible server of unknown make."""
        if "build_info" in self.lanes[0].identity:
            return "llama-server"
        text = self._metrics_text()
        if "vllm:" in text:
            return "vllm"
        if "sglang:" in text:
            return "sglang"
        return "openai"

    def describe(self) -> dict[str, Any]:
        identity = self.lanes[0].identity
        return {
            "kind": "server",
            "endpoint": without_credentials(self.lane.endpoint),
            "engine": self.flavor,
            "api": self.lane.api,
            "lane": self.lane.as_dict(),
            "server": identity,
            "other_endpoint": without_credentials(self.other.endpoint) if self.other else None,
        }

    def _metrics_text(self) -> str:
        from specdiff.engine.server.client import MAX_IDENTITY_BYTES  # deferred, as above

        answer = self.probe.request("GET", "/metrics", MAX_IDENTITY_BYTES)
        return answer.body.decode("utf-8", "replace") if answer.status == 200 else ""

    def _running(self) -> tuple[str, int] | None:
        """How many requests the server says it runs now, and where it says so."""
        if self.flavor == "llama-server":
            answer = self.probe.request("GET", "/slots")
            if answer.status == 200:
                busy = slots_processing(answer.json())
                if busy is not None:
                    return "/slots", busy
        found = first_of(metric_values(self._metrics_text(), RUNNING), RUNNING)
        return (f"/metrics {found[0]}", int(found[1])) if found else None

    def _hits(self) -> float | None:
        found = first_of(metric_values(self._metrics_text(), CACHE_HITS), CACHE_HITS)
        return found[1] if found else None

    def _generate(self, lane: ServerLane, prompt: str, max_tokens: int) -> list[TokenStep]:
        with self.timeline.request() as counted:
            steps = list(lane.generate(prompt, max_tokens))
            counted[0] = len(steps)
        return steps

    def alone(self, prompt: str, max_tokens: int) -> list[TokenStep]:
        return self._generate(self.lanes[0], prompt, max_tokens)

    def together(
        self, prompts: Sequence[str], max_tokens: int, wanted: Sequence[int]
    ) -> tuple[dict[int, list[TokenStep]], Proof]:
        results, reached, seen = self._sent_together(prompts, max_tokens)
        return {p: results[p] for p in wanted}, _running_proof(seen, reached)

    def _sent_together(
        self, prompts: Sequence[str], max_tokens: int
    ) -> tuple[list[list[TokenStep]], int, list[tuple[str, int]]]:
        """Each prompt's steps, all sent at once (one lane each); how many this client
        had in flight at most; and what the server said it ran meanwhile."""
        start = threading.Barrier(len(prompts))
        spans: list[tuple[float, float]] = []

        def send(place: int) -> list[TokenStep]:
            start.wait()
            began = time.perf_counter()
            try:
                return self._generate(self.lanes[place], prompts[place], max_tokens)
            finally:
                spans.append((began, time.perf_counter()))

        with Watch(self._running) as watch:
            with ThreadPoolExecutor(max_workers=len(prompts)) as executor:
                futures = [executor.submit(send, place) for place in range(len(prompts))]
                results = [future.result() for future in futures]
        return results, overlap(spans), watch.seen

    def cold_and_warm(
        self, question: str, max_tokens: int
    ) -> CacheOutcome | str:
        if self.flavor == "llama-server":
            return self._llama_cache(question, max_tokens)
        return self._counted_cache(question, max_tokens)

    def _llama_cache(
        self, question: str, max_tokens: int
    ) -> CacheOutcome | str:
        """llama-server: cold with cache_prompt off; warm after a priming request in the
        same slot; its timings' cache_n says how many prompt tokens came from the cache."""
        prompt = SHARED_PREFIX + question
        cold_lane = self.lanes[0]
        cold = self._generate(cold_lane, prompt, max_tokens)
        cold_hits = cold_lane.timings.get("cache_n")
        warm_lane = self._open(replace(self.lane, prefix="cached", prefix_text=SHARED_PREFIX))
        warm = self._generate(warm_lane, prompt, max_tokens)
        warm_hits = warm_lane.timings.get("cache_n")
        return cold, warm, cache_proof(
            "timings.cache_n", cold_hits, warm_hits, len(warm_lane.tokenize(prompt)),
            "sent with cache_prompt off",
        )  # fmt: skip

    def _counted_cache(
        self, question: str, max_tokens: int
    ) -> CacheOutcome | str:
        """vLLM, SGLang and others: empty the cache where the server has a way (else a
        prompt it has never seen), then prime the prefix; the hit counter of /metrics
        says what came from the cache, and must say nothing for the cold request."""
        if self._hits() is None:
            return (
                "the server exports no prefix-cache hit counter (/metrics "
                f"{' or '.join(CACHE_HITS)}), so a cache hit cannot be shown"
            )
        emptied = self._empty_cache()
        nonce = "" if emptied else f"[{secrets.token_hex(4)}] "
        prefix, prompt = nonce + SHARED_PREFIX, nonce + SHARED_PREFIX + question
        before = self._hits()
        cold = self._generate(self.lanes[0], prompt, max_tokens)
        after_cold = self._hits()
        self._generate(self.lanes[0], prefix, 1)  # the priming turn
        primed = self._hits()
        warm = self._generate(self.lanes[0], prompt, max_tokens)
        after_warm = self._hits()
        if None in (before, after_cold, primed, after_warm):
            return "the hit counter stopped answering during the test"
        assert before is not None and after_cold is not None
        assert primed is not None and after_warm is not None
        how = f"after {emptied}" if emptied else "on a prompt it was never sent (a fresh nonce)"
        return cold, warm, cache_proof(
            "/metrics hit counter", after_cold - before, after_warm - primed,
            len(self.lanes[0].tokenize(prompt)), how,
        )  # fmt: skip

    def _empty_cache(self) -> str:
        """Empty the prefix cache where the engine has a way; what was done, or ""."""
        paths = {"vllm": "/reset_prefix_cache", "sglang": "/flush_cache"}
        path = paths.get(self.flavor)
        if path is None:
            return ""
        for method in ("POST", "GET"):
            answer = self.probe.request(method, path)
            if answer.status == 200:
                return f"{method} {path}"
        return ""

    def forced(self, prompt: str, steps: Sequence[TokenStep]) -> list[TokenStep] | str:
        if self.flavor != "llama-server" or self.lane.api != "llama-server":
            return (
                "scoring forced tokens needs llama-server's /completion with token ids "
                "(--lane api=llama-server); this server offers no such request"
            )
        from specdiff.engine.server.dialects import LlamaServer
        from specdiff.engine.server.rescore import Rescorer

        lane = self.lanes[0]
        ids = Rescorer(lane.client, lane.lane.top_k, lane.vocab.piece, lane.extra).prompt_ids(
            prompt
        )
        forced = []
        for index in range(len(steps)):
            body = {
                **lane.extra,
                "prompt": [*ids, *(s.token_id for s in steps[:index])],
                "n_predict": 1,
                "n_probs": max(lane.lane.top_k, 2),
                "temperature": 0,
                "repeat_penalty": 1.0,
                "cache_prompt": False,  # a whole prefill each time, never the cached decode
                "return_tokens": True,
                "stream": False,
            }
            with self.timeline.request() as counted:
                answer = lane.client.request("POST", "/completion", 1 << 20, json=body)
                counted[0] = 1
            lane.client.check_status(answer)
            data = answer.json()
            event = LlamaServer(lane.vocab.piece).parse(data if isinstance(data, dict) else {})
            if not event.tokens:
                return "a scoring answer held no token"
            token, top = event.tokens[0]
            forced.append(lane._step(index, token, top))
        return forced

    def speculation(
        self, prompts: Sequence[str], max_tokens: int
    ) -> tuple[list[Compared], Proof] | str:
        speculating = [self.lanes[0]]
        if self.other is None:
            return (
                "no second endpoint to compare with: give the same model without speculation "
                "as --endpoint (serve-pair starts both)"
            )
        plain_lane = self._open(replace(self.other, prefix="fresh"))
        pairs, drafted, accepted = [], 0, 0
        for number, prompt in enumerate(prompts, 1):
            spec = self._generate(speculating[0], prompt, max_tokens)
            drafted += speculating[0].generation.drafted
            accepted += speculating[0].generation.accepted
            plain = self._generate(plain_lane, prompt, max_tokens)
            if plain_lane.generation.accepted:
                return "the second endpoint speculates too: it is no plain reference"
            pairs.append(Compared(f"prompt {number} plain vs speculative", plain, spec))
        proof = Proof(
            accepted > 0,
            f"the server accepted {accepted} of {drafted} drafted tokens"
            if accepted
            else "the server accepted no drafted token (its timings show none): it did not "
            "speculate on these prompts",
            {"drafted": drafted, "accepted": accepted},
        )
        return pairs, proof

    def against_bare_client(self, max_tokens: int) -> BareClient:
        from specdiff.engine.server.dialects import dialect_for, request_body  # deferred

        lane = self.lanes[0]
        dialect = dialect_for(self.lane.api, lane.vocab.piece)
        body = request_body(self.lane, dialect, DEFAULT_PROMPT, max_tokens, [], lane.extra)
        body["stream"] = False
        began = time.perf_counter()
        answer = self.probe.request("POST", dialect.path, 1 << 22, json=body)
        bare = time.perf_counter() - began
        if answer.status != 200:
            return BareClient()
        began = time.perf_counter()
        steps = list(lane.generate(DEFAULT_PROMPT, max_tokens))
        through = time.perf_counter() - began
        return BareClient(bare, through, len(steps))

    def close(self) -> None:
        self.stack.close()
        self.pool.close()


def cache_proof(
    source: str, cold: float | None, warm: float | None, prompt_tokens: int, cold_how: str
) -> Proof:
    """Whether a cache hit is shown: none on the cold request, some (no more than the
    prompt holds) on the warm one. A server that counts hits on a request it could not
    have served from its cache is not believed about the warm one either."""
    facts = {"source": source, "cold_hits": cold, "warm_hits": warm, "prompt_tokens": prompt_tokens}
    if cold is None or warm is None:
        return Proof(False, f"the server reported no cache hits ({source} absent)", facts)
    if cold > 0:
        return Proof(
            False,
            f"the server claimed {cold:g} cached tokens for the cold request ({cold_how}), "
            "a hit it cannot have made, so its claim for the warm one is not evidence",
            facts,
        )
    if warm > prompt_tokens + 1:
        return Proof(
            False,
            f"the server claimed {warm:g} cached tokens for a {prompt_tokens}-token prompt",
            facts,
        )
    if warm <= 0:
        return Proof(False, "the warm request reused no cached token", facts)
    return Proof(True, f"{source}: 0 cached tokens cold, {warm:g} warm", facts)
