"""The endpoints of one server lane, shared by every request the lane sends in a process.

A lane's ``endpoint`` names one server or several (``endpoint=http://a:1,http://b:2``,
or a TOML list). Every ServerLane built for the same lane in one process (the lanes of
a concurrent suite, the clients of ``repeat``) draws from one EndpointPool, found with
``shared_pool(lane, key)`` and handed back with ``EndpointPool.release()``.

How a generation gets its endpoint, its retries and its wait:

- ``pool.claim()`` picks the endpoint with the least work in flight (ties go round
  robin), skipping any set aside, and counts the claim as work in flight until
  ``pool.unclaim(endpoint)``. A ServerLane claims one when it tokenizes a prompt (so the
  session header, written next, names it) or when it starts a generation without one.
- A generation stays on its endpoint from its first byte to its last: steps from two
  servers are never merged. Its record (``ServerLane.executed()``) holds
  ``served_by`` (the endpoint, credentials masked), ``retries`` and ``waited_seconds``:
  the attempts that were sent again and the seconds spent backing off before it was
  answered.
- When its endpoint fails for good (the retries spent, or the endpoint set aside), the
  generation raises ``EndpointFailed`` (a ServerError) whose ``restartable`` is True:
  the caller may send the whole prompt again, and the next claim goes elsewhere. A
  stream broken after tokens were emitted raises it too: the prompt restarts from
  scratch, never from the middle.
- Requests that are not generations (the server's identity, /tokenize, templates) are
  sent with ``pool.send(attempt)``, which may move to another endpoint after a failure.

Back-off: an HTTP 429 or 503 is tried again after the server's Retry-After (seconds or
an HTTP date, at most MAX_WAIT), or else after BACKOFF_FIRST * 2**attempt seconds, in
both cases stretched by up to JITTER so that clients told the same thing do not return
at once. A refused connection waits the exponential back-off. Every retry counts against
the request budget: ``max_retries`` (the lane's ``retries`` key unless
``configure(max_retries=N)`` or ``pool.set_max_retries(N)`` says otherwise).

Circuit breaking: BREAK_AFTER consecutive failures of an endpoint (a refused or broken
connection, HTTP 502/503/504) set it aside for COOL_DOWN seconds (doubling each time it
fails again after one, up to MAX_WAIT); claims go to the others meanwhile. When every
endpoint is set aside, a request waits for the earliest to come back, within its
budget, else fails with one line naming each endpoint and its last error.

Connections: one httpx.Client per endpoint, kept alive between requests, its connection
limit sized to the requests that may be in flight: the lane's users of the pool or the
concurrency ``configure(concurrency=N)`` announced, whichever is more, plus the lane's
own side requests.
"""

from __future__ import annotations

import email.utils
import itertools
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, TypedDict, TypeVar

from specdiff.lanes import Lane, without_credentials

MAX_WAIT = 60.0
"""The longest single back-off or cool-down, whatever a server's Retry-After asks."""
BACKOFF_FIRST = 0.5
"""The first back-off in seconds where the server names none; it doubles per retry."""
JITTER = 0.25
"""A back-off is stretched by a random fraction up to this."""
BREAK_AFTER = 3
"""Consecutive failures that set an endpoint aside."""
COOL_DOWN = 5.0
"""Seconds an endpoint stays set aside the first time."""
BUSY_STATUSES = (429, 503)
"""Answers that mean "later": tried again after the back-off."""
FAILED_STATUSES = (502, 503, 504)
"""Answers that count as the endpoint failing, for circuit breaking."""
SPARE_CONNECTIONS = 2
"""Connections beyond the concurrency: a lane's identity and rescoring requests."""

T = TypeVar("T")


class Busy(Exception):
    """An attempt answered 429 or 503: the status, the Retry-After in seconds (None when
    the server named none) and whatever the caller needs to report it at the end."""

    def __init__(self, status: int, retry_after: float | None, answer: Any = None) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status
        self.retry_after = retry_after
        self.answer = answer


class EndpointsDown(Exception):
    """Every endpoint of a lane is set aside and the request's budget is spent."""


class BackoffRecord(TypedDict):
    """A request's retries and the seconds it waited, as a lane's executed table has them."""

    retries: int
    waited_seconds: float


@dataclass
class Backoff:
    """What one request went through before it was answered."""

    retries: int = 0
    waited: float = 0.0

    def as_record(self) -> BackoffRecord:
        return {"retries": self.retries, "waited_seconds": round(self.waited, 3)}


@dataclass(eq=False)
class Endpoint:
    """One server of a lane and what the pool knows of it."""

    url: str
    shown: str
    """The URL with its credentials masked: what messages and sessions name."""
    client: Any = None
    in_flight: int = 0
    failures: int = 0
    """Consecutive failures; a success resets it."""
    breaks: int = 0
    """How often it was set aside in a row (the cool-down doubles with each)."""
    ready_at: float = 0.0
    """The monotonic time before which nothing is sent to it (a back-off or a cool-down)."""
    set_aside: bool = False
    last_error: str = ""


@dataclass
class Settings:
    """What a run announces before its lanes start: see configure()."""

    concurrency: int = 1
    max_retries: int | None = None


SETTINGS = Settings()


def configure(concurrency: int | None = None, max_retries: int | None = None) -> None:
    """Announce, before the lanes start, the requests each lane has in flight at most
    (sizes the connection limit) and the request budget that replaces each lane's
    ``retries`` key. Pools made earlier keep their connection limit."""
    if concurrency is not None:
        SETTINGS.concurrency = max(1, concurrency)
    if max_retries is not None:
        SETTINGS.max_retries = max(0, max_retries)
        for pool in _SHARED.values():
            pool.set_max_retries(max_retries)


def backoff_delay(attempt: int, retry_after: float | None = None) -> float:
    """Seconds to wait before attempt number `attempt` + 1: the server's Retry-After, or
    the exponential back-off where it named none, stretched by up to JITTER; at most
    MAX_WAIT, and never less than the Retry-After (itself capped at MAX_WAIT)."""
    base = BACKOFF_FIRST * 2 ** min(attempt, 16) if retry_after is None else retry_after
    base = min(max(base, 0.0), MAX_WAIT)
    return min(base * (1 + random.uniform(0, JITTER)), MAX_WAIT)


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """A Retry-After header in seconds: a number of seconds or an HTTP date; None when
    absent or unreadable, and at most MAX_WAIT."""
    if not value:
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=timezone.utc)
        current = datetime.now(timezone.utc).timestamp() if now is None else now
        seconds = when.timestamp() - current
    if seconds != seconds:  # NaN
        return None
    return min(max(seconds, 0.0), MAX_WAIT)


class EndpointPool:
    """The endpoints of one lane: which to use, when to wait, which to set aside.
    Thread-safe: every decision is taken under one lock; requests run outside it."""

    def __init__(
        self,
        urls: Sequence[str],
        headers: dict[str, str],
        timeout: float,
        max_retries: int,
        connections: int | None = None,
        make_client: Callable[..., Any] | None = None,
    ) -> None:
        if not urls:
            raise ValueError("an endpoint pool needs at least one URL")
        self.endpoints = [Endpoint(url, without_credentials(url)) for url in urls]
        self.headers = headers
        self.timeout = timeout
        self.max_retries = max_retries
        self.connections = (connections or SETTINGS.concurrency) + SPARE_CONNECTIONS
        self._make_client = make_client
        self._lock = threading.Lock()
        self._turn = itertools.count()
        self._users = 0
        self._retired: list[Any] = []
        """Clients replaced by larger ones, closed with the pool."""
        self._key: tuple[Any, ...] | None = None

    # -- settings --------------------------------------------------------------------
    def set_max_retries(self, max_retries: int) -> None:
        """The request budget from now on (`suite --max-retries`)."""
        self.max_retries = max(0, max_retries)

    @property
    def shown(self) -> str:
        return ", ".join(endpoint.shown for endpoint in self.endpoints)

    # -- choosing ---------------------------------------------------------------------
    def claim(self) -> Endpoint:
        """The endpoint for the next request, counted in flight until unclaim(): the
        least loaded of those not set aside (ties in turn); when all are set aside, the
        one back soonest (a request sent there first waits for it). An endpoint backing
        off after a 429 comes after the others."""
        with self._lock:
            now = time.monotonic()
            for endpoint in self.endpoints:
                if endpoint.set_aside and endpoint.ready_at <= now:
                    endpoint.set_aside = False  # its cool-down is over: tried again
            usable = [e for e in self.endpoints if not e.set_aside] or [
                min(self.endpoints, key=lambda e: e.ready_at)
            ]

            def load(endpoint: Endpoint) -> tuple[bool, int]:
                # one backing off (a Retry-After) comes after every one that is not
                return (endpoint.ready_at > now, endpoint.in_flight)

            least = min(load(e) for e in usable)
            tied = [e for e in usable if load(e) == least]
            chosen = tied[next(self._turn) % len(tied)]
            chosen.in_flight += 1
            return chosen

    def unclaim(self, endpoint: Endpoint) -> None:
        with self._lock:
            endpoint.in_flight = max(0, endpoint.in_flight - 1)

    @contextmanager
    def claimed(self) -> Iterator[Endpoint]:
        endpoint = self.claim()
        try:
            yield endpoint
        finally:
            self.unclaim(endpoint)

    def fit_connections(self, users: int) -> None:
        """Room for `users` requests in flight on each endpoint: a pool that has less
        makes new clients for the requests to come; the old ones finish what they carry
        and close with the pool."""
        with self._lock:
            if users + SPARE_CONNECTIONS <= self.connections:
                return
            self.connections = users + SPARE_CONNECTIONS
            for endpoint in self.endpoints:
                if endpoint.client is not None:
                    self._retired.append(endpoint.client)
                    endpoint.client = None

    def client(self, endpoint: Endpoint) -> Any:
        """The endpoint's httpx.Client, made on first use: keep-alive, a connection
        limit sized to the concurrency."""
        with self._lock:
            if endpoint.client is None:
                endpoint.client = self._new_client(endpoint.url)
            return endpoint.client

    def _new_client(self, url: str) -> Any:
        if self._make_client is not None:
            return self._make_client(url)
        import httpx  # deferred: only server lanes need it

        limits = httpx.Limits(
            max_connections=self.connections,
            max_keepalive_connections=self.connections,
            keepalive_expiry=30.0,
        )
        return httpx.Client(
            base_url=url.rstrip("/"),
            headers=self.headers,
            timeout=httpx.Timeout(self.timeout),
            limits=limits,
        )

    # -- what happened ---------------------------------------------------------------
    def succeeded(self, endpoint: Endpoint) -> None:
        with self._lock:
            endpoint.failures = 0
            endpoint.breaks = 0
            endpoint.set_aside = False

    def failed(self, endpoint: Endpoint, why: str) -> None:
        """A failure of the endpoint itself; the BREAK_AFTER-th in a row sets it aside."""
        with self._lock:
            endpoint.failures += 1
            endpoint.last_error = why
            if endpoint.failures >= BREAK_AFTER:
                cool_down = min(COOL_DOWN * 2 ** min(endpoint.breaks, 16), MAX_WAIT)
                endpoint.breaks += 1
                endpoint.failures = 0
                endpoint.set_aside = True
                endpoint.ready_at = max(endpoint.ready_at, time.monotonic() + cool_down)

    def hold_off(self, endpoint: Endpoint, seconds: float) -> None:
        """Send nothing more to the endpoint for `seconds` (its Retry-After)."""
        with self._lock:
            endpoint.ready_at = max(endpoint.ready_at, time.monotonic() + seconds)

    def wait_for(self, endpoint: Endpoint, backoff: Backoff, at_least: float = 0.0) -> None:
        """Sleep until the endpoint may be sent to, and at least `at_least` seconds."""
        with self._lock:
            delay = max(endpoint.ready_at - time.monotonic(), at_least, 0.0)
        if delay > 0:
            time.sleep(delay)
            backoff.waited += delay

    def all_set_aside(self) -> bool:
        with self._lock:
            now = time.monotonic()
            return all(e.set_aside and e.ready_at > now for e in self.endpoints)

    def down(self) -> EndpointsDown:
        """The one-line failure when no endpoint is left."""
        with self._lock:
            named = "; ".join(f"{e.shown} ({e.last_error or 'no answer'})" for e in self.endpoints)
        return EndpointsDown(f"every endpoint failed: {named}")

    # -- sending ---------------------------------------------------------------------
    def send(
        self,
        attempt: Callable[[Endpoint, Any], T],
        retryable: Callable[[BaseException], str | None],
        backoff: Backoff | None = None,
        pinned: Endpoint | None = None,
    ) -> T:
        """`attempt(endpoint, client)` until it returns, within the budget. It raises
        Busy for a 429/503; `retryable(error)` names (in a few words) any other error
        worth another try, None for one that ends the request. Unpinned requests move
        to another endpoint after a failure; a pinned one stays."""
        backoff = backoff if backoff is not None else Backoff()
        tries = 0
        delay = 0.0
        while True:
            endpoint = pinned or self.claim()
            try:
                self.wait_for(endpoint, backoff, delay)
                try:
                    result = attempt(endpoint, self.client(endpoint))
                except Busy as busy:
                    delay = backoff_delay(tries, busy.retry_after)
                    if busy.status in FAILED_STATUSES:
                        self.failed(endpoint, f"HTTP {busy.status}")
                    if tries >= self.max_retries or (pinned is not None and endpoint.set_aside):
                        raise
                    self.hold_off(endpoint, delay)
                    delay = 0.0 if pinned is None and len(self.endpoints) > 1 else delay
                except Exception as error:
                    why = retryable(error)
                    if why is None:
                        raise
                    self.failed(endpoint, why)
                    if pinned is not None and endpoint.set_aside:
                        raise  # its cool-down is no wait for: the prompt may go elsewhere
                    if tries >= self.max_retries:
                        if pinned is None and len(self.endpoints) > 1 and self.all_set_aside():
                            raise self.down() from None
                        raise
                    delay = backoff_delay(tries)
                else:
                    self.succeeded(endpoint)
                    return result
            finally:
                if pinned is None:
                    self.unclaim(endpoint)
            tries += 1
            backoff.retries += 1

    # -- sharing ----------------------------------------------------------------------
    def release(self) -> None:
        """One user less; the last one closes the connections."""
        with _SHARED_LOCK:
            self._users -= 1
            if self._users > 0:
                return
            if self._key is not None and _SHARED.get(self._key) is self:
                del _SHARED[self._key]
        self.close()

    def close(self) -> None:
        with self._lock:
            clients = [e.client for e in self.endpoints if e.client is not None]
            clients += self._retired
            self._retired = []
            for endpoint in self.endpoints:
                endpoint.client = None
        for client in clients:
            client.close()


_SHARED: dict[tuple[Any, ...], EndpointPool] = {}
_SHARED_LOCK = threading.Lock()


def shared_pool(lane: Lane, headers: dict[str, str]) -> EndpointPool:
    """The pool of every ServerLane of `lane` in this process (same endpoints, same
    credentials, same timeout); each caller hands it back with release()."""
    key = (lane.endpoint, tuple(sorted(headers.items())), lane.timeout)
    with _SHARED_LOCK:
        pool = _SHARED.get(key)
        if pool is None:
            budget = SETTINGS.max_retries if SETTINGS.max_retries is not None else lane.retries
            pool = EndpointPool(lane.endpoints, headers, lane.timeout, budget)
            pool._key = key
            _SHARED[key] = pool
        pool._users += 1
        pool.fit_connections(pool._users)
        return pool
