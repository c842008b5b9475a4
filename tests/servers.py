"""Real servers on loopback for the server-lane tests: llama-cpp-python's OpenAI server,
and a small HTTP server that misbehaves on purpose: errors, broken streams, slowness, and
the hostile answers a server the user does not control may give (endless streams, NaN,
an echoed key, escape sequences, redirects, giant events); deployment servers that speak
vLLM's and SGLang's metrics and cache resets, honestly or not; and servers that answer as
llama-server does, honestly or not."""

from __future__ import annotations

import base64
import contextlib
import email.utils
import json
import socket
import subprocess
import sys
import threading
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


REPACKED_SERVER = (
    # llama_cpp.server has no flag for llama.cpp's repacked kernels: the model's default
    # parameters are set before its main() reads them
    "import sys; sys.path.pop(0); import llama_cpp.llama_cpp as low\n"
    "repack = sys.argv.pop(1) == 'on'\n"
    "default = low.llama_model_default_params\n"
    "def params():\n"
    "    made = default()\n"
    "    made.use_extra_bufts = repack\n"
    "    return made\n"
    "low.llama_model_default_params = params\n"
    "from llama_cpp.server.__main__ import main\n"
    "main()\n"
)


def probed_repack(model: Path) -> bool:
    """Whether the in-process lanes run `model` with repacked kernels here: the kernel
    probe's verdict (off on a CPU where they crash, as AMX Xeons do), so a reference
    built apart from specdiff runs the kernels the lane it checks ran."""
    # deferred: the probe loads llama.cpp in a child process only
    from specdiff.engine.llama.probe import verdict

    return verdict(model).chosen_repack == "on"


@contextlib.contextmanager
def llama_cpp_server(model: Path, *extra: str) -> Iterator[tuple[str, subprocess.Popen]]:
    """`python -m llama_cpp.server` on a free loopback port, with the kernels the probe
    chose for in-process lanes; yields (base URL, process)."""
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            REPACKED_SERVER,
            "on" if probed_repack(model) else "off",
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


def fault_server(mode: str) -> contextlib.AbstractContextManager[str]:
    """This file run as a server that answers /v1/completions the way `mode` says."""
    return script_server(__file__, mode)


@contextlib.contextmanager
def script_server(script: str, mode: str) -> Iterator[str]:
    """`python3 SCRIPT MODE PORT` on a free loopback port, up once /v1/models answers;
    yields its base URL and kills it afterwards."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, script, mode, str(port)],
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


ESCAPES = "\x1b]52;c;c3BlY2RpZmY=\x07\x1b]0;pwned\x07\x1b[31m"
"""What a hostile server hides in its words: a clipboard write (OSC 52), a window title,
a colour."""
PASSWORD = "pw-hostile-9876543210"
"""The password the `password` mode asks for (basic auth, from the endpoint URL)."""
DRIFT_WORDS = (" today", " here", " now", " there")
"""The drift mode's third word, one per request in turn: none is steady's " again"."""
ENDLESS_CAP = 200_000
"""Tokens an endless stream sends at most before it gives up on a client that never left."""
UNBOUNDED_SECONDS = 0.05
"""The unbounded mode's time per token: too slow to fill a bare client's byte limit."""


def _event(
    text: str, logprobs: bool = True, logprob: float = -0.5, finish: str | None = None
) -> bytes:
    choice: dict = {"text": text, "index": 0, "finish_reason": finish, "logprobs": None}
    if logprobs:
        choice["logprobs"] = {
            "tokens": [text],
            "token_logprobs": [logprob],
            "top_logprobs": [{text: logprob, " other": -1.5}],
        }
    return f"data: {json.dumps({'choices': [choice]})}\n\n".encode()


WRONG_PROPS: dict[str, object] = {
    "props-list": [1, "n_ctx"],
    "props-text": "n_ctx n_batch cache_prompt params speculative",
    "props-int": -7,
    "props-nested": json.loads('{"a":' * 400 + "1" + "}" * 400),
    "props-huge": 10**400,
    "props-long": "x" * (1 << 20),
}
"""The props-* modes: the one wrong value every field of /props and /slots holds."""


def _wrong_props(value: object, path: str, shape: int) -> object:
    """/props or /slots with `value` in every field a lane reads, in one of three shapes:
    at the top (the settings object and the slot list are `value` themselves), inside
    the settings (their params are `value`), inside the settings' params."""
    if path == "/slots":
        return value if shape == 0 else [{"id": value, "n_ctx": value, "speculative": value}]
    if shape == 0:
        names = ("build_info", "model_path", "total_slots", "default_generation_settings")
        return dict.fromkeys(names, value)
    names = ("n_ctx", "n_batch", "n_ubatch", "cache_prompt")
    params = {"speculative.n_max": value, "n_batch": value, "cache_prompt": value}
    if shape == 2:
        return {"default_generation_settings": {"params": params}}
    settings = {**dict.fromkeys(names, value), "params": value}
    return {"default_generation_settings": settings}


def _secret(authorization: str) -> str:
    """What the client authenticated with: the bearer key, or a basic-auth password."""
    kind, _, value = authorization.partition(" ")
    if kind == "Basic":
        return base64.b64decode(value).decode("utf-8", "replace").partition(":")[2]
    return value


BUSY_MODES = ("429", "429date", "503", "pooled")
"""Modes that answer over HTTP/1.1 keep-alive and count: MODE:N:SECONDS answers its first
N POSTs with MODE's status (429date: 429 with the Retry-After as an HTTP date; 503 with
none when SECONDS is left out), then as steady does; pooled is steady. GET /stats says
how many connections were opened and POSTs received."""


def busy_mode(status: str, count: int, seconds: float | None = None) -> str:
    """The mode string of a busy fault server."""
    return f"{status}:{count}" + ("" if seconds is None else f":{seconds:g}")


class _QuietJson(BaseHTTPRequestHandler):
    """A handler that logs nothing and answers JSON with its length: what every fake
    server here shares."""

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


class _Faulty(_QuietJson):
    """Answers as `mode` says. ok: no tokens; steady: four tokens and a finish; endless:
    tokens until the client leaves, whatever max_tokens says; nan / inf: a second token
    whose log-probability is NaN / a top candidate at -inf; echo-key: the client's secret
    in /v1/models, /props and the streamed text; newline-error: an HTTP 500 whose message
    holds newlines and escape sequences; redirect: a 307 to a URL with credentials;
    giant-event: one 50 MB line; giant-body: a 50 MB /props and a 50 MB HTTP 500;
    keepalive: comments, never a token; password: steady for a client that authenticates
    with PASSWORD, HTTP 401 for any other; echo-escaped: the secret in JSON \\u escapes
    inside an event of the wrong shape; echo-finish: the secret as the finish reason;
    echo-basic: an HTTP 500 quoting the Authorization header (basic auth: base64);
    trickle: an event line that grows by a byte every half second; unbounded: a token
    every UNBOUNDED_SECONDS until the client leaves, whatever max_tokens and stream say
    (a server that ignores the budget, at a model's pace); redirect-control: a
    307 whose Location holds an escape sequence; drift: steady, but the third word differs
    from one request to the next (DRIFT_WORDS); props-*: a /props and /slots whose every
    field holds the wrong value WRONG_PROPS names."""

    mode = "ok"
    props_asked = 0
    connections = 0
    posts = 0
    counting = threading.Lock()

    def setup(self) -> None:
        super().setup()
        with _Faulty.counting:
            _Faulty.connections += 1

    def _giant(self, status: int, start: bytes) -> None:
        """A 50 MB body that opens as JSON and never closes, sent without a length."""
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.wfile.write(start)
            for _ in range(50):
                self.wfile.write(b"x" * (1 << 20))
        self.close_connection = True

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path == "/stats":
            self._json(200, {"connections": _Faulty.connections, "posts": _Faulty.posts})
            return
        secret = _secret(self.headers.get("Authorization", ""))
        if self.mode in WRONG_PROPS and self.path in ("/props", "/slots"):
            # each lane that asks gets the next shape: the wrong value at another level
            _Faulty.props_asked += self.path == "/props"
            shape = (_Faulty.props_asked - 1) % 3
            self._json(200, _wrong_props(WRONG_PROPS[self.mode], self.path, shape))
            return
        if self.mode == "echo-key" and self.path == "/props":
            self._json(200, {"build_info": f"b1 {secret}", "model_path": f"/m/{secret}.gguf"})
            return
        if self.mode == "giant-body" and self.path == "/props":
            self._giant(200, b'{"build_info": "')
            return
        model = f"{secret}{ESCAPES}" if self.mode == "echo-key" else f"fault-{self.mode}"
        self._json(200, {"data": [{"id": model}]})

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length", 0))
        self.rfile.read(length)
        authorization = self.headers.get("Authorization", "")
        if self.mode.partition(":")[0] in BUSY_MODES:
            self._busy()
            return
        if self.mode == "password" and _secret(authorization) != PASSWORD:
            self._json(401, {"error": {"message": "wrong password"}})
            return
        if self.mode == "http500":
            self._json(500, {"error": {"message": "out of memory (injected)"}})
            return
        if self.mode == "giant-body":
            self._giant(500, b'{"error": {"message": "')
            return
        if self.mode == "newline-error":
            message = f"out of memory\nat line 2\r\n{ESCAPES}\nend of message"
            self._json(500, {"error": {"message": message}})
            return
        if self.mode == "redirect":
            location = "http://admin:hunter2-redirect@127.0.0.1:9/v1/completions"
            self._json(307, {"error": "moved"}, Location=location)
            return
        if self.mode == "redirect-control":
            self._json(307, {"error": "moved"}, Location="http://127.0.0.1:9/\x1b]0;x\x07")
            return
        if self.mode == "echo-basic":
            message = f"bad credentials in header {authorization}"
            self._json(500, {"error": {"message": message}})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self._stream(_secret(authorization))

    def _busy(self) -> None:
        """A busy mode's answer: the status with its Retry-After while the first N POSTs
        last, then a steady stream with its length, so the connection stays open."""
        status, _, rest = self.mode.partition(":")
        count, _, seconds = rest.partition(":")
        with _Faulty.counting:
            _Faulty.posts += 1
            early = _Faulty.posts <= int(count or 0)
        if early and status != "pooled":
            headers = {}
            if seconds and status == "429date":
                headers["Retry-After"] = email.utils.formatdate(
                    time.time() + float(seconds), usegmt=True
                )
            elif seconds:
                headers["Retry-After"] = seconds
            self._json(503 if status == "503" else 429, {"error": "busy"}, **headers)
            return
        words = (" Hello", " world", " again", ".")
        body = b"".join(_event(word) for word in words)
        body += _event("", logprobs=False, finish="length") + b"data: [DONE]\n\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _stream(self, secret: str) -> None:
        write = self.wfile.write
        if self.mode == "nologprobs":
            write(_event(" Hello", logprobs=False))
        elif self.mode == "malformed":
            write(_event(" Hello"))
            write(b"data: {not json\n\n")
        elif self.mode == "slow":
            write(_event(" Hello"))
            self.wfile.flush()
            time.sleep(30)
        elif self.mode == "die":
            for _ in range(3):
                write(_event(" Hello"))
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        elif self.mode in ("steady", "password"):
            for word in (" Hello", " world", " again", "."):
                write(_event(word))
            write(_event("", logprobs=False, finish="length"))
        elif self.mode == "drift":
            # a server whose batches change with its load: no two requests agree
            with _Faulty.counting:
                _Faulty.posts += 1
                third = DRIFT_WORDS[(_Faulty.posts - 1) % len(DRIFT_WORDS)]
            for word in (" Hello", " world", third, "."):
                write(_event(word))
            write(_event("", logprobs=False, finish="length"))
        elif self.mode == "endless":
            for _ in range(ENDLESS_CAP):
                write(_event(" Hello"))
                self.wfile.flush()
        elif self.mode == "unbounded":
            for _ in range(int(600 / UNBOUNDED_SECONDS)):
                write(_event(" Hello"))
                self.wfile.flush()
                time.sleep(UNBOUNDED_SECONDS)
        elif self.mode in ("nan", "inf"):
            write(_event(" Hello"))
            if self.mode == "nan":
                write(_event(" world", logprob=float("nan")))
            else:
                write(_event(" world").replace(b"-1.5", b"-Infinity"))
        elif self.mode == "echo-key":
            for word in (
                " The",
                " key",
                " is",
                " ",
                *[secret[i : i + 3] for i in range(0, len(secret), 3)],
                ".",
            ):
                write(_event(word))
        elif self.mode == "giant-event":
            write(_event(" Hello"))
            write(b"data: " + b"x" * (1 << 20))
            for _ in range(49):
                write(b"x" * (1 << 20))
            return
        elif self.mode == "echo-escaped":
            write(_event(" Hello"))
            escaped = "".join(f"\\u{ord(c):04x}" for c in secret)
            write(f'data: {{"choices": 7, "k": "{escaped}"}}\n\n'.encode())
        elif self.mode == "echo-finish":
            write(_event(" Hello"))
            write(_event("", logprobs=False, finish=secret))
        elif self.mode == "trickle":
            write(_event(" Hello"))
            write(b'data: {"choices": [')
            for _ in range(240):
                self.wfile.flush()
                time.sleep(0.5)
                write(b" ")
        elif self.mode == "keepalive":
            for _ in range(600):
                write(b": ping\n\n")
                self.wfile.flush()
                time.sleep(0.1)
        write(b"data: [DONE]\n\n")


DEPLOYMENT_MODES = (
    "vllm",
    "vllm-variant",
    "vllm-liar",
    "sglang",
    "sglang-liar",
    "bare",
    "vllm-restart",
    "vllm-endless-metrics",
    "vllm-doubled",
    "vllm-busy",
    "vllm-serial",
)
"""Modes of `deployment_server`: an OpenAI-compatible server that batches (its running
requests counted in /metrics as vLLM or SGLang name them) and keeps a prefix cache (its hit
counter there too, emptied by vLLM's POST /reset_prefix_cache or SGLang's /flush_cache).
vllm and sglang answer alike whatever the load; vllm-variant's log-probabilities, and from
token 5 its words, change while another request runs (a batch-variant server); the -liar
modes count every prompt token of every request as a cache hit; bare has no /metrics.
The rest answer as vllm does but report what cannot be taken as evidence:
vllm-restart's hit counter stands at RESTART_HITS, drops to 0 on the first completion
(a restart) and counts RESTART_STEP for each later one; vllm-endless-metrics streams
"vllm:num_requests_running 3" lines until the client leaves; vllm-doubled gives its
running-request series twice; vllm-busy always reports BUSY_RUNNING requests running;
vllm-serial runs one completion at a time (as llama-server --parallel 1 does), and
reports so honestly."""
RESTART_HITS = 1000.0
RESTART_STEP = 20
BUSY_RUNNING = 4
DEPLOYMENT_WORDS = (" the", " cat", " sat", " on", " a", " mat", " and", " then", " it", " ran")
TOKEN_SECONDS = 0.01
"""A deployment server's time per token: long enough that requests sent together overlap."""


def deployment_server(mode: str) -> contextlib.AbstractContextManager[str]:
    """This file run as a deployment server of `mode` (DEPLOYMENT_MODES)."""
    return script_server(__file__, mode)


class _Deployment(_QuietJson):
    mode = "vllm"
    running = 0
    hits = 0.0
    completions = 0
    cached: list[list[str]] = []
    guard = threading.Lock()
    serial = threading.Lock()

    def _metrics(self) -> str:
        engine = self.mode.partition("-")[0]
        running, hits = _Deployment.running, _Deployment.hits
        if self.mode == "vllm-busy":
            running = BUSY_RUNNING
        if engine == "vllm":
            series = f'vllm:num_requests_running{{model_name="fake"}} {running}\n'
            return (
                "# TYPE vllm:num_requests_running gauge\n"
                + series * (2 if self.mode == "vllm-doubled" else 1)
                + "# TYPE vllm:prefix_cache_hits_total counter\n"
                f'vllm:prefix_cache_hits_total{{model_name="fake"}} {hits}\n'
            )
        return (
            f'sglang:num_running_reqs{{model_name="fake"}} {running}\n'
            f'sglang:cached_tokens_total{{model_name="fake"}} {hits}\n'
        )

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path == "/v1/models":
            self._json(200, {"data": [{"id": f"fake-{self.mode}"}]})
        elif self.path == "/metrics" and self.mode == "vllm-endless-metrics":
            self._endless_metrics()
        elif self.path == "/metrics" and self.mode != "bare":
            body = self._metrics().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif self.path == "/stats":
            self._json(200, {"hits": _Deployment.hits, "running": _Deployment.running})
        else:
            self._json(404, {"error": "not found"})

    def _endless_metrics(self) -> None:
        """Prometheus text that never ends: the same gauge line again and again."""
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        chunk = b"vllm:num_requests_running 3\n" * 2048
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.wfile.write(b"# TYPE vllm:num_requests_running gauge\n")
            for _ in range(4096):  # 224 MiB at most, for a client that never leaves
                self.wfile.write(chunk)
        self.close_connection = True

    def _count_hits(self, words: list[str]) -> None:
        """The hit counter after a completion of `words` (under the guard)."""
        _Deployment.completions += 1
        if self.mode == "vllm-restart":
            # the first completion finds a restarted server; later ones count a fixed step
            first = _Deployment.completions == 1
            _Deployment.hits = 0.0 if first else _Deployment.hits + RESTART_STEP
        elif self.mode.endswith("-liar"):
            _Deployment.hits += len(words)  # a hit claimed whatever the cache holds
        else:
            _Deployment.hits += max(
                (_common(words, seen) for seen in _Deployment.cached), default=0
            )

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        engine = self.mode.partition("-")[0]
        reset = {"vllm": "/reset_prefix_cache", "sglang": "/flush_cache"}.get(engine)
        if self.path == reset:
            with _Deployment.guard:
                _Deployment.cached = []
            self._json(200, {"ok": True})
            return
        if self.path != "/v1/completions":
            self._json(404, {"error": "not found"})
            return
        words = str(body.get("prompt", "")).split(" ")
        serial = self.mode == "vllm-serial"
        with _Deployment.serial if serial else contextlib.nullcontext():
            with _Deployment.guard:
                self._count_hits(words)
                _Deployment.cached.append(words)
                _Deployment.running += 1
            try:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self._complete(words, int(body.get("max_tokens", 16)))
            finally:
                with _Deployment.guard:
                    _Deployment.running -= 1

    def _complete(self, words: list[str], max_tokens: int) -> None:
        seed = sum(" ".join(words).encode())
        for index in range(max_tokens):
            time.sleep(TOKEN_SECONDS)
            crowded = self.mode == "vllm-variant" and _Deployment.running > 1
            shift = 7 if crowded and index >= 5 else 0
            word = DEPLOYMENT_WORDS[(seed + 3 * index + shift) % len(DEPLOYMENT_WORDS)]
            logprob = -0.25 - (0.001 if crowded else 0.0)
            self.wfile.write(_event(word, logprob=logprob))
            self.wfile.flush()
        self.wfile.write(_event("", logprobs=False, finish="length") + b"data: [DONE]\n\n")


def _common(words: list[str], seen: list[str]) -> int:
    """How many leading words two prompts share."""
    count = 0
    for mine, theirs in zip(words, seen):
        if mine != theirs:
            break
        count += 1
    return count


LLAMA_MODES = ("llama-drafts", "llama-plain", "llama-openai", "llama-nologprobs")
"""Modes of `llama_like_server`: a server that says it is llama-server (/props with its
build_info, /slots) and answers greedily with LLAMA_TOKENS, whatever the prompt.
llama-drafts and llama-plain stream llama-server's own /completion, every token with its
probabilities, and end with timings: llama-drafts claims DRAFT_CLAIM drafted and
DRAFT_CLAIM accepted tokens however few it generated, llama-plain none. llama-openai
streams OpenAI's /v1/completions with log-probabilities; llama-nologprobs streams it
without them (a llama-server reached through the OpenAI API, asked for log-probabilities
it does not give there)."""
LLAMA_TOKENS = ((9259, " x"), (236764, " y"), (1902, " z"), (506, " w"))
"""Token ids of the bundled Gemma 3 vocabulary, and the words the OpenAI modes send."""
DRAFT_CLAIM = 100


def llama_like_server(mode: str) -> contextlib.AbstractContextManager[str]:
    """This file run as a server that says it is llama-server, in `mode` (LLAMA_MODES)."""
    return script_server(__file__, mode)


def _llama_entry(token_id: int, logprob: float) -> dict:
    """A completion_probabilities entry as llama-server sends it (n_probs 2)."""
    other = LLAMA_TOKENS[0][0] if token_id != LLAMA_TOKENS[0][0] else LLAMA_TOKENS[1][0]
    top = [
        {"id": token_id, "token": "x", "logprob": logprob},
        {"id": other, "token": "y", "logprob": logprob - 1.0},
    ]
    return {"id": token_id, "token": "x", "logprob": logprob, "top_logprobs": top}


class _LlamaLike(_QuietJson):
    mode = "llama-plain"

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path == "/props":
            self._json(200, {"build_info": "b1-fake", "total_slots": 4})
        elif self.path == "/slots":
            self._json(200, [{"id": 0, "n_ctx": 1024, "is_processing": False}])
        elif self.path == "/v1/models":
            self._json(200, {"data": [{"id": f"fake-{self.mode}"}]})
        else:
            self._json(404, {"error": {"code": 404, "message": "File Not Found"}})

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        native = self.mode in ("llama-drafts", "llama-plain")
        if self.path != ("/completion" if native else "/v1/completions"):
            self._json(404, {"error": {"code": 404, "message": "File Not Found"}})
            return
        count = int(body.get("n_predict" if native else "max_tokens", 16))
        tokens = [LLAMA_TOKENS[i % len(LLAMA_TOKENS)] for i in range(count)]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            for event in self._native(tokens) if native else self._openai(tokens):
                self.wfile.write(event)
                self.wfile.flush()

    def _native(self, tokens: list[tuple[int, str]]) -> list[bytes]:
        """llama-server's stream: each token with its probabilities, then the stop event
        with the timings (and the draft counts) of the request."""
        events: list[dict] = [
            {
                "content": "x",
                "tokens": [token_id],
                "completion_probabilities": [_llama_entry(token_id, -0.25)],
            }
            for token_id, _ in tokens
        ]
        claim = DRAFT_CLAIM if self.mode == "llama-drafts" else 0
        timings = {"draft_n": claim, "draft_n_accepted": claim, "predicted_per_second": 50.0}
        events.append(
            {"content": "", "tokens": [], "stop": True, "stop_type": "limit", "timings": timings}
        )
        return [f"data: {json.dumps(event)}\n\n".encode() for event in events]

    def _openai(self, tokens: list[tuple[int, str]]) -> list[bytes]:
        logprobs = self.mode == "llama-openai"
        events = [_event(word, logprobs=logprobs, logprob=-0.25) for _, word in tokens]
        return [*events, _event("", logprobs=False, finish="length"), b"data: [DONE]\n\n"]


if __name__ == "__main__":
    if sys.argv[1] in DEPLOYMENT_MODES:
        _Deployment.mode = sys.argv[1]
        _Deployment.hits = RESTART_HITS if sys.argv[1] == "vllm-restart" else 0.0
        ThreadingHTTPServer(("127.0.0.1", int(sys.argv[2])), _Deployment).serve_forever()
    if sys.argv[1] in LLAMA_MODES:
        _LlamaLike.mode = sys.argv[1]
        ThreadingHTTPServer(("127.0.0.1", int(sys.argv[2])), _LlamaLike).serve_forever()
    _Faulty.mode = sys.argv[1]
    if _Faulty.mode.partition(":")[0] in BUSY_MODES:
        _Faulty.protocol_version = "HTTP/1.1"  # keep-alive: every answer has its length
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[2])), _Faulty).serve_forever()
