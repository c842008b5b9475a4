"""Running clients' requests on the pair: a bounded queue, the runners that take from it,
and the suite folders each ended pair is saved into.

A request waits in its kind's queue (completions, chat) until a runner is free; past
`max_queue` waiting requests, a new one is refused (HTTP 429) instead of waiting without
end. A runner is the suite's: one worker process for a pair with an in-process lane (a
native crash ends one request, and the next gets a fresh worker), or, with several
requests in flight (server lanes only), a `PairRun` in a thread per request, sharing
each lane's endpoint pool. Chat requests run on the pair with each lane formatting the
conversation (an in-process lane with its model's own template, Gemma's turns for a
Gemma GGUF without one; a server lane on its chat API), so they are a pair of their own
and fill a suite folder of their own; that pair is made at the first chat request.

Each request's steps of the served lane go to its client as they come; the pair is
saved when both lanes end. A client that leaves cancels its pair (nothing is saved: no
one got an answer); a lane that fails is saved as a failed run, never dropped.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from specdiff.errors import PromptError, SpecdiffError, printable
from specdiff.lanes import Lane, LaneId, Pair
from specdiff.proxy.folder import ProxySuite, Recorded
from specdiff.proxy.requests import ApiError, ProxyRequest
from specdiff.results import PairResult
from specdiff.steps import TokenStep
from specdiff.suite.prompts import SuitePrompt
from specdiff.suite.settings import SuiteSettings

if TYPE_CHECKING:
    from specdiff.engine.pairrun import PairRun
    from specdiff.engine.worker import PairWorker

    Runner = PairWorker | PairRun


@dataclass(frozen=True)
class Finished:
    """The pair ended: its result (the served lane's outcome answers the client)."""

    result: PairResult
    recorded: Recorded | None


Event = TokenStep | Finished | ApiError
"""What a request's client hears, in order: steps of the served lane, then how it ended."""


@dataclass
class Job:
    """One request, from the queue to its answer."""

    request: ProxyRequest
    prompt: SuitePrompt
    events: queue.Queue[Event] = field(default_factory=queue.Queue)
    gone: threading.Event = field(default_factory=threading.Event)
    """The client left: its pair is cancelled."""
    released: bool = False
    """No longer counted against the queue's limit."""
    _runner_cancel: threading.Event | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def abandon(self) -> None:
        with self._lock:
            self.gone.set()
            if self._runner_cancel is not None:
                self._runner_cancel.set()

    def started(self, cancel: threading.Event) -> bool:
        """Tie the runner's cancel to this job; False when its client already left."""
        with self._lock:
            self._runner_cancel = cancel
            return not self.gone.is_set()


MAX_SAMPLED_KINDS = 8
"""Distinct temperatures whose server lanes stay open at once; more share the last's."""


def sampled_pair(pair: Pair, temperature: float) -> Pair:
    """The pair with each server lane asked for `temperature` (its `request` fields): an
    in-process lane decodes greedily whatever is asked."""

    def sampling(lane: Lane) -> Lane:
        if lane.backend != "server":
            return lane
        fields = json.loads(lane.request) if lane.request else {}
        return replace(lane, request=json.dumps({**fields, "temperature": temperature}))

    return replace(pair, a=sampling(pair.a), b=sampling(pair.b))


GEMMA_ARCHITECTURES = ("gemma", "gemma2", "gemma3", "gemma3n")
"""The GGUF architectures whose chat turns are Gemma's (llama.cpp's template "gemma")."""


def chat_pair(pair: Pair) -> Pair:
    """The pair with each lane formatting a conversation: an in-process lane with the
    template it names, else its model's own (see `own_template`); a server lane on the
    chat API."""
    beside_server = "server" in (pair.a.backend, pair.b.backend)

    def chatting(lane: Lane) -> Lane:
        if lane.backend == "server":
            return lane if lane.api == "chat" else replace(lane, api="chat")
        if lane.chat:
            return lane
        # beside a server lane, llama.cpp's own rule formats both lanes' prompts alike
        return replace(lane, chat="true" if beside_server else own_template(lane))

    return replace(pair, a=chatting(pair.a), b=chatting(pair.b))


def own_template(lane: Lane) -> str:
    """The chat setting for an in-process lane that names none: its GGUF's own template
    ("true"), or Gemma's turns for a Gemma GGUF that carries none, as the bundled one.

    llama.cpp formats a GGUF without a template as chatml, a format Gemma never learned:
    every chat answer of the bundled model came back as chatml's markers, `<|im_end|>`
    over and over. `chat=true` keeps llama.cpp's rule, as llama-server formats; the
    proxy's chat requests, which name no setting, get the family's own turns."""
    from specdiff.engine.gguf import read_gguf
    from specdiff.engine.models import base_model_path

    try:
        info = read_gguf(base_model_path(lane.model))
    except (SpecdiffError, OSError):
        return "true"  # the lane's load says what is wrong with the model, in its words
    templated = bool(info.metadata.get("tokenizer.chat_template"))
    return "gemma" if not templated and info.architecture in GEMMA_ARCHITECTURES else "true"


@dataclass(frozen=True)
class ProxySettings:
    pair: Pair
    report_dir: Path
    max_tokens: int
    near_tie: float
    control: bool = False
    serve: LaneId = "a"
    concurrency: int = 1
    max_queue: int = 16


class Kind:
    """The runners of one kind of request (one pair) and the queue they take from."""

    def __init__(self, service: Service, pair: Pair, chat: bool = False) -> None:
        self.service = service
        self.pair = pair
        self.chat = chat
        """Its sessions are a suite of their own, in chat/: the pair formats messages."""
        self.jobs: queue.Queue[Job | None] = queue.Queue()
        self.threads: list[threading.Thread] = []
        self.started = False
        self.held = 0
        """Requests taken and not yet answered: waiting, or running."""

    def start(self) -> None:
        """Load one runner here (so a pair that will not load is said at once), then
        start a thread per runner."""
        if self.started:
            return
        first = self.service.open_runner(self.pair, threading.Event())
        self.started = True
        for number in range(self.service.settings.concurrency):
            thread = threading.Thread(
                target=self.service.serve_jobs,
                args=(self, first if number == 0 else None),
                daemon=True,
                name=f"specdiff-proxy-{self.pair.name}-{number}",
            )
            thread.start()
            self.threads.append(thread)


class Service:
    """Takes requests, runs them on the pair, saves each ended pair."""

    def __init__(
        self,
        settings: ProxySettings,
        on_recorded: Callable[[Recorded, str], None] = lambda *_: None,
        on_message: Callable[[str], None] = lambda _: None,
    ) -> None:
        self.settings = settings
        self.on_recorded = on_recorded
        self.on_message = on_message
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self.stopping = False
        self.sampled = 0
        """Requests with temperature > 0 saved (their own suite folders)."""
        self.kinds = {"completions": Kind(self, settings.pair)}
        self.suites: dict[tuple[str, bool], ProxySuite] = {}
        self._pool: object | None = None

    @property
    def models(self) -> list[str]:
        """The model names clients may ask for: the pair's."""
        return [self.settings.pair.name]

    @property
    def serves_server_lane(self) -> bool:
        """Whether the lane that answers is a server's (its top-k are log-probabilities)."""
        pair = self.settings.pair
        return (pair.a if self.settings.serve == "a" else pair.b).backend == "server"

    def start(self) -> None:
        """Make the report folder (a --report that cannot be one is said now, not at the
        first request) and load the pair."""
        self.suite_for(self.kinds["completions"], False)
        self.kinds["completions"].start()

    def submit(self, request: ProxyRequest) -> Job:
        """Queue the request; ApiError 404 for a model not served, 429 when the queue is
        full, 503 once stopping."""
        if request.model not in self.models:
            raise ApiError(
                404,
                f"the model {printable(request.model, 80)!r} is not served here; use "
                f"{self.models[0]!r} (GET /v1/models lists it)",
                param="model",
                code="model_not_found",
            )
        kind = self.kind_for(request)
        with self._lock:
            if self.stopping:
                raise ApiError(503, "the proxy is stopping", "server_error")
            if kind.held - self.settings.concurrency >= self.settings.max_queue:
                raise ApiError(
                    429,
                    f"{self.settings.max_queue} requests are waiting already (--max-queue "
                    f"{self.settings.max_queue}); send it again later",
                    "rate_limit_error",
                    code="rate_limit_exceeded",
                )
            kind.held += 1
            prompt_id = f"r{next(self._ids):06d}"
        try:
            kind.start()
        except SpecdiffError as error:
            with self._lock:
                kind.held -= 1
            raise ApiError(502, f"the chat pair would not load: {error}", "server_error") from None
        prompt = SuitePrompt(
            prompt_id,
            request.prompt,
            request.max_tokens or self.settings.max_tokens,
            f"request {prompt_id}",
            stop=request.stop,
        )
        job = Job(request, prompt)
        kind.jobs.put(job)
        return job

    def kind_for(self, request: ProxyRequest) -> Kind:
        """The runners of the request's endpoint; a sampled request on server lanes gets
        lanes that pass its temperature on."""
        kind = self.chat_kind() if request.endpoint == "chat" else self.kinds[request.endpoint]
        pair = kind.pair
        if not request.sampled or "server" not in (pair.a.backend, pair.b.backend):
            return kind
        key = f"{request.endpoint}@{request.temperature:g}"
        with self._lock:
            if key not in self.kinds and len(self.kinds) < 2 + MAX_SAMPLED_KINDS:
                self.kinds[key] = Kind(self, sampled_pair(pair, request.temperature), kind.chat)
            return self.kinds.get(key) or kind

    def chat_kind(self) -> Kind:
        """The chat requests' runners, made at the first chat request: choosing their
        template reads the model's file, which a proxy serving completions never needs."""
        with self._lock:
            kind = self.kinds.get("chat")
            if kind is None:
                chatting = chat_pair(self.settings.pair)
                completions = self.kinds["completions"]
                same = chatting == self.settings.pair
                kind = self.kinds["chat"] = completions if same else Kind(self, chatting, True)
            return kind

    def open_runner(self, pair: Pair, cancel: threading.Event) -> Runner:
        """A runner with the pair loaded, as a suite makes it."""
        # deferred: the engine loads only once the proxy runs a pair
        if self.settings.concurrency == 1:
            from specdiff.engine.worker import PairWorker

            return PairWorker(pair, self.on_message, cancel)
        from specdiff.engine.llama.context import ModelPool
        from specdiff.engine.pairrun import PairRun
        from specdiff.engine.server.pool import configure

        configure(concurrency=self.settings.concurrency)
        with self._lock:
            if self._pool is None:
                self._pool = ModelPool()
            pool = self._pool
        assert isinstance(pool, ModelPool)
        return PairRun(pair, self.on_message, cancel, pool)

    def serve_jobs(self, kind: Kind, runner: Runner | None) -> None:
        """One runner's loop: take a job, run it, until told to stop (None)."""
        cancel = threading.Event() if runner is None else runner.cancel
        try:
            while (job := kind.jobs.get()) is not None:
                try:
                    if not job.started(cancel):
                        continue
                    if runner is None:
                        runner = self.open_runner(kind.pair, cancel)
                    runner = self.run_job(kind, runner, job)
                except SpecdiffError as error:
                    job.events.put(ApiError(502, f"the pair would not load: {error}",
                                            "server_error"))  # fmt: skip
                finally:
                    cancel.clear()
                    self.release(kind, job)
        finally:
            if runner is not None:
                runner.close()

    def run_job(self, kind: Kind, runner: Runner, job: Job) -> Runner | None:
        """Run one request's pair, its served lane's steps to the client, and save it;
        the runner to use next (None: open a fresh one, this one is spent)."""
        # deferred, as in open_runner, which has loaded it by now
        from specdiff.engine.worker import WorkerCrashed

        prompt, serve = job.prompt, self.settings.serve
        assert prompt.max_tokens is not None
        try:
            runner.check(runner.tokenize(prompt.prompt), prompt.max_tokens)
            for step in runner.stream(
                prompt.prompt, prompt.max_tokens, prompt.stop, self.settings.near_tie,
                control=self.settings.control,
            ):  # fmt: skip
                if step.lane == serve:
                    job.events.put(step)
        except PromptError as error:
            job.events.put(ApiError(400, str(error), param="prompt"))
            return runner
        except WorkerCrashed as crash:
            job.events.put(ApiError(502, f"the lanes' worker crashed: {crash}", "server_error"))
            runner.close()
            return None
        except SpecdiffError as error:
            lane = f"lane {error.lane}" if error.lane else "the pair"
            job.events.put(ApiError(502, f"{lane} failed: {error}", "server_error"))
            return runner if getattr(runner, "alive", True) else None
        result = runner.result
        assert result is not None
        if result.cancelled:
            self.release(kind, job)
            self.on_message(f"proxy: {prompt.id} cancelled: its client left (not saved)")
            runner.close()  # a cancelled worker is not reused: a fresh one runs the next
            return None
        job.events.put(Finished(result, self.save(kind, job, result)))
        return runner if getattr(runner, "alive", True) else None

    def release(self, kind: Kind, job: Job) -> None:
        """The job no longer holds a place (said once, whichever way it ended)."""
        with self._lock:
            if not job.released:
                job.released = True
                kind.held -= 1

    def save(self, kind: Kind, job: Job, result: PairResult) -> Recorded | None:
        """Save the pair into its suite folder; None (said once) when it cannot be."""
        suite = self.suite_for(kind, job.request.sampled)
        try:
            recorded = suite.record(job.prompt, result, self.settings.concurrency)
        except (SpecdiffError, OSError) as error:
            self.on_message(f"could not save {job.prompt.id}: {error}")
            return None
        if job.request.sampled:
            with self._lock:
                self.sampled += 1
        self.on_recorded(recorded, str(suite.report_dir))
        return recorded

    def suite_for(self, kind: Kind, sampled: bool) -> ProxySuite:
        """The suite folder of the kind's pair, greedy or sampled: the first is the
        report folder itself, chat's is its chat/, and sampled requests' are sampled/
        beside them. A folder that holds another is made first: a suite refuses a folder
        that exists, and chat/ or sampled/ made first would make their parent exist."""
        chat = kind.chat
        if sampled:
            self.suite_for(self.chat_kind() if chat else self.kinds["completions"], False)
        with self._lock:
            suite = self.suites.get((kind.pair.name + ("+chat" if chat else ""), sampled))
            if suite is None:
                folder = self.settings.report_dir
                folder = folder / "chat" if chat else folder
                folder = folder / "sampled" if sampled else folder
                settings = SuiteSettings(
                    source="proxy",
                    pairs=(kind.pair,),
                    max_tokens=self.settings.max_tokens,
                    near_tie=self.settings.near_tie,
                    concurrency=self.settings.concurrency,
                    control=self.settings.control,
                )
                suite = ProxySuite(folder, settings)
                self.suites[(kind.pair.name + ("+chat" if chat else ""), sampled)] = suite
            return suite

    def stop(self, cancelled: bool) -> list[Path]:
        """Refuse new requests, answer those still waiting with 503, let those running
        finish, and write every suite folder's report; the report.md paths."""
        with self._lock:
            self.stopping = True
        for kind in dict.fromkeys(self.kinds.values()):
            with contextlib.suppress(queue.Empty):
                while True:
                    job = kind.jobs.get_nowait()
                    if job is not None:
                        job.events.put(ApiError(503, "the proxy is stopping", "server_error"))
            for _ in kind.threads:
                kind.jobs.put(None)
            for thread in kind.threads:
                thread.join()
        reports: list[Path] = []
        for suite in self.suites.values():
            paths = suite.close(cancelled)
            reports.extend(p for p in paths if p.name == "report.md")
        return reports
