"""What an OpenAI client asked for: one typed record per request, read from its JSON body,
and the OpenAI-shaped error a request that cannot run gets instead.

Only the fields specdiff acts on are checked; the others an OpenAI client sends
(`top_p`, `presence_penalty`, `user`, ...) are let through unread, as a server that
ignores them would, so a harness runs unchanged. A field that asks for what one pair of
lanes cannot give (several choices, the prompt echoed back, token ids as the prompt)
is refused with a message that names it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Literal

from specdiff.chat import Conversation, parse_messages
from specdiff.safe_text import first_surrogate

Endpoint = Literal["completions", "chat"]
MAX_LOGPROBS = {"completions": 5, "chat": 20}
"""The most alternatives per token OpenAI's API lets each endpoint ask for."""
ROLE_ALIASES = {"developer": "system"}
"""Roles newer OpenAI clients send, as the chat templates know them."""


@dataclass(frozen=True)
class ApiError(Exception):
    """A request answered with an OpenAI-style error instead of a completion."""

    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class ProxyRequest:
    """One completion a client asked for, as the lanes run it."""

    endpoint: Endpoint
    model: str
    prompt: str
    """The text; a `Conversation` for the chat endpoint."""
    max_tokens: int | None
    """None: the proxy's --max-tokens."""
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    """stream_options.include_usage: a last chunk with the token counts."""
    logprobs: int | None = None
    """Alternatives per token the answer carries; None: no logprobs were asked for."""
    temperature: float = 0.0
    """0 (or none given): greedy, what specdiff compares; above it, sampling."""

    @property
    def sampled(self) -> bool:
        return self.temperature > 0


def bad(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def read_body(raw: bytes, endpoint: Endpoint) -> ProxyRequest:
    """The request a body holds; ApiError (400) naming the first field that is wrong."""
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise bad("the request body is not JSON; send a JSON object", code="invalid_json") from None
    if not isinstance(data, dict):
        raise bad("the request body must be a JSON object", code="invalid_json")
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise bad("'model' must be a non-empty string: the name /v1/models lists", "model")
    refuse_unsupported(data)
    prompt = chat_prompt(data) if endpoint == "chat" else completion_prompt(data)
    stream = typed(data, "stream", bool, False)
    options = typed(data, "stream_options", dict, None) or {}
    return ProxyRequest(
        endpoint=endpoint,
        model=model,
        prompt=prompt,
        max_tokens=token_budget(data),
        stop=stop_strings(data.get("stop")),
        stream=stream,
        include_usage=stream and options.get("include_usage") is True,
        logprobs=asked_logprobs(data, endpoint),
        temperature=temperature(data),
    )


def typed(data: dict[str, Any], key: str, kind: type, default: Any) -> Any:
    """`data[key]` when it has the type `kind` (null reads as absent); else ApiError."""
    value = data.get(key)
    if value is None:
        return default
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        names = {bool: "true or false", int: "a whole number", dict: "an object", str: "text"}
        raise bad(f"'{key}' must be {names.get(kind, kind.__name__)}, not {value!r:.40}", key)
    return value


def refuse_unsupported(data: dict[str, Any]) -> None:
    """Fields asking for what one pair's answer cannot be."""
    n = typed(data, "n", int, 1)
    if n != 1:
        raise bad(f"'n' must be 1: the proxy answers with one choice, not {n}", "n")
    if typed(data, "best_of", int, 1) != 1:
        raise bad("'best_of' must be 1: the proxy answers with one choice", "best_of")
    if typed(data, "echo", bool, False):
        raise bad("'echo' is not supported: the answer holds the completion only", "echo")
    if data.get("tools") or data.get("functions"):
        raise bad("tools and functions are not supported; send plain messages", "tools")


def completion_prompt(data: dict[str, Any]) -> str:
    """/v1/completions' prompt: a string, or a list of one string."""
    prompt = data.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, list):
        raise bad(
            "'prompt' must be one string (or a list of one): send one prompt a request, "
            "as text, not token ids",
            "prompt",
        )
    if not isinstance(prompt, str) or not prompt.strip():
        raise bad("'prompt' must be a non-empty string", "prompt")
    if first_surrogate(prompt) is not None or "\x00" in prompt:
        raise bad("'prompt' holds a lone surrogate or a NUL character", "prompt")
    return prompt


def chat_prompt(data: dict[str, Any]) -> Conversation:
    """/v1/chat/completions' messages as a conversation the chat lanes format."""
    messages = data.get("messages")
    if not isinstance(messages, list):
        raise bad("'messages' must be a list of {role, content} objects", "messages")
    plain = [plain_message(item, n) for n, item in enumerate(messages)]
    try:
        conversation = Conversation(parse_messages(plain, "'messages'"))
    except ValueError as error:
        raise bad(str(error), "messages") from None
    if not conversation.strip():
        raise bad("'messages' holds no text; give the messages some content", "messages")
    return conversation


def plain_message(item: object, number: int) -> object:
    """A message with its content as one text: a list of text parts joined, a name
    dropped, and a developer message read as a system one."""
    if not isinstance(item, dict):
        return item
    content = item.get("content")
    if isinstance(content, list):
        texts = [part.get("text") for part in content if isinstance(part, dict)]
        if len(texts) != len(content) or not all(isinstance(t, str) for t in texts):
            raise bad(f"'messages'[{number}].content: only text parts are supported", "messages")
        content = "".join(str(text) for text in texts)
    role = item.get("role")
    return {"role": ROLE_ALIASES.get(str(role), role), "content": content}


def token_budget(data: dict[str, Any]) -> int | None:
    """max_tokens (or the newer max_completion_tokens): at least 1."""
    key = "max_completion_tokens" if data.get("max_completion_tokens") is not None else "max_tokens"
    value = typed(data, key, int, None)
    if value is not None and value < 1:
        raise bad(f"'{key}' must be at least 1, not {value}", key)
    return value  # type: ignore[no-any-return]


def stop_strings(value: object) -> tuple[str, ...]:
    """'stop': a string or a list of up to 4 of them (empty ones dropped)."""
    if value is None:
        return ()
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise bad("'stop' must be a string or a list of strings", "stop")
    if len(values) > 4:
        raise bad("'stop' holds at most 4 strings", "stop")
    return tuple(dict.fromkeys(v for v in values if v))


def asked_logprobs(data: dict[str, Any], endpoint: Endpoint) -> int | None:
    """How many alternatives per token the client asked for; None when it asked for
    no logprobs at all."""
    most = MAX_LOGPROBS[endpoint]
    if endpoint == "chat":
        if not typed(data, "logprobs", bool, False):
            return None
        count = typed(data, "top_logprobs", int, 0)
        key = "top_logprobs"
    else:
        count = typed(data, "logprobs", int, None)
        key = "logprobs"
        if count is None:
            return None
    if not 0 <= count <= most:
        raise bad(f"'{key}' must be from 0 to {most}, not {count}", key)
    return count  # type: ignore[no-any-return]


def temperature(data: dict[str, Any]) -> float:
    value = data.get("temperature")
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise bad(f"'temperature' must be a number, not {value!r:.40}", "temperature")
    if not 0 <= value <= 2:
        raise bad(f"'temperature' must be from 0 to 2, not {value}", "temperature")
    return float(value)
