"""Token ids for what a server streams, through the lane's own tokenizer.

A server gives a token's id (llama-server), its bytes, or only its text (OpenAI's
APIs); each is mapped to the id the tokenizer vocabulary gives it, so server steps
compare with any other lane's by id.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from specdiff.engine.llama.context import LoadedModel
from specdiff.engine.server.dialects import Token

UNKNOWN_TOKEN = (1 << 31) - 1
"""The id given to a token whose text the tokenizer vocabulary does not hold."""
MAX_CACHED_TEXTS = 1 << 16
"""Texts whose ids are remembered: a real server repeats a few thousand tokens, while one
that sends a new text each time would otherwise grow the cache without end."""


class Vocabulary:
    """Maps server tokens to the tokenizer's ids; `fail` makes the error for an id the
    vocabulary cannot hold (the server runs another model family)."""

    def __init__(self, model: LoadedModel, fail: Callable[[str], Exception]) -> None:
        self.model = model
        self.fail = fail
        self._by_text: dict[str, int] | None = None
        self._by_bytes: dict[bytes, int] | None = None
        self._text_ids: dict[str, int] = {}

    def checked(self, token_id: object) -> int:
        """A server's token id, once it is known to be one of the vocabulary's: llama.cpp
        aborts the process on an id outside it."""
        if type(token_id) is not int or not 0 <= token_id < self.model.n_vocab:
            raise self.fail(
                f"token id {token_id!r:.40} is outside the tokenizer's vocabulary of "
                f"{self.model.n_vocab}: the server runs another model family than "
                "model= names"
            )
        return token_id

    def piece(self, token_id: object) -> bytes:
        """The bytes of a token id a server reported."""
        return self.model.piece(self.checked(token_id))

    def token_id(self, token: Token) -> int:
        model = self.model
        if token.token_id is not None:
            return self.checked(token.token_id)
        if token.data is not None:
            found = self._maps()[1].get(token.data)
            if found is not None:
                return found
        # Text only (OpenAI's legacy API): the id the tokenizer gives that text when it is
        # one token, else the lowest id whose piece reads so.
        cached = self._text_ids.get(token.text)
        if cached is not None:
            return cached
        ids = model.tokenize(token.text, add_special=False) if token.text else []
        found = ids[0] if len(ids) == 1 else self._maps()[0].get(token.text, UNKNOWN_TOKEN)
        if len(self._text_ids) >= MAX_CACHED_TEXTS:
            self._text_ids.clear()
        self._text_ids[token.text] = found
        return found

    def bytes_of(self, token: Token, token_id: int) -> bytes:
        if token.data is not None:
            return token.data
        if token_id != UNKNOWN_TOKEN:
            return self.model.piece(token_id)
        return token.text.encode("utf-8")

    def detokenize(self, tokens: Sequence[int]) -> str:
        """The text of token ids, as a prompt to send (without the BOS token: the server
        adds its own)."""
        bos = self.model.bos()
        data = b"".join(self.model.piece(t) for t in tokens if t != bos)
        return data.decode("utf-8", "replace")

    def _maps(self) -> tuple[dict[str, int], dict[bytes, int]]:
        """Text -> lowest id and bytes -> lowest id, over the whole vocabulary, built on
        first need."""
        if self._by_text is None or self._by_bytes is None:
            by_text: dict[str, int] = {}
            by_bytes: dict[bytes, int] = {}
            piece = self.model.piece
            for token_id in range(self.model.n_vocab):
                data = piece(token_id)
                by_bytes.setdefault(data, token_id)
                by_text.setdefault(data.decode("utf-8", "ignore"), token_id)
            self._by_text, self._by_bytes = by_text, by_bytes
        return self._by_text, self._by_bytes
