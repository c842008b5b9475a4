"""A small HTTP server that answers as llama-server does where a server lane relies on it
beyond the stream (/props, /apply-template, /tokenize, and the non-streamed /completion a
rescoring request sends), then breaks the answer the way its mode says.

Its stream is a real llama-server's shape: one token with probabilities, then two
accepted drafts without them, then the stop event with draft counts, so that a lane with
rescore=auto sends a rescoring request per draft. Token ids are the bundled model's.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

FIRST, DRAFTED, OTHER = 9259, (236764, 1902), 506
"""The streamed token, the two accepted drafts after it, and the runner-up a rescoring
answer names (ids of the bundled Gemma 3 vocabulary)."""
PROMPT_IDS = [2, 9259, 1902]
FORMATTED = "<start_of_turn>user\nName a colour.<end_of_turn>\n<start_of_turn>model\n"
OUT_OF_VOCAB = 1 << 30

RESCORING_FAULTS = (
    "rescore-nan",
    "rescore-wrong-types",
    "rescore-list",
    "rescore-out-of-vocab",
    "rescore-other-pick",
    "rescore-giant",
    "rescore-slow",
    "rescore-trickle",
    "tokenize-out-of-vocab",
)
"""Modes whose stream is good and whose rescoring answers are not."""
TEMPLATE_FAULTS = (
    "template-missing",
    "template-wrong-type",
    "template-padded",
    "template-surrogate",
    "template-giant",
    "tokenize-wrong-type",
    "tokenize-out-of-vocab",
    "tokenize-too-many",
)
"""Modes whose /apply-template or /tokenize answer is one no session may keep."""


def _entry(token_id: int, logprob: float | str, runner_up: int = OTHER) -> dict:
    """A completion_probabilities entry as llama-server sends it (n_probs 2)."""
    top = [
        {"id": token_id, "token": "x", "bytes": [120], "logprob": logprob},
        {"id": runner_up, "token": "y", "bytes": [121], "logprob": -3.0},
    ]
    return {"id": token_id, "token": "x", "bytes": [120], "logprob": logprob, "top_logprobs": top}


class _LlamaServerFaults(BaseHTTPRequestHandler):
    mode = "ok"

    def log_message(self, *_: object) -> None:
        return None

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.wfile.write(body)

    def _json(self, data: object, status: int = 200) -> None:
        self._send(status, json.dumps(data).encode())

    def _slowly(self, start: bytes, pause: float, times: int) -> None:
        """A body that opens and then arrives a byte per `pause` seconds, `times` times."""
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.wfile.write(start)
            for _ in range(times):
                self.wfile.flush()
                time.sleep(pause)
                self.wfile.write(b" ")
        self.close_connection = True

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path == "/props":
            self._json({"build_info": "b1-faults", "total_slots": 1})
        elif self.path == "/slots":
            self._json([])
        else:
            self._json({"data": [{"id": f"faults-{self.mode}"}]})

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if self.path == "/apply-template":
            self._template()
        elif self.path == "/tokenize":
            self._tokenize()
        elif self.path == "/completion" and body.get("stream"):
            self._stream()
        elif self.path == "/completion":
            self._rescoring(body.get("prompt") or [0])
        else:
            self._json({"error": {"code": 404, "message": "File Not Found"}}, 404)

    def _template(self) -> None:
        answers: dict[str, object] = {
            "template-wrong-type": {"prompt": ["not", "text"]},
            "template-padded": {"prompt": FORMATTED + "x" * 200_000},
            "template-surrogate": {"prompt": "\udc80"},
        }
        if self.mode == "template-missing":
            self._json({"error": {"code": 404, "message": "File Not Found"}}, 404)
        elif self.mode == "template-giant":
            self._send(200, b'{"prompt": "' + b"x" * (50 << 20) + b'"}')
        else:
            self._json(answers.get(self.mode, {"prompt": FORMATTED}))

    def _tokenize(self) -> None:
        answers: dict[str, object] = {
            "tokenize-wrong-type": {"tokens": ["2", 9259]},
            "tokenize-out-of-vocab": {"tokens": [2, OUT_OF_VOCAB]},
            "tokenize-too-many": {"tokens": [2] * 100_000},
        }
        self._json(answers.get(self.mode, {"tokens": PROMPT_IDS}))

    def _stream(self) -> None:
        events = [
            {"content": "x", "tokens": [FIRST], "completion_probabilities": [_entry(FIRST, -0.1)]},
            {"content": "ab", "tokens": list(DRAFTED), "completion_probabilities": []},
            {
                "content": "",
                "tokens": [],
                "stop": True,
                "stop_type": "limit",
                "timings": {"draft_n": 2, "draft_n_accepted": 2, "predicted_per_second": 50.0},
            },
        ]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            for event in events:
                self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())

    def _rescoring(self, prompt: list[int]) -> None:
        """A rescoring request's answer: the draft that follows the prompt, scored."""
        if self.mode == "rescore-giant":
            self._send(200, b'{"content": "' + b"x" * (50 << 20) + b'"}')
            return
        if self.mode in ("rescore-slow", "rescore-trickle"):
            pause, times = (60.0, 1) if self.mode == "rescore-slow" else (0.5, 240)
            self._slowly(b'{"content": "x", ', pause, times)
            return
        picked = DRAFTED[1] if prompt[-1] == DRAFTED[0] else DRAFTED[0]
        answers: dict[str, object] = {
            "rescore-nan": {
                "tokens": [picked],
                "completion_probabilities": [_entry(picked, "NaN")],
            },
            "rescore-wrong-types": {"tokens": [picked], "completion_probabilities": {"id": 5}},
            "rescore-list": [{"tokens": [picked]}],
            "rescore-out-of-vocab": {
                "tokens": [picked],
                "completion_probabilities": [_entry(picked, -0.2, OUT_OF_VOCAB)],
            },
            "rescore-other-pick": {
                "tokens": [OTHER],
                "completion_probabilities": [_entry(OTHER, -0.2, OTHER + 1)],
            },
        }
        good = {"tokens": [picked], "completion_probabilities": [_entry(picked, -0.2)]}
        data = answers.get(self.mode, good)
        # Python's json writes NaN as the bare word, as a careless server would
        self._send(200, json.dumps(data).replace('"NaN"', "NaN").encode())


def llama_server_faults(mode: str) -> contextlib.AbstractContextManager[str]:
    """This file run as a server in `mode`; yields its base URL."""
    from tests.servers import script_server

    return script_server(__file__, mode)


if __name__ == "__main__":
    _LlamaServerFaults.mode = sys.argv[1]
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[2])), _LlamaServerFaults).serve_forever()
