"""The proxy's HTTP front: OpenAI's /v1/completions, /v1/chat/completions (whole or
streamed as server-sent events) and /v1/models, on the standard library's threading
HTTP server, one thread per connection.

Each answer is HTTP/1.0's: the connection closes after it, so a stream needs no chunked
encoding and ends when the connection does. A request body is read only when its
Content-Length is within the limit (413 otherwise, the body left unread). While a
request waits for its pair, the connection is watched: a client that closes it cancels
the pair. With an API key, every request must carry it as a bearer token, compared in
constant time.
"""

from __future__ import annotations

import hmac
import json
import queue
import select
import socket
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from specdiff.proxy.answers import Answer, Usage
from specdiff.proxy.requests import ApiError, Endpoint, read_body
from specdiff.proxy.service import Finished, Job, Service
from specdiff.steps import TokenStep

MAX_BODY = 4 * 1024 * 1024
"""The largest request body read: far more than any context holds as text."""
ROUTES: dict[str, Endpoint] = {"/v1/completions": "completions", "/v1/chat/completions": "chat"}
WAIT_SECONDS = 0.2
"""How often a waiting request looks whether its client is still there."""


class ProxyServer(ThreadingHTTPServer):
    """The listening socket, with the service and the key every handler reads."""

    daemon_threads = False
    """Stopping waits for every answer being written (server_close joins them)."""

    def __init__(self, address: tuple[str, int], service: Service, api_key: str | None) -> None:
        self.service = service
        self.api_key = api_key
        super().__init__(address, ProxyHandler)

    @property
    def port(self) -> int:
        return int(self.server_address[1])


class ProxyHandler(BaseHTTPRequestHandler):
    server: ProxyServer
    server_version = "specdiff-proxy"

    def log_message(self, format: str, *args: Any) -> None:
        """No access log: the live line says what ran."""

    def do_GET(self) -> None:
        if not self.authorized():
            return
        path = self.path.split("?", 1)[0].rstrip("/")
        models = [
            {"id": name, "object": "model", "created": 0, "owned_by": "specdiff"}
            for name in self.server.service.models
        ]
        if path == "/v1/models":
            self.send_json(200, {"object": "list", "data": models})
            return
        named = [model for model in models if path == f"/v1/models/{model['id']}"]
        if named:  # the SDK's models.retrieve
            self.send_json(200, named[0])
            return
        if path in ROUTES:
            self.send_error_json(
                ApiError(405, f"{path} takes POST, not GET", code="method_not_allowed")
            )
            return
        self.send_error_json(not_found(path))

    def do_POST(self) -> None:
        if not self.authorized():
            return
        endpoint = ROUTES.get(self.path.split("?", 1)[0].rstrip("/"))
        if endpoint is None:
            self.send_error_json(not_found(self.path))
            return
        try:
            request = read_body(self.read_body(), endpoint)
            job = self.server.service.submit(request)
        except ApiError as error:
            self.send_error_json(error)
            return
        answer = Answer(request, self.server.service.serves_server_lane)
        answer.created = int(time.time())
        if request.stream:
            self.stream_answer(job, answer)
        else:
            self.whole_answer(job, answer)

    def authorized(self) -> bool:
        key = self.server.api_key
        if key is None:
            return True
        scheme, _, given = self.headers.get("Authorization", "").partition(" ")
        # the scheme's name is case-insensitive (RFC 9110); the key is compared whole
        same = hmac.compare_digest(given.encode("utf-8", "replace"), key.encode("utf-8"))
        if scheme.lower() == "bearer" and same:
            return True
        self.send_error_json(
            ApiError(
                401,
                "a missing or wrong API key: send it as 'Authorization: Bearer KEY'",
                code="invalid_api_key",
            )  # fmt: skip
        )
        return False

    def read_body(self) -> bytes:
        length = self.headers.get("Content-Length")
        if length is None or not length.strip().isdigit():
            raise ApiError(411, "send the request body with a Content-Length header",
                           code="length_required")  # fmt: skip
        size = int(length)
        if size > MAX_BODY:
            self.close_connection = True
            raise ApiError(413, f"the request body is {size} bytes; at most {MAX_BODY} are "
                           "read", code="request_too_large")  # fmt: skip
        return self.rfile.read(size)

    # -- answers

    def next_event(self, job: Job) -> TokenStep | Finished | ApiError | None:
        """The job's next event; None (the pair cancelled) once the client has left."""
        while True:
            try:
                return job.events.get(timeout=WAIT_SECONDS)
            except queue.Empty:
                if client_gone(self.connection):
                    job.abandon()
                    return None

    def whole_answer(self, job: Job, answer: Answer) -> None:
        while (event := self.next_event(job)) is not None:
            if isinstance(event, TokenStep):
                answer.add(event)
                continue
            if isinstance(event, ApiError):
                self.send_error_json(event)
                return
            outcome = event.result.a if answer_lane(self) == "a" else event.result.b
            if outcome.error:
                self.send_error_json(lane_error(answer_lane(self), outcome.error))
                return
            usage = Usage(len(event.result.prompt_tokens), answer.cutter.tokens)
            self.send_json(200, answer.response(outcome.stop_reason, usage))
            return

    def stream_answer(self, job: Job, answer: Answer) -> None:
        started = False
        try:
            while (event := self.next_event(job)) is not None:
                if isinstance(event, ApiError) and not started:
                    self.send_error_json(event)
                    return
                if isinstance(event, Finished):
                    outcome = event.result.a if answer_lane(self) == "a" else event.result.b
                    if outcome.error and not started:
                        self.send_error_json(lane_error(answer_lane(self), outcome.error))
                        return
                if not started:
                    self.start_stream()
                    if answer.chat:  # the role comes first, as OpenAI's streams give it
                        self.send_event(answer.chunk("", first=True))
                    started = True
                if isinstance(event, TokenStep):
                    text = answer.add(event)
                    if text or answer.request.logprobs is not None and not answer.cutter.stopped:
                        self.send_event(answer.chunk(text))
                    continue
                if isinstance(event, ApiError):
                    self.send_event(event.body())
                elif outcome.error:
                    self.send_event(lane_error(answer_lane(self), outcome.error).body())
                else:
                    usage = Usage(len(event.result.prompt_tokens), answer.cutter.tokens)
                    for chunk in answer.closing_chunks(outcome.stop_reason, usage):
                        self.send_event(chunk)
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
                return
        except OSError:
            job.abandon()  # the client left mid-stream: its pair is cancelled

    def start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()

    def send_event(self, data: dict[str, Any]) -> None:
        self.wfile.write(b"data: " + json.dumps(data, ensure_ascii=False).encode() + b"\n\n")
        self.wfile.flush()

    def send_json(self, status: int, data: dict[str, Any]) -> None:
        body = json.dumps(data, ensure_ascii=False).encode("utf-8")
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            self.close_connection = True  # the client has gone; nothing to tell it

    def send_error_json(self, error: ApiError) -> None:
        self.send_json(error.status, error.body())


def answer_lane(handler: ProxyHandler) -> str:
    return handler.server.service.settings.serve


def lane_error(lane: str, error: str) -> ApiError:
    """A 502 that says which lane failed and why."""
    return ApiError(502, f"lane {lane} failed: {error}", "server_error", code="lane_failed")


def not_found(path: str) -> ApiError:
    return ApiError(
        404,
        f"no route {path[:80]!r}: the proxy serves /v1/completions, /v1/chat/completions "
        "and /v1/models",
        code="not_found",
    )


def client_gone(connection: socket.socket) -> bool:
    """Whether the client has closed its connection (it sends nothing more once its
    request is in, so a readable socket with no bytes is a closed one)."""
    try:
        readable, _, _ = select.select([connection], [], [], 0)
        if not readable:
            return False
        return connection.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
        return True
