"""The noise-floor control: lane a run a second time, cold, beside the pair.

A fork between two configurations proves nothing if the first configuration, run twice
on its own, forks too: a server under load batches requests with whatever else it is
serving, so the same greedy request may come back different. `--control` runs lane a
once more on a context (or connection) of its own after the pair, and compares a with
a'. A fork of a vs b is the *noise floor* when a vs a' forks at the same step or
earlier (the configuration alone already moved the text there), else an *effect* of
what the lanes differ in.

Pure: this module only reads fork indices, so reports and the suite use it without
the engine. The labels themselves (`noise_floor_label`) belong to the run's record,
`RunSummary.control_label`, and live beside it in sessions/records.py.
"""

from __future__ import annotations

import json

from specdiff.errors import LaneConfigError
from specdiff.fork_words import counted
from specdiff.lanes import Lane, Pair
from specdiff.safe_text import visible
from specdiff.sessions.records import CUT_SHORT, NOISE_FLOOR, RunSummary


def refuse_uncontrollable(pair: Pair) -> None:
    """Refuse --control where lane a cannot run a second time cold: a server lane that
    asks the server to keep its prompt cache would find the first run's tokens there."""
    reason = warm_second_run(pair.a)
    if reason is not None:
        raise LaneConfigError(
            f"--control runs lane a twice, cold, but {reason}, so its second run would reuse "
            "the first one's cache; drop --control, or swap the lanes (--pair with lane a "
            "uncached)"
        )


def warm_second_run(lane: Lane) -> str | None:
    """Why a second run of `lane` would not be cold; None where it would be."""
    if lane.backend != "server":
        # an in-process lane's second run gets a context of its own: nothing carries over
        return None
    if lane.prefix == "cached":
        return "lane a primes llama-server's prompt cache (prefix=cached)"
    extra = json.loads(lane.request) if lane.request else {}
    # llama-server reads a value that is not a JSON boolean (1, "true", null) as its
    # default, which caches: only an explicit false keeps the second run cold
    if "cache_prompt" in extra and extra["cache_prompt"] is not False:
        shown = json.dumps(extra["cache_prompt"], ensure_ascii=True)[:40]
        return f'lane a asks the server for cache_prompt (request={{"cache_prompt": {shown}}})'
    return None


def control_sentence(summary: RunSummary) -> str | None:
    """One line on the control of a run: what a vs a' did and the fork's label; None for
    a run without the control. Its texts pass through `visible`."""
    control = summary.control
    if control is None:
        return None
    head = "control (lane a again, cold):"
    if control.error:
        done = counted(control.generated, "token")
        return f"{head} failed after {done}: {visible(control.error)}"
    if control.fork_index is None:
        seen = f"same tokens as lane a over {control.generated}"
    else:
        margins = control.fork_margins or (0.0, 0.0)
        seen = (
            f"forked from lane a at token {control.fork_index} "
            f"(margins {margins[0]:.3f} / {margins[1]:.3f})"
        )
    fork = summary.fork_index
    label = summary.control_label
    if fork is None:
        verdict = "a and b agreed" if control.fork_index is None else "though a and b agreed"
    elif label == CUT_SHORT:
        verdict = f"it stopped ({visible(control.stop_reason)}) before the fork at token {fork}"
    else:
        verdict = f"the fork at token {fork} is {'the ' if label == NOISE_FLOOR else 'an '}{label}"
    return f"{head} {seen}; {verdict}"


def control_brief(summary: RunSummary) -> str | None:
    """The control in a few words, for a status line: `control: noise floor (a' forked
    at 2)`; None for a run without the control."""
    control = summary.control
    if control is None:
        return None
    if control.error:
        return "control failed"
    seen = "a' = a" if control.fork_index is None else f"a' forked at {control.fork_index}"
    label = summary.control_label
    return f"control: {label} ({seen})" if label else f"control: {seen}"
