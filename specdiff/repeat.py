"""Repeat mode: one prompt, one lane, N runs that differ only in what shares the batch.

Run r decodes the prompt beside r mod (K + 1) other sequences, taken in turn from the
bundled `open` prompts, so both the batch's size and its neighbours change from run to
run. A greedy decode that depended on nothing but the prompt would give one completion;
the report says how many there are, how many runs share each, and the token where they
first split, with each completion's margin there.

`--batch B` batches the runs themselves instead (continuous batching, as a busy server
does): up to B runs of the prompt are in flight in one KV memory and a run that ends makes
room for the next, so a thousand runs take minutes. A list of companions (or of a
server's concurrency) is a sweep: the runs are repeated at each value, each run beside
exactly that many sequences (or with that many requests in flight), and the report gives
unique completions and the first split against the value.

Both modes load llama.cpp (a server repeat for its tokenizer), so the command runs
`run_repeat` in a worker process: a native crash ends the command with one line, and
the front end receives the summary only (`repeat_summary.py`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from typing import TYPE_CHECKING, Any

from specdiff.engine.base import Cancelled
from specdiff.engine.faults import fault_point
from specdiff.errors import PromptError
from specdiff.lanes import Lane, Pair
from specdiff.prompts import load as load_prompts
from specdiff.repeat_summary import (
    RepeatResult,
    RepeatSummary,
    SweepSummary,
    summary,
    sweep_summary,
)

if TYPE_CHECKING:
    from specdiff.engine.llama.batched import BatchedLane, BatchedRun
    from specdiff.engine.server.lane import ServerLane

COMPANION_SET = "open"


def _quiet(_: str) -> None:
    return None


def companions_for(run: int, max_companions: int, pool_size: int, exact: bool = False) -> list[int]:
    """Indices into the companion pool for run `run`: r mod (K + 1) of them, or K when
    `exact` (a sweep's point)."""
    count = max_companions if exact else run % (max_companions + 1)
    return [(run + j) % pool_size for j in range(count)]


def check_request(prompt: str, runs: int, max_tokens: int) -> None:
    """What both repeat modes refuse before any model or server is touched."""
    if runs < 1:
        raise PromptError(f"-n must be at least 1, got {runs}")
    if max_tokens < 1:
        raise PromptError(f"--max-tokens must be at least 1, got {max_tokens}")
    if not prompt.strip():
        raise PromptError("the prompt is empty; give some text (--prompt or --prompt-file)")


def check_repeat(lane: Lane, prompt: str, runs: int, width: int, max_tokens: int) -> None:
    """What `run_repeat` refuses, checked before a worker starts: `width` is the
    companions of an in-process repeat, the concurrency of a server's."""
    check_request(prompt, runs, max_tokens)
    if lane.backend == "server":
        if width < 1:
            raise PromptError(f"--concurrency must be at least 1, got {width}")
        return
    if width < 0:
        raise PromptError(f"--companions must be 0 or more, got {width}")
    if lane.speculation != "none" or lane.prefix != "fresh":
        raise PromptError(
            "repeat runs a plain lane (speculation=none, prefix=fresh); "
            "drop the speculation / prefix settings"
        )


def check_batch(lane: Lane, batch: int, max_tokens: int) -> None:
    """Refused before the model loads: B runs in flight need B x max_tokens KV cells at
    least (the engine checks again with the prompt's tokens counted)."""
    if batch * max_tokens > lane.n_ctx:
        raise PromptError(
            f"{batch} runs in flight of up to {max_tokens} tokens need over "
            f"{batch * max_tokens} KV cells; n_ctx is {lane.n_ctx}: raise n_ctx "
            "(--lane n_ctx=N) or lower --batch or --max-tokens"
        )


RunDone = Callable[[int, int, int], None]
"""A finished run as `run_repeat` reports it: its number, its token count, and how many
sequences (or requests) it shared its batches with at most."""


def run_repeat(
    lane: Lane,
    prompt: str,
    runs: int,
    width: int,
    max_tokens: int,
    batch: int | None = None,
    on_run: RunDone | None = None,
    progress: Callable[[str], None] | None = None,
    cancel: threading.Event | None = None,
) -> RepeatSummary:
    """The repeat the lane names (against its server, or batched in-process) as its
    `summary`: what the worker process hands back. `batch` batches the runs themselves
    (in-process only)."""
    how: Callable[..., RepeatResult]
    if batch is not None:
        how = partial(repeat_batched, batch=batch)
    else:
        how = repeat_server if lane.backend == "server" else repeat
    handed_over = _handing_over(on_run)
    return summary(how(lane, prompt, runs, width, max_tokens, handed_over, progress, cancel))


def _handing_over(on_run: RunDone | None) -> Callable[[int, BatchedRun], None]:
    """What crosses back from the worker for each run: counts only, not its steps."""

    def handed_over(number: int, run: BatchedRun) -> None:
        fault_point(run.steps)
        if on_run is not None:
            on_run(number, len(run.steps), run.companions)

    return handed_over


@contextmanager
def _local_lane(
    lane: Lane,
    companions: int,
    progress: Callable[[str], None] | None,
    cancel: threading.Event,
) -> Iterator[BatchedLane]:
    """The lane's model with room for 1 + `companions` sequences, its kernels probed
    first as before a pair runs (repack=auto turns off kernels that crash on this CPU)."""
    # deferred: the batched lane loads llama.cpp, which only a worker process does
    from specdiff.engine.llama.batched import BatchedLane
    from specdiff.engine.llama.probe import trust_kernels
    from specdiff.engine.runtime import check_offload

    check_offload(lane.gpu_layers, "the lane")
    trust_kernels(Pair("repeat", lane, lane), progress or _quiet)
    kwargs: dict[str, Any] = {"cancel": cancel}
    if progress is not None:
        kwargs["progress"] = progress
    with BatchedLane(lane, companions, **kwargs) as batched:
        yield batched


def repeat(
    lane: Lane,
    prompt: str,
    runs: int,
    max_companions: int,
    max_tokens: int,
    on_run: Callable[[int, BatchedRun], None] | None = None,
    progress: Callable[[str], None] | None = None,
    cancel: threading.Event | None = None,
) -> RepeatResult:
    """Run r beside r mod (K + 1) companions from the `open` prompts."""
    check_repeat(lane, prompt, runs, max_companions, max_tokens)  # runs < 1 is refused here
    return repeat_numbers(
        lane, prompt, range(runs), max_companions, max_tokens, on_run, progress, cancel
    )


def repeat_numbers(
    lane: Lane,
    prompt: str,
    numbers: Sequence[int],
    max_companions: int,
    max_tokens: int,
    on_run: Callable[[int, BatchedRun], None] | None = None,
    progress: Callable[[str], None] | None = None,
    cancel: threading.Event | None = None,
) -> RepeatResult:
    """Only the runs numbered `numbers` of `repeat` (each beside the companions its number
    gives it), in that order: a share of the runs, for one of several machines."""
    check_repeat(lane, prompt, max(len(numbers), 1), max_companions, max_tokens)
    cancel = cancel or threading.Event()
    result = RepeatResult(lane, prompt, max_tokens, max_companions, [], [])
    with _local_lane(lane, max_companions, progress, cancel) as batched:
        _beside_companions(batched, result, numbers, False, on_run, cancel)
    return result


def sweep_companions(
    lane: Lane,
    prompt: str,
    runs: int,
    values: list[int],
    max_tokens: int,
    on_run: Callable[[int, BatchedRun], None] | None = None,
    progress: Callable[[str], None] | None = None,
    cancel: threading.Event | None = None,
) -> list[RepeatResult]:
    """`runs` runs at each companion count in `values`, every run beside exactly that
    many companions; one context (the largest count's) serves every point."""
    for value in values:
        check_repeat(lane, prompt, runs, value, max_tokens)
    cancel = cancel or threading.Event()
    results = []
    with _local_lane(lane, max(values), progress, cancel) as batched:
        for value in values:
            result = RepeatResult(lane, prompt, max_tokens, value, [], [])
            results.append(result)
            _beside_companions(batched, result, range(runs), True, on_run, cancel)
            if result.cancelled:
                break
    return results


def _beside_companions(
    batched: BatchedLane,
    result: RepeatResult,
    numbers: Sequence[int],
    exact: bool,
    on_run: Callable[[int, BatchedRun], None] | None,
    cancel: threading.Event,
) -> None:
    """Decode the result's prompt once per run number, each run beside its companions."""
    pool = load_prompts(COMPANION_SET)
    tokens = batched.tokenize(result.prompt)
    companion_tokens = [batched.tokenize(item["prompt"]) for item in pool]
    for number in numbers:
        if cancel.is_set():
            result.cancelled = True
            return
        chosen = companions_for(number, result.max_companions, len(pool), exact)
        try:
            outcome = batched.run(tokens, [companion_tokens[i] for i in chosen], result.max_tokens)
        except Cancelled:
            result.cancelled = True
            return
        result.runs.append(outcome)
        result.companion_ids.append([pool[i]["id"] for i in chosen])
        if on_run is not None:
            on_run(number, outcome)


def repeat_batched(
    lane: Lane,
    prompt: str,
    runs: int,
    _companions: int,
    max_tokens: int,
    on_run: Callable[[int, BatchedRun], None] | None = None,
    progress: Callable[[str], None] | None = None,
    cancel: threading.Event | None = None,
    *,
    batch: int,
) -> RepeatResult:
    """`runs` runs of the prompt continuously batched, up to `batch` in flight: each
    run's neighbours are the other runs, at other steps, in a KV memory whose free
    cells move as runs end."""
    check_repeat(lane, prompt, runs, 0, max_tokens)
    check_batch(lane, batch, max_tokens)
    cancel = cancel or threading.Event()
    result = RepeatResult(lane, prompt, max_tokens, batch - 1, [], [], batch=batch)
    ended: dict[int, BatchedRun] = {}

    def on_end(number: int, run: BatchedRun) -> None:
        ended[number] = run
        if on_run is not None:
            on_run(number, run)

    with _local_lane(lane, batch - 1, progress, cancel) as batched:
        try:
            batched.run_continuous(batched.tokenize(prompt), runs, max_tokens, on_end)
        except Cancelled:
            result.cancelled = True
    # runs end out of order: a stop keeps the ones that ended, in the order they began
    for number in sorted(ended):
        result.runs.append(ended[number])
        result.companion_ids.append([f"up to {ended[number].companions} other runs in flight"])
    return result


def repeat_server(
    lane: Lane,
    prompt: str,
    runs: int,
    concurrency: int,
    max_tokens: int,
    on_run: Callable[[int, BatchedRun], None] | None = None,
    progress: Callable[[str], None] | None = None,
    cancel: threading.Event | None = None,
) -> RepeatResult:
    """The same request `runs` times, `concurrency` at a time, to a server lane: the
    server batches them with each other as it would any concurrent clients."""
    # deferred: only a repeat against a server needs the server lane
    from specdiff.engine.llama.context import ModelPool
    from specdiff.engine.server.lane import ServerLane

    check_repeat(lane, prompt, runs, concurrency, max_tokens)
    cancel = cancel or threading.Event()
    result = RepeatResult(lane, prompt, max_tokens, concurrency - 1, [], [], concurrency)
    pool = ModelPool()
    clients: list[ServerLane] = []
    try:
        for _ in range(min(concurrency, runs)):
            clients.append(ServerLane(lane, "a", pool, progress or _quiet, cancel))
        requests = _Requests(clients, prompt, max_tokens, concurrency - 1, on_run, cancel)
        result.cancelled = requests.send(runs)
    finally:
        for client in clients:
            client.close()
        pool.close()
    for number in sorted(requests.outcomes):
        result.runs.append(requests.outcomes[number])
        result.companion_ids.append([f"{concurrency - 1} concurrent requests"])
    return result


def sweep_concurrency(
    lane: Lane,
    prompt: str,
    runs: int,
    values: list[int],
    max_tokens: int,
    on_run: Callable[[int, BatchedRun], None] | None = None,
    progress: Callable[[str], None] | None = None,
    cancel: threading.Event | None = None,
) -> list[RepeatResult]:
    """`runs` requests at each concurrency in `values`, one point after another."""
    for value in values:
        check_repeat(lane, prompt, runs, value, max_tokens)
    cancel = cancel or threading.Event()
    results = []
    for value in values:
        result = repeat_server(lane, prompt, runs, value, max_tokens, on_run, progress, cancel)
        results.append(result)
        if result.cancelled:
            break
    return results


def run_sweep(
    lane: Lane,
    prompt: str,
    runs: int,
    values: list[int],
    max_tokens: int,
    on_run: RunDone | None = None,
    progress: Callable[[str], None] | None = None,
    cancel: threading.Event | None = None,
) -> SweepSummary:
    """`run_repeat` at each value of the lane's width (a server's concurrency, else the
    companions), as `sweep_summary`: what the worker process hands back."""
    how = sweep_concurrency if lane.backend == "server" else sweep_companions
    handed_over = _handing_over(on_run)
    results = how(lane, prompt, runs, values, max_tokens, handed_over, progress, cancel)
    return sweep_summary(results, values, runs)


class _Requests:
    """Requests sent from a thread each, every one on whichever server client is free."""

    def __init__(
        self,
        clients: list[ServerLane],
        prompt: str,
        max_tokens: int,
        companions: int,
        on_run: Callable[[int, BatchedRun], None] | None,
        cancel: threading.Event,
    ) -> None:
        self.free = list(clients)
        self.workers = len(clients)
        self.prompt = prompt
        self.max_tokens = max_tokens
        self.companions = companions
        self.on_run = on_run
        self.cancel = cancel
        self.guard = threading.Lock()
        self.outcomes: dict[int, BatchedRun] = {}

    def send(self, runs: int) -> bool:
        """Send `runs` requests; True when a stop ended them early."""
        cancelled = False
        with ThreadPoolExecutor(max_workers=self.workers) as executor:
            futures = [executor.submit(self.one, number) for number in range(runs)]
            try:
                for future in futures:
                    try:
                        future.result()
                    except Cancelled:
                        cancelled = True
            except BaseException:
                self.cancel.set()  # one request failed: the queued ones are not sent
                executor.shutdown(cancel_futures=True)
                raise
        return cancelled

    def one(self, number: int) -> None:
        # deferred: the batched lane's module is the engine's, loaded in the worker only
        from specdiff.engine.llama.batched import BatchedRun

        if self.cancel.is_set():
            raise Cancelled("cancelled")  # queued runs do not start after a stop
        with self.guard:
            client = self.free.pop()
        try:
            began = time.perf_counter()
            outcome = BatchedRun(self.companions)
            outcome.steps = list(client.generate(self.prompt, self.max_tokens))
            outcome.seconds = time.perf_counter() - began
            self.outcomes[number] = outcome
            if self.on_run is not None:
                with self.guard:
                    self.on_run(number, outcome)
        finally:
            with self.guard:
                self.free.append(client)
