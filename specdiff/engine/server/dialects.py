"""The three APIs a server lane speaks (lane key `api`): what a request holds, and how
each streamed event becomes tokens.

- `completions`: POST /v1/completions with `logprobs: k` (OpenAI's legacy API; vLLM,
  SGLang, llama-cpp-python's server);
- `chat`: POST /v1/chat/completions with `logprobs: true, top_logprobs: k`;
- `llama-server`: POST /completion with `n_probs: k` and `return_tokens` (token ids,
  bytes, and the server's draft counts and timings).

What a session will hold is checked here, where it enters: a log-probability that is not
a finite number, or a token longer than any token is, ends the lane (`Unusable`), since a
session file must never hold what its readers refuse; timings keep their finite numbers.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from specdiff.chat import messages_of
from specdiff.engine.server.client import ServerClient, finite
from specdiff.lanes import BOUNDS, Lane

LOGPROB_LIMIT = 1e6
"""The largest magnitude a log-probability may have: real ones are above -1e4 (a server's
"impossible" stands at -9999), and within the limit a margin cannot overflow."""
MAX_PIECE_BYTES = 512
"""The longest token a server may report. With top-k at its bound of 1024 a step line
then stays under the session readers' line limit, escaped or not."""
MAX_CANDIDATES = BOUNDS["top_k"][1]

NO_LOGPROBS = (
    "the server sent tokens without log-probabilities, so there are no margins; "
    "enable them (llama-cpp-python's server: --logits_all true) or use a server "
    "that reports them"
)


class MissingLogprobs(Exception):
    """An event carried generated text but no log-probabilities for it."""


class Unusable(Exception):
    """A value no session may hold: a log-probability that is not a finite number, or a
    token too long to be one."""


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
            candidates = [
                Token(_piece_text(t), _logprob(v, "top_logprobs"))
                for t, v in list(top.items())[:MAX_CANDIDATES]
            ]
            token = Token(_piece_text(text), _logprob(values[index], "token_logprobs"))
            tokens.append((token, candidates))
        return tokens


class Chat(_OpenAI):
    path = "/v1/chat/completions"

    def body(self, prompt: str, max_tokens: int, top_k: int, cached: bool) -> dict[str, Any]:
        return {
            # a conversation's own messages; a plain prompt as the one user message
            "messages": [message.to_json() for message in messages_of(prompt)],
            "max_tokens": max_tokens,
            "temperature": 0,
            "logprobs": True,
            "top_logprobs": top_k,
            "stream": True,
        }

    def produced(self, choice: dict[str, Any]) -> Any:
        return (choice.get("delta") or {}).get("content")

    def tokens(self, logprobs: dict[str, Any]) -> list[tuple[Token, list[Token]]]:
        return [(_token(entry), _candidates(entry)) for entry in logprobs.get("content") or []]


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
        probabilities = _objects(data.get("completion_probabilities"), "completion_probabilities")
        ids: list[Any] = [t for t in data.get("tokens") or [] if type(t) is int]
        if not probabilities and data.get("content") and (not ids or not self.seen_probs):
            raise MissingLogprobs
        self.seen_probs = self.seen_probs or bool(probabilities)
        tokens: list[tuple[Token, list[Token]]] = []
        if not ids:
            ids = [entry.get("id") for entry in probabilities]
        for token_id in ids:
            if probabilities and probabilities[0].get("id") == token_id:
                entry = probabilities.pop(0)
                tokens.append((_token(entry), _candidates(entry)))
            else:
                # llama-server reports no probabilities for the draft tokens it accepted:
                # such a step holds the token alone (no margin) and is marked drafted
                piece = self.piece(token_id)
                tokens.append(
                    (Token(piece.decode("utf-8", "replace"), 0.0, token_id, piece, True), [])
                )
        finish = None
        if data.get("stop"):
            finish = _finish(data.get("stop_type") or "eos")
        return Event(tokens, finish, _timings(data.get("timings")))


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
    is a ServerError (masked, then cut). A server that keeps the stream alive without
    sending a token for `timeout` seconds fails as a silent one does."""
    timeout = client.lane.timeout
    last_token = time.monotonic()
    for line in lines:
        if stopped.is_set():
            return  # nothing more is wanted: no parsing (the tokenizer may be freed)
        if time.monotonic() - last_token > timeout:
            raise client.fail(
                f"no token for {timeout} s, only keep-alives or empty events "
                "(raise timeout=SECONDS for a slow server)"
            )
        if not line or line.startswith(":"):
            continue  # keep-alive comments and event separators
        if line.startswith(("event:", "id:", "retry:")):
            continue
        if not line.startswith("data:"):
            raise client.fail(f"malformed server-sent event line: {client.quote(line)!r}")
        payload = line[5:].strip()
        if payload == "[DONE]":
            yield Event([], done=True)
            return
        event = _event(payload, dialect, client)
        yield event
        if event.tokens:  # counted from here: the time the tokens took to handle is not silence
            last_token = time.monotonic()


def _event(payload: str, dialect: Dialect, client: ServerClient) -> Event:
    quote = client.quote
    try:
        data = json.loads(payload)
    except (ValueError, RecursionError) as error:
        # not quoted: JSON escapes (\u0068...) can spell a secret that no mask sees
        where = f" at column {error.colno}" if isinstance(error, json.JSONDecodeError) else ""
        raise client.fail(
            f"malformed JSON in an event of {len(payload)} characters{where}"
        ) from None
    if not isinstance(data, dict):
        raise client.fail(f"unexpected event: {quote(json.dumps(data, ensure_ascii=False))!r}")
    if data.get("error"):
        reported = data["error"]
        message = reported.get("message") if isinstance(reported, dict) else reported
        raise client.fail(f"the server reported an error: {quote(str(message))}")
    try:
        return dialect.parse(data)
    except MissingLogprobs:
        raise client.fail(NO_LOGPROBS) from None
    except Unusable as error:
        raise client.fail(f"the server sent {quote(str(error))}; nothing of it was kept") from None
    except (KeyError, TypeError, AttributeError, IndexError, ValueError) as error:
        decoded = json.dumps(data, ensure_ascii=False)  # escapes undone before the mask
        raise client.fail(
            f"an event of an unexpected shape ({type(error).__name__}: "
            f"{quote(str(error))}): {quote(decoded)!r}"
        ) from None


def _logprob(value: object, field: str) -> float:
    number = finite(value, -LOGPROB_LIMIT, LOGPROB_LIMIT)
    if number is None:
        raise Unusable(f"{value!r:.40} as a log-probability ({field}), not a finite number")
    return number


def _piece_text(value: object) -> str:
    text = str(value)
    if len(text) > MAX_PIECE_BYTES or len(text.encode("utf-8", "surrogatepass")) > MAX_PIECE_BYTES:
        raise Unusable(f"a token of {len(text)} characters (at most {MAX_PIECE_BYTES} bytes)")
    return text


def _token(entry: dict[str, Any]) -> Token:
    data = entry.get("bytes")
    if isinstance(data, list) and len(data) > MAX_PIECE_BYTES:
        raise Unusable(f"a token of {len(data)} bytes (at most {MAX_PIECE_BYTES})")
    token_id = entry.get("id")
    return Token(
        text=_piece_text(entry.get("token", "")),
        logprob=_logprob(entry.get("logprob", 0.0), "logprob"),
        token_id=token_id if type(token_id) is int else None,
        data=bytes(data) if isinstance(data, list) else None,
    )


def _candidates(entry: dict[str, Any]) -> list[Token]:
    """An entry's top candidates, no more than any lane records."""
    top = _objects(entry.get("top_logprobs"), "top_logprobs")
    return [_token(candidate) for candidate in top[:MAX_CANDIDATES]]


def _objects(value: object, field: str) -> list[dict[str, Any]]:
    """A list of JSON objects (absent: none); TypeError naming `field` for anything else,
    which every reader of an answer takes as an answer of the wrong shape."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise TypeError(f"{field} must be a list of objects")
    return list(value)


def _timings(value: object) -> dict[str, float] | None:
    """llama-server's timings, finite numbers only: they become speeds and counts."""
    if not isinstance(value, dict):
        return None
    kept = {str(k): finite(v, 0, 1e12) for k, v in list(value.items())[:64]}
    return {k: v for k, v in kept.items() if v is not None}


def _finish(reason: object) -> str | None:
    if reason is None:
        return None
    text = str(reason)
    if text in _FINISH_REASONS:
        return _FINISH_REASONS[text]
    # anything else is a server's own word, which the footer and every report would
    # carry: a secret it echoes, or junk
    return "ended"


_FINISH_REASONS = {
    "length": "length",
    "limit": "length",
    "stop": "eos",
    "eos": "eos",
    "word": "stop",
    "content_filter": "content_filter",
    "tool_calls": "tool_calls",
    "function_call": "function_call",
    "abort": "abort",
    "cancelled": "cancelled",
}
"""The finish reasons OpenAI's API, vLLM, SGLang and llama-server send, as specdiff
records them."""
