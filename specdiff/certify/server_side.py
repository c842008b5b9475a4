"""The certify battery's server side: one deployment behind an endpoint, reached through
server lanes (one per request in flight), and a probe that reads what the server says
of itself (/slots, /metrics, llama-server's timings) while they run.

A server's words are evidence only where they are consistent with what this client
did: a cache hit claimed for a request that could not have hit is not believed about
the others either. The engine (a lane's tokenizer) loads only in the worker process, so
its imports are deferred.
"""

from __future__ import annotations

import json
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
    Reading,
    counter_readings,
    draft_proof,
    metric_reading,
    overlap,
    running_proof,
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
IDLE_READINGS = 5
"""How often the running-request count is read before requests are sent together, until
it reads zero: a request that just ended may still be counted for a moment."""
OWN_API = "give --both api=llama-server"
"""How a llama-server reached through its OpenAI API is reached through its own."""


class Watch:
    """Reads what the server says it runs, every POLL_SECONDS, while requests are in
    flight (a `with` block); the readings it got are in `seen`."""

    def __init__(self, read: Callable[[], Reading | str | None]) -> None:
        self.read = read
        self.seen: list[Reading | str] = []
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
        return self._metrics()[0]

    def _metrics(self) -> tuple[str, str]:
        """The server's /metrics text ("" where it has none), and why it is no reading
        where it was cut short: past the bytes read, or within a line (Prometheus text
        ends every line, the last one too)."""
        from specdiff.engine.server.client import MAX_IDENTITY_BYTES  # deferred, as above

        answer = self.probe.request("GET", "/metrics", MAX_IDENTITY_BYTES)
        if answer.status != 200:
            return "", ""
        text = answer.body.decode("utf-8", "replace")
        if len(answer.body) >= MAX_IDENTITY_BYTES:
            return text, f"its /metrics ran past {MAX_IDENTITY_BYTES >> 20} MiB and was cut short"
        if text and not text.endswith("\n"):
            return text, "its /metrics answer ended within a line (cut short)"
        return text, ""

    def _metric(self, names: Sequence[str]) -> tuple[str, float] | str | None:
        """The first of `names` in /metrics with its value; None where none is there;
        why not, where the answer is no reading."""
        text, cut = self._metrics()
        found = metric_reading(text, names)
        return cut if cut and found is not None else found

    def _running(self) -> Reading | str | None:
        """How many requests the server says it runs now, and where it says so; why its
        answer is no reading; None where it does not say."""
        if self.flavor == "llama-server":
            answer = self.probe.request("GET", "/slots")
            if answer.status == 200:
                busy = slots_processing(answer.json())
                if busy is not None:
                    return "/slots", busy
        found = self._metric(RUNNING)
        if found is None or isinstance(found, str):
            return found
        name, value = found
        if value < 0 or value != int(value):
            return f"its /metrics {name} read {value:g}, which is no count of requests"
        return f"/metrics {name}", int(value)

    def _idle(self) -> list[Reading | str]:
        """The running-request count before requests are sent together: read until it is
        zero, IDLE_READINGS times at most."""
        readings: list[Reading | str] = []
        for _ in range(IDLE_READINGS):
            try:
                reading = self._running()
            except Exception:  # as while they run: a probe that fails shows nothing
                reading = None
            if reading is None:
                break
            readings.append(reading)
            if isinstance(reading, str) or reading[1] == 0:
                break
            time.sleep(POLL_SECONDS)
        return readings

    def _hits(self) -> float | str | None:
        found = self._metric(CACHE_HITS)
        return found if found is None or isinstance(found, str) else found[1]

    def _generate(self, lane: ServerLane, prompt: str, max_tokens: int) -> list[TokenStep]:
        from specdiff.engine.server.client import ServerError  # deferred, as in __init__
        from specdiff.engine.server.dialects import NO_LOGPROBS

        with self.timeline.request() as counted:
            try:
                steps = list(lane.generate(prompt, max_tokens))
            except ServerError as error:
                if NO_LOGPROBS in str(error) and self._llama_server_off_its_api():
                    # the hint for llama-cpp-python's server would send the user astray
                    raise lane.client.fail(
                        "llama-server sent tokens without log-probabilities on its OpenAI "
                        f"API; it reports them on its own: {OWN_API}"
                    ) from None
                raise
            counted[0] = len(steps)
        return steps

    def _llama_server_off_its_api(self) -> bool:
        """Whether this is llama-server reached through an API other than its own."""
        return self.flavor == "llama-server" and self.lane.api != "llama-server"

    def alone(self, prompt: str, max_tokens: int) -> list[TokenStep]:
        return self._generate(self.lanes[0], prompt, max_tokens)

    def together(
        self, prompts: Sequence[str], max_tokens: int, wanted: Sequence[int]
    ) -> tuple[dict[int, list[TokenStep]], Proof]:
        before = self._idle()
        results, reached, during = self._sent_together(prompts, max_tokens)
        proof = running_proof(before, during, len(prompts), reached)
        return {p: results[p] for p in wanted}, proof

    def _sent_together(
        self, prompts: Sequence[str], max_tokens: int
    ) -> tuple[list[list[TokenStep]], int, list[Reading | str]]:
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

        with Watch(self._running) as watch, ThreadPoolExecutor(len(prompts)) as executor:
            futures = [executor.submit(send, place) for place in range(len(prompts))]
            results = [future.result() for future in futures]
        return results, overlap(spans), watch.seen

    def cold_and_warm(self, question: str, max_tokens: int) -> CacheOutcome | str:
        if self.flavor == "llama-server":
            return self._llama_cache(question, max_tokens)
        return self._counted_cache(question, max_tokens)

    def _llama_cache(self, question: str, max_tokens: int) -> CacheOutcome | str:
        """llama-server: cold with cache_prompt off; warm after a priming request in the
        same slot; its timings' cache_n says how many prompt tokens came from the cache.
        Both the priming request and the timings are llama-server's own API's."""
        if self.lane.api != "llama-server":
            return (
                "llama-server's prompt cache is primed, and its hits counted "
                f"(timings.cache_n), through its own API only: {OWN_API}"
            )
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

    def _counted_cache(self, question: str, max_tokens: int) -> CacheOutcome | str:
        """vLLM, SGLang and others: empty the cache where the server has a way (else a
        prompt it has never seen), then prime the prefix; the hit counter of /metrics
        says what came from the cache, and must say nothing for the cold request."""
        if self._hits() is None:  # an answer that is no reading still shows a counter
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
        counted = counter_readings((before, after_cold, primed, after_warm))
        if isinstance(counted, str):
            return cold, warm, Proof(False, counted, {"source": "/metrics hit counter"})
        cold_hits, warm_hits = counted[1] - counted[0], counted[3] - counted[2]
        how = f"after {emptied}" if emptied else "on a prompt it was never sent (a fresh nonce)"
        tokens = len(self.lanes[0].tokenize(prompt))
        proof = cache_proof("/metrics hit counter", cold_hits, warm_hits, tokens, how)
        return cold, warm, proof

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
                "(--both api=llama-server); this server offers no such request"
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
        speculating = self.lanes[0]
        if self.other is None:
            return (
                "no second endpoint to compare with: give the same model without speculation "
                "as --endpoint (serve-pair starts both)"
            )
        plain_lane = self._open(replace(self.other, prefix="fresh"))
        pairs: list[Compared] = []
        counts: list[tuple[int, int, int]] = []
        for number, prompt in enumerate(prompts, 1):
            spec = self._generate(speculating, prompt, max_tokens)
            generation = speculating.generation
            counts.append((generation.drafted, generation.accepted, len(spec)))
            plain = self._generate(plain_lane, prompt, max_tokens)
            if plain_lane.generation.accepted:
                return "the second endpoint speculates too: it is no plain reference"
            pairs.append(Compared(f"prompt {number} plain vs speculative", plain, spec))
        return pairs, draft_proof(counts, self._draft_limit())

    def _draft_limit(self) -> int | None:
        """The most tokens the server drafts at a time, where its /props says."""
        speculative = self.lanes[0].identity.get("speculative")
        limit = speculative.get("speculative.n_max") if isinstance(speculative, dict) else None
        return limit if type(limit) is int and limit > 0 else None

    def against_bare_client(self, max_tokens: int) -> BareClient:
        from specdiff.engine.server.client import ServerError  # deferred, as in __init__
        from specdiff.engine.server.dialects import dialect_for, request_body

        lane = self.lanes[0]
        dialect = dialect_for(self.lane.api, lane.vocab.piece)
        body = request_body(self.lane, dialect, DEFAULT_PROMPT, max_tokens, [], lane.extra)
        body["stream"] = False
        began = time.perf_counter()
        try:
            answer = self.probe.request("POST", dialect.path, BARE_ANSWER_BYTES, json=body)
        except ServerError as error:
            return BareClient(fault=f"the request without streaming failed: {error}")
        bare = time.perf_counter() - began
        fault = bare_answer_fault(answer.status, answer.body, bare, self.lane.timeout, max_tokens)
        if fault:
            return BareClient(fault=fault)
        began = time.perf_counter()
        steps = list(lane.generate(DEFAULT_PROMPT, max_tokens))
        through = time.perf_counter() - began
        return BareClient(bare, through, len(steps))

    def close(self) -> None:
        self.stack.close()
        self.pool.close()


BARE_ANSWER_BYTES = 1 << 22
"""The most of a bare client's answer read: a completion of --max-tokens tokens is far
shorter, so an answer this long is a server that ignored the budget."""


def bare_answer_fault(
    status: int, body: bytes, seconds: float, timeout: float, max_tokens: int
) -> str:
    """Why a bare client's answer to one request of `max_tokens` tokens, without
    streaming, is no measurement of the server's speed ("" where it is one): an error,
    an answer that ran past the bytes or the time read, or one that is not a single
    completion within the budget."""
    asked = f"one {max_tokens}-token request without streaming"
    if status != 200:
        return f"the server answered {asked} with HTTP {status}"
    if len(body) >= BARE_ANSWER_BYTES:
        return (
            f"the server sent over {BARE_ANSWER_BYTES >> 20} MiB for {asked}: it ignores "
            "max_tokens or the request not to stream"
        )
    if seconds >= timeout:
        return (
            f"the server was still sending its answer to {asked} after {timeout:g} s (the "
            "lane's timeout): it ignores max_tokens or the request not to stream"
        )
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        data = None
    if not isinstance(data, dict):
        return f"the server's answer to {asked} is not one JSON object (it may have streamed)"
    usage = data.get("usage")
    counted = usage.get("completion_tokens") if isinstance(usage, dict) else None
    if type(counted) is int and counted > max_tokens:
        return f"the server generated {counted} tokens for {asked}: it ignores max_tokens"
    return ""


def cache_proof(
    source: str, cold: float | None, warm: float | None, prompt_tokens: int, cold_how: str
) -> Proof:
    """Whether a cache hit is shown: none on the cold request, some (no more than the
    prompt holds) on the warm one. A server that counts hits on a request it could not
    have served from its cache is not believed about the warm one either."""
    facts = {"source": source, "cold_hits": cold, "warm_hits": warm, "prompt_tokens": prompt_tokens}
    if cold is None or warm is None:
        return Proof(False, f"the server reported no cache hits ({source} absent)", facts)
    if cold < 0 or warm < 0:
        return Proof(False, f"the server counted fewer than no cached tokens ({source})", facts)
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
    return Proof(True, f"{source}: {cold:g} cached tokens cold, {warm:g} warm", facts)
