"""Repeat mode: one prompt, one lane, N runs that differ only in what shares the batch.

Run r decodes the prompt beside r mod (K + 1) other sequences, taken in turn from the
bundled `open` prompts, so both the batch's size and its neighbours change from run to
run. A greedy decode that depended on nothing but the prompt would give one completion;
the report says how many there are, how many runs share each, and the token where they
first split, with each completion's margin there.

Both modes load llama.cpp (a server repeat for its tokenizer), so the command runs
`run_repeat` in a worker process: a native crash ends the command with one line, and
the front end receives the summary only.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from specdiff.engine.base import Cancelled
from specdiff.errors import PromptError
from specdiff.lanes import Lane, Pair, without_credentials
from specdiff.prompts import load as load_prompts
from specdiff.steps import TokenStep, text_of

if TYPE_CHECKING:
    from specdiff.engine.llama.batched import BatchedRun
    from specdiff.engine.server.lane import ServerLane

COMPANION_SET = "open"


def _quiet(_: str) -> None:
    return None


@dataclass
class RepeatResult:
    lane: Lane
    prompt: str
    max_tokens: int
    max_companions: int
    runs: list[BatchedRun]
    companion_ids: list[list[str]]
    concurrency: int | None = None
    """Requests in flight at once, for a repeat against a server; None for a local one."""
    cancelled: bool = False


def companions_for(run: int, max_companions: int, pool_size: int) -> list[int]:
    """Indices into the companion pool for run `run`."""
    count = run % (max_companions + 1)
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


RunDone = Callable[[int, list[TokenStep], int], None]
"""A finished run as `run_repeat` reports it: its number, its steps, its companions."""


def run_repeat(
    lane: Lane,
    prompt: str,
    runs: int,
    width: int,
    max_tokens: int,
    on_run: RunDone | None = None,
    progress: Callable[[str], None] | None = None,
    cancel: threading.Event | None = None,
) -> dict[str, Any]:
    """The repeat the lane names (against its server, or batched in-process) as its
    `summary`: what the worker process hands back."""
    how = repeat_server if lane.backend == "server" else repeat

    def handed_over(number: int, run: BatchedRun) -> None:
        if on_run is not None:
            on_run(number, run.steps, run.companions)

    return summary(how(lane, prompt, runs, width, max_tokens, handed_over, progress, cancel))


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
    # deferred: the batched lane loads llama.cpp, which only a worker process does
    from specdiff.engine.llama.batched import BatchedLane
    from specdiff.engine.probe import trust_kernels
    from specdiff.engine.runtime import check_offload

    check_repeat(lane, prompt, runs, max_companions, max_tokens)
    check_offload(lane.gpu_layers, "the lane")
    # as before a pair runs: kernels that crash on this CPU are found by a probe in a
    # further process, and repack=auto turns them off
    trust_kernels(Pair("repeat", lane, lane), progress or _quiet)
    pool = load_prompts(COMPANION_SET)
    cancel = cancel or threading.Event()
    result = RepeatResult(lane, prompt, max_tokens, max_companions, [], [])
    kwargs: dict[str, Any] = {"cancel": cancel}
    if progress is not None:
        kwargs["progress"] = progress
    with BatchedLane(lane, max_companions, **kwargs) as batched:
        tokens = batched.tokenize(prompt)
        companion_tokens = [batched.tokenize(item["prompt"]) for item in pool]
        for number in range(runs):
            if cancel.is_set():
                result.cancelled = True
                break
            chosen = companions_for(number, max_companions, len(pool))
            try:
                outcome = batched.run(tokens, [companion_tokens[i] for i in chosen], max_tokens)
            except Cancelled:
                result.cancelled = True
                break
            result.runs.append(outcome)
            result.companion_ids.append([pool[i]["id"] for i in chosen])
            if on_run is not None:
                on_run(number, outcome)
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


def first_split(completions: list[list[int]]) -> int | None:
    """The first index at which any two completions differ (a shorter one that is a
    prefix of a longer one splits where it ends); None when all are equal."""
    if len({tuple(c) for c in completions}) <= 1:
        return None
    index = 0
    while True:
        tokens = {c[index] if index < len(c) else None for c in completions}
        if len(tokens) > 1:
            return index
        index += 1


def summary(result: RepeatResult) -> dict[str, Any]:
    """The repeat as JSON: the distinct completions (most runs first), where they split,
    and each run's group and speed; a server repeat adds its endpoint and concurrency."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for number, run in enumerate(result.runs):
        groups.setdefault(tuple(run.token_ids), []).append(number)
    ordered = sorted(groups.items(), key=lambda item: (-len(item[1]), item[1][0]))
    split = first_split([list(tokens) for tokens in groups])
    data: dict[str, Any] = {
        "prompt": result.prompt,
        "lane": result.lane.as_dict(),
        "runs": len(result.runs),
        "max_companions": result.max_companions,
        "max_tokens": result.max_tokens,
        "cancelled": result.cancelled,
        "unique": len(groups),
        "first_split": split,
        "groups": [_group_json(result, members, split) for _, members in ordered],
        "per_run": [
            {
                "run": number,
                "companions": result.companion_ids[number],
                "group": next(i for i, (_, m) in enumerate(ordered) if number in m),
                "tokens_per_second": (
                    (len(run.steps) - 1) / run.seconds if run.seconds and run.steps else 0.0
                ),
            }
            for number, run in enumerate(result.runs)
        ],
    }
    if result.concurrency is not None:
        data["endpoint"] = without_credentials(result.lane.endpoint)
        data["concurrency"] = result.concurrency
    return data


def _group_json(result: RepeatResult, members: list[int], split: int | None) -> dict[str, Any]:
    """One distinct completion: its runs, and its pick and margin at the split."""
    first = result.runs[members[0]]
    entry: dict[str, Any] = {
        "runs": members,
        "count": len(members),
        "companions": sorted({result.runs[m].companions for m in members}),
        "tokens": len(first.steps),
        "text": text_of(first.steps),
    }
    if split is not None and split < len(first.steps):
        step = first.steps[split]
        entry["at_split"] = {
            "token_id": step.token_id,
            "piece": step.piece.decode("utf-8", "replace"),
            "margin": step.margin,
            "top": [
                [c.token_id, c.piece.decode("utf-8", "replace"), c.logit] for c in step.top[:4]
            ],
        }
    return entry


def format_summary(data: dict[str, Any]) -> str:
    if "endpoint" in data:
        how = f"sent to {data['endpoint']}, {data['concurrency']} at a time"
    else:
        how = f"each decoded beside 0 to {data['max_companions']} other sequences"
    lines = [
        f"repeat: {data['runs']} runs of one prompt, {how}, up to {data['max_tokens']} tokens",
        f"unique completions: {data['unique']} of {data['runs']} runs",
    ]
    for number, group in enumerate(data["groups"], 1):
        text = " ".join(group["text"].split())
        text = text if len(text) <= 60 else text[:59] + "…"
        runs = ", ".join(str(r) for r in group["runs"][:8])
        more = "…" if len(group["runs"]) > 8 else ""
        beside = (
            ""
            if "endpoint" in data
            else f"; companions {', '.join(str(c) for c in group['companions'])}"
        )
        lines.append(
            f"  #{number}: {group['count']} run{'s' if group['count'] > 1 else ''} "
            f"(runs {runs}{more}{beside}), {group['tokens']} tokens: {text!r}"
        )
    split = data["first_split"]
    if split is None:
        lines.append("every run produced the same tokens")
    else:
        picks = []
        for number, group in enumerate(data["groups"], 1):
            at = group.get("at_split")
            if at is None:
                picks.append(f"#{number} ended")
            else:
                picks.append(f"#{number} {at['piece']!r} (margin {at['margin']:.4f})")
        lines.append(f"first split at token {split}: " + ", ".join(picks))
    if data["cancelled"]:
        lines.append("stopped: the counts cover the runs that finished")
    return "\n".join(lines)
