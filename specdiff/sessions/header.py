"""The session file's first line: SessionHeader, everything needed to re-run a session
(prompt, limits, both lanes in full, what executed them), with the `to_json` that
writes it and the `from_json` that reads it back through the field checks, the tables
of what a lane's executed record may hold among them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from specdiff import __version__
from specdiff.chat import Conversation, parse_messages
from specdiff.lanes import Pair, lane_from_dict
from specdiff.sessions.checks import (
    MAX_INDEX,
    MAX_ITEMS,
    MAX_PROMPT_TOKENS,
    MAX_TOKEN_ID,
    check_bool,
    check_float,
    check_int,
    check_list,
    check_object,
    check_plain,
    check_text,
    lanes_of,
)
from specdiff.sessions.format import LANE_IDS, SCHEMA_VERSION


def _text_or_none(value: object, what: str) -> str | None:
    return None if value is None else check_text(value, what)


def _size_or_none(value: object, what: str) -> int | None:
    return None if value is None else check_int(value, what, 0, 1 << 62)


def _repack_or_none(value: object, what: str) -> bool | str | None:
    # a bool from the lanes' own record; "on"/"off"/"auto" where a lane's setting is copied
    if value is None or isinstance(value, (bool, str)):
        return value
    raise ValueError(f"{what} must be true, false or text, got {value!r:.60}")


def _object_or_none(value: object, what: str) -> dict[str, Any] | None:
    return None if value is None else check_plain(check_object(value, what), what)


def _bool_or_none(value: object, what: str) -> bool | None:
    return None if value is None else check_bool(value, what)


def _gpu_layers_or_none(value: object, what: str) -> int | None:
    return None if value is None else check_int(value, what, -1, 1 << 20)


DEVICE_FIELDS: dict[str, Any] = {
    **dict.fromkeys(("name", "description", "type"), _text_or_none),
    **dict.fromkeys(("memory_free", "memory_total"), _size_or_none),
}
"""One device llama.cpp registered, as a lane's executed table lists it."""


def _devices_or_none(value: object, what: str) -> list[dict[str, Any]] | None:
    if value is None:
        return None
    items = check_plain(check_list(value, what), what)
    return [_checked_table(item, f"{what}[{i}]", DEVICE_FIELDS) for i, item in enumerate(items)]


def _reasons(value: object, what: str) -> list[str]:
    items = check_list(value, what)
    return [check_text(item, f"{what}[{i}]") for i, item in enumerate(items[:MAX_ITEMS])]


RESCORING_FIELDS: dict[str, Any] = {
    **dict.fromkeys(("rescored", "skipped"), _size_or_none),
    "seconds": lambda value, what: None if value is None else check_float(value, what),
    "reasons": lambda value, what: None if value is None else _reasons(value, what),
}
"""A server lane's rescoring of its accepted drafts: how many were rescored, how many
left without margins, what it took, and why any were left."""


def _rescoring_or_none(value: object, what: str) -> dict[str, Any] | None:
    return None if value is None else _checked_table(value, what, RESCORING_FIELDS)


EXECUTED_FIELDS: dict[str, Any] = {
    **dict.fromkeys(
        (
            "model_path",
            "model_sha256",
            "quantization",
            "architecture",
            "flash_attn",
            "type_k",
            "type_v",
            "repack_choice",
            "draft_model_path",
            "draft_model_sha256",
            "spec_accept",
            "backend",
            "endpoint",
            "api",
            "tokenizer_path",
            "tokenizer_sha256",
            "chat_template",
            "split_mode",
            "served_by",
        ),
        _text_or_none,
    ),
    **dict.fromkeys(
        (
            "model_size",
            "n_ctx",
            "n_batch",
            "n_ubatch",
            "threads",
            "threads_batch",
            "main_gpu",
            "layers_offloaded",
            "layers_total",
            "retries",
        ),
        _size_or_none,
    ),
    "waited_seconds": RESCORING_FIELDS["seconds"],
    "gpu_layers": _gpu_layers_or_none,
    "gpu_offload": _bool_or_none,
    "restartable": _bool_or_none,
    "devices": _devices_or_none,
    "repack": _repack_or_none,
    "server": _object_or_none,
    "request": _object_or_none,
    "rescoring": _rescoring_or_none,
}
"""What a lane's executed table may hold, as the readers use it (verify's environment
diff, the reports' tables); other keys are kept as plain values."""
BUILD_FIELDS = (
    "llama_cpp_python",
    "llama_cpp_build",
    "system_info",
    "cpu",
    "platform",
    "python",
    "specdiff",
)
"""Every known build field is text (verify reads the CPU's features from system_info)."""


def _checked_table(value: object, what: str, fields: Mapping[str, Any]) -> dict[str, Any]:
    table: dict[str, Any] = check_plain(check_object(value, what), what)
    for key, check in fields.items():
        if key in table:
            table[key] = check(table[key], f"{what}.{key}")
    return table


def _executed(value: object) -> dict[str, dict[str, Any]]:
    lanes = lanes_of(value, "executed")
    return {
        lane_id: _checked_table(table, f"executed.{lane_id}", EXECUTED_FIELDS)
        for lane_id, table in lanes.items()
    }


def _build(value: object) -> dict[str, Any]:
    return _checked_table(value, "build", dict.fromkeys(BUILD_FIELDS, _text_or_none))


def _repack_as_meant(lane: Mapping[str, Any]) -> Mapping[str, Any]:
    """A lane recorded when repack was a bool: true was llama.cpp's default, which
    repack=auto now names (on, unless a probe finds the repacked kernels crash on this
    CPU), so it reads as auto; false was a choice, and stays off. Read as "on", such a
    session (the bundled ones among them) could not be verified or re-run on a CPU
    whose repacked kernels crash. What ran stays in the executed record."""
    repack = lane.get("repack")
    if not isinstance(repack, bool):
        return lane
    return {**lane, "repack": "auto" if repack else "off"}


@dataclass(frozen=True)
class SessionHeader:
    """Everything needed to re-run a session: prompt, limits, both lanes in full, and
    what executed them."""

    pair: Pair
    prompt: str
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    stop: tuple[str, ...]
    executed: dict[str, dict[str, Any]]
    """Per lane: model path and sha256, settings as llama.cpp applied them, server identity."""
    build: dict[str, Any]
    created: str
    teacher_forced: bool = False
    specdiff: str = __version__
    """The version that wrote the file."""
    schema: int = SCHEMA_VERSION
    lane_prompts: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per chat lane: the prompt as its template formatted it ("text") and its
    "token_ids"; a lane's executed table hands them over as "chat_prompt"."""

    def __post_init__(self) -> None:
        # kept apart from `executed`, whose every key the configuration tables list
        prompts = dict(self.lane_prompts)
        executed = {}
        for lane_id, table in self.executed.items():
            executed[lane_id] = {k: v for k, v in table.items() if k != "chat_prompt"}
            if "chat_prompt" in table:
                prompts[lane_id] = table["chat_prompt"]
        object.__setattr__(self, "executed", executed)
        object.__setattr__(self, "lane_prompts", prompts)

    def to_json(self) -> dict[str, Any]:
        record: dict[str, Any] = {
            "type": "header",
            "schema": self.schema,
            "specdiff": self.specdiff,
            "created": self.created,
            "pair": self.pair.name,
            "description": self.pair.description,
            "prompt": self.prompt,
            "prompt_token_ids": list(self.prompt_token_ids),
            "max_tokens": self.max_tokens,
            "stop": list(self.stop),
            "lanes": {"a": self.pair.a.as_dict(), "b": self.pair.b.as_dict()},
            "executed": self.executed,
            "build": self.build,
        }
        if self.teacher_forced:
            record["teacher_forced"] = True
        if isinstance(self.prompt, Conversation):
            record["messages"] = self.prompt.to_json()
        if self.lane_prompts:
            record["lane_prompts"] = self.lane_prompts
        return record

    @classmethod
    def from_json(cls, record: Mapping[str, Any]) -> SessionHeader:
        """Raises ValueError (or LaneConfigError for a bad lane) naming the bad field, or
        KeyError naming a missing one."""
        if record.get("type") != "header":
            raise ValueError("the first line must be the header")
        schema = record.get("schema")
        if type(schema) is not int or schema != SCHEMA_VERSION:  # true == 1 in Python
            raise ValueError(f"schema version {schema!r:.20} is unknown")
        lanes = lanes_of(record["lanes"], "lanes")
        pair = Pair(
            check_text(record["pair"], "the pair"),
            lane_from_dict(_repack_as_meant(lanes["a"])),
            lane_from_dict(_repack_as_meant(lanes["b"])),
            check_text(record.get("description", ""), "the description"),
        )
        tokens = check_list(record.get("prompt_token_ids", []), "prompt_token_ids")
        if len(tokens) > MAX_PROMPT_TOKENS:
            raise ValueError(f"prompt_token_ids holds more than {MAX_PROMPT_TOKENS} tokens")
        prompt = check_text(record["prompt"], "the prompt")
        if record.get("messages") is not None:
            prompt = Conversation(parse_messages(record["messages"], "messages"))
        return cls(
            pair=pair,
            prompt=prompt,
            prompt_token_ids=tuple(check_int(t, "a prompt id", 0, MAX_TOKEN_ID) for t in tokens),
            max_tokens=check_int(record["max_tokens"], "max_tokens", 1, MAX_INDEX),
            stop=tuple(
                check_text(s, "a stop string") for s in check_list(record.get("stop", []), "stop")
            ),
            executed=_executed(record.get("executed", {"a": {}, "b": {}})),
            build=_build(record.get("build", {})),
            created=check_text(record.get("created", ""), "created"),
            teacher_forced=check_bool(record.get("teacher_forced", False), "teacher_forced"),
            specdiff=check_text(record.get("specdiff", ""), "specdiff"),
            lane_prompts=_lane_prompts(record.get("lane_prompts", {})),
        )


def _lane_prompts(value: object) -> dict[str, dict[str, Any]]:
    """{"a": {"text": ..., "token_ids": [...]}} for the lanes that formatted a chat."""
    table = check_object(value, "lane_prompts")
    prompts: dict[str, dict[str, Any]] = {}
    for lane_id, entry in table.items():
        what = f"lane_prompts.{lane_id:.10}"
        if lane_id not in LANE_IDS:
            raise ValueError(f"{what}: lane_prompts holds lanes a and b only")
        entry = check_object(entry, what)
        ids = check_list(entry.get("token_ids"), f"{what}.token_ids")
        if len(ids) > MAX_PROMPT_TOKENS:
            raise ValueError(f"{what}.token_ids holds more than {MAX_PROMPT_TOKENS} tokens")
        prompts[lane_id] = {
            "text": check_text(entry.get("text"), f"{what}.text"),
            "token_ids": [check_int(t, f"{what}.token_ids", 0, MAX_TOKEN_ID) for t in ids],
        }
    return prompts
