"""The HTTP side of a server lane: one httpx client, retries on refused connections,
the API key, and error messages that never show it.

The key is read from the environment variable the lane names, sent as a bearer token,
and never written anywhere: every message is masked before it is cut short, so no
part of the key survives a cut either.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

from specdiff.engine.base import EngineError
from specdiff.errors import LaneConfigError
from specdiff.lanes import Lane


class ServerError(EngineError):
    """The server could not be reached, refused, or answered what specdiff cannot use."""


def read_api_key(lane: Lane, lane_id: str) -> str:
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


def reason(error: BaseException) -> str:
    """An httpx error in a few words."""
    text = str(error) or type(error).__name__
    if "Connection refused" in text:
        return "connection refused"
    return text.split("\n")[0][:120]


class ServerClient:
    """Requests to one lane's endpoint; every failure is a ServerError naming it."""

    def __init__(self, lane: Lane, key: str) -> None:
        # deferred: httpx takes a noticeable part of a second to import, and only
        # server lanes need it
        import httpx

        self.lane = lane
        self.key = key
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.client = httpx.Client(
            base_url=lane.endpoint.rstrip("/"),
            headers=headers,
            timeout=httpx.Timeout(lane.timeout),
        )

    def mask(self, text: str) -> str:
        return text.replace(self.key, "***") if self.key else text

    def fail(self, what: str) -> ServerError:
        return ServerError(self.mask(f"{self.lane.endpoint}: {what}"))

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """One request with retries on refused connections; returns the response."""
        import httpx  # deferred, as in __init__

        attempt = 0
        while True:
            try:
                return self.client.request(method, path, **kwargs)
            except httpx.HTTPError as error:
                attempt = self._next_attempt(error, attempt, None)

    def stream_lines(
        self, path: str, body: dict[str, Any], emitted: Callable[[], int]
    ) -> Iterator[str]:
        """POST `body` and yield the response's lines as they arrive. A refused
        connection is tried again while no token has been emitted (`emitted()` counts
        them, for the messages too)."""
        import httpx  # deferred, as in __init__

        attempt = 0
        while True:
            try:
                with self.client.stream("POST", path, json=body) as response:
                    self.check_status(response)
                    yield from response.iter_lines()
                return
            except httpx.HTTPError as error:
                attempt = self._next_attempt(error, attempt, emitted())

    def _next_attempt(self, error: Exception, attempt: int, emitted: int | None) -> int:
        """After a failed try: wait, and return the next attempt's number, when a refused
        connection may be tried again (retries left, no token streamed yet); else raise
        the error as one line."""
        import httpx  # deferred, as in __init__

        if isinstance(error, httpx.ConnectError) and not emitted and attempt < self.lane.retries:
            time.sleep(0.5 * (attempt + 1))
            return attempt + 1
        raise self._failure(error, emitted) from None

    def _failure(self, error: Exception, emitted: int | None) -> ServerError:
        """An httpx error in one line; `emitted`: the tokens streamed before it, None for
        a request that streams nothing."""
        import httpx  # deferred, as in __init__

        timeout = self.lane.timeout
        after = "" if emitted is None else f" after {emitted} tokens"
        if isinstance(error, httpx.ConnectError):
            return self.fail(f"cannot connect ({reason(error)}); is the server running?")
        if isinstance(error, httpx.TimeoutException):
            if emitted is None:
                return self.fail(f"no answer within {timeout} s (timeout=SECONDS)")
            return self.fail(
                f"no data for {timeout} s{after} (raise timeout=SECONDS for a slow server)"
            )
        if emitted is not None and isinstance(error, (httpx.RemoteProtocolError, httpx.ReadError)):
            return self.fail(f"the connection broke{after} ({reason(error)})")
        return self.fail(f"the request failed{after} ({type(error).__name__}: {reason(error)})")

    def check_status(self, response: Any) -> None:
        if response.status_code == 200:
            return
        body = self.mask(response.read().decode("utf-8", "replace"))
        try:
            message = json.loads(body).get("error", body)
            if isinstance(message, dict):
                message = message.get("message", body)
        except (ValueError, AttributeError):
            message = body
        message = " ".join(str(message).split())[:300]
        if response.status_code in (401, 403):
            where = f"${self.lane.api_key_env}" if self.lane.api_key_env else "api_key_env"
            raise self.fail(
                f"the server refused the API key (HTTP {response.status_code}); check {where}"
            )
        raise self.fail(f"HTTP {response.status_code}: {message or 'no details'}")

    def identity(self) -> dict[str, Any]:
        """What the server says it runs: its models, and llama-server's /props."""
        identity: dict[str, Any] = {}
        response = self.request("GET", "/v1/models")
        if response.status_code == 200:
            try:
                identity["models"] = [m.get("id") for m in response.json().get("data", [])]
            except (ValueError, AttributeError):
                identity["models"] = []
        elif response.status_code in (401, 403):
            self.check_status(response)
        props = self.request("GET", "/props")
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

    def close(self) -> None:
        self.client.close()
