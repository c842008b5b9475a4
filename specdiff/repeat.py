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
the front end receives the summary only.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from specdiff.engine.base import Cancelled
from specdiff.engine.faults import fault_point
from specdiff.errors import PromptError
from specdiff.lanes import Lane, Pair, without_credentials
from specdiff.prompts import load as load_prompts
from specdiff.steps import text_of

if TYPE_CHECKING:
    from specdiff.engine.llama.batched import BatchedLane, BatchedRun
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
    batch: int | None = None
    """Runs in flight at once, for a continuously batched repeat; None otherwise."""


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
) -> dict[str, Any]:
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
    check_repeat(lane, prompt, runs, max_companions, max_tokens)
    cancel = cancel or threading.Event()
    result = RepeatResult(lane, prompt, max_tokens, max_companions, [], [])
    with _local_lane(lane, max_companions, progress, cancel) as batched:
        _beside_companions(batched, result, runs, False, on_run, cancel)
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
            _beside_companions(batched, result, runs, True, on_run, cancel)
            if result.cancelled:
                break
    return results


def _beside_companions(
    batched: BatchedLane,
    result: RepeatResult,
    runs: int,
    exact: bool,
    on_run: Callable[[int, BatchedRun], None] | None,
    cancel: threading.Event,
) -> None:
    """Decode the result's prompt `runs` times, each run beside its companions."""
    pool = load_prompts(COMPANION_SET)
    tokens = batched.tokenize(result.prompt)
    companion_tokens = [batched.tokenize(item["prompt"]) for item in pool]
    for number in range(runs):
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
) -> dict[str, Any]:
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
    largest = len(ordered[0][1]) if ordered else 0
    data: dict[str, Any] = {
        "prompt": result.prompt,
        "lane": result.lane.as_dict(),
        "runs": len(result.runs),
        "max_companions": result.max_companions,
        "max_tokens": result.max_tokens,
        "cancelled": result.cancelled,
        "unique": len(groups),
        "largest_share": largest / len(result.runs) if result.runs else 0.0,
        "first_split": split,
        "groups": [
            _group_json(result, members, split, result.runs[ordered[0][1][0]])
            for _, members in ordered
        ],
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
    if result.batch is not None:
        data["batch"] = result.batch
    if result.concurrency is not None:
        data["endpoint"] = without_credentials(result.lane.endpoint)
        data["concurrency"] = result.concurrency
    return data


def _group_json(
    result: RepeatResult, members: list[int], split: int | None, largest: BatchedRun
) -> dict[str, Any]:
    """One distinct completion: its runs, its pick and margin at the split, and where it
    leaves the largest group's completion (token and character), so two completions
    that read alike for a while can be shown from where they differ."""
    first = result.runs[members[0]]
    entry: dict[str, Any] = {
        "runs": members,
        "count": len(members),
        "companions": sorted({result.runs[m].companions for m in members}),
        "tokens": len(first.steps),
        "text": text_of(first.steps),
    }
    if first is not largest:
        departs = first_split([largest.token_ids, first.token_ids])
        if departs is not None:
            entry["departs_at"] = departs
            entry["departs_at_char"] = len(text_of(first.steps[:departs]))
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


def sweep_summary(results: list[RepeatResult], values: list[int], runs: int) -> dict[str, Any]:
    """A sweep as JSON: per value, the unique completions, the largest group's share,
    the first split among its runs, and where its runs first depart from the first
    value's most common completion (the reference: alone, or one request at a time)."""
    summaries = [summary(result) for result in results]
    served = bool(results) and results[0].concurrency is not None
    reference: list[int] | None = None
    points = []
    for value, result, data in zip(values, results, summaries):
        completions = [run.token_ids for run in result.runs]
        if reference is None and completions:
            reference = [int(t) for t in _most_common(completions)]
        departs = first_split([reference, *completions]) if reference is not None else None
        points.append(
            {
                "value": value,
                "runs": data["runs"],
                "unique": data["unique"],
                "largest_share": data["largest_share"],
                "first_split": data["first_split"],
                "departs_at": departs,
                "summary": data,
            }
        )
    return {
        "sweep": "concurrency" if served else "companions",
        "values": values,
        "runs_per_value": runs,
        "cancelled": any(result.cancelled for result in results) or len(results) < len(values),
        "points": points,
    }


def _most_common(completions: list[list[int]]) -> tuple[int, ...]:
    """The completion most runs gave (the earliest run's, on a tie)."""
    counts: dict[tuple[int, ...], int] = {}
    for tokens in completions:
        counts[tuple(tokens)] = counts.get(tuple(tokens), 0) + 1
    return max(counts, key=lambda tokens: counts[tokens])


def format_sweep(data: dict[str, Any]) -> str:
    """The sweep as a table: one line per value."""
    name = data["sweep"]
    lines = [
        f"sweep of --{name}: {data['runs_per_value']} runs per value",
        f"{name:>12}  {'unique':>6}  {'largest group':>13}  {'first split':>11}  departs from "
        f"{data['values'][0]} at",
    ]
    for point in data["points"]:
        share = f"{point['largest_share']:.0%}"
        split = "–" if point["first_split"] is None else str(point["first_split"])
        departs = "–" if point["departs_at"] is None else str(point["departs_at"])
        lines.append(
            f"{point['value']:>12}  {point['unique']:>6}  {share:>13}  {split:>11}  {departs}"
        )
    if data["cancelled"]:
        lines.append("stopped: the table covers the runs that finished")
    return "\n".join(lines)


GROUPS_SHOWN = 10
"""A thousand runs may give dozens of completions: the text lists the largest."""


def format_summary(data: dict[str, Any]) -> str:
    if "endpoint" in data:
        how = f"sent to {data['endpoint']}, {data['concurrency']} at a time"
    elif "batch" in data:
        how = f"up to {data['batch']} in flight at once"
    else:
        how = f"each decoded beside 0 to {data['max_companions']} other sequences"
    lines = [
        f"repeat: {data['runs']} runs of one prompt, {how}, up to {data['max_tokens']} tokens",
        f"unique completions: {data['unique']} of {data['runs']} runs; the largest group "
        f"holds {data['largest_share']:.1%}",
    ]
    shown = data["groups"][:GROUPS_SHOWN]
    lines += [_group_line(data, number, group) for number, group in enumerate(shown, 1)]
    if len(data["groups"]) > GROUPS_SHOWN:
        lines.append(f"  … {len(data['groups']) - GROUPS_SHOWN} more (--json lists them all)")
    split = data["first_split"]
    if split is None:
        lines.append("every run produced the same tokens")
    else:
        picks = []
        for number, group in enumerate(shown, 1):
            at = group.get("at_split")
            if at is None:
                picks.append(f"#{number} ended")
            else:
                picks.append(f"#{number} {at['piece']!r} (margin {at['margin']:.4f})")
        lines.append(f"first split at token {split}: " + ", ".join(picks))
    if data["cancelled"]:
        lines.append("stopped: the counts cover the runs that finished")
    return "\n".join(lines)


TEXT_SHOWN = 60
"""Characters of a completion a group line shows."""
CONTEXT_SHOWN = 20
"""Characters before the point where a completion leaves the largest group's that its
line shows, so the reader sees the words leading into the difference."""


def _group_line(data: dict[str, Any], number: int, group: dict[str, Any]) -> str:
    text, where = group["text"], ""
    departs = group.get("departs_at_char")
    if departs is not None and departs > TEXT_SHOWN - CONTEXT_SHOWN:
        # the first TEXT_SHOWN characters are #1's too: show where this one differs
        text = "…" + text[departs - CONTEXT_SHOWN :]
    if departs is not None:
        where = f", differs from #1 at token {group['departs_at']}"
    text = " ".join(text.split())
    text = text if len(text) <= TEXT_SHOWN else text[: TEXT_SHOWN - 1] + "…"
    runs = ", ".join(str(r) for r in group["runs"][:8])
    more = "…" if len(group["runs"]) > 8 else ""
    if "endpoint" in data:
        beside = ""
    elif "batch" in data:
        beside = f"; beside up to {max(group['companions'])} other runs"
    else:
        beside = f"; companions {', '.join(str(c) for c in group['companions'])}"
    plural = "s" if group["count"] > 1 else ""
    return (
        f"  #{number}: {group['count']} run{plural} "
        f"(run{plural} {runs}{more}{beside}), {group['tokens']} tokens{where}: {text!r}"
    )
