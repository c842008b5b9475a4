"""Run both lanes of a pair on one prompt, interleaved step by step.

The lanes advance in lockstep (A's step i, then B's step i), so a client can render
both as they stream, and so that at the first differing step both lanes still hold
that step's logits: the runner then looks up each lane's logit and rank for the
other lane's pick (``TokenStep.probes``), even when it lies outside the top-k.
Each lane is timed only while its own generator runs.

A server lane rescores its accepted drafts only once both lanes' streams have ended: two
lanes may share one server, and a rescoring request beside the other lane's stream
would share the server's batches with it and change what that lane measures.

With `control`, lane a runs once more after the pair, alone, on a lane opened for that
run (a new context, or a new connection to the server) and closed after it: nothing
the first run left behind is shared with it (specdiff.control).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

from specdiff import __version__
from specdiff.chat import EMPTY_CONVERSATION, Conversation
from specdiff.compare import DEFAULT_NEAR_TIE
from specdiff.control import warm_second_run
from specdiff.engine.backends import ModelPool, open_lane
from specdiff.engine.base import (
    Cancelled,
    Generation,
    LaneBackend,
    Live,
    LiveStats,
    Prompt,
    Steps,
    StreamGate,
    StreamsARun,
)
from specdiff.engine.runtime import build_info
from specdiff.errors import PromptError, SpecdiffError, lane_failure
from specdiff.lanes import Lane, LaneId, Pair, headline
from specdiff.results import LaneOutcome, PairResult, RunRequest
from specdiff.steps import TokenStep

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    return None


class PairRun(StreamsARun):
    """Both lanes of a pair, loaded once, run on as many prompts as needed."""

    def __init__(
        self,
        pair: Pair,
        progress: Progress = _quiet,
        cancel: threading.Event | None = None,
        pool: ModelPool | None = None,
    ) -> None:
        self.pair = pair
        self.progress = progress
        self.cancel = cancel or threading.Event()
        # runs side by side share one pool: each would otherwise hold its own weights
        self._own_pool = pool is None
        self.pool = pool or ModelPool()
        self.lanes: dict[LaneId, LaneBackend] = {}
        try:
            opened: tuple[tuple[LaneId, Lane, Lane], ...] = (
                ("a", pair.a, pair.b),
                ("b", pair.b, pair.a),
            )
            for lane_id, lane, other in opened:
                # named as the lane's header names it
                progress(f"loading lane {lane_id}: {headline(lane, other)}")
                with lane_failure(lane_id):
                    self.lanes[lane_id] = open_lane(lane, lane_id, self.pool, progress, self.cancel)
        except BaseException:
            self.close()
            raise
        a, b = self.lanes["a"], self.lanes["b"]
        if a.vocab_digest() != b.vocab_digest():
            self.close()
            raise SpecdiffError(
                f"lane a's model ({a.model_path.name}) and lane b's ({b.model_path.name}) have "
                "different vocabularies, so their token ids cannot be compared; "
                "use models of the same family"
            )
        self.build = dict(build_info(), specdiff=__version__)
        self.result: PairResult | None = None
        self.outcomes: dict[LaneId, LaneOutcome] = {}
        """The current run's outcomes, filled in while it streams."""
        self.lane_tokens: dict[LaneId, list[int]] = {}
        """Each lane's token ids of the prompt last tokenized."""
        self.streams = StreamGate()
        """The current run's server streams, which rescoring waits for."""

    def tokenize(self, prompt: str) -> list[int]:
        """Lane a's token ids of the prompt. Each lane formats it its own way (a chat lane
        with its template), so each lane's own ids are kept for `check`."""
        if not prompt.strip():
            if isinstance(prompt, Conversation):
                raise PromptError(EMPTY_CONVERSATION)
            raise PromptError("the prompt is empty; give some text (--prompt or --prompt-file)")
        self.lane_tokens = {lane_id: lane.tokenize(prompt) for lane_id, lane in self.lanes.items()}
        return self.lane_tokens["a"]

    def check(self, tokens: Sequence[int], max_tokens: int) -> None:
        """Bad input found before any lane decodes: limits, context room, cached prefix.
        `tokens` are lane a's; every other lane is checked with its own ids of the prompt
        they came from, so a chat lane whose template overflows its n_ctx is refused
        before lane a starts."""
        if max_tokens < 1:
            raise PromptError(f"--max-tokens must be at least 1, got {max_tokens}")
        own = self.lane_tokens if self.lane_tokens.get("a") == list(tokens) else {}
        for lane_id, local in self.lanes.items():
            with lane_failure(lane_id):
                local.check(own.get(lane_id, tokens), max_tokens)

    def stream(
        self,
        prompt: str,
        max_tokens: int,
        stop: Sequence[str] = (),
        near_tie: float = DEFAULT_NEAR_TIE,
        teacher_forced: bool = False,
        control: bool = False,
    ) -> Iterator[TokenStep]:
        """Yield both lanes' steps as they are produced; `self.result` holds the outcome
        once the iterator is exhausted.

        `teacher_forced`: lane A runs first, then lane B is fed A's tokens instead of its
        own picks (see LocalLane.generate), so every step of B is computed on the same
        text as A's. `control`: lane a then runs again, cold, into `result.control`."""
        tokens = self.tokenize(prompt)
        self.check(tokens, max_tokens)
        request = RunRequest(
            prompt,
            tokens,
            max_tokens,
            list(stop),
            near_tie,
            teacher_forced,
            started=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        )
        stop_bytes = [s.encode("utf-8") for s in stop if s]
        outcomes = self._begin(len(tokens))
        cancelled, stopped = yield from self._run_lanes(request, stop_bytes)
        self._settle(stopped)
        again = (
            None if cancelled or not control else self._control_run(prompt, max_tokens, stop_bytes)
        )
        cancelled = cancelled or again is not None and again.stop_reason == "cancelled"
        self.result = PairResult.assemble(
            self.pair, request, outcomes, self.build, cancelled=cancelled, control=again
        )

    def _run_lanes(
        self, request: RunRequest, stop: list[bytes]
    ) -> Generator[TokenStep, None, tuple[bool, set[LaneId]]]:
        """Start each lane's generation (lane b's later, when teacher-forced) and step
        them in lockstep; returns what `_lockstep` does."""
        # each lane takes the ids or, a server lane, the text they came from
        ids = Prompt(request.prompt, request.prompt_tokens)
        max_tokens = request.max_tokens
        generators = {
            lane_id: local.generate(ids, max_tokens, stop)
            for lane_id, local in self.lanes.items()
            if not (request.teacher_forced and lane_id == "b")
        }
        self._gate_streams()
        for lane_id in generators:
            local = self.lanes[lane_id]
            if local.SENDS_AHEAD:
                local.send_ahead(ids, max_tokens, stop)

        def forced_b(forced: list[int]) -> Steps:
            return self.lanes["b"].generate(ids, max_tokens, stop, forced=forced)

        try:
            return (
                yield from self._lockstep(generators, forced_b if request.teacher_forced else None)
            )
        finally:
            # also on an error or a second Ctrl+C: a server lane's reader thread must stop
            for generator in generators.values():
                generator.close()

    def _begin(self, prompt_tokens: int) -> dict[LaneId, LaneOutcome]:
        """A run's new outcomes, each lane's counters cleared: a lane whose loop never
        starts (cancelled first) must not show the last run's."""
        self.outcomes = {
            lane_id: LaneOutcome(lane_id, local.lane) for lane_id, local in self.lanes.items()
        }
        for local in self.lanes.values():
            local.generation = Generation(prompt_tokens=prompt_tokens)
        return self.outcomes

    def _control_run(self, prompt: str, max_tokens: int, stop: list[bytes]) -> LaneOutcome:
        """Lane a once more, alone, on a lane opened for this run and closed after it."""
        outcome = LaneOutcome("a", self.pair.a)
        warm = warm_second_run(self.pair.a)
        if warm is not None:
            # the command line refuses this pair; a pair picked later (the TUI) lands here
            outcome.error = f"not run: {warm}"
            return outcome
        self.progress("control: lane a again, cold")
        try:
            again = open_lane(self.pair.a, "a", self.pool, self.progress, self.cancel)
        except SpecdiffError as error:
            outcome.error = str(error)
            return outcome
        try:
            # its own ids: a chat lane formats the prompt, a server lane picks its endpoint
            ids = Prompt(prompt, again.tokenize(prompt))
            generator = again.generate(ids, max_tokens, stop)
            try:
                while self._advance(outcome, generator) is not None:
                    pass
            except Cancelled:
                outcome.stop_reason = "cancelled"
            finally:
                generator.close()
            outcome.stop_reason = outcome.stop_reason or again.generation.stop_reason
            outcome.executed = dict(again.executed())
            outcome.reported_tokens_per_second = again.tokens_per_second(outcome.steps)
        except SpecdiffError as error:
            outcome.error = str(error)
        finally:
            again.close()
        return outcome

    def _lockstep(
        self,
        generators: dict[LaneId, Steps],
        forced_b: Callable[[list[int]], Steps] | None,
    ) -> Generator[TokenStep, None, tuple[bool, set[LaneId]]]:
        """Step the lanes in turn until all have finished or a cancel; with `forced_b`,
        lane b starts when lane a has finished, fed a's tokens (and is added to
        `generators`). Returns whether the run was cancelled, and the lanes that were
        still generating then."""
        live = dict(generators)
        forked = cancelled = False
        while live and not cancelled:
            fresh: dict[LaneId, TokenStep] = {}
            for lane_id in list(live):
                try:
                    step = self._advance(self.outcomes[lane_id], live[lane_id])
                except Cancelled:
                    cancelled = True
                    break
                if step is not None:
                    fresh[lane_id] = step
                    continue
                del live[lane_id]
                self.streams.ended(lane_id)  # also a lane that failed before it streamed
                if lane_id == "a" and forced_b is not None and self.outcomes["a"].error is None:
                    live["b"] = generators["b"] = forced_b(self.outcomes["a"].token_ids)
            if not forked and len(fresh) == 2 and fresh["a"].token_id != fresh["b"].token_id:
                forked = True
                fresh = self._probe_fork(fresh, self.outcomes)
            yield from fresh.values()
            cancelled = cancelled or self.cancel.is_set()
        return cancelled, set(live) if cancelled else set()

    def _gate_streams(self) -> None:
        """Give this run's server lanes one StreamGate: each one's rescoring then waits
        for the other's stream to end. An in-process lane takes no part: it steps only
        when this thread asks, and this thread may be waiting on the rescoring lane."""
        self.streams = StreamGate()
        for local in self.lanes.values():
            if local.GATES_STREAMS:
                local.share_streams(self.streams)

    def _advance(self, outcome: LaneOutcome, generator: Iterator[TokenStep]) -> TokenStep | None:
        """A lane's next step, its time added to the lane's outcome; None once the lane
        has finished or failed (its error noted in its outcome). Raises Cancelled."""
        began = time.perf_counter()
        try:
            step = next(generator)
        except StopIteration:
            return None
        except SpecdiffError as error:
            outcome.error = str(error)
            return None
        finally:
            elapsed = time.perf_counter() - began
            outcome.seconds += elapsed
            if len(outcome.steps) == 0:
                outcome.first_token_seconds += elapsed
        outcome.steps.append(step)
        return step

    def _settle(self, stopped: set[LaneId]) -> None:
        """Copy each lane's counters into its outcome; lanes in `stopped` were cut short
        by a cancel."""
        for lane_id, local in self.lanes.items():
            outcome = self.outcomes[lane_id]
            generation = local.generation
            outcome.stop_reason = "cancelled" if lane_id in stopped else generation.stop_reason
            outcome.drafted = generation.drafted
            outcome.accepted = generation.accepted
            outcome.verify_calls = generation.verify_calls
            outcome.prefix_tokens = generation.prefix_tokens
            outcome.executed = dict(local.executed())
            outcome.reported_tokens_per_second = local.tokens_per_second(outcome.steps)

    def executed(self) -> dict[str, dict[str, Any]]:
        """What each lane runs on: model path and sha256, context settings as applied;
        plain tables keyed by lane id, as a session header holds them."""
        return {lane_id: dict(local.executed()) for lane_id, local in self.lanes.items()}

    def live(self) -> Live:
        """Per lane, while a run streams: its tokens/s so far, drafted and accepted."""
        speeds: Live = {}
        for lane_id, outcome in self.outcomes.items():
            local = self.lanes[lane_id]
            speed = local.tokens_per_second(outcome.steps)
            speeds[lane_id] = LiveStats(
                outcome.tokens_per_second if speed is None else speed,
                local.generation.drafted,
                local.generation.accepted,
            )
        return speeds

    def _probe_fork(
        self, fresh: dict[LaneId, TokenStep], outcomes: dict[LaneId, LaneOutcome]
    ) -> dict[LaneId, TokenStep]:
        """Attach each lane's view of the other lane's pick to the fork step."""
        probed: dict[LaneId, TokenStep] = {}
        others: tuple[tuple[LaneId, LaneId], ...] = (("a", "b"), ("b", "a"))
        for lane_id, other_id in others:
            step, local = fresh[lane_id], self.lanes[lane_id]
            probed[lane_id] = replace(
                step,
                probes=local.probe(step.index, [fresh[other_id].token_id]),
                logsumexp=local.normalizer(step.index),
            )
        for lane_id, probed_step in probed.items():
            outcomes[lane_id].steps[-1] = probed_step
        return probed

    def close(self) -> None:
        for local in self.lanes.values():
            local.close()
        self.lanes.clear()
        if self._own_pool:
            self.pool.close()

    def __enter__(self) -> PairRun:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
