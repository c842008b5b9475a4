"""What a client gets back: the served lane's steps as an OpenAI response (a whole one, or
server-sent chunks), with only the fields it asked for.

The text ends where a stop string begins, as OpenAI's API cuts it (a lane's last step may
hold the stop string and more); while streaming, text that may be the start of a stop
string is held back until the next step says whether it is. Log-probabilities come from
each step's top-k: a server lane's are log-probabilities already; an in-process lane's
are logits, turned into log-probabilities with the step's normaliser where it was
computed, else with the top-k's own (a slight overestimate, said in the docs).
"""

from __future__ import annotations

import codecs
import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from specdiff.proxy.requests import ProxyRequest
from specdiff.steps import TokenStep

FINISH_REASONS = {"length": "length", "eos": "stop", "stop": "stop"}
"""specdiff's stop reasons as OpenAI names them (anything else ended the text: stop)."""


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int

    def to_json(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }


class TextCutter:
    """Decodes steps' bytes into text and cuts it before the first stop string."""

    def __init__(self, stop: Sequence[str]) -> None:
        self.stop = tuple(stop)
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._held = ""
        self.stopped = False
        self.tokens = 0
        """Steps whose text (some of it) was given out."""

    def feed(self, piece: bytes, final: bool = False) -> str:
        """The text that can be given out now."""
        if self.stopped:
            return ""
        self.tokens += 1
        text = self._held + self._decoder.decode(piece, final=final)
        cut = min((i for s in self.stop if (i := text.find(s)) >= 0), default=-1)
        if cut >= 0:
            self.stopped, self._held = True, ""
            return text[:cut]
        keep = 0 if final else self._held_back(text)
        self._held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]

    def flush(self) -> str:
        """What was held back, once no step follows."""
        if self.stopped:
            return ""
        text, self._held = self._held + self._decoder.decode(b"", final=True), ""
        return text

    def _held_back(self, text: str) -> int:
        """How many characters at the end of `text` may begin a stop string."""
        longest = 0
        for stop in self.stop:
            for size in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:size]):
                    longest = size
                    break
        return longest


def log_probabilities(step: TokenStep, server: bool) -> list[tuple[int, bytes, float]]:
    """(token id, bytes, log-probability) of the step's top-k, highest first."""
    if server:
        normaliser = 0.0
    elif step.logsumexp is not None:
        normaliser = step.logsumexp
    else:
        top = max(c.logit for c in step.top)
        normaliser = top + math.log(sum(math.exp(c.logit - top) for c in step.top))
    return [(c.token_id, c.piece, c.logit - normaliser) for c in step.top]


def token_text(piece: bytes) -> str:
    return piece.decode("utf-8", errors="replace")


class Answer:
    """One request's answer, built from the served lane's steps as they come."""

    def __init__(self, request: ProxyRequest, server: bool) -> None:
        self.request = request
        self.server = server
        self.id = ("chatcmpl-" if request.endpoint == "chat" else "cmpl-") + uuid.uuid4().hex
        self.created = 0
        self.cutter = TextCutter(request.stop)
        self.text: list[str] = []
        self._logprobs: list[dict[str, Any]] = []
        self._offset = 0

    @property
    def chat(self) -> bool:
        return self.request.endpoint == "chat"

    def add(self, step: TokenStep) -> str:
        """The text this step adds to the answer (its log-probabilities noted)."""
        if self.cutter.stopped:
            return ""
        text = self.cutter.feed(step.piece)
        if self.request.logprobs is not None and not self.cutter.stopped:
            self._logprobs.append(self._token_logprobs(step))
        self.text.append(text)
        return text

    def _token_logprobs(self, step: TokenStep) -> dict[str, Any]:
        ranked = log_probabilities(step, self.server)
        chosen = next((lp for tid, _, lp in ranked if tid == step.token_id), ranked[0][2])
        top = ranked[: self.request.logprobs]
        if self.chat:
            return {
                "token": token_text(step.piece),
                "logprob": chosen,
                "bytes": list(step.piece),
                "top_logprobs": [
                    {"token": token_text(p), "logprob": lp, "bytes": list(p)} for _, p, lp in top
                ],
            }
        entry = {
            "token": token_text(step.piece),
            "logprob": chosen,
            "top": {token_text(p): lp for _, p, lp in top},
            "offset": self._offset,
        }
        self._offset += len(token_text(step.piece))
        return entry

    def finish_reason(self, stop_reason: str) -> str:
        if self.cutter.stopped:
            return "stop"
        return FINISH_REASONS.get(stop_reason, "stop")

    def logprobs_json(self, entries: list[dict[str, Any]]) -> dict[str, Any]:
        if self.chat:
            return {"content": entries}
        return {
            "tokens": [e["token"] for e in entries],
            "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": [e["top"] for e in entries],
            "text_offset": [e["offset"] for e in entries],
        }

    def response(self, stop_reason: str, usage: Usage) -> dict[str, Any]:
        """The whole answer, once the lane has finished."""
        self.text.append(self.cutter.flush())
        text = "".join(self.text)
        choice: dict[str, Any] = {"index": 0}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        if self.request.logprobs is not None:
            choice["logprobs"] = self.logprobs_json(self._logprobs)
        choice["finish_reason"] = self.finish_reason(stop_reason)
        return {**self._envelope("chat.completion" if self.chat else "text_completion"),
                "choices": [choice], "usage": usage.to_json()}  # fmt: skip

    def _envelope(self, kind: str) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created,
                "model": self.request.model}  # fmt: skip

    def chunk(self, text: str, finish: str | None = None, first: bool = False) -> dict[str, Any]:
        """One server-sent chunk holding `text` (and the logprobs noted since the last)."""
        choice: dict[str, Any] = {"index": 0}
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": text} if first else {}
            if text and not first:
                delta["content"] = text
            choice["delta"] = delta
        else:
            choice["text"] = text
        if self.request.logprobs is not None:
            entries, self._logprobs = self._logprobs, []
            choice["logprobs"] = self.logprobs_json(entries) if entries or not self.chat else None
        choice["finish_reason"] = finish
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return {**self._envelope(kind), "choices": [choice]}

    def closing_chunks(self, stop_reason: str, usage: Usage) -> list[dict[str, Any]]:
        """What ends a stream: the held-back text with the finish reason, and the usage
        when the client asked for it."""
        chunks = [self.chunk(self.cutter.flush(), self.finish_reason(stop_reason))]
        if self.request.include_usage:
            kind = "chat.completion.chunk" if self.chat else "text_completion"
            chunks.append({**self._envelope(kind), "choices": [], "usage": usage.to_json()})
        return chunks
