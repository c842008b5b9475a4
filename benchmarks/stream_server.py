"""A fast OpenAI-compatible completions server that streams a fixed text, for suites of
thousands of prompts and for load tests: `python3 benchmarks/stream_server.py MODE PORT`.

MODE is `key=value` settings joined by `:`, each optional:
- `tokens=N`: the words streamed per request (default 4), then a finish;
- `delay=S`: seconds between two words (default 0), so requests overlap in time;
- `busy=K` and `retry_after=S`: the first K completion requests are answered HTTP 429
  with `Retry-After: S` (default 1), as a loaded server answers;
- `broken=K`: the first K streams drop their connection halfway, with no end marker;
- `first=S`: seconds before a stream's first word (default 0), as a prompt is read.

Every GET answers a one-model list, which is all a server lane asks of a server it does
not know. GET /counts says what the server did: the completions it streamed, the 429s
it sent, the most streams it had at once (`peak`) and waiting for their first word at
once (`peak_unanswered`), the streams it broke, and its settings (`mode`).
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.request import urlopen

WORDS = (" Hello", " world", " and", " again", ".")


def read_mode(mode: str) -> dict[str, float]:
    settings = {
        "tokens": 4.0,
        "delay": 0.0,
        "busy": 0.0,
        "retry_after": 1.0,
        "broken": 0.0,
        "first": 0.0,
    }
    for part in filter(None, mode.split(":")):
        key, _, value = part.partition("=")
        if key not in settings:
            raise SystemExit(f"unknown setting {key!r}; known: {', '.join(settings)}")
        settings[key] = float(value)
    return settings


def event(text: str, finish: str | None = None) -> bytes:
    """One server-sent event: a word with its log-probability and one other candidate."""
    logprobs = None
    if text:
        logprobs = {
            "tokens": [text],
            "token_logprobs": [-0.25],
            "top_logprobs": [{text: -0.25, " other": -2.0}],
        }
    choice = {"text": text, "index": 0, "finish_reason": finish, "logprobs": logprobs}
    return f"data: {json.dumps({'choices': [choice]})}\n\n".encode()


class Streamer(BaseHTTPRequestHandler):
    settings: dict[str, float] = read_mode("")
    counts = {"streamed": 0, "busy": 0, "peak": 0, "broken": 0, "peak_unanswered": 0}
    streaming = 0
    unanswered = 0
    lock = threading.Lock()
    protocol_version = "HTTP/1.1"  # keep-alive, as a real server offers

    def log_message(self, *_: object) -> None:
        return None

    def _json(self, status: int, data: object, **headers: str) -> None:
        body = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path == "/counts":
            with self.lock:
                self._json(200, {**self.counts, "mode": self.settings})
            return
        self._json(200, {"data": [{"id": "stream-server"}]})

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with self.lock:
            busy = self.counts["busy"] < self.settings["busy"]
            self.counts["busy" if busy else "streamed"] += 1
        if busy:
            wait = f"{self.settings['retry_after']:g}"
            self._json(429, {"error": {"message": "busy"}}, **{"Retry-After": wait})
            return
        with self.lock:
            Streamer.streaming += 1
            self.counts["peak"] = max(self.counts["peak"], Streamer.streaming)
        try:
            self._stream()
        finally:
            with self.lock:
                Streamer.streaming -= 1

    def _stream(self) -> None:
        with self.lock:
            broken = self.counts["broken"] < self.settings["broken"]
            self.counts["broken"] += broken
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self._first_wait()
        tokens = int(self.settings["tokens"])
        for number in range(tokens):
            if number and self.settings["delay"]:
                time.sleep(self.settings["delay"])
            if broken and number == tokens // 2:
                self.close_connection = True  # half the stream, then the connection drops
                return
            self._chunk(event(WORDS[number % len(WORDS)]))
        self._chunk(event("", finish="length"))
        self._chunk(b"data: [DONE]\n\n")
        self._chunk(b"")

    def _first_wait(self) -> None:
        """The `first` seconds before the first word, counting the streams that wait
        for theirs at once (`peak_unanswered`): requests sent together all wait."""
        with self.lock:
            Streamer.unanswered += 1
            self.counts["peak_unanswered"] = max(
                self.counts["peak_unanswered"], Streamer.unanswered
            )
        time.sleep(self.settings["first"])
        with self.lock:
            Streamer.unanswered -= 1

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


@contextlib.contextmanager
def serving(mode: str) -> Iterator[str]:
    """This server in a process of its own on a free loopback port; yields its URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen([sys.executable, __file__, mode, str(port)])
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            with contextlib.suppress(OSError):
                urlopen(f"{url}/v1/models", timeout=1).close()
                break
            time.sleep(0.1)
        yield url
    finally:
        process.kill()
        process.wait()


def main() -> None:
    Streamer.settings = read_mode(sys.argv[1])
    server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[2])), Streamer)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
