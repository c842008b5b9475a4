"""Real servers on loopback for the server-lane tests: llama-cpp-python's OpenAI server,
and a small HTTP server that misbehaves on purpose (errors, broken streams, slowness)."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx


def report_agreement(result: Any, server: str, capsys: Any) -> Any:
    """Print whether a server lane (a) and the in-process lane (b) agreed, and where not,
    the first difference and both margins there; returns the fork."""
    fork = result.comparison.fork
    with capsys.disabled():
        if fork is None:
            print(f"\n{server} == in-process lane over {result.comparison.length_a} tokens")
        else:
            print(
                f"\n{server} differs from the in-process lane at token {fork.index}: "
                f"margins {fork.a.margin:.4f} / {fork.b.margin:.4f}"
            )
    return fork


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_until_up(url: str, process: subprocess.Popen, seconds: float = 120.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode}")
        try:
            if httpx.get(url, timeout=1.0).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not come up in {seconds} s")


@contextlib.contextmanager
def llama_cpp_server(model: Path, *extra: str) -> Iterator[tuple[str, subprocess.Popen]]:
    """`python -m llama_cpp.server` on a free loopback port; yields (base URL, process)."""
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llama_cpp.server",
            "--model",
            str(model),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--n_ctx",
            "1024",
            "--logits_all",
            "true",
            "--n_threads",
            "1",
            "--verbose",
            "false",
            # a new request must not cut the one streaming (repeat sends them concurrently)
            "--interrupt_requests",
            "false",
            *extra,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(f"{url}/v1/models", process)
        yield url, process
    finally:
        process.kill()
        process.wait(timeout=30)


@contextlib.contextmanager
def fault_server(mode: str) -> Iterator[str]:
    """This file run as a server that answers /v1/completions the way `mode` says."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, __file__, mode, str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(f"{url}/v1/models", process, 30.0)
        yield url
    finally:
        process.kill()
        process.wait(timeout=30)


def _event(text: str, logprobs: bool = True) -> bytes:
    choice: dict = {"text": text, "index": 0, "finish_reason": None, "logprobs": None}
    if logprobs:
        choice["logprobs"] = {
            "tokens": [text],
            "token_logprobs": [-0.5],
            "top_logprobs": [{text: -0.5, " other": -1.5}],
        }
    return f"data: {json.dumps({'choices': [choice]})}\n\n".encode()


class _Faulty(BaseHTTPRequestHandler):
    mode = "ok"

    def log_message(self, *_: object) -> None:
        return None

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = json.dumps({"data": [{"id": f"fault-{self.mode}"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length", 0))
        self.rfile.read(length)
        if self.mode == "http500":
            body = json.dumps({"error": {"message": "out of memory (injected)"}}).encode()
            self.send_response(500)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        if self.mode == "nologprobs":
            self.wfile.write(_event(" Hello", logprobs=False))
        elif self.mode == "malformed":
            self.wfile.write(_event(" Hello"))
            self.wfile.write(b"data: {not json\n\n")
        elif self.mode == "slow":
            self.wfile.write(_event(" Hello"))
            self.wfile.flush()
            time.sleep(30)
        elif self.mode == "die":
            for _ in range(3):
                self.wfile.write(_event(" Hello"))
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.wfile.write(b"data: [DONE]\n\n")


if __name__ == "__main__":
    _Faulty.mode = sys.argv[1]
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[2])), _Faulty).serve_forever()
