"""The HTTP side of a server lane: its endpoints' pool (pool.py: retries, back-off,
circuit breaking), the API key and URL credentials, and every byte of a server's answer
bounded.

The key is read from the environment variable the lane names and sent as a bearer
token; credentials in the endpoint URL are sent as HTTP basic auth. Neither is written
anywhere: a server that echoes them (in its identity, its errors, its text) has them
masked as *** before anything is kept or shown, and every message is masked before it
is cut short, so no part of a secret survives a cut either.

A server is not trusted to be well-behaved: bodies and event lines are read in chunks
up to a limit, never whole, and compression is declined so that a limit on the bytes
received is a limit on the bytes held.
"""

from __future__ import annotations

import base64
import itertools
import json
import math
import os
import time
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar, cast
from urllib.parse import unquote, urlsplit

from specdiff.engine.base import EngineError
from specdiff.engine.server.pool import (
    BUSY_STATUSES,
    Backoff,
    Busy,
    Endpoint,
    EndpointsDown,
    retry_after_seconds,
    shared_pool,
)
from specdiff.errors import LaneConfigError, printable
from specdiff.lanes import Lane, LaneId, without_credentials

MAX_LINE_BYTES = 1 << 20
"""The longest event line read: a real event is a few kilobytes even with top-k 1024."""
MAX_BODY_BYTES = 1 << 16
"""The most of any other non-streamed answer (an error, a priming request's answer) read."""
MAX_IDENTITY_BYTES = 1 << 22
"""The most of /v1/models or /props that is read: a long model list or chat template
runs past MAX_BODY_BYTES, and a body cut short is no JSON, so nothing of it would be
kept."""
MIN_SECRET_CHARS = 8
"""The shortest key or URL credential that is masked and guarded against: local servers
take placeholders ("EMPTY", "test", "x") that any text may hold, and a lane failed or a
word masked everywhere for those protects nothing."""
MESSAGE_CHARS = 400
"""A lane error's length at most, the endpoint included."""
QUOTED_CHARS = 160
"""How much of a server's own words (an error body, a bad event) a message quotes."""
MAX_MODELS = 16
"""Model ids kept from /v1/models for the session header."""
MAX_SETTINGS = 256
"""Generation settings of /props looked through for the speculative ones."""
MAX_SLOTS = 16
"""Slots of /slots kept for the session header."""
T = TypeVar("T")


class ServerError(EngineError):
    """The server could not be reached, refused, or answered what specdiff cannot use."""

    restartable = False
    """Whether sending the whole prompt again may succeed (on another endpoint)."""


class EndpointFailed(ServerError):
    """The endpoint failed (refused, broke the stream, or stayed busy past the budget):
    the prompt may be sent again from the start, where the pool's next claim goes."""

    restartable = True


def _retryable(error: BaseException) -> str | None:
    """Why an attempt's error is worth another try (a connection refused before
    anything was sent), None where it is not."""
    import httpx  # deferred, as in ServerClient._send

    return reason(error) if isinstance(error, httpx.ConnectError) else None


def read_api_key(lane: Lane, lane_id: LaneId) -> str:
    """The key from the variable `api_key_env` names, stripped; "" when none is named."""
    if not lane.api_key_env:
        return ""
    key = os.environ.get(lane.api_key_env, "").strip()
    if key and not (key.isascii() and key.isprintable()):
        raise LaneConfigError(
            f"lane {lane_id}: the API key in {lane.api_key_env} holds characters a "
            "header cannot carry (control characters or non-ASCII); set it again"
        )
    if not key:
        raise LaneConfigError(
            f"lane {lane_id}: the environment variable {lane.api_key_env} "
            "(api_key_env) is not set; export the API key there"
        )
    return key


def credentials(endpoint: str) -> list[str]:
    """The secrets an endpoint URL carries: its password (or a user name that stands
    alone, as a token does), as written and percent-decoded; none shorter than
    MIN_SECRET_CHARS (a lone "admin" is a user name, not a token)."""
    try:
        parts = urlsplit(endpoint)
        user, password = parts.username, parts.password
    except ValueError:  # a malformed port or address: httpx refuses it before sending
        return []
    secret = password if password else user
    if not secret or len(unquote(secret)) < MIN_SECRET_CHARS:
        return []
    # a server that quotes its Authorization header back shows the basic-auth form
    pair = f"{unquote(user or '')}:{unquote(password or '')}"
    return [secret, unquote(secret), base64.b64encode(pair.encode("utf-8")).decode("ascii")]


def reason(error: BaseException) -> str:
    """An httpx error in a few words."""
    text = str(error) or type(error).__name__
    if "Connection refused" in text:
        return "connection refused"
    return text.split("\n")[0][:120]


@dataclass(frozen=True)
class Answer:
    """A non-streamed response, read up to MAX_BODY_BYTES."""

    status: int
    body: bytes
    location: str = ""

    def json(self) -> Any:
        """The body as JSON, or None where it is not (or is cut, or nested too deep)."""
        try:
            return json.loads(self.body)
        except (ValueError, RecursionError):
            return None


def read_bounded(chunks: Iterable[bytes], limit: int, patience: float = math.inf) -> bytes:
    """At most `limit` bytes of a body, and what arrived within `patience` seconds: the
    rest is never read (a server sending a byte at a time resets every read timeout)."""
    data = bytearray()
    began = time.monotonic()
    for chunk in chunks:
        data += chunk
        if len(data) >= limit or time.monotonic() - began > patience:
            break
    return bytes(data[:limit])


def split_lines(
    chunks: Iterable[bytes],
    too_long: Callable[[], Exception],
    patience: float = math.inf,
    too_slow: Callable[[], Exception] | None = None,
) -> Iterator[str]:
    """The lines of a byte stream (\\n, \\r\\n or \\r ends one, as in server-sent
    events); a line past MAX_LINE_BYTES raises `too_long()` instead of growing, and one
    still unfinished `patience` seconds after it began raises `too_slow()`: a server that
    sends a byte a second resets every read timeout, and would hold the lane forever."""
    pending = b""
    begun = 0.0
    for chunk in chunks:
        if not pending:
            begun = time.monotonic()
        pending += chunk
        lines = pending.splitlines(keepends=True)
        pending = lines.pop() if lines and not lines[-1].endswith((b"\n", b"\r")) else b""
        for line in lines:
            if len(line) > MAX_LINE_BYTES:
                raise too_long()
            yield line.rstrip(b"\r\n").decode("utf-8", "replace")
        if len(pending) > MAX_LINE_BYTES:
            raise too_long()
        if pending and too_slow is not None and time.monotonic() - begun > patience:
            raise too_slow()
    if pending:
        yield pending.decode("utf-8", "replace")


class ServerClient:
    """Requests to one lane's endpoints, through the EndpointPool every ServerLane of
    the lane in this process shares; every failure is a ServerError naming the
    endpoint. While an endpoint is pinned (a generation's, from its claim to its end),
    every request goes there: a prompt, its cached prefix and its rescoring are one
    server's."""

    def __init__(self, lane: Lane, key: str) -> None:
        self.lane = lane
        self.key = key
        found = [key, *(c for url in lane.endpoints for c in credentials(url))]
        self.secrets = sorted(
            {s for s in found if len(s) >= MIN_SECRET_CHARS}, key=len, reverse=True
        )
        """What a server must not get into a message, a session or the screen."""
        # identity: a limit on the bytes received is then a limit on the bytes decoded
        headers = {"Accept-Encoding": "identity"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self.pool = shared_pool(lane, headers)
        self.pinned: Endpoint | None = None
        """The endpoint every request goes to for now (a generation's), if any."""
        self.backoff = Backoff()
        """The retries and back-off of the requests since the last pin()."""
        self._closed = False

    @property
    def where(self) -> str:
        """The endpoint as messages name it: the pinned one, else all of them."""
        return self.pinned.shown if self.pinned is not None else self.pool.shown

    def pin(self) -> Endpoint:
        """Claim an endpoint (the least busy) for the next generation, unless one is
        held; requests go there until unpin()."""
        if self.pinned is None:
            self.pinned = self.pool.claim()
            self.backoff = Backoff()
        return self.pinned

    def unpin(self) -> None:
        if self.pinned is not None:
            self.pool.unclaim(self.pinned)
            self.pinned = None

    def mask(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, "***")
        return text

    def quote(self, text: str) -> str:
        """A server's words, fit for a one-line message: masked, escaped, cut."""
        return printable(self.mask(text), QUOTED_CHARS)

    def fail(self, what: str, restartable: bool = False) -> ServerError:
        kind = EndpointFailed if restartable else ServerError
        return kind(printable(self.mask(f"{self.where}: {what}"), MESSAGE_CHARS))

    def request(self, method: str, path: str, limit: int = MAX_BODY_BYTES, **kwargs: Any) -> Answer:
        """One request, tried again after a refused connection or a 429/503 within the
        budget; its answer, at most `limit` bytes of it (a 429/503 left when the budget
        is spent is answered as it came, for check_status to name)."""

        def attempt(endpoint: Endpoint, client: Any) -> Answer:
            with client.stream(method, path, **kwargs) as response:
                return self._busy_or(self.answer(response, limit), response)

        try:
            return self._send(attempt, None)
        except Busy as busy:
            return cast(Answer, busy.answer)

    def _busy_or(self, answer: Answer, response: Any) -> Answer:
        """`answer`, or Busy where it says to come back later."""
        if answer.status in BUSY_STATUSES:
            retry_after = retry_after_seconds(response.headers.get("retry-after"))
            raise Busy(answer.status, retry_after, answer)
        return answer

    def _send(self, attempt: Callable[[Endpoint, Any], T], emitted: int | None) -> T:
        """`attempt` through the pool; an httpx error or a lost pool as a ServerError."""
        import httpx  # deferred: httpx takes a noticeable part of a second to import

        try:
            return self.pool.send(attempt, _retryable, self.backoff, self.pinned)
        except EndpointsDown as down:
            raise ServerError(printable(self.mask(str(down)), MESSAGE_CHARS)) from None
        except httpx.HTTPError as error:
            raise self._failure(error, emitted) from None

    def answer(self, response: Any, limit: int = MAX_BODY_BYTES) -> Answer:
        return Answer(
            response.status_code,
            read_bounded(response.iter_raw(), limit, self.lane.timeout),
            response.headers.get("location", ""),
        )

    def stream_lines(
        self, path: str, body: dict[str, Any], emitted: Callable[[], int]
    ) -> Generator[str, None, None]:
        """POST `body` and yield the response's lines as they arrive. A refused
        connection or a 429/503 is tried again on the same endpoint within the budget;
        a stream that breaks is not resumed (`emitted()` counts the tokens, for the
        messages): the whole prompt may be sent again (EndpointFailed)."""
        import httpx  # deferred, as in _send

        def too_long() -> ServerError:
            return self.fail(
                f"the server sent a line longer than {MAX_LINE_BYTES // 1024} KiB "
                f"after {emitted()} tokens; no event is that long"
            )

        def too_slow() -> ServerError:
            return self.fail(
                f"an event took over {self.lane.timeout} s to arrive after {emitted()} "
                "tokens (raise timeout=SECONDS for a slow server)"
            )

        def attempt(endpoint: Endpoint, client: Any) -> tuple[Any, Any]:
            opened = client.stream("POST", path, json=body)
            response = opened.__enter__()
            try:
                if response.status_code != 200:
                    self.check_status(self._busy_or(self.answer(response), response))
            except BaseException:
                opened.__exit__(None, None, None)
                raise
            return opened, response

        try:
            opened, response = self._send(attempt, 0)
        except Busy as busy:
            self.check_status(busy.answer)
            raise  # check_status raised already: a 429/503 is no 200
        try:
            yield from split_lines(response.iter_raw(), too_long, self.lane.timeout, too_slow)
        except httpx.HTTPError as error:
            if self.pinned is not None:
                self.pool.failed(self.pinned, reason(error))
            raise self._failure(error, emitted()) from None
        finally:
            opened.__exit__(None, None, None)

    def _failure(self, error: Exception, emitted: int | None) -> ServerError:
        """An httpx error in one line; `emitted`: the tokens streamed before it, None for
        a request that streams nothing."""
        import httpx  # deferred, as in __init__

        timeout = self.lane.timeout
        after = "" if emitted is None else f" after {emitted} tokens"
        if isinstance(error, httpx.ConnectError):
            return self.fail(
                f"cannot connect ({reason(error)}); is the server running?", restartable=True
            )
        if isinstance(error, httpx.TimeoutException):
            if emitted is None:
                return self.fail(f"no answer within {timeout} s (timeout=SECONDS)")
            return self.fail(
                f"no data for {timeout} s{after} (raise timeout=SECONDS for a slow server)"
            )
        if isinstance(error, httpx.RemoteProtocolError) and "location header" in str(error):
            # httpx reads a redirect's target even when it follows none
            return self.fail(
                "the server redirects to an address that is not a URL, which specdiff "
                "does not follow; set endpoint= to the server that answers"
            )
        if emitted is not None and isinstance(error, (httpx.RemoteProtocolError, httpx.ReadError)):
            return self.fail(f"the connection broke{after} ({reason(error)})", restartable=True)
        return self.fail(f"the request failed{after} ({type(error).__name__}: {reason(error)})")

    def check_status(self, answer: Answer) -> None:
        """Nothing for a 200; else the ServerError that says what the server answered."""
        status = answer.status
        if status == 200:
            return
        if status in (401, 403):
            where = f"${self.lane.api_key_env}" if self.lane.api_key_env else "api_key_env"
            raise self.fail(f"the server refused the API key (HTTP {status}); check {where}")
        if 300 <= status < 400:
            location = self.quote(without_credentials(answer.location)) or "nowhere"
            raise self.fail(
                f"the server redirects to {location} (HTTP {status}), which specdiff does "
                "not follow; set endpoint= to the server that answers"
            )
        text = answer.body.decode("utf-8", "replace")
        parsed: Any = answer.json()
        if parsed is not None:
            # quoted decoded: JSON's \u escapes would spell a secret past the mask
            text = json.dumps(parsed, ensure_ascii=False)
        message: Any = parsed
        if isinstance(message, dict):
            message = message.get("error", text)
            if isinstance(message, dict):
                message = message.get("message", text)
        message = " ".join(str(message if message is not None else text).split())
        busy = status in BUSY_STATUSES
        tried = f" (sent {self.backoff.retries + 1} times; raise retries=N)" if busy else ""
        raise self.fail(f"HTTP {status}: {self.quote(message) or 'no details'}{tried}", busy)

    def identity(self) -> dict[str, Any]:
        """What the server says it runs: its models, and llama-server's /props and /slots;
        only short texts, whole numbers and switches, masked, since the session header
        keeps them. A field of the wrong type or out of bounds is left out, as if the
        server had not sent it. "identity_truncated" says an answer ran past
        MAX_IDENTITY_BYTES, so that what it held is missing here."""
        identity: dict[str, Any] = {}
        answer = self.request("GET", "/v1/models", MAX_IDENTITY_BYTES)
        answers = [answer]
        if answer.status == 200:
            data = answer.json()
            listed = data.get("data") if isinstance(data, dict) else None
            models = listed if isinstance(listed, list) else []
            identity["models"] = [
                self.quote(m["id"])
                for m in models[:MAX_MODELS]
                if isinstance(m, dict) and isinstance(m.get("id"), str)
            ]
        elif answer.status in (401, 403):
            self.check_status(answer)
        props = self.request("GET", "/props", MAX_IDENTITY_BYTES)
        answers.append(props)
        if props.status == 200:
            identity.update(self._props(props.json()))
            slots = self.request("GET", "/slots", MAX_IDENTITY_BYTES)
            answers.append(slots)
            if slots.status == 200:
                identity.update(self._slots(slots.json()))
        if any(len(a.body) >= MAX_IDENTITY_BYTES for a in answers if a.status == 200):
            identity["identity_truncated"] = True
        return identity

    def _props(self, data: Any) -> dict[str, Any]:
        """What the session header keeps of llama-server's /props."""
        kept: dict[str, Any] = {}
        if not isinstance(data, dict):
            return kept
        settings = _mapping(data.get("default_generation_settings"))
        params = _mapping(settings.get("params"))
        for key in ("build_info", "model_path"):
            if isinstance(data.get(key), str):
                kept[key] = self.quote(data[key])
        # what decides whether two requests decode alike: the context, the batch sizes,
        # the prompt cache's default, and the speculation, where this build shows them;
        # each from the first place that holds a usable value
        for key in ("total_slots", "n_ctx", "n_batch", "n_ubatch", "cache_prompt"):
            switch = key == "cache_prompt"
            value = next(
                (
                    place[key]
                    for place in (data, settings, params)
                    if _whole(place.get(key)) or (switch and isinstance(place.get(key), bool))
                ),
                None,
            )
            if value is not None:
                kept[key] = value
        speculative = {
            self.quote(key): self._setting(value)
            for key, value in itertools.islice(params.items(), MAX_SETTINGS)
            if isinstance(key, str) and key.startswith("speculative")
        }
        speculative = {key: value for key, value in speculative.items() if value is not None}
        if speculative:
            kept["speculative"] = speculative
        return kept

    def _slots(self, data: Any) -> dict[str, Any]:
        """llama-server's /slots: each slot's context and whether it speculates."""
        if not isinstance(data, list):
            return {}
        slots = []
        for slot in data[:MAX_SLOTS]:
            if isinstance(slot, dict):
                shown = {k: slot[k] for k in ("id", "n_ctx") if _whole(slot.get(k))}
                if isinstance(slot.get("speculative"), bool):
                    shown["speculative"] = slot["speculative"]
                slots.append(shown)
        return {"slots": slots} if slots else {}

    def _setting(self, value: object) -> str | int | float | bool | None:
        """One server setting as a header may keep it: short text (masked), a count, a
        finite number or a switch; anything else is dropped."""
        if isinstance(value, bool) or _whole(value):
            return value  # type: ignore[return-value]
        if isinstance(value, str):
            return self.quote(value)
        return finite(value, -1e12, 1e12)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.unpin()
            self.pool.release()


def _mapping(value: object) -> dict[Any, Any]:
    """`value` where it is a JSON object, else an empty one: a server's field of the wrong
    type counts as absent."""
    return value if isinstance(value, dict) else {}


def _whole(value: object) -> bool:
    """A count a header can hold: an int, not a bool, from 0 to 2**31."""
    return type(value) is int and 0 <= value <= 1 << 31


def finite(value: object, low: float, high: float) -> float | None:
    """`value` as a float when it is a number from `low` to `high`, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int past a float's range
        return None
    return number if math.isfinite(number) and low <= number <= high else None
