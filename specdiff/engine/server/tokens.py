"""What a server streams, as TokenSteps: the step of a token and its candidates, and
the guard that keeps a server's echo of a secret out of the steps.

A streamed token becomes a step with the token id where the server gives it (else looked
up in the lane's tokenizer vocabulary by its exact bytes or text), its bytes, and the
top-k candidates with their log-probabilities as logits.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from specdiff.engine.server.dialects import Token
from specdiff.engine.server.vocab import Vocabulary
from specdiff.lanes import LaneId
from specdiff.steps import Candidate, TokenStep


def token_step(
    lane_id: LaneId, top_k: int, vocab: Vocabulary, index: int, token: Token, top: list[Token]
) -> TokenStep:
    """Step `index` of lane `lane_id`: the server's token with its `top` candidates, the
    chosen one always among them, at most `top_k` (at least one) kept."""
    chosen_id = vocab.token_id(token)
    candidates: dict[int, Candidate] = {}
    for entry in top:
        entry_id = vocab.token_id(entry)
        if entry_id not in candidates:
            piece = vocab.bytes_of(entry, entry_id)
            candidates[entry_id] = Candidate(entry_id, entry.logprob, piece)
    if chosen_id not in candidates:
        piece = vocab.bytes_of(token, chosen_id)
        candidates[chosen_id] = Candidate(chosen_id, token.logprob, piece)
    if token.unscored:
        candidates = {chosen_id: candidates[chosen_id]}
    ordered = sorted(candidates.values(), key=lambda c: (-c.logit, c.token_id))
    return TokenStep(
        lane=lane_id,
        index=index,
        token_id=chosen_id,
        piece=vocab.bytes_of(token, chosen_id),
        top=tuple(ordered[: max(top_k, 1)]),
        drafted=token.unscored,
        verify_width=1,
        timestamp=time.perf_counter(),
    )


class EchoGuard:
    """Keeps a server's echo of a secret out of the steps: a step whose text could begin
    a secret is held until later tokens show it does not; a whole secret in the text, or
    in a candidate's piece, fails the lane, and the held steps are dropped with it.

    Masking the text instead would leave the token ids, from which anyone with the
    tokenizer reads the secret back; so the lane ends, keeping only the steps before."""

    SHORTEST_ECHO = 6
    """Held bytes at the end of a stream that count as an echo cut short rather than a
    chance match of a secret's first characters."""

    def __init__(self, secrets: Sequence[str], fail: Callable[[str], Exception]) -> None:
        self.secrets = [secret.encode("utf-8") for secret in secrets]
        self.fail = fail
        self.held: list[TokenStep] = []

    def admit(self, step: TokenStep) -> list[TokenStep]:
        """The steps that are safe to pass on now, in order."""
        if not self.secrets:
            return [step]
        self.held.append(step)
        text = b"".join(held.piece for held in self.held)
        pieces = [text, *(candidate.piece for candidate in step.top)]
        if any(secret in piece for secret in self.secrets for piece in pieces):
            raise self.echoed()
        pending = self._pending(text)
        released = []
        while self.held and len(text) - len(self.held[0].piece) >= pending:
            first = self.held.pop(0)
            text = text[len(first.piece) :]
            released.append(first)
        return released

    def finish(self) -> list[TokenStep]:
        """At the stream's end: the held steps, unless they hold most of a secret."""
        if self._could_be_echo():
            raise self.echoed()
        released, self.held = self.held, []
        return released

    def release(self) -> list[TokenStep]:
        """At a cancel: the held steps, or none where they hold most of a secret. The
        stream was cut by the consumer, not by the server, so this fails nothing."""
        if self._could_be_echo():
            self.held = []
        released, self.held = self.held, []
        return released

    def _could_be_echo(self) -> bool:
        text = b"".join(held.piece for held in self.held)
        return self._pending(text) >= self.SHORTEST_ECHO

    def echoed(self) -> Exception:
        self.held = []
        return self.fail(
            "the server's text holds the API key or the endpoint's password; the lane "
            "stopped before it and kept nothing that holds it"
        )

    def _pending(self, text: bytes) -> int:
        """The length of the longest end of `text` that begins a secret."""
        longest = 0
        for secret in self.secrets:
            for length in range(min(len(text), len(secret) - 1), longest, -1):
                if text.endswith(secret[:length]):
                    longest = length
                    break
        return longest
