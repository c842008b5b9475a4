"""Margins for the drafts a llama-server accepted.

llama-server streams the tokens it accepted from a draft without probabilities (a client
that reads them as p = 1 sees a certain pick where there may have been a near tie). Each
such step is scored again, teacher-forced, on the same server once its stream has ended:
a request whose prompt is the prompt's token ids (as the server tokenized them) and the
tokens generated before the step, `n_predict` 1 and `n_probs` the lane's top-k, one
position per request, the prompt cache on so that each request decodes only the tokens
added since the last one.

After the streams, not beside them: a second request running while a lane streams would
share the server's batches with it and change the very numbers the lane measures. Two
lanes may share one server (a prompt cache against a fresh prompt), so a lane's drafts
wait for both lanes' streams to end, and the lanes rescore one at a time (StreamGate).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

from specdiff.engine.base import StreamGate
from specdiff.engine.server.client import MAX_LINE_BYTES, ServerClient, ServerError
from specdiff.engine.server.dialects import LlamaServer, MissingLogprobs, Token, Unusable
from specdiff.steps import TokenStep

RESCORED_BY = "rescored by llama-server /completion"
"""A rescored step's `source`: its candidates came from a teacher-forced request."""
MAX_PROMPT_IDS = 1 << 20
"""The longest prompt /tokenize may answer with (a lane's largest n_ctx)."""

Scored = Callable[[TokenStep, Token, list[Token]], TokenStep | None]
"""Builds the rescored step from the step and the server's token and candidates; None
where they cannot stand for it (the accepted draft is not among the top-k candidates)."""
MAX_REASONS = 4
"""Why steps were left unrescored: the distinct reasons a record keeps at most."""


def needs_rescoring(step: TokenStep) -> bool:
    """An accepted draft reported without probabilities: the chosen token alone."""
    return step.drafted and len(step.top) < 2 and not step.source


class _RescoringCounts(TypedDict):
    rescored: int
    skipped: int
    seconds: float


class RescoringRecord(_RescoringCounts, total=False):
    """What rescoring one generation took, in a lane's executed table."""

    reasons: list[str]


class Rescoring(TypedDict, total=False):
    """A lane's executed table's `rescoring` entry, there only where a step needed it."""

    rescoring: RescoringRecord


@dataclass
class RescoreCost:
    """What rescoring one generation took, and what it left as the server reported it."""

    steps: int = 0
    """Accepted drafts rescored."""
    seconds: float = 0.0
    skipped: int = 0
    """Accepted drafts left without probabilities: a failed request, a draft outside the
    teacher-forced top-k, a run stopped first."""
    reasons: list[str] = field(default_factory=list)
    """Why, at most MAX_REASONS distinct reasons."""
    began: float | None = None
    """time.perf_counter() when the first rescoring request was sent (a step's clock)."""

    def skip(self, count: int, why: str) -> None:
        self.skipped += count
        if why not in self.reasons and len(self.reasons) < MAX_REASONS:
            self.reasons.append(why)

    def as_record(self) -> Rescoring:
        """{"rescoring": ...} for a lane's executed table; {} where no step needed it."""
        if not (self.steps or self.skipped):
            return {}
        record: RescoringRecord = {
            "rescored": self.steps,
            "skipped": self.skipped,
            "seconds": round(self.seconds, 4),
        }
        if self.reasons:
            record["reasons"] = list(self.reasons)
        return {"rescoring": record}


class Rescorer:
    """Scores a llama-server lane's accepted drafts again on the same server."""

    def __init__(
        self,
        client: ServerClient,
        top_k: int,
        piece: Callable[[int], bytes],
        extra: dict[str, Any],
        streams: StreamGate | None = None,
    ) -> None:
        self.client = client
        self.top_k = top_k
        self.piece = piece
        self.extra = extra
        """The lane's request fields: what a server needs (a model name) it needs here too."""
        self.cost = RescoreCost()
        self.streams = streams or StreamGate()
        """What must end before the first rescoring request."""

    def prompt_ids(self, text: str) -> list[int]:
        """The prompt's token ids as the server tokenizes it (special tokens included):
        the rescoring prompts must continue exactly the sequence the stream decoded."""
        body = {"content": text, "add_special": True}
        answer = self.client.request("POST", "/tokenize", MAX_LINE_BYTES, json=body)
        self.client.check_status(answer)
        data = answer.json()
        tokens = data.get("tokens") if isinstance(data, dict) else None
        if (
            not isinstance(tokens, list)
            or len(tokens) > MAX_PROMPT_IDS
            or not all(type(t) is int and t >= 0 for t in tokens)
        ):
            raise self.client.fail("/tokenize answered without a list of token ids")
        for token_id in tokens:
            self.piece(token_id)  # one outside the vocabulary fails here, not on the server
        return tokens

    def rescore(
        self,
        prompt: str,
        steps: Sequence[TokenStep],
        scored: Scored,
        stopped: Callable[[], bool],
    ) -> list[TokenStep]:
        """`steps` (the whole generation of `prompt`, in order) with every step that
        needs it rescored, once every stream of the run has ended; a failed request
        leaves it and the rest as they were, and the cost counts them and says why: the
        steps themselves are never lost."""
        result = list(steps)
        waiting = [position for position, step in enumerate(steps) if needs_rescoring(step)]
        if not waiting:
            return result
        with self.streams.quiet(stopped) as quiet:
            if not quiet:
                self.cost.skip(len(waiting), "the run stopped before the drafts were rescored")
                return result
            self._rescore_waiting(prompt, steps, waiting, scored, stopped, result)
        return result

    def _rescore_waiting(
        self,
        prompt: str,
        steps: Sequence[TokenStep],
        waiting: list[int],
        scored: Scored,
        stopped: Callable[[], bool],
        result: list[TokenStep],
    ) -> None:
        """Rescore the steps at the positions `waiting` into `result`, in order."""
        started = time.perf_counter()
        self.cost.began = started
        done = 0
        try:
            prompt_ids = self.prompt_ids(prompt)
            for done, position in enumerate(waiting):
                if stopped():
                    self.cost.skip(len(waiting) - done, "the run stopped while rescoring")
                    break
                history = [*prompt_ids, *(earlier.token_id for earlier in steps[:position])]
                rescored = scored(steps[position], *self._score(history))
                if rescored is None:
                    self.cost.skip(1, "an accepted draft was not in the teacher-forced top-k")
                    continue
                result[position] = rescored
                self.cost.steps += 1
        except ServerError as error:
            self.cost.skip(len(waiting) - done, str(error))
        finally:
            self.cost.seconds += time.perf_counter() - started

    def _score(self, history: list[int]) -> tuple[Token, list[Token]]:
        """One teacher-forced position: the server's pick after `history` and its top-k."""
        body = {
            **self.extra,
            "prompt": history,
            "n_predict": 1,
            "n_probs": self.top_k,
            "temperature": 0,
            "repeat_penalty": 1.0,
            "cache_prompt": True,
            "return_tokens": True,
            "stream": False,
        }
        answer = self.client.request("POST", "/completion", MAX_LINE_BYTES, json=body)
        self.client.check_status(answer)
        data = answer.json()
        if not isinstance(data, dict):
            raise self.client.fail("a rescoring request was answered without a JSON object")
        try:
            event = LlamaServer(self.piece).parse(data)
        except (MissingLogprobs, Unusable, KeyError, TypeError, ValueError, IndexError) as error:
            raise self.client.fail(
                f"a rescoring answer could not be read ({type(error).__name__})"
            ) from None
        if not event.tokens or event.tokens[0][0].unscored or not event.tokens[0][1]:
            raise self.client.fail("a rescoring answer held no probabilities")
        return event.tokens[0]
