"""A lane served over HTTP: OpenAI-compatible servers and llama-server's own API.

Each streamed token becomes a TokenStep: the token id where the server gives it (else
looked up in the lane's tokenizer vocabulary by its exact bytes or text), its bytes, the
top-k candidates with their log-probabilities as logits (a difference of two
log-probabilities equals the difference of the logits, so margins mean the same thing),
and the time it arrived.

APIs (lane key `api`):
- `completions`: POST /v1/completions with `logprobs: k` (OpenAI's legacy API; vLLM,
  SGLang, llama-cpp-python's server);
- `chat`: POST /v1/chat/completions with `logprobs: true, top_logprobs: k`;
- `llama-server`: POST /completion with `n_probs: k` and `return_tokens` (token ids,
  bytes, and the server's draft counts and timings).

The API key is read from the environment variable the lane names, sent as a bearer
token, and never written anywhere: error messages have it masked.
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from specdiff.engine.base import Cancelled, EngineError, Generation
from specdiff.engine.llama.lane import ModelPool
from specdiff.engine.models import Progress, resolve_model
from specdiff.errors import LaneConfigError, PromptError, SpecdiffError
from specdiff.lanes import Lane
from specdiff.steps import Candidate, TokenStep

UNKNOWN_TOKEN = (1 << 31) - 1
"""The id given to a token whose text the tokenizer vocabulary does not hold."""


class ServerError(EngineError):
    """The server could not be reached, refused, or answered what specdiff cannot use."""


def _quiet(_: str) -> None:
    return None


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
    tokens: list[tuple[Token, list[Token]]]
    finish: str | None = None
    timings: dict[str, Any] | None = None


class ServerLane:
    """A lane whose tokens come from a server; the interface PairRun uses of LocalLane."""

    def __init__(
        self,
        lane: Lane,
        lane_id: str = "a",
        pool: ModelPool | None = None,
        progress: Progress = _quiet,
        cancel: threading.Event | None = None,
    ) -> None:
        import httpx

        self.lane = lane
        self.lane_id = lane_id
        self.cancel = cancel or threading.Event()
        self.key = ""
        if lane.api_key_env:
            self.key = os.environ.get(lane.api_key_env, "").strip()
            if self.key and not (self.key.isascii() and self.key.isprintable()):
                raise LaneConfigError(
                    f"lane {lane_id}: the API key in {lane.api_key_env} holds characters a "
                    "header cannot carry (control characters or non-ASCII); set it again"
                )
            if not self.key:
                raise LaneConfigError(
                    f"lane {lane_id}: the environment variable {lane.api_key_env} "
                    "(api_key_env) is not set; export the API key there"
                )
        self.extra: dict[str, Any] = json.loads(lane.request) if lane.request else {}
        headers = {"Authorization": f"Bearer {self.key}"} if self.key else {}
        self.client = httpx.Client(
            base_url=lane.endpoint.rstrip("/"),
            headers=headers,
            timeout=httpx.Timeout(lane.timeout),
        )
        self._own_pool = pool is None
        self.pool = pool or ModelPool()
        try:
            # The tokenizer: prompt token ids for the session, and ids for servers that
            # report tokens only as text.
            self.model_path = resolve_model(lane.model, lane.quant, lane.threads, progress)
            self.model = self.pool.get(self.model_path, lane.repack)
            progress(f"lane {lane_id}: asking {lane.endpoint} who it is")
            self.identity = self._identity()
        except ServerError as error:
            self.close()
            raise ServerError(f"lane {lane_id}: {error}") from None
        except BaseException:
            self.close()
            raise
        self.generation = Generation()
        self._by_text: dict[str, int] | None = None
        self._by_bytes: dict[bytes, int] | None = None
        self._text_ids: dict[str, int] = {}
        self._seen_probs = False
        self._readers: list[threading.Thread] = []
        self.timings: dict[str, Any] = {}
        """llama-server's own timings of the last request (predicted_per_second, ...)."""

    # -- the server ----------------------------------------------------------------
    def _mask(self, text: str) -> str:
        return text.replace(self.key, "***") if self.key else text

    def _fail(self, what: str) -> ServerError:
        return ServerError(self._mask(f"{self.lane.endpoint}: {what}"))

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        """One request with retries on refused connections; returns the response."""
        import httpx

        attempt = 0
        while True:
            try:
                return self.client.request(method, path, **kwargs)
            except httpx.ConnectError as error:
                if attempt >= self.lane.retries:
                    raise self._fail(
                        f"cannot connect ({_reason(error)}); is the server running?"
                    ) from None
            except httpx.TimeoutException:
                raise self._fail(
                    f"no answer within {self.lane.timeout} s (timeout=SECONDS)"
                ) from None
            except httpx.HTTPError as error:
                raise self._fail(
                    f"the request failed ({type(error).__name__}: {_reason(error)})"
                ) from None
            attempt += 1
            time.sleep(0.5 * attempt)

    def _check_status(self, response: Any) -> None:
        if response.status_code == 200:
            return
        body = self._mask(response.read().decode("utf-8", "replace"))
        try:
            message = json.loads(body).get("error", body)
            if isinstance(message, dict):
                message = message.get("message", body)
        except (ValueError, AttributeError):
            message = body
        message = " ".join(str(message).split())[:300]
        if response.status_code in (401, 403):
            where = f"${self.lane.api_key_env}" if self.lane.api_key_env else "api_key_env"
            raise self._fail(
                f"the server refused the API key (HTTP {response.status_code}); check {where}"
            )
        raise self._fail(f"HTTP {response.status_code}: {message or 'no details'}")

    def _identity(self) -> dict[str, Any]:
        identity: dict[str, Any] = {}
        response = self._request("GET", "/v1/models")
        if response.status_code == 200:
            try:
                identity["models"] = [m.get("id") for m in response.json().get("data", [])]
            except (ValueError, AttributeError):
                identity["models"] = []
        elif response.status_code in (401, 403):
            self._check_status(response)
        props = self._request("GET", "/props")
        if props.status_code == 200:
            try:
                data = props.json()
            except ValueError:
                data = {}
            if not isinstance(data, dict):
                data = {}
            for key in ("build_info", "model_path", "total_slots", "n_ctx"):
                if key in data:
                    identity[key] = data[key]
            settings = data.get("default_generation_settings") or {}
            if isinstance(settings, dict) and "n_ctx" in settings:
                identity["n_ctx"] = settings["n_ctx"]
        return identity

    # -- what PairRun asks of a lane -------------------------------------------------
    @property
    def vocab_digest(self) -> str:
        return self.model.info.vocab_digest

    def tokenize(self, text: str) -> list[int]:
        return self.model.tokenize(text)

    def check_prompt(self, prompt: Sequence[int], max_tokens: int) -> None:
        if max_tokens < 1:
            raise PromptError(f"--max-tokens must be at least 1, got {max_tokens}")

    def prefix_length(self, prompt: Sequence[int]) -> int:
        return 0  # checked when the priming request is built

    def probe(self, index: int, token_ids: Sequence[int]) -> tuple[Any, ...]:
        return ()  # a server reports its top-k only

    def normalizer(self, index: int) -> float | None:
        return None

    def executed(self) -> dict[str, Any]:
        return {
            "backend": "server",
            "endpoint": self.lane.endpoint,
            "api": self.lane.api,
            "server": self.identity,
            "tokenizer_path": str(self.model_path),
            "tokenizer_sha256": self.model.sha256,
            "request": self.extra,
        }

    def close(self) -> None:
        for reader in getattr(self, "_readers", []):
            reader.join(timeout=5)  # before the tokenizer it may be using is freed
        client = getattr(self, "client", None)
        if client is not None:
            client.close()
        if getattr(self, "_own_pool", False):
            self.pool.close()

    # -- generating ----------------------------------------------------------------
    def _body(self, prompt: str, max_tokens: int, stop: Sequence[str]) -> tuple[str, dict]:
        k = self.lane.top_k
        api = self.lane.api
        if api == "llama-server":
            body: dict[str, Any] = {
                "prompt": prompt,
                "n_predict": max_tokens,
                "temperature": 0,
                "n_probs": k,
                "stream": True,
                "return_tokens": True,
                "cache_prompt": False,
            }
            path = "/completion"
            if self.lane.prefix == "cached":
                # the same slot as the priming request, so the cached prefix is found
                body["cache_prompt"] = True
                body["id_slot"] = 0
        elif api == "chat":
            body = {
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": max_tokens,
                "temperature": 0,
                "logprobs": True,
                "top_logprobs": k,
                "stream": True,
            }
            path = "/v1/chat/completions"
        else:
            body = {
                "prompt": prompt,
                "max_tokens": max_tokens,
                "temperature": 0,
                "logprobs": k,
                "stream": True,
            }
            path = "/v1/completions"
        # Greedy means the argmax of the model's own distribution: llama-cpp-python's
        # server penalizes repeats by default (1.1), which changes picks. `request`
        # overrides this for a server that rejects the field.
        body["repeat_penalty"] = 1.0
        if self.lane.api_model:
            body["model"] = self.lane.api_model
        if stop:
            body["stop"] = list(stop)
        body.update(self.extra)
        return path, body

    def generate(
        self,
        prompt: Sequence[int] | str,
        max_tokens: int,
        stop: Sequence[bytes] = (),
        forced: Sequence[int] | None = None,
    ) -> Iterator[TokenStep]:
        """Stream the server's greedy completion of the prompt (text, or token ids that
        are turned back into text), one TokenStep per token.

        A thread reads the stream as it comes, so each step is stamped when it arrived
        even while the caller is busy with another lane; the steps wait in a queue."""
        if forced is not None:
            raise LaneConfigError("teacher forcing needs an in-process lane (backend=local)")
        text = prompt if isinstance(prompt, str) else self._detokenize(prompt)
        count = len(self.tokenize(prompt)) if isinstance(prompt, str) else len(prompt)
        self.generation = Generation(prompt_tokens=count)
        self.timings = {}
        if self.lane.prefix == "cached":
            self._prime(text)
        arrived: queue.Queue[TokenStep | BaseException | None] = queue.Queue()
        stopped = threading.Event()

        def read() -> None:
            try:
                for step in self._stream(text, max_tokens, stop, stopped):
                    arrived.put(step)
                arrived.put(None)
            except SpecdiffError as error:  # handed to the consumer, raised there
                arrived.put(error)
            except Exception as error:  # anything else is still this lane's failure only
                arrived.put(
                    self._fail(f"unexpected {type(error).__name__}: {self._mask(str(error))}")
                )

        reader = threading.Thread(target=read, name=f"lane-{self.lane_id}-stream", daemon=True)
        self._readers = [r for r in self._readers if r.is_alive()] + [reader]
        reader.start()
        try:
            while True:
                try:
                    # a short wait, so a cancel is noticed while the server is silent
                    item = arrived.get(timeout=0.1)
                except queue.Empty:
                    if self.cancel.is_set():
                        raise Cancelled("cancelled") from None
                    continue
                if item is None:
                    if self.cancel.is_set():
                        raise Cancelled("cancelled")
                    return
                if isinstance(item, BaseException):
                    raise item
                if self.cancel.is_set():
                    raise Cancelled("cancelled")
                yield item
        finally:
            stopped.set()

    def _stream(
        self, text: str, max_tokens: int, stop: Sequence[bytes], stopped: threading.Event
    ) -> Iterator[TokenStep]:
        import httpx

        generation = self.generation
        path, body = self._body(text, max_tokens, [s.decode("utf-8", "replace") for s in stop])
        emitted = 0
        attempt = 0
        while True:
            self._ended = False
            self._seen_probs = False
            try:
                with self.client.stream("POST", path, json=body) as response:
                    self._check_status(response)
                    for event in self._events(response.iter_lines(), stopped):
                        for token, top in event.tokens:
                            if stopped.is_set() or self.cancel.is_set():
                                return  # the consumer left or cancelled: close the stream
                            yield self._step(emitted, token, top)
                            emitted += 1
                        if event.timings:
                            self.timings = event.timings
                            generation.drafted = int(event.timings.get("draft_n", 0) or 0)
                            generation.accepted = int(event.timings.get("draft_n_accepted", 0) or 0)
                        if event.finish:
                            generation.stop_reason = event.finish
                        if event.finish:
                            # llama-server's last event says stop, with no [DONE]; an
                            # OpenAI stream that gave its finish reason is complete too
                            self._ended = True
                if not self._ended:
                    raise self._fail(
                        f"the stream ended after {emitted} tokens without its end marker "
                        "(did the server stop?)"
                    )
                if not generation.stop_reason:
                    # no finish reason given: "ended" unless the budget explains it
                    generation.stop_reason = "length" if emitted >= max_tokens else "ended"
                return
            except httpx.ConnectError as error:
                if emitted or attempt >= self.lane.retries:
                    raise self._fail(
                        f"cannot connect ({_reason(error)}); is the server running?"
                    ) from None
                attempt += 1
                time.sleep(0.5 * attempt)
            except httpx.TimeoutException:
                raise self._fail(
                    f"no data for {self.lane.timeout} s after {emitted} tokens "
                    "(raise timeout=SECONDS for a slow server)"
                ) from None
            except (httpx.RemoteProtocolError, httpx.ReadError) as error:
                raise self._fail(
                    f"the connection broke after {emitted} tokens ({_reason(error)})"
                ) from None
            except httpx.HTTPError as error:
                raise self._fail(
                    f"the request failed after {emitted} tokens "
                    f"({type(error).__name__}: {_reason(error)})"
                ) from None

    def tokens_per_second(self, steps: Sequence[TokenStep]) -> float:
        """The server's own count where it reports one (llama-server), else the rate the
        tokens arrived at, first to last."""
        reported = self.timings.get("predicted_per_second")
        if isinstance(reported, (int, float)) and reported > 0:
            return float(reported)
        if len(steps) < 2 or steps[-1].timestamp <= steps[0].timestamp:
            return 0.0
        return (len(steps) - 1) / (steps[-1].timestamp - steps[0].timestamp)

    def _prime(self, prompt: str) -> None:
        """Fill llama-server's prompt cache with the prompt's prefix (half of it unless
        prefix_tokens / prefix_text say otherwise), as an earlier turn would."""
        tokens = self.tokenize(prompt)
        if self.lane.prefix_text:
            if not prompt.startswith(self.lane.prefix_text):
                raise PromptError("prefix_text must be the beginning of the prompt")
            prefix = self.lane.prefix_text
        else:
            count = self.lane.prefix_tokens or len(tokens) // 2
            if not 1 < count < len(tokens):
                raise PromptError(
                    f"the cached prefix must be shorter than the {len(tokens)}-token prompt"
                )
            prefix = self._detokenize(tokens[:count])
        body = {
            "prompt": prefix,
            "n_predict": 1,
            "temperature": 0,
            "cache_prompt": True,
            "id_slot": 0,
            **self.extra,
        }
        response = self._request("POST", "/completion", json=body)
        self._check_status(response)
        self.generation.prefix_tokens = len(self.tokenize(prefix)) - 1

    def _detokenize(self, tokens: Sequence[int]) -> str:
        bos = self._bos()
        data = b"".join(self.model.piece(t) for t in tokens if t != bos)
        return data.decode("utf-8", "replace")

    def _bos(self) -> int:
        from specdiff.engine.runtime import llama

        return int(llama().llama_vocab_bos(self.model.vocab))

    def _events(self, lines: Iterator[str], stopped: threading.Event) -> Iterator[Event]:
        for line in lines:
            if stopped.is_set():
                return  # nothing more is wanted: no parsing (the tokenizer may be freed)
            if not line or line.startswith(":"):
                continue  # keep-alive comments and event separators
            if line.startswith(("event:", "id:", "retry:")):
                continue
            if not line.startswith("data:"):
                raise self._fail(f"malformed server-sent event line: {self._mask(line)[:80]!r}")
            payload = line[5:].strip()
            if payload == "[DONE]":
                self._ended = True
                return
            try:
                data = json.loads(payload)
            except ValueError:
                raise self._fail(
                    f"malformed JSON in an event: {self._mask(payload)[:80]!r}"
                ) from None
            if not isinstance(data, dict):
                raise self._fail(f"unexpected event: {self._mask(payload)[:80]!r}")
            if data.get("error"):
                error = data["error"]
                message = error.get("message") if isinstance(error, dict) else error
                raise self._fail(f"the server reported an error: {message}")
            try:
                yield self._parse(data)
            except (KeyError, TypeError, AttributeError, IndexError, ValueError) as error:
                raise self._fail(
                    f"an event of an unexpected shape ({type(error).__name__}: "
                    f"{self._mask(str(error))[:80]}): {self._mask(payload)[:80]!r}"
                ) from None

    def _parse(self, data: dict[str, Any]) -> Event:
        api = self.lane.api
        if api == "llama-server":
            return self._parse_llama_server(data)
        choices = data.get("choices") or []
        if not choices:
            return Event([])
        choice = choices[0]
        finish = _finish(choice.get("finish_reason"))
        logprobs = choice.get("logprobs")
        produced = (
            choice.get("text")
            if api == "completions"
            else ((choice.get("delta") or {}).get("content"))
        )
        if logprobs is None:
            if produced:
                raise self._no_logprobs()
            return Event([], finish)
        if api == "chat":
            tokens = []
            for entry in logprobs.get("content") or []:
                chosen = _token(entry)
                tokens.append((chosen, [_token(t) for t in entry.get("top_logprobs") or []]))
            if produced and not tokens:
                raise self._no_logprobs()
            return Event(tokens, finish)
        texts = logprobs.get("tokens") or []
        if produced and not texts:
            raise self._no_logprobs()
        values = logprobs.get("token_logprobs") or []
        tops = logprobs.get("top_logprobs") or []
        tokens = []
        for index, text in enumerate(texts):
            top = tops[index] if index < len(tops) and tops[index] else {}
            if not top:
                raise self._no_logprobs()
            candidates = [Token(t, float(v)) for t, v in top.items()]
            tokens.append((Token(text, float(values[index])), candidates))
        return Event(tokens, finish)

    def _parse_llama_server(self, data: dict[str, Any]) -> Event:
        probabilities = list(data.get("completion_probabilities") or [])
        ids = [t for t in data.get("tokens") or [] if isinstance(t, int)]
        if not probabilities and data.get("content") and (not ids or not self._seen_probs):
            raise self._no_logprobs()
        self._seen_probs = self._seen_probs or bool(probabilities)
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
                piece = self.model.piece(token_id)
                tokens.append(
                    (Token(piece.decode("utf-8", "replace"), 0.0, token_id, piece, True), [])
                )
        finish = None
        if data.get("stop"):
            kind = data.get("stop_type", "")
            finish = {"eos": "eos", "limit": "length", "word": "stop"}.get(kind, kind or "eos")
        return Event(tokens, finish, data.get("timings"))

    def _no_logprobs(self) -> ServerError:
        return self._fail(
            "the server sent tokens without log-probabilities, so there are no margins; "
            "enable them (llama-cpp-python's server: --logits_all true) or use a server "
            "that reports them"
        )

    def _token_id(self, token: Token) -> int:
        if token.token_id is not None:
            if not 0 <= token.token_id < self.model.n_vocab:
                raise self._fail(
                    f"token id {token.token_id} is outside the tokenizer's vocabulary of "
                    f"{self.model.n_vocab}: the server runs another model family than "
                    "model= names"
                )
            return token.token_id
        if token.data is not None:
            if self._by_bytes is None:
                self._build_maps()
            assert self._by_bytes is not None
            found = self._by_bytes.get(token.data)
            if found is not None:
                return found
        # Text only (OpenAI's legacy API): the id the tokenizer gives that text when it is
        # one token, else the lowest id whose piece reads so.
        cached = self._text_ids.get(token.text)
        if cached is not None:
            return cached
        ids = self.model.tokenize(token.text, add_special=False) if token.text else []
        if len(ids) == 1:
            found = ids[0]
        else:
            if self._by_text is None:
                self._build_maps()
            assert self._by_text is not None
            found = self._by_text.get(token.text, UNKNOWN_TOKEN)
        self._text_ids[token.text] = found
        return found

    def _build_maps(self) -> None:
        by_text: dict[str, int] = {}
        by_bytes: dict[bytes, int] = {}
        piece = self.model.piece
        for token_id in range(self.model.n_vocab):
            data = piece(token_id)
            by_bytes.setdefault(data, token_id)
            by_text.setdefault(data.decode("utf-8", "ignore"), token_id)
        self._by_text, self._by_bytes = by_text, by_bytes

    def _bytes_of(self, token: Token, token_id: int) -> bytes:
        if token.data is not None:
            return token.data
        if token_id != UNKNOWN_TOKEN:
            return self.model.piece(token_id)
        return token.text.encode("utf-8")

    def _step(self, index: int, token: Token, top: list[Token]) -> TokenStep:
        chosen_id = self._token_id(token)
        candidates: dict[int, Candidate] = {}
        for entry in top:
            entry_id = self._token_id(entry)
            if entry_id not in candidates:
                candidates[entry_id] = Candidate(
                    entry_id, entry.logprob, self._bytes_of(entry, entry_id)
                )
        if chosen_id not in candidates:
            candidates[chosen_id] = Candidate(
                chosen_id, token.logprob, self._bytes_of(token, chosen_id)
            )
        if token.unscored:
            candidates = {chosen_id: candidates[chosen_id]}
        ordered = sorted(candidates.values(), key=lambda c: (-c.logit, c.token_id))
        return TokenStep(
            lane=self.lane_id,
            index=index,
            token_id=chosen_id,
            piece=self._bytes_of(token, chosen_id),
            top=tuple(ordered[: max(self.lane.top_k, 1)]),
            drafted=token.unscored,
            verify_width=1,
            timestamp=time.perf_counter(),
        )


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


def _reason(error: BaseException) -> str:
    text = str(error) or type(error).__name__
    if "Connection refused" in text:
        return "connection refused"
    return text.split("\n")[0][:120]
