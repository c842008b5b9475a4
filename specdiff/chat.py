"""Chat conversations: a prompt given as messages, and the lane key that picks a template.

A conversation is a JSON list of ``{"role": "system"|"user"|"assistant", "content":
TEXT}`` objects (``run --messages``, a suite line's ``messages``, the TUI's prompt box,
a session header). It travels through the engine as a `Conversation`: a str whose text
is the plain rendition a raw-text lane decodes (the contents, a blank line apart) and
which carries the messages a chat lane formats with its template. Being a str, it goes
wherever a prompt goes (the lanes' worker, sessions, reports) without a second path.

The templates themselves are applied in the engine by llama.cpp's
``llama_chat_apply_template``; this module only names them, so the front end can check
a lane without loading llama.cpp.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from specdiff.errors import LaneConfigError, SpecdiffError
from specdiff.safe_text import first_surrogate

ROLES = ("system", "user", "assistant")
MODEL_TEMPLATE = ("true", "auto")
"""`chat=` words for the GGUF's own template (tokenizer.chat_template)."""
BUILTIN_TEMPLATES = (
    "bailing", "bailing-think", "bailing2", "chatglm3", "chatglm4", "chatml",
    "command-r", "deepseek", "deepseek-ocr", "deepseek2", "deepseek3", "exaone-moe",
    "exaone3", "exaone4", "falcon3", "gemma", "gigachat", "glmedge", "gpt-oss",
    "granite", "granite-4.0", "granite-4.1", "grok-2", "hunyuan-dense", "hunyuan-moe",
    "hunyuan-vl", "kimi-k2", "llama2", "llama2-sys", "llama2-sys-bos",
    "llama2-sys-strip", "llama3", "llama4", "megrez", "minicpm", "mistral-v1",
    "mistral-v3", "mistral-v3-tekken", "mistral-v7", "mistral-v7-tekken", "monarch",
    "openchat", "orion", "pangu-embedded", "phi3", "phi4", "rwkv-world", "seed_oss",
    "smolvlm", "solar-open", "vicuna", "vicuna-orca", "yandex", "zephyr",
)  # fmt: skip
"""llama_chat_builtin_templates() of llama.cpp as llama-cpp-python 0.3.36 builds it
(src/llama-chat.cpp's LLM_CHAT_TEMPLATES); a model test checks it against the build."""
FALLBACK_TEMPLATE = "chatml"
"""What llama.cpp (llama_chat_apply_template and llama-server alike) applies for a model
whose GGUF holds no template."""
MAX_MESSAGES = 1024
MAX_CONVERSATION_CHARS = 1 << 20
"""A conversation's text at most: more than any context holds, and what the largest
prompt file a command reads may be."""
EXAMPLE = '[{"role": "user", "content": "Hello"}]'
EMPTY_CONVERSATION = "the conversation holds no text; give its messages content"


class ChatError(SpecdiffError):
    """A messages list that is not a conversation specdiff can send."""


def check_chat_setting(value: str) -> None:
    """The lane key `chat`: "" (raw text), true/auto (the GGUF's own template) or a
    template llama.cpp builds in; anything else is one line with the closest name."""
    if value == "" or value in MODEL_TEMPLATE or value in BUILTIN_TEMPLATES:
        return
    close = difflib.get_close_matches(value.lower(), BUILTIN_TEMPLATES, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise LaneConfigError(
        f"lane key 'chat' cannot be {value!r:.60}; {hint}use true (the model's own "
        "template), a llama.cpp template name such as gemma, chatml or llama3, or leave "
        "it empty for raw text"
    )


@dataclass(frozen=True)
class Message:
    role: str
    content: str

    def to_json(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}


def parse_messages(value: object, where: str = "messages") -> tuple[Message, ...]:
    """A conversation from its JSON value; ValueError naming `where` and the item."""
    if not isinstance(value, list):
        raise ValueError(f"{where} must be a list of messages like {EXAMPLE}")
    if not value:
        raise ValueError(f"{where} is empty; give at least one user message")
    if len(value) > MAX_MESSAGES:
        raise ValueError(f"{where} holds more than {MAX_MESSAGES} messages")
    messages = tuple(_message(item, f"{where}[{n}]") for n, item in enumerate(value))
    if not any(m.role == "user" for m in messages):
        raise ValueError(f"{where} holds no user message; add one to answer")
    if sum(len(m.content) for m in messages) > MAX_CONVERSATION_CHARS:
        raise ValueError(f"{where} is longer than {MAX_CONVERSATION_CHARS} characters")
    return messages


def _message(item: object, where: str) -> Message:
    if not isinstance(item, dict):
        raise ValueError(f'{where} must be an object {{"role": ..., "content": ...}}')
    extra = sorted(set(item) - {"role", "content"})
    if extra:
        raise ValueError(f"{where} has unknown key {extra[0]!r:.40}; give role and content")
    role, content = item.get("role"), item.get("content")
    if role not in ROLES:
        raise ValueError(f"{where}.role must be one of {', '.join(ROLES)}, got {role!r:.40}")
    if "content" not in item:
        raise ValueError(f'{where} has no "content"; give the message\'s text')
    if not isinstance(content, str):
        raise ValueError(f"{where}.content must be text, got {content!r:.40}")
    if "\x00" in content:
        # a template takes C strings: the content would end at the NUL, unsaid
        raise ValueError(f"{where}.content holds a NUL character, which no template can pass")
    if first_surrogate(content) is not None:
        raise ValueError(f"{where}.content holds a lone surrogate (a \\udXXX escape)")
    return Message(role, content)


class Conversation(str):
    """A prompt given as messages: the str is the plain text a raw-text lane decodes,
    `messages` what a chat lane formats."""

    messages: tuple[Message, ...]

    def __new__(cls, messages: Sequence[Message]) -> Conversation:
        text = super().__new__(cls, "\n\n".join(m.content for m in messages))
        text.messages = tuple(messages)
        return text

    def __reduce__(self) -> tuple[Any, ...]:
        # pickled to the lanes' worker and back: the messages travel, not just the text
        return (Conversation, (self.messages,))

    def to_json(self) -> list[dict[str, str]]:
        return [m.to_json() for m in self.messages]


def messages_of(prompt: str) -> tuple[Message, ...]:
    """What a chat lane formats: the conversation's messages, or a plain prompt as the
    one user message."""
    if isinstance(prompt, Conversation):
        return prompt.messages
    return (_checked(Message("user", prompt), "the prompt"),)


def conversation(prompt: str, system: str | None) -> str:
    """The prompt a run sends: `prompt` as it is, or with --system a conversation that
    opens with that system message."""
    if system is None:
        return prompt
    if not system.strip():
        raise ChatError("--system is empty; give the system message's text, or drop --system")
    messages = messages_of(prompt)
    if messages[0].role == "system":
        raise ChatError(
            "--system and a system message in --messages both give the system prompt; keep one"
        )
    return Conversation((_checked(Message("system", system), "--system"), *messages))


def _checked(message: Message, where: str) -> Message:
    try:
        return _message(message.to_json(), where)
    except ValueError as error:
        raise ChatError(str(error)) from None


class _RepeatedKey(ValueError):
    """A JSON object with a key twice: json.loads would keep the last, unsaid."""


def _once_each(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    value = dict(pairs)
    if len(value) < len(pairs):
        keys = [key for key, _ in pairs]
        raise _RepeatedKey(next(key for i, key in enumerate(keys) if key in keys[:i]))
    return value


def read_messages(text: str, where: str) -> Conversation:
    """A conversation from JSON text (a --messages value or file); ChatError naming
    `where`."""
    try:
        # editors on Windows save UTF-8 with a byte-order mark, which JSON itself refuses
        value = json.loads(text.removeprefix("\ufeff"), object_pairs_hook=_once_each)
    except _RepeatedKey as repeated:
        raise ChatError(
            f"{where} gives {str(repeated)!r:.40} twice in one message; give each key once"
        ) from None
    except ValueError as error:
        raise ChatError(
            f"{where} is not valid JSON ({str(error).split(':')[0]}); give a list like {EXAMPLE}"
        ) from None
    except RecursionError:
        raise ChatError(f"{where} is nested too deep; give a list like {EXAMPLE}") from None
    try:
        read = Conversation(parse_messages(value, where))
    except ValueError as error:
        raise ChatError(str(error)) from None
    if not read.strip():
        raise ChatError(f"{EMPTY_CONVERSATION} ({where})")
    return read


def looks_like_messages(text: str) -> bool:
    """Whether text is a JSON list of objects: a conversation someone typed into the
    TUI's prompt box, which switching it to messages mode keeps as typed."""
    stripped = text.strip()
    if not stripped.startswith("[") or not stripped.endswith("]"):
        return False
    try:
        value = json.loads(stripped)
    except (ValueError, RecursionError):
        return False
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def typed_messages(text: str) -> Conversation:
    """The TUI's prompt box read as a messages list: the conversation, or ChatError
    naming what is wrong with it."""
    return read_messages(text.strip(), "the prompt box")


def box_json(prompt: Conversation) -> str:
    """A conversation as the TUI's prompt box holds it: JSON on one line whose every
    character is printable (the others as \\u escapes, which JSON reads back as the same
    characters), so the box shows exactly the conversation and reads it back unchanged."""
    text = json.dumps(prompt.to_json(), ensure_ascii=False)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _json_escape(c) for c in text)


def _json_escape(character: str) -> str:
    code = ord(character)
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000  # beyond the BMP: JSON writes a surrogate pair
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def one_message(text: str) -> Conversation:
    """A plain prompt as a conversation of one user message."""
    return Conversation((_checked(Message("user", text), "the prompt"),))


def shown_prompt(prompt: str) -> str:
    """What the TUI's prompt box shows for a prompt: a conversation as its JSON messages
    list (`box_json`), plain text as it is."""
    if isinstance(prompt, Conversation):
        return box_json(prompt)
    return prompt


def chat_lane(lane: Any) -> bool:
    """Whether a lane formats the conversation with a chat template: an in-process lane
    with `chat` set, or a server lane on the chat API (whose server applies its own)."""
    if lane.backend == "server":
        return bool(lane.api == "chat")
    return bool(lane.chat)


def unformatted_note(prompt: str, lane_a: Any, lane_b: Any) -> str | None:
    """A note when a conversation meets a pair with no chat lane: both lanes decode its
    contents as raw text, which is rarely what messages were given for."""
    if not isinstance(prompt, Conversation) or chat_lane(lane_a) or chat_lane(lane_b):
        return None
    served = lane_a.backend == "server" and lane_b.backend == "server"
    fix = (
        "set api=chat (--both api=chat), and each server applies its template"
        if served
        else "set chat=true or a template name on in-process lanes (e.g. --both chat=gemma), "
        "api=chat on server lanes"
    )
    return (
        "neither lane formats the conversation with a chat template, so both decode its "
        f"contents as raw text; {fix}"
    )


def mixed_note(lane_a: Any, lane_b: Any) -> str | None:
    """A note when one lane formats the prompt with a chat template and the other sends
    it as raw text: the pair then compares two different prompts. (Two templates may
    format a conversation alike, chatml and a GGUF's missing one: run's summary says
    whether the lanes' prompts differed.)"""
    chat_a, chat_b = chat_lane(lane_a), chat_lane(lane_b)
    if chat_a == chat_b:
        return None
    chat_id = "a" if chat_a else "b"
    raw_id = "b" if chat_a else "a"
    return (
        f"lane {chat_id} formats the prompt with a chat template and lane {raw_id} sends "
        "it as raw text: the lanes compare different prompts"
    )
