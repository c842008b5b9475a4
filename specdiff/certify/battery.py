"""The certify battery: the requests behind each property, against a server or the
in-process engine, and the evidence that the condition each is about really happened.

Both sides answer the same questions (a prompt alone; prompts together; a prompt cold
and warm; a decode against the same positions forced; speculation on and off), so the
verdict logic in `records` never knows which side it judges. The in-process side uses
`BatchedLane` (the batches repeat builds) and `PairRun` (the cache and speculation
pairs); the server side uses server lanes, one per request in flight, and reads the
server's /slots and /metrics while they run.

Like repeat, the battery loads llama.cpp (a server lane's tokenizer), so the command
runs `run_battery` in a worker process.
"""

from __future__ import annotations

import random
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from typing import Any

from specdiff.certify.evidence import (
    CACHE_HITS,
    RUNNING,
    busy_time,
    first_of,
    metric_values,
    overlap,
    slots_processing,
)
from specdiff.certify.records import (
    BATCH,
    DECODE_PREFILL,
    NEEDLE,
    PREFIX_CACHE,
    RUN_TO_RUN,
    SPECULATION,
    Certificate,
    Compared,
    Proof,
    PropertyResult,
    judge,
    not_tested,
)
from specdiff.errors import PromptError
from specdiff.lanes import Lane, Pair, without_credentials
from specdiff.prompts import DEFAULT_PROMPT
from specdiff.prompts import load as load_prompts
from specdiff.steps import TokenStep

Progress = Callable[[str], None]

SHARED_PREFIX = (
    "You are a careful assistant. Answer in plain words, one short paragraph, and say "
    "when you are not sure. Context: the town library opens at nine, closes at six, and "
    "lends books for three weeks; the reading room is quiet and has forty seats.\n"
)
"""The prefix the cache property primes: long enough that a hit covers many tokens."""
CACHE_QUESTIONS = ("Question: When does the library close?\nAnswer:",)
POLL_SECONDS = 0.05
"""How often a server's /slots and /metrics are read while requests run together."""
FILLER_WORDS = (3, 12, 40, 80)
"""The lengths (in words, cycled) the needle's fillers are cut to: a ragged batch."""


def _quiet(_: str) -> None:
    return None


@dataclass(frozen=True)
class Settings:
    runs: int = 4
    """Run to run: how often the same request is sent."""
    batch: int = 4
    """Batch size N: prompts sent together."""
    fillers: int = 8
    """Needle: filler prompts sent with it."""
    needle_trials: int = 2
    max_tokens: int = 48
    seed: int = 0
    properties: tuple[str, ...] = ()

    def check(self) -> None:
        if self.runs < 1:
            raise PromptError(f"-n must be at least 1, got {self.runs}")
        if self.batch < 2:
            raise PromptError(f"--batch-size must be at least 2 to batch, got {self.batch}")
        if self.fillers < 1:
            raise PromptError(f"--fillers must be at least 1, got {self.fillers}")
        if self.max_tokens < 1:
            raise PromptError(f"--max-tokens must be at least 1, got {self.max_tokens}")


def batch_prompts(count: int) -> list[str]:
    """`count` distinct prompts: the divergence set's, then the open set's."""
    pool = [item["prompt"] for item in load_prompts("divergence") + load_prompts("open")]
    return [pool[i % len(pool)] for i in range(count)]


def filler_prompts(count: int) -> list[str]:
    """Fillers of mixed lengths, cut from the open set's prompts (padded by repeating)."""
    texts = [item["prompt"] for item in load_prompts("open")]
    fillers = []
    for i in range(count):
        words = (texts[i % len(texts)] + " ").split() * 20
        fillers.append(" ".join(words[: FILLER_WORDS[i % len(FILLER_WORDS)]]))
    return fillers


def speculation_prompts() -> list[str]:
    """Where speculation drafts: the default prompt and a repetitive one."""
    return [DEFAULT_PROMPT, load_prompts("repetitive")[0]["prompt"]]


class Timeline:
    """Every request's time span, for the cost and the overhead figures."""

    def __init__(self) -> None:
        self.spans: list[tuple[float, float]] = []
        self.tokens = 0
        self.guard = threading.Lock()

    @contextmanager
    def request(self) -> Iterator[list[int]]:
        counted = [0]
        began = time.perf_counter()
        try:
            yield counted
        finally:
            with self.guard:
                self.spans.append((began, time.perf_counter()))
                self.tokens += counted[0]


class Side:
    """What the battery asks of an engine; each method returns steps (and evidence)."""

    timeline: Timeline

    def describe(self) -> dict[str, Any]:
        raise NotImplementedError

    def alone(self, prompt: str, max_tokens: int) -> list[TokenStep]:
        raise NotImplementedError

    def together(
        self, prompts: Sequence[str], max_tokens: int, wanted: Sequence[int]
    ) -> tuple[dict[int, list[TokenStep]], Proof]:
        """The prompts decoded at once; the steps of those at the `wanted` places."""
        raise NotImplementedError

    def cold_and_warm(
        self, question: str, max_tokens: int
    ) -> tuple[list[TokenStep], list[TokenStep], Proof] | str:
        """The same prompt with its cache emptied and with its prefix cached; or why not."""
        raise NotImplementedError

    def forced(self, prompt: str, steps: Sequence[TokenStep]) -> list[TokenStep] | str:
        """Each step's position scored with the prompt and the earlier tokens forced in
        one prefill; or why it cannot be."""
        raise NotImplementedError

    def speculation(
        self, prompts: Sequence[str], max_tokens: int
    ) -> tuple[list[Compared], Proof] | str:
        raise NotImplementedError

    def against_bare_client(self, max_tokens: int) -> dict[str, Any]:
        """One request sent by a bare HTTP client and the same through a lane, timed."""
        return {}

    def close(self) -> None:
        return None


def run_battery(side: Side, settings: Settings, progress: Progress = _quiet) -> Certificate:
    """Every property `settings` names, in order, on `side`."""
    chosen = settings.properties
    results: list[PropertyResult] = []
    began = time.perf_counter()
    reference: tuple[str, list[TokenStep]] | None = None
    for name in chosen:
        progress(f"certify: {name}")
        start = time.perf_counter()
        if name == RUN_TO_RUN:
            result, reference = _run_to_run(side, settings)
        elif name == BATCH:
            result = _batch(side, settings)
        elif name == NEEDLE:
            result = _needle(side, settings)
        elif name == PREFIX_CACHE:
            result = _prefix_cache(side, settings)
        elif name == DECODE_PREFILL:
            result = _decode_prefill(side, settings, reference)
        else:
            result = _speculation(side, settings)
        result.seconds = time.perf_counter() - start
        results.append(result)
    wall = time.perf_counter() - began
    timeline = side.timeline
    busy = busy_time(timeline.spans)
    cost = {
        "wall_seconds": wall,
        "request_seconds": busy,
        "overhead": wall / busy if busy else None,
        "requests": len(timeline.spans),
        "tokens": timeline.tokens,
        "tokens_per_second": timeline.tokens / busy if busy else None,
    }
    cost.update(side.against_bare_client(settings.max_tokens))
    return Certificate(side.describe(), _settings_record(settings), results, cost)


def _settings_record(settings: Settings) -> dict[str, Any]:
    return {
        "runs": settings.runs,
        "batch": settings.batch,
        "fillers": settings.fillers,
        "needle_trials": settings.needle_trials,
        "max_tokens": settings.max_tokens,
        "seed": settings.seed,
        "properties": list(settings.properties),
    }


def _run_to_run(
    side: Side, settings: Settings
) -> tuple[PropertyResult, tuple[str, list[TokenStep]] | None]:
    prompt = DEFAULT_PROMPT
    runs = [side.alone(prompt, settings.max_tokens) for _ in range(settings.runs)]
    unique = len({tuple(s.token_id for s in run) for run in runs})
    if len(runs) < 2:
        return (
            not_tested(RUN_TO_RUN, "one run has nothing to compare with; give -n 2 or more"),
            (prompt, runs[0]),
        )
    pairs = [Compared(f"run {i + 1} vs run 1", runs[0], run) for i, run in enumerate(runs[1:], 1)]
    proof = Proof(True, f"{len(runs)} requests sent one after another", {"runs": len(runs)})
    result = judge(RUN_TO_RUN, pairs, proof)
    result.identical += 1  # run 1 is identical to itself: X of N counts runs
    result.compared += 1
    result.details["unique_completions"] = unique
    return result, (prompt, runs[0])


def _batch(side: Side, settings: Settings) -> PropertyResult:
    prompts = batch_prompts(settings.batch)
    alone = [side.alone(prompt, settings.max_tokens) for prompt in prompts]
    together, proof = side.together(prompts, settings.max_tokens, range(len(prompts)))
    pairs = [
        Compared(f"prompt {i + 1} alone vs among {len(prompts)}", alone[i], together[i])
        for i in range(len(prompts))
    ]
    return judge(BATCH, pairs, proof)


def _needle(side: Side, settings: Settings) -> PropertyResult:
    needle = DEFAULT_PROMPT
    fillers = filler_prompts(settings.fillers)
    alone = side.alone(needle, settings.max_tokens)
    chooser = random.Random(settings.seed)
    pairs: list[Compared] = []
    proofs: list[Proof] = []
    places = []
    for _ in range(settings.needle_trials):
        place = chooser.randrange(len(fillers) + 1)
        places.append(place)
        prompts = [*fillers[:place], needle, *fillers[place:]]
        found, proof = side.together(prompts, settings.max_tokens, [place])
        proofs.append(proof)
        pairs.append(
            Compared(f"alone vs at place {place + 1} of {len(prompts)}", alone, found[place])
        )
    shown = all(proof.shown for proof in proofs)
    joined = Proof(shown, proofs[-1].how if shown else next(p.how for p in proofs if not p.shown))
    joined.facts.update(proofs[-1].facts, places=[p + 1 for p in places])
    result = judge(NEEDLE, pairs, joined)
    result.details["filler_words"] = [len(f.split()) for f in fillers]
    return result


def _prefix_cache(side: Side, settings: Settings) -> PropertyResult:
    pairs: list[Compared] = []
    proofs: list[Proof] = []
    for question in CACHE_QUESTIONS:
        outcome = side.cold_and_warm(question, settings.max_tokens)
        if isinstance(outcome, str):
            return not_tested(PREFIX_CACHE, outcome)
        cold, warm, proof = outcome
        pairs.append(Compared("cold vs warm", cold, warm))
        proofs.append(proof)
    failed = [p for p in proofs if not p.shown]
    proof = failed[0] if failed else proofs[-1]
    return judge(PREFIX_CACHE, pairs, proof)


def _decode_prefill(
    side: Side, settings: Settings, reference: tuple[str, list[TokenStep]] | None
) -> PropertyResult:
    prompt, decoded = reference or (DEFAULT_PROMPT, side.alone(DEFAULT_PROMPT, settings.max_tokens))
    forced = side.forced(prompt, decoded)
    if isinstance(forced, str):
        return not_tested(DECODE_PREFILL, forced)
    proof = Proof(
        True,
        f"each of {len(decoded)} decoded positions scored again with its prompt and earlier "
        "tokens prefilled",
        {"positions": len(decoded)},
    )
    result = judge(DECODE_PREFILL, [Compared("decoded vs prefilled", decoded, forced)], proof)
    result.details["positions_identical"] = sum(
        a.token_id == b.token_id for a, b in zip(decoded, forced)
    )
    return result


def _speculation(side: Side, settings: Settings) -> PropertyResult:
    outcome = side.speculation(speculation_prompts(), settings.max_tokens)
    if isinstance(outcome, str):
        return not_tested(SPECULATION, outcome)
    pairs, proof = outcome
    return judge(SPECULATION, pairs, proof)


# -- the in-process side -------------------------------------------------------------


class LocalSide(Side):
    """The bundled (or given) model in-process: batches of sequences in one KV memory,
    as repeat builds them; the cache and speculation pairs as run runs them."""

    def __init__(
        self, lane: Lane, settings: Settings, progress: Progress, cancel: threading.Event
    ) -> None:
        # deferred: the engine loads in the worker process only
        from specdiff.engine.llama.batched import BatchedLane
        from specdiff.engine.llama.context import ModelPool
        from specdiff.engine.llama.probe import trust_kernels

        self.lane = replace(lane, speculation="none", prefix="fresh")
        self.progress = progress
        self.cancel = cancel
        self.timeline = Timeline()
        self.pool = ModelPool()
        trust_kernels(Pair("certify", self.lane, self.lane), progress)
        width = max(settings.batch, settings.fillers + 1)
        room = max(self.lane.n_ctx, width * (settings.max_tokens + 256))
        self.lane = replace(self.lane, n_ctx=room, n_ubatch=max(self.lane.n_ubatch, width + 2))
        self.batched = BatchedLane(self.lane, width - 1, self.pool, progress, cancel)
        self.base = lane

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "in-process",
            "lane": self.base.as_dict(),
            "model": self.batched.model_path.name,
            "executed": self.batched.context.executed,
        }

    def alone(self, prompt: str, max_tokens: int) -> list[TokenStep]:
        with self.timeline.request() as counted:
            run = self.batched.run(self.batched.tokenize(prompt), [], max_tokens)
            counted[0] = len(run.steps)
        return run.steps

    def together(
        self, prompts: Sequence[str], max_tokens: int, wanted: Sequence[int]
    ) -> tuple[dict[int, list[TokenStep]], Proof]:
        tokens = [self.batched.tokenize(p) for p in prompts]
        found: dict[int, list[TokenStep]] = {}
        widths: list[int] = []
        for place in wanted:
            others = tokens[:place] + tokens[place + 1 :]
            with self.timeline.request() as counted:
                run = self.batched.run(tokens[place], others, max_tokens)
                counted[0] = len(run.steps)
            found[place] = run.steps
            widths.append(max(run.widths, default=1))
        widest = min(widths)
        shown = widest >= 2
        how = (
            f"every decode call held up to {widest} sequences (the prompts shared each batch)"
            if shown
            else "no decode call held more than one sequence"
        )
        facts = {
            "rows_per_decode_call": max(widths),
            # in-process the prompt read is always sequence 0, its neighbours after it
            "sequence_of_the_prompt": 0,
        }
        return found, Proof(shown, how, facts)

    def cold_and_warm(
        self, question: str, max_tokens: int
    ) -> tuple[list[TokenStep], list[TokenStep], Proof] | str:
        warm = replace(self.base, prefix="cached", prefix_text=SHARED_PREFIX, speculation="none")
        cold = replace(self.base, prefix="fresh", speculation="none")
        result = self._pair(
            Pair("cache-vs-fresh", warm, cold), SHARED_PREFIX + question, max_tokens
        )
        prefix = result.a.prefix_tokens
        proof = Proof(
            prefix > 0,
            f"the warm run decoded {prefix} prefix tokens in an earlier call and reused them"
            if prefix > 0
            else "the warm run reused no prefix",
            {"prefix_tokens": prefix},
        )
        return result.b.steps, result.a.steps, proof

    def forced(self, prompt: str, steps: Sequence[TokenStep]) -> list[TokenStep] | str:
        if not steps:
            return "the decode produced no token"
        batched = self.batched
        tokens = batched.tokenize(prompt)
        history = [*tokens, *(s.token_id for s in steps[:-1])]
        if len(history) > self.lane.n_batch:
            return f"prompt and tokens ({len(history)}) exceed one n_batch ({self.lane.n_batch})"
        with self.timeline.request() as counted:
            batched.context.clear()
            batched.context.decode_rows([(t, p, 0) for p, t in enumerate(history)], True)
            forced = [
                batched._step(batched.context.row(len(tokens) - 1 + i), i, len(history))
                for i in range(len(steps))
            ]
            counted[0] = len(forced)
        return forced

    def speculation(
        self, prompts: Sequence[str], max_tokens: int
    ) -> tuple[list[Compared], Proof] | str:
        speculative = (
            self.base if self.base.speculative else replace(self.base, speculation="ngram")
        )
        plain = replace(self.base, speculation="none", prefix="fresh")
        pairs, accepted = [], 0
        for number, prompt in enumerate(prompts, 1):
            result = self._pair(Pair("spec-vs-plain", speculative, plain), prompt, max_tokens)
            pairs.append(
                Compared(f"prompt {number} plain vs speculative", result.b.steps, result.a.steps)
            )
            accepted += result.a.accepted
        proof = Proof(
            accepted > 0,
            f"{accepted} drafted tokens were accepted ({speculative.speculation} speculation)"
            if accepted
            else "no drafted token was accepted",
            {"accepted": accepted, "speculation": speculative.speculation},
        )
        return pairs, proof

    def _pair(self, pair: Pair, prompt: str, max_tokens: int) -> Any:
        from specdiff.engine.pairrun import PairRun  # deferred, as in __init__

        runner = PairRun(pair, self.progress, self.cancel, self.pool)
        try:
            with self.timeline.request() as counted:  # the run, not the lanes' opening
                result = runner.run(prompt, max_tokens)
                counted[0] = len(result.a.steps) + len(result.b.steps)
        finally:
            runner.close()
        for outcome in (result.a, result.b):
            if outcome.error:
                raise PromptError(f"lane {outcome.lane_id} failed: {outcome.error}")
        return result

    def close(self) -> None:
        self.batched.close()
        self.pool.close()


# -- the server side -------------------------------------------------------------------


class ServerSide(Side):
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
        width = max(settings.batch, settings.fillers + 1)
        try:
            self.lanes = [self._open(self.lane) for _ in range(width)]
            self.probe = ServerClient(self.lane, read_api_key(self.lane, "a"))
            self.stack.callback(self.probe.close)
            self.flavor = self._flavor()
        except BaseException:
            self.close()
            raise

    def _open(self, lane: Lane) -> Any:
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

    def _generate(self, client: Any, prompt: str, max_tokens: int) -> list[TokenStep]:
        with self.timeline.request() as counted:
            steps = list(client.generate(prompt, max_tokens))
            counted[0] = len(steps)
        return steps

    def alone(self, prompt: str, max_tokens: int) -> list[TokenStep]:
        return self._generate(self.lanes[0], prompt, max_tokens)

    def together(
        self, prompts: Sequence[str], max_tokens: int, wanted: Sequence[int]
    ) -> tuple[dict[int, list[TokenStep]], Proof]:
        start = threading.Barrier(len(prompts))
        spans: list[tuple[float, float]] = []
        seen: list[tuple[str, int]] = []
        done = threading.Event()

        def send(place: int) -> list[TokenStep]:
            start.wait()
            began = time.perf_counter()
            try:
                return self._generate(self.lanes[place], prompts[place], max_tokens)
            finally:
                spans.append((began, time.perf_counter()))

        def watch() -> None:
            while not done.is_set():
                try:
                    reading = self._running()
                except Exception:  # a probe that fails shows nothing; the requests go on
                    reading = None
                if reading is not None:
                    seen.append(reading)
                done.wait(POLL_SECONDS)

        watcher = threading.Thread(target=watch, name="certify-probe", daemon=True)
        watcher.start()
        try:
            with ThreadPoolExecutor(max_workers=len(prompts)) as executor:
                futures = [executor.submit(send, place) for place in range(len(prompts))]
                results = [future.result() for future in futures]
        finally:
            done.set()
            watcher.join(timeout=10)
        reached = overlap(spans)
        facts: dict[str, Any] = {"in_flight_from_client": reached}
        if not seen:
            how = (
                f"the server shows no running-request count (/slots or /metrics), so that the "
                f"{reached} requests in flight shared a batch cannot be shown"
            )
            return {p: results[p] for p in wanted}, Proof(False, how, facts)
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
        return {p: results[p] for p in wanted}, Proof(shown, how, facts)

    def cold_and_warm(
        self, question: str, max_tokens: int
    ) -> tuple[list[TokenStep], list[TokenStep], Proof] | str:
        if self.flavor == "llama-server":
            return self._llama_cache(question, max_tokens)
        return self._counted_cache(question, max_tokens)

    def _llama_cache(
        self, question: str, max_tokens: int
    ) -> tuple[list[TokenStep], list[TokenStep], Proof] | str:
        """llama-server: cold with cache_prompt off; warm after a priming request in the
        same slot; its timings' cache_n says how many prompt tokens came from the cache."""
        prompt = SHARED_PREFIX + question
        cold_lane = self.lanes[0]
        cold = self._generate(cold_lane, prompt, max_tokens)
        cold_hits = cold_lane.timings.get("cache_n")
        warm_lane = self._open(replace(self.lane, prefix="cached", prefix_text=SHARED_PREFIX))
        warm = self._generate(warm_lane, prompt, max_tokens)
        warm_hits = warm_lane.timings.get("cache_n")
        return cold, warm, _cache_proof(
            "timings.cache_n", cold_hits, warm_hits, len(warm_lane.tokenize(prompt)),
            "sent with cache_prompt off",
        )  # fmt: skip

    def _counted_cache(
        self, question: str, max_tokens: int
    ) -> tuple[list[TokenStep], list[TokenStep], Proof] | str:
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
        return cold, warm, _cache_proof(
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

    def against_bare_client(self, max_tokens: int) -> dict[str, Any]:
        from specdiff.engine.server.dialects import dialect_for, request_body  # deferred

        lane = self.lanes[0]
        dialect = dialect_for(self.lane.api, lane.vocab.piece)
        body = request_body(self.lane, dialect, DEFAULT_PROMPT, max_tokens, [], lane.extra)
        body["stream"] = False
        began = time.perf_counter()
        answer = self.probe.request("POST", dialect.path, 1 << 22, json=body)
        bare = time.perf_counter() - began
        if answer.status != 200:
            return {}
        began = time.perf_counter()
        steps = list(lane.generate(DEFAULT_PROMPT, max_tokens))
        through = time.perf_counter() - began
        return {
            "bare_client_seconds": bare,
            "through_specdiff_seconds": through,
            "bare_client_tokens": len(steps),
        }

    def close(self) -> None:
        self.stack.close()
        self.pool.close()


def _cache_proof(
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


def open_side(
    lane: Lane,
    settings: Settings,
    progress: Progress,
    cancel: threading.Event,
    other: Lane | None,
) -> Side:
    if lane.backend == "server":
        return ServerSide(lane, settings, progress, cancel, other)
    return LocalSide(lane, settings, progress, cancel)


def certify(
    lane: Lane,
    settings: Settings,
    other: Lane | None = None,
    control: bool = False,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
) -> dict[str, Any]:
    """The battery on `lane` as the certificate's JSON: what the worker process hands
    back. `control`: the battery again on `other`, which lacks the deterministic switch."""
    progress = progress or _quiet
    cancel = cancel or threading.Event()
    side = open_side(lane, settings, progress, cancel, other)
    try:
        certificate = run_battery(side, settings, progress)
    finally:
        side.close()
    if control and other is not None:
        progress("certify: the same battery without the switch (the inverse control)")
        inverse = open_side(other, settings, progress, cancel, None)
        try:
            without = run_battery(inverse, settings, progress)
        finally:
            inverse.close()
        certificate.control = {
            "endpoint": without_credentials(other.endpoint),
            "outcome": without.outcome(),
            "broken": without.broken,
            "properties": [r.as_dict() for r in without.results],
            "cost": without.cost,
        }
    if other is not None and certificate.control is not None:
        theirs = certificate.control["cost"].get("tokens_per_second")
        ours = certificate.cost.get("tokens_per_second")
        if theirs and ours:
            certificate.cost["against_other"] = ours / theirs
    return certificate.as_dict()
