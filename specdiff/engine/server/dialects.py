"""The three APIs a server lane speaks (lane key `api`): what a request holds, and how
each streamed event becomes tokens.

- `completions`: POST /v1/completions with `logprobs: k` (OpenAI's legacy API; vLLM,
  SGLang, llama-cpp-python's server);
- `chat`: POST /v1/chat/completions with `logprobs: true, top_logprobs: k`;
- `llama-server`: POST /completion with `n_probs: k` and `return_tokens` (token ids,
  bytes, and the server's draft counts and timings).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from specdiff.engine.server.client import ServerClient
from specdiff.lanes import Lane

NO_LOGPROBS = (
    "the server sent tokens without log-probabilities, so there are no margins; "
    "enable them (llama-cpp-python's server: --logits_all true) or use a server "
    "that reports them"
)


class MissingLogprobs(Exception):
    """An event carried generated text but no log-probabilities for it."""


@dataclass(frozen=True)
class Token:
    """One token as a server reports it; id and bytes where it gives them."""

    text: str
    logprob: float
    token_id: int | None = None
    data: bytes | None = None
    unscored: bool = False
    """The server gave this token without probabilities (an accepted draft)."""


@dataclass
class Event:
    """One streamed event: the tokens it carries, each with its top candidates."""

    tokens: list[tuple[Token, list[Token]]]
    finish: str | None = None
    timings: dict[str, Any] | None = None
    done: bool = False
    """The stream's end marker ([DONE]) arrived."""


class Dialect(Protocol):
    path: str

    def body(self, prompt: str, max_tokens: int, top_k: int, cached: bool) -> dict[str, Any]:
        """The API's own request fields; `cached`: reuse the primed prompt cache."""

    def parse(self, data: dict[str, Any]) -> Event: ...


class _OpenAI:
    """What OpenAI's completions and chat APIs share: one choice per event, its finish
    reason, and no tokens unless log-probabilities came with them."""

    def parse(self, data: dict[str, Any]) -> Event:
        choices = data.get("choices") or []
        if not choices:
            return Event([])
        choice = choices[0]
        finish = _finish(choice.get("finish_reason"))
        logprobs = choice.get("logprobs")
        produced = self.produced(choice)
        if logprobs is None:
            if produced:
                raise MissingLogprobs
            return Event([], finish)
        tokens = self.tokens(logprobs)
        if produced and not tokens:
            raise MissingLogprobs
        return Event(tokens, finish)

    def produced(self, choice: dict[str, Any]) -> Any:
        raise NotImplementedError

    def tokens(self, logprobs: dict[str, Any]) -> list[tuple[Token, list[Token]]]:
        raise NotImplementedError


class Completions(_OpenAI):
    path = "/v1/completions"

    def body(self, prompt: str, max_tokens: int, top_k: int, cached: bool) -> dict[str, Any]:
        return {
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "logprobs": top_k,
            "stream": True,
        }

    def produced(self, choice: dict[str, Any]) -> Any:
        return choice.get("text")

    def tokens(self, logprobs: dict[str, Any]) -> list[tuple[Token, list[Token]]]:
        values = logprobs.get("token_logprobs") or []
        tops = logprobs.get("top_logprobs") or []
        tokens = []
        for index, text in enumerate(logprobs.get("tokens") or []):
            top = tops[index] if index < len(tops) and tops[index] else {}
            if not top:
                raise MissingLogprobs
            candidates = [Token(t, float(v)) for t, v in top.items()]
            tokens.append((Token(text, float(values[index])), candidates))
        return tokens


class Chat(_OpenAI):
    path = "/v1/chat/completions"

    def body(self, prompt: str, max_tokens: int, top_k: int, cached: bool) -> dict[str, Any]:
        return {
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "logprobs": True,
            "top_logprobs": top_k,
            "stream": True,
        }

    def produced(self, choice: dict[str, Any]) -> Any:
        return (choice.get("delta") or {}).get("content")

    def tokens(self, logprobs: dict[str, Any]) -> list[tuple[Token, list[Token]]]:
        return [
            (_token(entry), [_token(t) for t in entry.get("top_logprobs") or []])
            for entry in logprobs.get("content") or []
        ]


class LlamaServer:
    """llama-server's own API: token ids and bytes, and accepted drafts that come
    without probabilities (`piece` gives their bytes)."""

    path = "/completion"

    def __init__(self, piece: Callable[[int], bytes]) -> None:
        self.piece = piece
        self.seen_probs = False
        """An earlier event of this request had probabilities: a later one without them
        holds accepted drafts, not a server that gives none."""

    def body(self, prompt: str, max_tokens: int, top_k: int, cached: bool) -> dict[str, Any]:
        body: dict[str, Any] = {
            "prompt": prompt,
            "n_predict": max_tokens,
            "temperature": 0,
            "n_probs": top_k,
            "stream": True,
            "return_tokens": True,
            "cache_prompt": False,
        }
        if cached:
            # the same slot as the priming request, so the cached prefix is found
            body["cache_prompt"] = True
            body["id_slot"] = 0
        return body

    def parse(self, data: dict[str, Any]) -> Event:
        probabilities = list(data.get("completion_probabilities") or [])
        ids = [t for t in data.get("tokens") or [] if isinstance(t, int)]
        if not probabilities and data.get("content") and (not ids or not self.seen_probs):
            raise MissingLogprobs
        self.seen_probs = self.seen_probs or bool(probabilities)
        tokens: list[tuple[Token, list[Token]]] = []
        if not ids:
            ids = [entry.get("id") for entry in probabilities]
        for token_id in ids:
            if probabilities and probabilities[0].get("id") == token_id:
                entry = probabilities.pop(0)
                tokens.append((_token(entry), [_token(t) for t in entry.get("top_logprobs") or []]))
            else:
                # llama-server reports no probabilities for the draft tokens it accepted:
                # such a step holds the token alone (no margin) and is marked drafted
                piece = self.piece(token_id)
                tokens.append(
                    (Token(piece.decode("utf-8", "replace"), 0.0, token_id, piece, True), [])
                )
        finish = None
        if data.get("stop"):
            kind = data.get("stop_type", "")
            finish = {"eos": "eos", "limit": "length", "word": "stop"}.get(kind, kind or "eos")
        return Event(tokens, finish, data.get("timings"))


def dialect_for(api: str, piece: Callable[[int], bytes]) -> Dialect:
    """A fresh dialect for one request (llama-server's keeps state across its events)."""
    if api == "llama-server":
        return LlamaServer(piece)
    return Chat() if api == "chat" else Completions()


def request_body(
    lane: Lane,
    dialect: Dialect,
    prompt: str,
    max_tokens: int,
    stop: Sequence[str],
    extra: dict[str, Any],
) -> dict[str, Any]:
    """The whole request: the API's fields, greedy settings, and the lane's `request`
    fields last, so they can override any of them."""
    body = dialect.body(prompt, max_tokens, lane.top_k, lane.prefix == "cached")
    # Greedy means the argmax of the model's own distribution: llama-cpp-python's
    # server penalizes repeats by default (1.1), which changes picks. `request`
    # overrides this for a server that rejects the field.
    body["repeat_penalty"] = 1.0
    if lane.api_model:
        body["model"] = lane.api_model
    if stop:
        body["stop"] = list(stop)
    body.update(extra)
    return body


def read_events(
    lines: Iterator[str], dialect: Dialect, client: ServerClient, stopped: threading.Event
) -> Iterator[Event]:
    """Server-sent events parsed into Events; any line or event of an unexpected shape
    is a ServerError (masked, then cut)."""
    mask = client.mask
    for line in lines:
        if stopped.is_set():
            return  # nothing more is wanted: no parsing (the tokenizer may be freed)
        if not line or line.startswith(":"):
            continue  # keep-alive comments and event separators
        if line.startswith(("event:", "id:", "retry:")):
            continue
        if not line.startswith("data:"):
            raise client.fail(f"malformed server-sent event line: {mask(line)[:80]!r}")
        payload = line[5:].strip()
        if payload == "[DONE]":
            yield Event([], done=True)
            return
        yield _event(payload, dialect, client)


def _event(payload: str, dialect: Dialect, client: ServerClient) -> Event:
    mask = client.mask
    try:
        data = json.loads(payload)
    except ValueError:
        raise client.fail(f"malformed JSON in an event: {mask(payload)[:80]!r}") from None
    if not isinstance(data, dict):
        raise client.fail(f"unexpected event: {mask(payload)[:80]!r}")
    if data.get("error"):
        error = data["error"]
        message = error.get("message") if isinstance(error, dict) else error
        raise client.fail(f"the server reported an error: {message}")
    try:
        return dialect.parse(data)
    except MissingLogprobs:
        raise client.fail(NO_LOGPROBS) from None
    except (KeyError, TypeError, AttributeError, IndexError, ValueError) as error:
        raise client.fail(
            f"an event of an unexpected shape ({type(error).__name__}: "
            f"{mask(str(error))[:80]}): {mask(payload)[:80]!r}"
        ) from None


def _token(entry: dict[str, Any]) -> Token:
    data = entry.get("bytes")
    token_id = entry.get("id")
    return Token(
        text=str(entry.get("token", "")),
        logprob=float(entry.get("logprob", 0.0)),
        token_id=token_id if isinstance(token_id, int) else None,
        data=bytes(data) if isinstance(data, list) else None,
    )


def _finish(reason: object) -> str | None:
    if reason is None:
        return None
    return {"length": "length", "stop": "eos"}.get(str(reason), str(reason))
