"""What every lane backend shares: the interface PairRun drives, the prompt it hands
each lane, and the records a generate() call leaves besides its steps.

A backend is the in-process llama.cpp lane (``engine.llama``) or a server lane
(``engine.server``); PairRun, the suite and the TUI see only this Protocol, so a new
backend is one new package that satisfies it (and one entry in ``engine.backends``).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Protocol, TypedDict

from specdiff.compare import DEFAULT_NEAR_TIE
from specdiff.errors import SpecdiffError
from specdiff.lanes import Lane, LaneId
from specdiff.results import PairResult
from specdiff.steps import Probe, TokenStep

Steps = Generator[TokenStep, None, None]
"""A lane's steps as it decodes them: a generator, which its caller closes to stop the
lane early (a server lane's reader thread ends with it)."""


@dataclass(frozen=True)
class LiveStats:
    """One lane's numbers while a run streams, as a front end shows them live."""

    tokens_per_second: float
    """Over the lane's own decode time so far (the runner's clock, not the wall's)."""
    drafted: int = 0
    accepted: int = 0


Live = dict[LaneId, LiveStats]
"""Lane id -> its live numbers."""


class ChatPrompt(TypedDict):
    """A chat lane's prompt as it was formatted: the text and its token ids (a session
    keeps them in `lane_prompts`)."""

    text: str
    token_ids: list[int]


class EngineError(SpecdiffError):
    """llama.cpp or a server refused a call that should have worked."""


class Cancelled(Exception):
    """Generation was stopped on request.

    Not a SpecdiffError: it is a control signal, and every ``except SpecdiffError``
    that reports bad input must let it through."""


@dataclass
class Generation:
    """What one generate() call did besides yielding steps."""

    prompt_tokens: int = 0
    prefix_tokens: int = 0
    verify_calls: int = 0
    drafted: int = 0
    accepted: int = 0
    stop_reason: str = ""


class Prompt(tuple[int, ...]):
    """A prompt's token ids that keep the text they were tokenized from.

    A backend that decodes takes the ids; one that is sent text (a server) takes
    `text`, as any client would send it. Being the ids themselves, a Prompt goes
    wherever a list of token ids does."""

    text: str

    def __new__(cls, text: str, tokens: Iterable[int]) -> Prompt:
        prompt = super().__new__(cls, tokens)
        prompt.text = text
        return prompt


class StreamGate:
    """The server streams of one run, and the rescoring that must not run beside them:
    a lane's rescoring starts only while no stream runs, and no stream begins while a
    lane rescores; lanes rescore one at a time. A lone lane waits for nothing."""

    def __init__(self) -> None:
        self._streaming: set[LaneId] = set()
        self._changed = threading.Condition()
        self._turn = threading.Lock()
        """Held while one lane rescores, and for a moment by a stream that begins."""

    def begin(self, lane_id: LaneId) -> None:
        """Lane `lane_id` is about to send its requests; waits while a lane rescores."""
        with self._turn, self._changed:
            self._streaming.add(lane_id)

    def ended(self, lane_id: LaneId) -> None:
        """Lane `lane_id` streams no more (saying it twice, or unbegun, is harmless)."""
        with self._changed:
            self._streaming.discard(lane_id)
            self._changed.notify_all()

    @contextlib.contextmanager
    def quiet(self, stopped: Callable[[], bool]) -> Iterator[bool]:
        """True, and the turn held for the block, once no stream runs; False (and no
        turn) once `stopped()` says so first."""
        held = self._take_turn(stopped)
        try:
            yield held
        finally:
            if held:
                self._turn.release()

    def _take_turn(self, stopped: Callable[[], bool]) -> bool:
        while True:
            with self._changed:
                while self._streaming:
                    if stopped():
                        return False
                    self._changed.wait(0.1)
            self._turn.acquire()
            with self._changed:
                if not self._streaming:
                    return True
            self._turn.release()  # a stream began in between: wait for it too


class LaneCapabilities:
    """What a backend can do beyond the Protocol's calls, declared by the backend (as a
    flag the runner reads) rather than found out from its class: PairRun sees only
    LaneBackend. Every capability is off unless a backend turns it on, and its method
    is then the backend's own."""

    SENDS_AHEAD: ClassVar[bool] = False
    """generate() reads a request another process serves: `send_ahead` puts it in
    flight before any lane steps, so a pair's requests run at once, as a bare client
    sends them (stepping in turn, lane b's would wait for lane a's first token)."""
    GATES_STREAMS: ClassVar[bool] = False
    """The lane has work of its own to do once its stream has ended (a server lane's
    rescoring) that must not run beside the other lane's stream: `share_streams` hands
    it the run's StreamGate. A lane that steps only when the runner's thread asks takes
    no part (that thread may be waiting on the rescoring lane)."""

    def send_ahead(
        self, prompt: Sequence[int], max_tokens: int, stop: Sequence[bytes] = ()
    ) -> None:
        """Send now the request the next generate() with these arguments reads."""
        raise NotImplementedError(f"{type(self).__name__} does not send ahead")

    def share_streams(self, gate: StreamGate) -> None:
        """Wait at `gate` for the run's other streams before working after this one."""
        raise NotImplementedError(f"{type(self).__name__} takes no part in a StreamGate")


class LaneBackend(Protocol):
    """One lane of a pair: loads its model or connects to its server when built, then
    generates greedily on as many prompts as asked."""

    SENDS_AHEAD: ClassVar[bool]
    GATES_STREAMS: ClassVar[bool]
    lane: Lane
    lane_id: LaneId
    model_path: Path
    """The GGUF file whose vocabulary this lane's token ids index (a server lane's
    tokenizer)."""
    generation: Generation
    """The current (or last) generate() call's counters, filled in as it runs."""

    def tokenize(self, text: str) -> list[int]: ...

    def check(self, tokens: Sequence[int], max_tokens: int) -> None:
        """Raise PromptError for a prompt that cannot run on this lane (budget, context
        room, cached prefix), before anything decodes."""

    def generate(
        self,
        prompt: Sequence[int],
        max_tokens: int,
        stop: Sequence[bytes] = (),
        forced: Sequence[int] | None = None,
    ) -> Steps:
        """Yield one TokenStep per generated token for `prompt` (token ids, or a Prompt
        that also carries its text); `forced` feeds these tokens instead of the lane's
        own picks (teacher forcing). Raises Cancelled when stopped, a SpecdiffError
        when this lane fails."""

    def probe(self, index: int, token_ids: Sequence[int]) -> tuple[Probe, ...]:
        """Logit and rank of other tokens at step `index` (the fork); () where the
        backend no longer holds, or never saw, that step's logits."""

    def normalizer(self, index: int) -> float | None:
        """log-sum-exp of step `index`'s logits, or None where the backend cannot
        compute it."""

    def tokens_per_second(self, steps: Sequence[TokenStep]) -> float | None:
        """The backend's own speed figure for these steps, or None: time the decode loop
        instead."""

    def vocab_digest(self) -> str:
        """Identifies the vocabulary, so two lanes' token ids can be compared."""

    def send_ahead(
        self, prompt: Sequence[int], max_tokens: int, stop: Sequence[bytes] = ()
    ) -> None:
        """Where SENDS_AHEAD: start the request the next generate() with these arguments
        reads (LaneCapabilities)."""

    def share_streams(self, gate: StreamGate) -> None:
        """Where GATES_STREAMS: the run's gate to wait at before rescoring."""

    def executed(self) -> Mapping[str, object]:
        """What actually ran: model file and hash, settings as applied, server identity;
        each backend's table is a TypedDict of its own (LocalExecuted, ServerExecuted)
        whose values a session file holds as JSON."""

    def close(self) -> None: ...


class StreamsARun:
    """`run` for a class whose `stream` yields both lanes' steps as they are produced and
    leaves the outcome in `result` (PairRun in-process, PairWorker across processes)."""

    result: PairResult | None

    def stream(
        self,
        prompt: str,
        max_tokens: int,
        stop: Sequence[str] = (),
        near_tie: float = DEFAULT_NEAR_TIE,
        teacher_forced: bool = False,
        control: bool = False,
    ) -> Iterator[TokenStep]:
        raise NotImplementedError

    def run(
        self,
        prompt: str,
        max_tokens: int,
        stop: Sequence[str] = (),
        near_tie: float = DEFAULT_NEAR_TIE,
        on_step: Callable[[TokenStep], None] | None = None,
        teacher_forced: bool = False,
        control: bool = False,
    ) -> PairResult:
        """The whole run; `on_step` sees each step as it comes; `control` runs lane a
        again, cold, after the pair."""
        for step in self.stream(prompt, max_tokens, stop, near_tie, teacher_forced, control):
            if on_step is not None:
                on_step(step)
        assert self.result is not None
        return self.result
