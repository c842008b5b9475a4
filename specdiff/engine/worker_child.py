"""The worker process's side: load the pair it is sent, or call the function it is
sent, and answer in worker_messages' records until told to close or until the front end
goes away.

A fault-injection switch read only here makes every crash path testable on any CPU:
``SPECDIFF_FAULT=LANE:STEP:KIND`` (see specdiff.engine.worker).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import signal
import threading
import traceback
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any, TypeVar

from specdiff.engine.base import LaneBackend, Steps
from specdiff.engine.faults import Fault
from specdiff.engine.runtime import build_info, refuse_unsupported_offload
from specdiff.engine.worker_messages import (
    CANCEL_SIGNAL,
    Answer,
    AskExecuted,
    Bug,
    CallFunction,
    Check,
    Close,
    DueStep,
    EventFired,
    OpenPair,
    Progressed,
    Raised,
    Ready,
    RunFinished,
    StepMade,
    StreamRun,
    Tokenize,
)
from specdiff.errors import SpecdiffError, lane_failure
from specdiff.lanes import Lane, LaneId, Pair
from specdiff.secrecy import hide_environment
from specdiff.steps import TokenStep

if TYPE_CHECKING:  # annotations only: the runner is imported where a pair is opened
    from specdiff.engine.pairrun import PairRun

T = TypeVar("T")


class _CancelFlag(threading.Event):
    """A cancel event a signal handler may set: setting takes no lock (a handler runs
    between two bytecodes of the main thread, which may hold the event's lock), and no
    one waits on it, so no one needs waking."""

    def set(self) -> None:
        self._flag = True  # type: ignore[attr-defined]


def serve(descriptor: int, due_path: str, lifeline: int | None = None) -> None:
    """The child's main: load the pair it is sent (or call the function), then answer
    requests until told to close or until the front end goes away. `lifeline` is a
    pipe's end whose other end only the front end holds: at its EOF the worker ends."""
    if lifeline is not None:
        _end_with_front_end(lifeline)
    # the front end decides what Ctrl+C means (the worker runs in its own session, but
    # a caller may still signal the group)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # server lanes read their API keys from this process's environment, which a graded
    # program running as the same user could otherwise read from /proc
    hide_environment()
    cancel = _CancelFlag()
    # a cancel arrives as a signal, so it is seen while the decode loop runs
    signal.signal(CANCEL_SIGNAL, lambda *_: cancel.set())
    conn = Connection(descriptor)
    try:
        request = conn.recv()
    except (EOFError, OSError):
        return
    if isinstance(request, CallFunction):
        _serve_call(conn, cancel, request)
    elif isinstance(request, OpenPair):
        _serve_pair(conn, cancel, request.pair, due_path)
    else:
        conn.send(Bug(f"unknown first request {type(request).__name__}"))


def _end_with_front_end(lifeline: int) -> None:
    """End this process, and whatever it started, once the front end has gone, however
    it went (a SIGTERM or SIGKILL leaves no time to close this worker): a busy worker
    reads no requests, so only a thread of its own sees the front end's end."""

    def watch() -> None:
        with contextlib.suppress(OSError):
            while os.read(lifeline, 1):  # the front end never writes: only EOF comes
                pass
        # the worker leads its own process group: a kernel probe it started goes too
        os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=watch, name="front-end-lifeline", daemon=True).start()


def _serve_pair(conn: Connection, cancel: threading.Event, pair: Pair, due_path: str) -> None:
    # deferred: a worker that calls a function never loads the pair runner
    from specdiff.engine.llama.probe import trust_lanes
    from specdiff.engine.pairrun import PairRun

    def progress(text: str) -> None:
        conn.send(Progressed(text))

    def open_lanes() -> PairRun:
        # GPU layers this build cannot place are refused before anything loads
        for lane_id, lane in _lanes(pair):
            with lane_failure(lane_id):
                refuse_unsupported_offload(((lane_id, lane),))
        # before any lane decodes: a kernel that crashes on this CPU is found by a probe
        # in a further child, not by the run (a model that is not there is that lane's
        # failure; a fallback both lanes take is said once)
        trust_lanes(_lanes(pair), progress)
        return PairRun(pair, progress, cancel)

    run = _reporting(conn, open_lanes)
    if run is None:
        return
    due, fault = DueStep(due_path), Fault.from_env()
    for lane_id, lane in run.lanes.items():
        _watch(lane, due, lane_id, fault)
    with run:
        conn.send(Ready(run.build, run.executed()))
        _answer(conn, run)


def _lanes(pair: Pair) -> tuple[tuple[LaneId, Lane], ...]:
    return (("a", pair.a), ("b", pair.b))


def _watch(lane: LaneBackend, due: DueStep, lane_id: LaneId, fault: Fault | None) -> None:
    """Wrap a lane's decode loop to mark each step before computing it (and let a
    SPECDIFF_FAULT strike there)."""
    generate = lane.generate

    def watched(*args: Any, **kwargs: Any) -> Steps:
        steps = generate(*args, **kwargs)
        try:
            for index in itertools.count():
                due.mark(lane_id, index)
                try:
                    step = next(steps)
                except StopIteration:
                    return
                if fault is not None:
                    # only where the lane really has that step: a lane that ends sooner
                    # never reaches the fault
                    fault.fire_before(lane_id, index)
                yield step
        finally:
            steps.close()

    # an instance attribute shadows the class's method, for this lane alone
    vars(lane)["generate"] = watched


def _answer(conn: Connection, run: PairRun) -> None:
    while True:
        try:
            request = conn.recv()
        except EOFError:
            return
        if isinstance(request, Close):
            return
        if isinstance(request, StreamRun):
            # a signal sent before this request was read must not be lost, nor one
            # left from the last run count
            run.cancel.set() if request.cancelled else run.cancel.clear()
            _reporting(conn, functools.partial(_stream, conn, run, request))
        elif isinstance(request, (Tokenize, Check, AskExecuted)):
            _reporting(conn, functools.partial(_answer_with, conn, run, request))
        else:
            conn.send(Bug(f"unknown request {type(request).__name__}"))


def _answer_with(conn: Connection, run: PairRun, request: Tokenize | Check | AskExecuted) -> None:
    value: object = None  # a check that passes answers None
    if isinstance(request, Tokenize):
        value = run.tokenize(request.prompt)
    elif isinstance(request, Check):
        run.check(request.tokens, request.max_tokens)
    else:
        value = run.executed()
    conn.send(Answer(value))


def _reporting(conn: Connection, work: Callable[[], T]) -> T | None:
    """`work`'s value; None when it raised, the error then sent to the front end as one
    message (bad input to show as it is, anything else as a bug with its traceback)."""
    try:
        return work()
    except SpecdiffError as error:
        conn.send(Raised(error))
    except Exception:
        conn.send(Bug(traceback.format_exc()))
    return None


def _stream(conn: Connection, run: PairRun, request: StreamRun) -> None:
    steps = run.stream(
        request.prompt,
        request.max_tokens,
        request.stop,
        request.near_tie,
        request.teacher_forced,
        request.control,
    )
    for step in steps:
        conn.send(StepMade(step, run.live()))
    assert run.result is not None  # the stream ran to its end
    conn.send(RunFinished(run.result))


# --- one function call -----------------------------------------------------------------


def _serve_call(conn: Connection, cancel: threading.Event, request: CallFunction) -> None:
    """The child's side of `call_in_worker`: call, pass its events on, send what it returns."""
    fault = Fault.from_env()
    guard = threading.Lock()  # events may come from the function's own threads

    def handing_over(event: str) -> Callable[..., None]:
        def send(*payload: Any) -> None:
            if fault is not None:
                for step in _steps_in(payload):
                    fault.fire_at(step)
            with guard:
                conn.send(EventFired(event, payload))

        return send

    conn.send(Ready(_build_info()))
    handlers = {event: handing_over(event) for event in request.events}

    def call() -> tuple[Any]:
        return (request.function(*request.args, cancel=cancel, **handlers),)

    # a function returning None is answered like any other: the tuple tells them apart
    value = _reporting(conn, call)
    if value is not None:
        conn.send(Answer(value[0]))


def _steps_in(payload: tuple[Any, ...]) -> Iterator[TokenStep]:
    """The steps an event hands over, alone or in a list: where a fault may fire."""
    for item in payload:
        if isinstance(item, TokenStep):
            yield item
        elif isinstance(item, (list, tuple)):
            yield from (step for step in item if isinstance(step, TokenStep))


def _build_info() -> dict[str, str]:
    """llama.cpp's build and the CPU, for a crash message; empty when llama.cpp will not load."""
    try:
        return build_info()
    except Exception:
        return {}
