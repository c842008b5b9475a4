"""A lane served over HTTP: OpenAI-compatible servers and llama-server's own API.

Each streamed token becomes a TokenStep: the token id where the server gives it (else
looked up in the lane's tokenizer vocabulary by its exact bytes or text), its bytes, the
top-k candidates with their log-probabilities as logits (a difference of two
log-probabilities equals the difference of the logits, so margins mean the same thing),
and the time it arrived. The APIs are in ``dialects``, the HTTP side in ``client``, a
token's step and the echo guard in ``tokens``.

The lane holds a server to its word: it stops reading at the token budget whatever the
server sends, and the steps whose text could be the start of the API key or the
endpoint's password wait until the next tokens show they are not, so that a server
echoing a secret ends the lane before any of it is kept.
"""

from __future__ import annotations

import dataclasses
import json
import queue
import threading
from collections.abc import Iterator, Sequence
from contextlib import closing
from typing import Any, TypedDict

from specdiff.chat import Message, messages_of
from specdiff.engine.base import Cancelled, ChatPrompt, Generation, Prompt, Steps, StreamGate
from specdiff.engine.llama.context import ModelPool, PooledLane, repack_choice
from specdiff.engine.models import Progress, resolve_model
from specdiff.engine.server.client import ServerClient, ServerError, finite, read_api_key
from specdiff.engine.server.dialects import Event, Token, dialect_for, read_events, request_body
from specdiff.engine.server.rescore import (
    RESCORED_BY,
    RescoreCost,
    Rescorer,
    Rescoring,
    needs_rescoring,
)
from specdiff.engine.server.tokens import EchoGuard, token_step
from specdiff.engine.server.vocab import Vocabulary
from specdiff.errors import LaneConfigError, PromptError, SpecdiffError
from specdiff.lanes import Lane, LaneId, without_credentials
from specdiff.safe_text import first_surrogate
from specdiff.steps import Probe, TokenStep

Arrival = TokenStep | BaseException | None
"""What the reader thread hands over: a step, the lane's failure, or None at the end."""

EVENTS_AFTER_BUDGET = 8
"""Token-less events read after the last token of the budget, for the one that ends the
request with its timings; a server that sends more is not listened to."""
MAX_COUNT = 1 << 24
"""The most drafts a server may claim for one request (the session's bound on an index)."""
TEMPLATE_CHARS_PER_MESSAGE = 256
"""What a chat template may add around each message (role markers, turn tokens) before a
formatted prompt a server reports counts as padded: a session header keeps it whole."""
TEMPLATE_CHARS = 4096
"""What a template may add once (a default system prompt, the assistant's opening)."""
SERVER_TEMPLATE = "the server's own, as its /apply-template and /tokenize report it"
UNKNOWN_TEMPLATE = (
    "the server's own, not known here ({why}); the session's prompt ids are the raw text's"
)


def _quiet(_: str) -> None:
    return None


class Served(TypedDict, total=False):
    """Which endpoint serves (or served) the generation, with its retries and back-off,
    and whether its failure may be mended by a fresh start; nothing before any was
    chosen."""

    served_by: str
    retries: int
    waited_seconds: float
    restartable: bool


class ChatRecord(TypedDict, total=False):
    """On the chat API: whose template formatted the prompt, and the prompt it formatted."""

    chat_template: str
    chat_prompt: ChatPrompt


class _ServerTable(TypedDict):
    backend: str
    endpoint: str
    api: str
    server: dict[str, Any]
    repack: str
    tokenizer_path: str
    tokenizer_sha256: str
    request: dict[str, Any]
    rescore: str
    server_flags: str


class ServerExecuted(_ServerTable, Served, Rescoring, ChatRecord, total=False):
    """A server lane's executed table: the endpoint and what the server said of itself,
    the tokenizer, the request's extra fields, and what serving and rescoring took."""


class ServerLane(PooledLane):
    """A lane whose tokens come from a server; a LaneBackend like LocalLane."""

    SENDS_AHEAD = True
    GATES_STREAMS = True

    def __init__(
        self,
        lane: Lane,
        lane_id: LaneId = "a",
        pool: ModelPool | None = None,
        progress: Progress = _quiet,
        cancel: threading.Event | None = None,
    ) -> None:
        lane.check_credentials(lane_id)
        key = read_api_key(lane, lane_id)
        super().__init__(lane, lane_id, pool, cancel)
        self.extra: dict[str, Any] = json.loads(lane.request) if lane.request else {}
        self.client = ServerClient(lane, key)
        self._readers: list[threading.Thread] = []
        self._ahead: tuple[tuple[Any, ...], tuple[queue.Queue[Arrival], threading.Event]] | None
        self._ahead = None
        """The request `send_ahead` sent, with what it was sent for, until taken."""
        self._connect(progress)
        self.vocab = Vocabulary(self.model, self.client.fail)
        self.generation = Generation()
        self.timings: dict[str, Any] = {}
        """llama-server's own timings of the last request (predicted_per_second, ...)."""
        self.rescoring = RescoreCost()
        """What rescoring the last request's accepted drafts took."""
        self.streams = StreamGate()
        """The run's streams that must end before this lane rescores (PairRun's)."""
        self.chat_prompt: ChatPrompt | None = None
        """On the chat API: the prompt as the server formatted it, text and token ids."""
        self.chat_template = ""
        """On the chat API: whose template formatted the prompt, and whether it is known."""
        self._formatted: dict[tuple[Message, ...], ChatPrompt | None] = {}
        self.served_by = ""
        """The endpoint that served the last generation, credentials masked."""
        self.restartable = False
        """Whether the last generation failed in a way a fresh start may mend (its
        endpoint refused, broke the stream or stayed busy): the prompt may be sent
        again, and the pool's next claim avoids an endpoint it set aside."""

    def _connect(self, progress: Progress) -> None:
        """Load the tokenizer (prompt token ids for the session, and ids for servers
        that report tokens only as text) and ask the server who it is; on a failure the
        lane is closed before the error goes on, naming the lane."""
        try:
            self.model_path = resolve_model(
                self.lane.model, self.lane.quant, self.lane.threads, progress
            )
            self.model = self.pool.get(
                self.model_path, repack_choice(self.lane, self.model_path).on
            )
            progress(f"lane {self.lane_id}: asking {self.client.where} who it is")
            self.identity = self.client.identity()
        except ServerError as error:
            self.close()
            raise ServerError(f"lane {self.lane_id}: {error}") from None
        except BaseException:
            self.close()
            raise

    # -- what PairRun asks of a lane -------------------------------------------------
    def vocab_digest(self) -> str:
        return self.model.info.vocab_digest

    def tokenize(self, text: str) -> list[int]:
        """The prompt's token ids; on the chat API those of the prompt as the server
        formats it, where it says (llama-server), else the raw text's."""
        # the next generation's endpoint, chosen now so that the session header written
        # before it names the server that serves it
        self.client.pin()
        if self.lane.api != "chat":
            return self.model.tokenize(text)
        messages = messages_of(text)
        if messages not in self._formatted:
            self._formatted = {messages: self._served_prompt(messages)}
        self.chat_prompt = self._formatted[messages]
        if self.chat_prompt is None:
            return self.model.tokenize(text)
        return list(self.chat_prompt["token_ids"])

    def _served_prompt(self, messages: tuple[Message, ...]) -> ChatPrompt | None:
        """The conversation as the server formats it, from llama-server's /apply-template
        and /tokenize; None (and why, in `chat_template`) where the server does not say
        or says what no session may keep. Only a server whose /props answered is asked:
        llama-server's."""
        if "build_info" not in self.identity:
            self.chat_template = UNKNOWN_TEMPLATE.format(why="no llama-server /props")
            return None
        try:
            text = self._template_text(messages)
            ids = self._rescorer().prompt_ids(text)
            if len(ids) > len(text.encode("utf-8")) + 8:
                raise self.client.fail(f"/tokenize gave {len(ids)} ids for a shorter text")
            ids = [self.vocab.checked(token_id) for token_id in ids]
        except ServerError as error:
            self.chat_template = UNKNOWN_TEMPLATE.format(why=str(error))
            return None
        self.chat_template = SERVER_TEMPLATE
        return {"text": text, "token_ids": ids}

    def _template_text(self, messages: tuple[Message, ...]) -> str:
        """llama-server's /apply-template answer: the formatted text, checked to be text a
        session holds (no lone surrogate, no secret, no longer than a template makes it)."""
        longest = sum(len(m.content) for m in messages)
        longest += TEMPLATE_CHARS_PER_MESSAGE * len(messages) + TEMPLATE_CHARS
        body = {"messages": [message.to_json() for message in messages]}
        # a character is at most 6 bytes as JSON escapes it
        answer = self.client.request("POST", "/apply-template", 6 * longest + 64, json=body)
        self.client.check_status(answer)
        data = answer.json()
        text = data.get("prompt") if isinstance(data, dict) else None
        if not isinstance(text, str) or not text:
            raise self.client.fail("/apply-template answered without a formatted prompt")
        if len(text) > longest:
            raise self.client.fail(f"/apply-template gave {len(text)} characters, over {longest}")
        if first_surrogate(text) is not None:
            raise self.client.fail("/apply-template gave text with a lone surrogate")
        if any(secret in text for secret in self.client.secrets):
            raise self.client.fail("/apply-template's text holds the API key or the password")
        return text

    def check(self, tokens: Sequence[int], max_tokens: int) -> None:
        """Only the budget: the server knows its context, and a cached prefix is checked
        when the priming request is built."""
        if max_tokens < 1:
            raise PromptError(f"--max-tokens must be at least 1, got {max_tokens}")

    def probe(self, index: int, token_ids: Sequence[int]) -> tuple[Probe, ...]:
        return ()  # a server reports its top-k only, never the logit of a token asked for

    def normalizer(self, index: int) -> float | None:
        return None  # nor the whole distribution a log-sum-exp would need

    def tokens_per_second(self, steps: Sequence[TokenStep]) -> float | None:
        """The server's own count where it reports one (llama-server), else the rate the
        tokens arrived at, first to last: the time spent waiting on this lane in
        lockstep with the other one says nothing of its speed."""
        reported = finite(self.timings.get("predicted_per_second"), 1e-9, 1e9)
        if reported is not None:
            return reported
        if len(steps) < 2 or steps[-1].timestamp <= steps[0].timestamp:
            return 0.0
        return (len(steps) - 1) / (steps[-1].timestamp - steps[0].timestamp)

    def executed(self) -> ServerExecuted:
        return {
            "backend": "server",
            "endpoint": without_credentials(self.lane.endpoint),
            **self._served_record(),
            "api": self.lane.api,
            "server": self.identity,
            # the lane's setting: serve-pair sets it off for a server it had to start
            # with --no-repack (a server started elsewhere does not report its own)
            "repack": self.lane.repack,
            "tokenizer_path": str(self.model_path),
            "tokenizer_sha256": self.model.sha256,
            "request": self.extra,
            "rescore": self.lane.rescore,
            "server_flags": self.lane.server_flags,
            **self.rescoring.as_record(),
            **self._chat_record(),
        }

    def _served_record(self) -> Served:
        """Which endpoint serves (or served) the generation, and its retries and
        back-off; nothing before any was chosen."""
        client = self.client
        served = client.pinned.shown if client.pinned is not None else self.served_by
        if not served:
            return {}
        record: Served = {"served_by": served, **client.backoff.as_record()}
        if self.restartable:
            record["restartable"] = True
        return record

    def _chat_record(self) -> ChatRecord:
        """On the chat API: whose template formatted the prompt and, where the server
        said, the prompt it formatted (the session keeps it in `lane_prompts`)."""
        if self.lane.api != "chat" or not self.chat_template:
            return {}
        record: ChatRecord = {"chat_template": self.chat_template}
        if self.chat_prompt is not None:
            record["chat_prompt"] = self.chat_prompt.copy()
        return record

    def share_streams(self, gate: StreamGate) -> None:
        self.streams = gate

    def close(self) -> None:
        self._drop_ahead()
        for reader in self._readers:
            reader.join(timeout=5)  # before the tokenizer it may be using is freed
        self.client.close()
        self._close_pool()

    # -- generating ----------------------------------------------------------------
    def generate(
        self,
        prompt: Sequence[int] | str,
        max_tokens: int,
        stop: Sequence[bytes] = (),
        forced: Sequence[int] | None = None,
    ) -> Steps:
        """Stream the server's greedy completion of the prompt, one TokenStep per token.
        The server is sent text: the prompt itself, a Prompt's text, or token ids turned
        back into text; a request `send_ahead` sent with the same arguments is the one
        read.

        A thread reads the stream as it comes, so each step is stamped when it arrived
        even while the caller is busy with another lane; the steps wait in a queue."""
        if forced is not None:
            raise LaneConfigError("teacher forcing needs an in-process lane (backend=local)")
        arrived, stopped = self._take_ahead(prompt, max_tokens, stop) or self._send(
            prompt, max_tokens, stop
        )
        self.restartable = False
        try:
            yield from self._receive(arrived)
        except ServerError as error:
            self.restartable = error.restartable
            raise
        finally:
            stopped.set()
            self.client.unpin()  # the next prompt's endpoint is chosen afresh

    def send_ahead(
        self, prompt: Sequence[int] | str, max_tokens: int, stop: Sequence[bytes] = ()
    ) -> None:
        """Send now the request that the next `generate` with these arguments reads: a
        run's two lanes then have both requests in flight from the start, for the server
        to batch, where the second would wait for the first lane's first token. A
        failure is left for `generate` to meet again, where the lane records it."""
        self._drop_ahead()
        try:
            self._ahead = ((prompt, max_tokens, tuple(stop)), self._send(prompt, max_tokens, stop))
        except SpecdiffError:
            return

    def _take_ahead(
        self, prompt: Sequence[int] | str, max_tokens: int, stop: Sequence[bytes]
    ) -> tuple[queue.Queue[Arrival], threading.Event] | None:
        """The request sent ahead for these arguments, if one was; any other is dropped."""
        if self._ahead is not None:
            (sent_prompt, sent_tokens, sent_stop), sent = self._ahead
            if sent_prompt is prompt and (sent_tokens, sent_stop) == (max_tokens, tuple(stop)):
                self._ahead = None
                return sent
        self._drop_ahead()
        return None

    def _drop_ahead(self) -> None:
        """Stop reading a request sent ahead that no generation took (a cancelled run)."""
        if self._ahead is not None:
            self._ahead[1][1].set()
            self._ahead = None
            self.client.unpin()

    def _send(
        self, prompt: Sequence[int] | str, max_tokens: int, stop: Sequence[bytes]
    ) -> tuple[queue.Queue[Arrival], threading.Event]:
        """Send the generation's request; its steps arrive in the queue, read by a thread
        until the event is set."""
        if isinstance(prompt, str):
            text, count = prompt, len(self.tokenize(prompt))
        else:
            text = prompt.text if isinstance(prompt, Prompt) else self.vocab.detokenize(prompt)
            # the ids given are another lane's: a chat lane's server formats its own
            count = len(self.tokenize(text)) if self.lane.api == "chat" else len(prompt)
        self.generation = Generation(prompt_tokens=count)
        endpoint = self.client.pin()
        self.served_by = endpoint.shown
        self.timings = {}
        self.streams.begin(self.lane_id)  # after another lane's rescoring, never beside it
        if self.lane.prefix == "cached":
            self._prime(text)
        arrived: queue.Queue[Arrival] = queue.Queue()
        stopped = threading.Event()
        reader = threading.Thread(
            target=self._read,
            args=(text, max_tokens, stop, stopped, arrived),
            name=f"lane-{self.lane_id}-stream",
            daemon=True,
        )
        self._readers = [r for r in self._readers if r.is_alive()] + [reader]
        reader.start()
        return arrived, stopped

    def _read(
        self,
        text: str,
        max_tokens: int,
        stop: Sequence[bytes],
        stopped: threading.Event,
        arrived: queue.Queue[Arrival],
    ) -> None:
        """The reader thread: every step, then None; or the failure that ended it.

        From the first accepted draft that needs rescoring on, the steps wait here (in
        order) until the stream has ended and the drafts are rescored; a failure passes
        on the waiting steps as they arrived before it."""
        self.rescoring = RescoreCost()
        steps: list[TokenStep] = []
        passed = 0
        try:
            for step in self._stream(text, max_tokens, stop, stopped):
                steps.append(step)
                if passed == len(steps) - 1 and not self._holds(step):
                    arrived.put(step)
                    passed += 1
            self.streams.ended(self.lane_id)
            if passed < len(steps):
                steps = self._rescored(text, steps, stopped)
            for step in steps[passed:]:
                arrived.put(step)
            arrived.put(None)
        except (SpecdiffError, Cancelled) as error:  # handed to the consumer, raised there
            for step in steps[passed:]:
                arrived.put(step)
            arrived.put(error)
        except Exception as error:  # anything else is still this lane's failure only
            for step in steps[passed:]:
                arrived.put(step)
            arrived.put(
                self.client.fail(
                    f"unexpected {type(error).__name__}: {self.client.quote(str(error))}"
                )
            )
        finally:
            self.streams.ended(self.lane_id)  # a failed stream holds no other lane back

    def _holds(self, step: TokenStep) -> bool:
        """Whether a step waits to be rescored: an accepted draft without probabilities
        on a llama-server lane whose rescore key is auto."""
        return (
            self.lane.rescore == "auto"
            and self.lane.api == "llama-server"
            and needs_rescoring(step)
        )

    def _rescored(
        self, text: str, steps: list[TokenStep], stopped: threading.Event
    ) -> list[TokenStep]:
        """The steps with their accepted drafts scored again on the same server."""
        rescorer = self._rescorer()
        self.rescoring = rescorer.cost
        try:
            return rescorer.rescore(
                text,
                steps,
                self._rescored_step,
                lambda: stopped.is_set() or self.cancel.is_set(),
            )
        except Exception as error:  # whatever a server's answer did: the steps stand
            reason = f"unexpected {type(error).__name__}: {self.client.quote(str(error))}"
            rescorer.cost.steps = 0
            rescorer.cost.skip(sum(1 for step in steps if needs_rescoring(step)), reason)
            return steps

    def _rescorer(self) -> Rescorer:
        return Rescorer(
            self.client, max(self.lane.top_k, 2), self.vocab.piece, self.extra, self.streams
        )

    def _rescored_step(self, step: TokenStep, token: Token, top: list[Token]) -> TokenStep | None:
        """`step` with the teacher-forced candidates; None where they do not hold its
        token, or hold a secret the stream itself would have been refused for."""
        scored = self._step(step.index, token, top)
        if all(candidate.token_id != step.token_id for candidate in scored.top):
            return None
        secrets = [secret.encode("utf-8") for secret in self.client.secrets]
        if any(secret in candidate.piece for secret in secrets for candidate in scored.top):
            return None
        return dataclasses.replace(step, top=scored.top, source=RESCORED_BY)

    def _receive(self, arrived: queue.Queue[Arrival]) -> Iterator[TokenStep]:
        """The reader's steps, in the caller's thread; a cancel ends them."""
        while True:
            try:
                # a short wait, so a cancel is noticed while the server is silent
                item = arrived.get(timeout=0.1)
            except queue.Empty:
                if self.cancel.is_set():
                    raise Cancelled("cancelled") from None
                continue
            if item is None:
                if self.cancel.is_set():
                    raise Cancelled("cancelled")
                return
            if isinstance(item, BaseException):
                raise item
            if self.cancel.is_set():
                raise Cancelled("cancelled")
            yield item

    def _stream(
        self, text: str, max_tokens: int, stop: Sequence[bytes], stopped: threading.Event
    ) -> Iterator[TokenStep]:
        """The request's steps, at most `max_tokens` of them whatever the server sends."""
        dialect = dialect_for(self.lane.api, self.vocab.piece)
        stop_text = [s.decode("utf-8", "replace") for s in stop]
        body = request_body(self.lane, dialect, text, max_tokens, stop_text, self.extra)
        guard = EchoGuard(self.client.secrets, self.client.fail)
        received = 0
        ended = False
        past_budget = 0
        lines = self.client.stream_lines(dialect.path, body, lambda: received)
        with closing(lines):  # leaving early closes the response at once
            for event in read_events(lines, dialect, self.client, stopped):
                for token, top in event.tokens[: max_tokens - received]:
                    if stopped.is_set() or self.cancel.is_set():
                        # the consumer left or cancelled: close the stream, and pass on
                        # the held steps that a later token was to clear
                        yield from guard.release()
                        return
                    step = self._step(received, token, top)
                    received += 1
                    yield from guard.admit(step)
                self._record(event)
                # llama-server's last event says stop, with no [DONE]; an OpenAI stream
                # that gave its finish reason is complete too
                ended = ended or event.done or bool(event.finish)
                if ended:
                    break
                if received >= max_tokens:
                    past_budget += 1
                    if past_budget > EVENTS_AFTER_BUDGET or (past_budget > 1 and event.tokens):
                        # it ignores the budget: the stream closes here
                        self.generation.stop_reason = "length"
                        break
        yield from guard.finish()
        if not ended and received < max_tokens:
            raise self.client.fail(
                f"the stream ended after {received} tokens without its end marker "
                "(did the server stop?)"
            )
        if not self.generation.stop_reason:
            # no finish reason given: "ended" unless the budget explains it
            self.generation.stop_reason = "length" if received >= max_tokens else "ended"

    def _record(self, event: Event) -> None:
        """Keep what an event says of the request: timings, draft counts, stop reason."""
        generation = self.generation
        if event.timings:
            self.timings = event.timings
            drafted = int(min(event.timings.get("draft_n", 0), MAX_COUNT))
            generation.drafted = drafted
            generation.accepted = int(min(event.timings.get("draft_n_accepted", 0), drafted))
        if event.finish:
            generation.stop_reason = event.finish

    def _prime(self, prompt: str) -> None:
        """Fill llama-server's prompt cache with the prompt's prefix (half of it unless
        prefix_tokens / prefix_text say otherwise), as an earlier turn would."""
        tokens = self.tokenize(prompt)
        if self.lane.prefix_text:
            if not prompt.startswith(self.lane.prefix_text):
                raise PromptError("prefix_text must be the beginning of the prompt")
            prefix = self.lane.prefix_text
        else:
            count = self.lane.prefix_tokens or len(tokens) // 2
            if not 1 < count < len(tokens):
                raise PromptError(
                    f"the cached prefix must be shorter than the {len(tokens)}-token prompt"
                )
            prefix = self.vocab.detokenize(tokens[:count])
        body = {
            "prompt": prefix,
            "n_predict": 1,
            "temperature": 0,
            "cache_prompt": True,
            "id_slot": 0,
            **self.extra,
        }
        response = self.client.request("POST", "/completion", json=body)
        self.client.check_status(response)
        self.generation.prefix_tokens = len(self.tokenize(prefix)) - 1

    def _step(self, index: int, token: Token, top: list[Token]) -> TokenStep:
        return token_step(self.lane_id, self.lane.top_k, self.vocab, index, token, top)
