"""Real files for the bad-input tests, made from the bundled model."""

from __future__ import annotations

import shutil
from pathlib import Path

from specdiff.engine.gguf import read_gguf


def model_with_changed_token(source: Path, target: Path) -> Path:
    """A valid GGUF that loads like the original but whose vocabulary differs in one
    token's text (same length, so every offset stays put)."""
    info = read_gguf(source)
    tokens = info.tokens
    token_id = next(
        i
        for i, text in enumerate(tokens)
        if i > 1000 and len(text) >= 6 and text.isascii() and text.isalpha() and text.islower()
    )
    old = tokens[token_id].encode()
    new = old[::-1] if old[::-1] != old else old.upper()
    shutil.copyfile(source, target)
    needle = len(old).to_bytes(8, "little") + old
    with target.open("r+b") as handle:
        header = handle.read(info.data_offset)
        # the token list is the only place the length-prefixed text appears in order;
        # find the occurrence that belongs to the tokens array
        start = header.find(b"tokenizer.ggml.tokens")
        position = header.find(needle, start)
        assert position > 0, "token text not found in the header"
        handle.seek(position + 8)
        handle.write(new)
    return target
