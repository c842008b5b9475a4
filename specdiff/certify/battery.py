"""The certify battery: the requests behind each property, and the verdict on each from
what they gave and the evidence that the condition it is about really happened.

The procedures ask a `Side` (sides.py) the same questions whichever engine answers (a
prompt alone; prompts together; a prompt cold and warm; a decode against the same
positions forced; speculation on and off), so the verdict logic in `records` never
knows which side it judges: `local_side` is the in-process engine, `server_side` a
deployment behind an endpoint.

Like repeat, the battery loads llama.cpp (a server lane's tokenizer), so the command
runs `certify` in a worker process.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

from specdiff.certify.evidence import busy_time
from specdiff.certify.local_side import LocalSide
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
from specdiff.certify.server_side import ServerSide
from specdiff.certify.sides import Progress, Settings, Side, quiet
from specdiff.lanes import Lane, without_credentials
from specdiff.prompts import DEFAULT_PROMPT
from specdiff.prompts import load as load_prompts
from specdiff.steps import TokenStep

CACHE_QUESTIONS = ("Question: When does the library close?\nAnswer:",)
FILLER_WORDS = (3, 12, 40, 80)
"""The lengths (in words, cycled) the needle's fillers are cut to: a ragged batch."""


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


def run_battery(side: Side, settings: Settings, progress: Progress = quiet) -> Certificate:
    """Every property `settings` names, in order, on `side`."""
    results: list[PropertyResult] = []
    began = time.perf_counter()
    reference: tuple[str, list[TokenStep]] | None = None
    for name in settings.properties:
        progress(f"certify: {name}")
        start = time.perf_counter()
        if name == RUN_TO_RUN:
            result, reference = _run_to_run(side, settings)
        elif name == DECODE_PREFILL:
            result = _decode_prefill(side, settings, reference)
        else:
            result = PROCEDURES[name](side, settings)
        result.seconds = time.perf_counter() - start
        results.append(result)
    cost = _cost(side, time.perf_counter() - began)
    bare = side.against_bare_client(settings.max_tokens)
    cost.update(bare.as_cost())
    certificate = Certificate(side.describe(), settings.as_dict(), results, cost)
    if bare.fault:
        # said where the timing would have been read, so no one takes it for one
        certificate.notes.append(f"no bare-client timing: {bare.fault}")
    return certificate


def _cost(side: Side, wall: float) -> dict[str, Any]:
    """What the battery cost: its wall time against the time its requests were in
    flight, and the tokens they brought."""
    timeline = side.timeline
    busy = busy_time(timeline.spans)
    return {
        "wall_seconds": wall,
        "request_seconds": busy,
        "overhead": wall / busy if busy else None,
        "requests": len(timeline.spans),
        "tokens": timeline.tokens,
        "tokens_per_second": timeline.tokens / busy if busy else None,
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


PROCEDURES: dict[str, Callable[[Side, Settings], PropertyResult]] = {
    BATCH: _batch,
    NEEDLE: _needle,
    PREFIX_CACHE: _prefix_cache,
    SPECULATION: _speculation,
}
"""The properties that need nothing from an earlier one (run to run and decode vs
prefill share the reference decode, so the loop runs them itself)."""


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


def battery_on(
    lane: Lane,
    settings: Settings,
    progress: Progress,
    cancel: threading.Event,
    other: Lane | None,
) -> Certificate:
    """The battery on a side opened for `lane`, closed afterwards whatever happened."""
    side = open_side(lane, settings, progress, cancel, other)
    try:
        return run_battery(side, settings, progress)
    finally:
        side.close()


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
    progress = progress or quiet
    cancel = cancel or threading.Event()
    certificate = battery_on(lane, settings, progress, cancel, other)
    if control and other is not None:
        progress("certify: the same battery without the switch (the inverse control)")
        without = battery_on(other, settings, progress, cancel, None)
        certificate.control = {
            "endpoint": without_credentials(other.endpoint),
            "outcome": without.outcome(),
            "broken": without.broken,
            "properties": [r.as_dict() for r in without.results],
            "cost": without.cost,
        }
        theirs = without.cost.get("tokens_per_second")
        ours = certificate.cost.get("tokens_per_second")
        if theirs and ours:
            certificate.cost["against_other"] = ours / theirs
    return certificate.as_dict()
