"""A chat lane's template, applied by llama.cpp's own ``llama_chat_apply_template``.

That is the formatter llama-server uses without ``--jinja``, and for the templates it
recognises its ``--jinja`` rendering gives the same text: so an in-process chat lane and
a llama-server lane on ``/v1/chat/completions`` with the same GGUF and template decode
the same prompt tokens (a server test checks it).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

from specdiff.chat import FALLBACK_TEMPLATE, MODEL_TEMPLATE, Message
from specdiff.engine.runtime import llama
from specdiff.errors import LaneConfigError
from specdiff.lanes import LaneId


class ChatTemplate:
    """One lane's template: the GGUF's own (`chat=true`) or one llama.cpp builds in."""

    def __init__(self, model_pointer: Any, setting: str, lane_id: LaneId) -> None:
        asked = f"the template chat={setting} names"
        if setting in MODEL_TEMPLATE:
            own = llama().llama_model_chat_template(model_pointer, None)
            self.template: bytes | None = own or None
            # llama.cpp formats a model without a template as chatml, llama-server too
            self.name = (
                "the model's own" if own else f"{FALLBACK_TEMPLATE} (no template in the model)"
            )
            asked = (
                f"the model's own template (chat={setting})"
                if own
                else f"{FALLBACK_TEMPLATE}, which it applies to a model without a template"
            )
        else:
            self.template = setting.encode()
            self.name = setting
        try:
            self.render((Message("user", "hello"),))
        except ValueError:
            raise LaneConfigError(
                f"lane {lane_id}: llama.cpp's chat formatter does not recognise {asked}; "
                "name a built-in one instead, e.g. chat=chatml"
            ) from None

    def render(self, messages: Sequence[Message]) -> str:
        """The conversation as the model reads it, ending where the assistant answers;
        ValueError when llama.cpp cannot apply the template."""
        lib = llama()
        encoded = [(m.role.encode(), m.content.encode()) for m in messages]
        chat = (lib.llama_chat_message * len(encoded))()
        for slot, (role, content) in zip(chat, encoded):  # `encoded` keeps the bytes alive
            slot.role, slot.content = role, content
        size = 2 * sum(len(content) for _, content in encoded) + 1024
        for _ in range(2):  # the second pass has the room the first one asked for
            buffer = ctypes.create_string_buffer(size)
            written = lib.llama_chat_apply_template(
                self.template, chat, len(encoded), True, buffer, size
            )
            if written < 0:
                raise ValueError("template not supported")
            if written <= size:
                return buffer.raw[:written].decode("utf-8", "replace")
            size = written
        raise ValueError("the formatted conversation kept growing")
