"""Margins for the drafts a llama-server accepted.

llama-server streams the tokens it accepted from a draft without probabilities (a client
that reads them as p = 1 sees a certain pick where there may have been a near tie). Each
such step is scored again, teacher-forced, on the same server once its stream has ended:
a request whose prompt is the prompt's token ids (as the server tokenized them) and the
tokens generated before the step, `n_predict` 1 and `n_probs` the lane's top-k, one
position per request, the prompt cache on so that each request decodes only the tokens
added since the last one.

After the stream, not beside it: a second request running while the lane streams would
share the server's batches with it and change the very numbers the lane measures.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from specdiff.engine.server.client import MAX_LINE_BYTES, ServerClient, ServerError
from specdiff.engine.server.dialects import LlamaServer, MissingLogprobs, Token, Unusable
from specdiff.steps import TokenStep

RESCORED_BY = "rescored by llama-server /completion"
"""A rescored step's `source`: its candidates came from a teacher-forced request."""
MAX_PROMPT_IDS = 1 << 20
"""The longest prompt /tokenize may answer with (a lane's largest n_ctx)."""

Scored = Callable[[TokenStep, Token, list[Token]], TokenStep | None]
"""Builds the rescored step from the step and the server's token and candidates; None
where they cannot stand for it (another token came out on top)."""


def needs_rescoring(step: TokenStep) -> bool:
    """An accepted draft reported without probabilities: the chosen token alone."""
    return step.drafted and len(step.top) < 2 and not step.source


@dataclass
class RescoreCost:
    """What rescoring one generation took."""

    steps: int = 0
    seconds: float = 0.0
    skipped: list[str] = field(default_factory=list)
    """Why steps were left as the server reported them (a failed request, a pick that
    differed), at most a few."""

    def as_dict(self) -> dict[str, Any]:
        record: dict[str, Any] = {"steps": self.steps, "seconds": round(self.seconds, 4)}
        if self.skipped:
            record["skipped"] = self.skipped[:4]
        return record


class Rescorer:
    """Scores a llama-server lane's accepted drafts again on the same server."""

    def __init__(
        self,
        client: ServerClient,
        top_k: int,
        piece: Callable[[int], bytes],
        extra: dict[str, Any],
    ) -> None:
        self.client = client
        self.top_k = top_k
        self.piece = piece
        self.extra = extra
        """The lane's request fields: what a server needs (a model name) it needs here too."""
        self.cost = RescoreCost()

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
        return tokens

    def rescore(
        self,
        prompt: str,
        steps: Sequence[TokenStep],
        scored: Scored,
        stopped: Callable[[], bool],
    ) -> list[TokenStep]:
        """`steps` (the whole generation of `prompt`, in order) with every step that
        needs it rescored; a failed request leaves it and the rest as they were, and
        says why in the cost's `skipped`: the steps themselves are never lost."""
        started = time.perf_counter()
        result = list(steps)
        try:
            prompt_ids = self.prompt_ids(prompt)
            for position, step in enumerate(steps):
                if not needs_rescoring(step):
                    continue
                if stopped():
                    break
                history = [*prompt_ids, *(earlier.token_id for earlier in steps[:position])]
                token, top = self._score(history)
                rescored = scored(step, token, top)
                if rescored is None:
                    self.cost.skipped.append(
                        f"step {step.index}: the accepted draft was not in the teacher-forced top-k"
                    )
                    continue
                result[position] = rescored
                self.cost.steps += 1
        except ServerError as error:
            self.cost.skipped.append(str(error))
        finally:
            self.cost.seconds += time.perf_counter() - started
        return result

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
