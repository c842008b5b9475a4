"""Run both lanes of a pair on one prompt, interleaved step by step.

The lanes advance in lockstep (A's step i, then B's step i), so a client can render
both as they stream, and so that at the first differing step both lanes still hold
that step's logits: the runner then looks up each lane's logit and rank for the
other lane's pick (``TokenStep.probes``), even when it lies outside the top-k.
Each lane is timed only while its own generator runs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

from specdiff import __version__
from specdiff.compare import DEFAULT_NEAR_TIE, compare
from specdiff.engine.base import Cancelled, Generation
from specdiff.engine.llama.lane import LocalLane, ModelPool
from specdiff.engine.runtime import build_info
from specdiff.errors import PromptError, SpecdiffError
from specdiff.lanes import Pair
from specdiff.sessions.format import LaneOutcome, PairResult
from specdiff.steps import TokenStep

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    return None


class PairRun:
    """Both lanes of a pair, loaded once, run on as many prompts as needed."""

    def __init__(
        self,
        pair: Pair,
        progress: Progress = _quiet,
        cancel: threading.Event | None = None,
    ) -> None:
        self.pair = pair
        self.cancel = cancel or threading.Event()
        self.pool = ModelPool()
        self.lanes: dict[str, Any] = {}
        """LocalLane, or ServerLane for backend=server: the same interface."""
        try:
            for lane_id, lane in (("a", pair.a), ("b", pair.b)):
                progress(f"loading lane {lane_id}: {lane.describe()}")
                kind: Any = LocalLane
                if lane.backend == "server":
                    from specdiff.engine.server.lane import ServerLane

                    kind = ServerLane
                self.lanes[lane_id] = kind(lane, lane_id, self.pool, progress, self.cancel)
        except BaseException:
            self.close()
            raise
        a_model, b_model = self.lanes["a"].model, self.lanes["b"].model
        if a_model.info.vocab_digest != b_model.info.vocab_digest:
            self.close()
            raise SpecdiffError(
                f"lane a's model ({a_model.path.name}) and lane b's ({b_model.path.name}) have "
                "different vocabularies, so their token ids cannot be compared; "
                "use models of the same family"
            )
        self.build = dict(build_info(), specdiff=__version__)
        self.result: PairResult | None = None
        self.outcomes: dict[str, LaneOutcome] = {}
        """The current run's outcomes, filled in while it streams."""

    def tokenize(self, prompt: str) -> list[int]:
        if not prompt.strip():
            raise PromptError("the prompt is empty; give some text (--prompt or --prompt-file)")
        return self.lanes["a"].tokenize(prompt)

    def check(self, tokens: Sequence[int], max_tokens: int) -> None:
        """Bad input found before any lane decodes: limits, context room, cached prefix."""
        if max_tokens < 1:
            raise PromptError(f"--max-tokens must be at least 1, got {max_tokens}")
        for local in self.lanes.values():
            local.check_prompt(tokens, max_tokens)
            if local.lane.prefix == "cached":
                local.prefix_length(tokens)

    def stream(
        self,
        prompt: str,
        max_tokens: int,
        stop: Sequence[str] = (),
        near_tie: float = DEFAULT_NEAR_TIE,
        teacher_forced: bool = False,
    ) -> Iterator[TokenStep]:
        """Yield both lanes' steps as they are produced; `self.result` holds the outcome
        once the iterator is exhausted.

        `teacher_forced`: lane A runs first, then lane B is fed A's tokens instead of its
        own picks (see LocalLane.generate), so every step of B is computed on the same
        text as A's."""
        tokens = self.tokenize(prompt)
        self.check(tokens, max_tokens)
        stop_bytes = [s.encode("utf-8") for s in stop if s]
        started = datetime.now(timezone.utc).isoformat(timespec="seconds")
        outcomes = self.outcomes = {
            lane_id: LaneOutcome(lane_id, local.lane) for lane_id, local in self.lanes.items()
        }
        for local in self.lanes.values():
            # a lane whose loop never starts (cancelled first) must not show the last run's
            local.generation = Generation(prompt_tokens=len(tokens))
        generators = {
            # a server lane is sent the prompt's text, as any client sends it
            lane_id: local.generate(
                prompt if local.lane.backend == "server" else tokens, max_tokens, stop_bytes
            )
            for lane_id, local in self.lanes.items()
            if not (teacher_forced and lane_id == "b")
        }
        live = dict(generators)
        forked = False
        cancelled = False
        try:
            while live and not cancelled:
                fresh: dict[str, TokenStep] = {}
                for lane_id in list(live):
                    outcome = outcomes[lane_id]
                    began = time.perf_counter()
                    try:
                        step = next(live[lane_id])
                    except StopIteration:
                        del live[lane_id]
                        if teacher_forced and lane_id == "a":
                            forced = outcomes["a"].token_ids
                            live["b"] = generators["b"] = self.lanes["b"].generate(
                                tokens, max_tokens, stop_bytes, forced=forced
                            )
                        continue
                    except Cancelled:
                        cancelled = True
                        break
                    except SpecdiffError as error:
                        outcome.error = str(error)
                        del live[lane_id]
                        continue
                    finally:
                        elapsed = time.perf_counter() - began
                        outcome.seconds += elapsed
                        if len(outcome.steps) == 0:
                            outcome.first_token_seconds += elapsed
                    outcome.steps.append(step)
                    fresh[lane_id] = step
                if not forked and len(fresh) == 2 and fresh["a"].token_id != fresh["b"].token_id:
                    forked = True
                    fresh = self._probe_fork(fresh, outcomes)
                for step in fresh.values():
                    yield step
                if self.cancel.is_set():
                    cancelled = True
        finally:
            # also on an error or a second Ctrl+C: a server lane's reader thread must stop
            for generator in generators.values():
                generator.close()
        for lane_id, local in self.lanes.items():
            outcome = outcomes[lane_id]
            generation = local.generation
            stopped_early = cancelled and lane_id in live
            outcome.stop_reason = "cancelled" if stopped_early else generation.stop_reason
            outcome.drafted = generation.drafted
            outcome.accepted = generation.accepted
            outcome.verify_calls = generation.verify_calls
            outcome.prefix_tokens = generation.prefix_tokens
            outcome.executed = local.executed()
            if local.lane.backend == "server":
                outcome.reported_tokens_per_second = local.tokens_per_second(outcome.steps)
        self.result = PairResult(
            pair=self.pair,
            prompt=prompt,
            prompt_tokens=tokens,
            max_tokens=max_tokens,
            a=outcomes["a"],
            b=outcomes["b"],
            comparison=compare(outcomes["a"].steps, outcomes["b"].steps, near_tie),
            build=self.build,
            started=started,
            cancelled=cancelled,
            teacher_forced=teacher_forced,
            stop=list(stop),
        )

    def executed(self) -> dict[str, dict[str, Any]]:
        """What each lane runs on: model path and sha256, context settings as applied."""
        return {lane_id: local.executed() for lane_id, local in self.lanes.items()}

    def live(self) -> dict[str, tuple[float, int, int]]:
        """Per lane, while a run streams: (tokens/s so far, drafted, accepted)."""
        return {
            lane_id: (
                self.lanes[lane_id].tokens_per_second(outcome.steps)
                if self.lanes[lane_id].lane.backend == "server"
                else outcome.tokens_per_second,
                self.lanes[lane_id].generation.drafted,
                self.lanes[lane_id].generation.accepted,
            )
            for lane_id, outcome in self.outcomes.items()
        }

    def _probe_fork(
        self, fresh: dict[str, TokenStep], outcomes: dict[str, LaneOutcome]
    ) -> dict[str, TokenStep]:
        """Attach each lane's view of the other lane's pick to the fork step."""
        probed = {}
        for lane_id, other_id in (("a", "b"), ("b", "a")):
            step, local = fresh[lane_id], self.lanes[lane_id]
            probed[lane_id] = replace(
                step,
                probes=local.probe(step.index, [fresh[other_id].token_id]),
                logsumexp=local.normalizer(step.index),
            )
        for lane_id, step in probed.items():
            outcomes[lane_id].steps[-1] = step
        return probed

    def run(
        self,
        prompt: str,
        max_tokens: int,
        stop: Sequence[str] = (),
        near_tie: float = DEFAULT_NEAR_TIE,
        on_step: Callable[[TokenStep], None] | None = None,
        teacher_forced: bool = False,
    ) -> PairResult:
        for step in self.stream(prompt, max_tokens, stop, near_tie, teacher_forced):
            if on_step is not None:
                on_step(step)
        assert self.result is not None
        return self.result

    def close(self) -> None:
        for local in self.lanes.values():
            local.close()
        self.lanes.clear()
        self.pool.close()

    def __enter__(self) -> PairRun:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
