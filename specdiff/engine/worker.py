"""Both lanes of a pair in a worker process: llama.cpp runs in a child, the front end
receives records.

specdiff drives llama.cpp into unusual corners (ubatch 1, KV types, drafts, other
people's GGUFs, CPUs whose kernels crash), and a native crash there (a SIGSEGV in a
kernel, a GGML_ASSERT abort) must end one run, not the program and its terminal. So
`PairWorker` offers PairRun's interface but runs PairRun in a child process (a fresh
interpreter, so the front-end process never loads llama.cpp, and no caller's main
module is imported again as multiprocessing's spawn would). Steps arrive one message
each, as they are produced, so when the child dies the front end holds every step it
produced and knows which lane died at which step.

A fault-injection switch read only in the worker makes every crash path testable on
any CPU: ``SPECDIFF_FAULT=LANE:STEP:KIND`` (e.g. ``b:5:segv``, ``a:0:abort``, ``b:3:ill``)
kills the worker by that signal just before it hands over that lane's step; KIND
``error`` instead makes that lane's decode fail there as llama.cpp refusing a call would
(the lane ends with the error, the other lane runs on).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime, timezone
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, TypeVar, cast

from specdiff.compare import DEFAULT_NEAR_TIE, compare
from specdiff.engine.base import Live, LiveStats, Steps, StreamsARun
from specdiff.engine.faults import Fault
from specdiff.errors import SpecdiffError, lane_failure, printable
from specdiff.lanes import Lane, LaneId, Pair
from specdiff.results import LaneOutcome, PairResult
from specdiff.secrecy import hide_environment
from specdiff.sessions.format import CRASHED
from specdiff.steps import TokenStep

CANCEL_SIGNAL = signal.SIGUSR1
WORKER_MAIN = (
    # the current folder first on sys.path (python -c puts it there) could shadow the
    # installed packages with whatever the user's folder holds
    "import sys; sys.path.pop(0); from specdiff.engine.worker import serve; "
    "serve(int(sys.argv[1]), sys.argv[2])"
)
POLL_SECONDS = 0.05
"""How often a silent worker is checked for death and a cancel is passed on."""
CLOSE_SECONDS = 5.0
LOG_TAIL_BYTES = 4096

Progress = Callable[[str], None]
T = TypeVar("T")


def _quiet(_: str) -> None:
    return None


class WorkerCrashed(SpecdiffError):
    """The worker process died: a native crash in llama.cpp, or an unexpected exit."""


class WorkerFailed(SpecdiffError):
    """The worker hit a Python error it could not report as bad input: a bug."""


class _CancelFlag(threading.Event):
    """A cancel event a signal handler may set: setting takes no lock (a handler runs
    between two bytecodes of the main thread, which may hold the event's lock), and no
    one waits on it, so no one needs waking."""

    def set(self) -> None:
        self._flag = True  # type: ignore[attr-defined]


class _DueStep:
    """Which lane's step the decode loop is computing, written to a small file before
    each step, so the front end can name where a native crash struck: steps are handed
    over in pairs, so what arrived does not say which lane died."""

    def __init__(self, path: str) -> None:
        self.descriptor = os.open(path, os.O_WRONLY)

    def mark(self, lane: str, index: int) -> None:
        os.pwrite(self.descriptor, f"{lane}{index:010d}".encode(), 0)

    @staticmethod
    def read(path: Path) -> tuple[str, int] | None:
        try:
            text = path.read_bytes().decode("ascii")
        except (OSError, UnicodeDecodeError):
            return None
        if len(text) != 11 or text[0] not in "ab" or not text[1:].isdigit():
            return None
        return text[0], int(text[1:])

    def watch(self, run: Any, fault: Fault | None) -> None:
        """Wrap each lane's decode loop to mark each step before computing it (and let
        a SPECDIFF_FAULT strike there)."""
        for lane_id, lane in run.lanes.items():
            lane.generate = self._watched(lane_id, lane.generate, fault)

    def _watched(
        self, lane_id: str, generate: Callable[..., Steps], fault: Fault | None
    ) -> Callable[..., Steps]:
        def watched(*args: Any, **kwargs: Any) -> Steps:
            steps = generate(*args, **kwargs)
            try:
                for index in itertools.count():
                    self.mark(lane_id, index)
                    try:
                        step = next(steps)
                    except StopIteration:
                        return
                    if fault is not None:
                        # only where the lane really has that step: a lane that ends
                        # sooner never reaches the fault
                        fault.fire_before(lane_id, index)
                    yield step
            finally:
                steps.close()

        return watched


# --- the worker process --------------------------------------------------------------


def serve(descriptor: int, due_path: str) -> None:
    """The child's main: load the pair it is sent, then answer requests until told to
    close or until the front end goes away."""
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
        kind, args = conn.recv()
    except (EOFError, OSError):
        return
    if kind == "call":
        _serve_call(conn, cancel, *args)
        return
    (pair,) = args
    # deferred: this module is imported by front ends, which must not load llama.cpp
    from specdiff.engine.llama.probe import trust_lanes
    from specdiff.engine.pairrun import PairRun
    from specdiff.engine.runtime import refuse_unsupported_offload

    def progress(text: str) -> None:
        conn.send(("progress", text))

    def open_lanes() -> PairRun:
        # GPU layers this build cannot place are refused before anything loads
        for lane_id, lane in (("a", pair.a), ("b", pair.b)):
            with lane_failure(lane_id):
                refuse_unsupported_offload(((lane_id, lane),))
        # before any lane decodes: a kernel that crashes on this CPU is found by a probe
        # in a further child, not by the run (a model that is not there is that lane's
        # failure; a fallback both lanes take is said once)
        trust_lanes((("a", pair.a), ("b", pair.b)), progress)
        return PairRun(pair, progress, cancel)

    run = _reporting(conn, open_lanes)
    if run is None:
        return
    fault = Fault.from_env()
    _DueStep(due_path).watch(run, fault)
    with run:
        conn.send(("ready", run.build, run.executed()))
        _answer(conn, run)


def _answer(conn: Connection, run: Any) -> None:
    while True:
        try:
            kind, args = conn.recv()
        except EOFError:
            return
        if kind == "close":
            return
        if kind == "stream":
            # the front end says whether a cancel is already asked for: a signal sent
            # before this request was read must not be lost, nor one left from the last
            cancelled, args = args[0], args[1:]
            run.cancel.set() if cancelled else run.cancel.clear()
            _reporting(conn, functools.partial(_stream, conn, run, args))
        elif kind in ("tokenize", "check", "executed"):
            _reporting(conn, functools.partial(_answer_with, conn, getattr(run, kind), args))
        else:
            conn.send(("bug", f"unknown request {kind!r}"))


def _answer_with(conn: Connection, method: Callable[..., Any], args: tuple[Any, ...]) -> None:
    conn.send(("ok", method(*args)))


def _reporting(conn: Connection, work: Callable[[], T]) -> T | None:
    """`work`'s value; None when it raised, the error then sent to the front end as one
    message (bad input to show as it is, anything else as a bug with its traceback)."""
    try:
        return work()
    except SpecdiffError as error:
        conn.send(("raise", error))
    except Exception:
        conn.send(("bug", traceback.format_exc()))
    return None


def _stream(conn: Connection, run: Any, args: tuple[Any, ...]) -> None:
    for step in run.stream(*args):
        conn.send(("step", step, run.live()))
    conn.send(("result", run.result))


# --- the front end's side ------------------------------------------------------------


class PairWorker(StreamsARun):
    """PairRun's interface, with the lanes in a worker process.

    A crash while a run streams ends the run, not the caller: `stream` stops, and
    `result` holds every step that arrived, both lanes stopped as "crashed" and the
    crash in the lane that died. A crash at any other time raises WorkerCrashed. Once
    the worker has died the object is spent (`alive` is False); open a new one.
    """

    _conn: Connection
    """The socket to the child interpreter, made anew by each _spawn."""

    WHO = "the lanes' worker"
    read_every = 0.0
    repack_off = "--both repack=false"
    """The option that turns off the kernels most often behind a crash."""

    def __init__(
        self,
        pair: Pair,
        progress: Progress = _quiet,
        cancel: threading.Event | None = None,
        read_every: float = 0.0,
    ) -> None:
        self.pair = pair
        self.cancel = cancel or threading.Event()
        self.read_every = read_every
        """Seconds a streaming reader waits before it drains what has arrived, when
        nothing is waiting (0: woken by each step). A reader that draws in batches
        anyway sets it: woken per step, its thread takes a core from the decode threads
        some 200 times a second, and each time both of them wait at the next barrier."""
        self.result: PairResult | None = None
        self.build: dict[str, str] = {}
        self._executed: dict[str, dict[str, Any]] = {}
        self._live: Live = {}
        self._received: dict[str, list[TokenStep]] = {"a": [], "b": []}
        self._progress = progress
        self._streaming = False
        self._cancel_sent_at = 0.0
        self._spawn()
        try:
            self._conn.send(("open", (pair,)))
            ready = self._reply(progress, "ready")
        except BaseException:
            self.close()
            raise
        self.build, self._executed = ready[1], ready[2]
        self._busy = False

    def _spawn(self) -> None:
        """Start the child interpreter on one end of a socket pair, in a session of its
        own: the terminal's Ctrl+C is the front end's to handle, and closing the worker
        ends everything it started (a kernel probe included)."""
        self._busy = True
        self._folder = Path(tempfile.mkdtemp(prefix="specdiff-worker-"))
        self._due = self._folder / "due"
        self._due.touch()
        # asked to see everything llama.cpp prints: leave stderr alone
        keep_stderr = os.environ.get("SPECDIFF_LLAMA_LOG") == "1"
        self._log = None if keep_stderr else self._folder / "log"
        ours, theirs = socket.socketpair()
        self._conn = Connection(ours.detach())
        try:
            with theirs, contextlib.ExitStack() as files:
                # llama.cpp's own aborts (GGML_ASSERT) write to fd 2: keep them off the
                # terminal, where a TUI is drawn, and let the crash message quote them
                log = None if self._log is None else files.enter_context(self._log.open("ab"))
                self.process = subprocess.Popen(
                    [sys.executable, "-c", WORKER_MAIN, str(theirs.fileno()), str(self._due)],
                    pass_fds=[theirs.fileno()],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL if log is None else log,
                    stderr=None if log is None else subprocess.STDOUT,
                    start_new_session=True,
                )
        except BaseException:
            self.close()
            raise

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    # -- requests

    def tokenize(self, prompt: str) -> list[int]:
        tokens = cast(list[int], self._call("tokenize", prompt))
        # a chat lane's executed record now holds the prompt it formatted
        self._executed = cast(dict[str, dict[str, Any]], self._call("executed"))
        return tokens

    def check(self, tokens: Sequence[int], max_tokens: int) -> None:
        self._call("check", list(tokens), max_tokens)

    def executed(self) -> dict[str, dict[str, Any]]:
        return self._executed

    def live(self) -> Live:
        """Per lane, while a run streams: its tokens/s so far, drafted and accepted."""
        return self._live

    def stream(
        self,
        prompt: str,
        max_tokens: int,
        stop: Sequence[str] = (),
        near_tie: float = DEFAULT_NEAR_TIE,
        teacher_forced: bool = False,
        control: bool = False,
    ) -> Iterator[TokenStep]:
        """Yield both lanes' steps as the worker produces them; `self.result` holds the
        outcome once the iterator is exhausted, a crash included. `control` runs lane a
        again, cold, in the worker after the pair (PairRun.stream)."""
        self.result = None
        self._received = {"a": [], "b": []}
        self._live = {}
        # asked first, so that a result cut short by a crash still names its prompt
        tokens = self.tokenize(prompt)
        started = datetime.now(timezone.utc).isoformat(timespec="seconds")
        self._cancel_sent_at = 0.0
        self._due.write_bytes(b"")
        self._send(
            "stream",
            self.cancel.is_set(),
            prompt,
            max_tokens,
            list(stop),
            near_tie,
            teacher_forced,
            control,
        )
        self._streaming = self._busy = True
        try:
            while True:
                try:
                    message = self._next()
                except WorkerCrashed as crash:
                    self.result = self._crashed_result(
                        crash, prompt, tokens, started, max_tokens, stop, near_tie, teacher_forced
                    )
                    return
                if message[0] == "step":
                    step, self._live = message[1], message[2]
                    self._received[step.lane].append(step)
                    yield step
                elif message[0] == "result":
                    self.result = message[1]
                    self._busy = False
                    return
                elif message[0] == "progress":
                    self._progress(message[1])
                else:
                    self._unexpected(message)
        finally:
            self._streaming = False
            if self._busy and self.alive:
                # left mid-run: the worker is still streaming, and its steps would answer
                # the next request; it is spent
                self._kill()

    # -- messages

    def _send(self, kind: str, *args: Any) -> None:
        if not self.alive:
            raise self._death()
        try:
            self._conn.send((kind, args))
        except (BrokenPipeError, ConnectionResetError, OSError):
            raise self._death() from None

    def _call(self, kind: str, *args: Any) -> Any:
        self._send(kind, *args)
        return self._reply(_quiet, "ok")[1]

    def _reply(self, progress: Progress, wanted: str) -> tuple[Any, ...]:
        """Messages until the one `wanted`, passing progress on; errors are raised."""
        while True:
            message = self._next()
            if message[0] == wanted:
                return cast(tuple[Any, ...], message)
            if message[0] == "progress":
                progress(message[1])
            else:
                self._unexpected(message)

    def _unexpected(self, message: tuple[Any, ...]) -> None:
        if message[0] == "raise":
            raise message[1]
        if message[0] == "bug":
            raise WorkerFailed(f"{self.WHO} failed: {message[1].strip().splitlines()[-1]}")
        raise WorkerFailed(f"the lanes' worker sent an unknown message {message[0]!r}")

    def _next(self) -> tuple[Any, ...]:
        """The worker's next message; WorkerCrashed once it has died and said everything."""
        while True:
            # checked on every message, not only when the worker is silent: steps may
            # arrive faster than the poll's timeout for a whole run
            self._pass_cancel_on()
            try:
                if self._streaming and self.read_every and not self._conn.poll(0):
                    time.sleep(self.read_every)
                if self._conn.poll(POLL_SECONDS):
                    return cast(tuple[Any, ...], self._conn.recv())
            except (EOFError, OSError):
                raise self._death() from None
            if not self.alive:
                try:
                    if self._conn.poll():
                        continue  # what it sent before it died is read first
                except OSError:
                    pass
                raise self._death()

    def _pass_cancel_on(self) -> None:
        """Signal the worker while a cancel is asked for: again now and then, since one
        signal may land before the worker reads the request it belongs to."""
        if not (self._streaming and self.cancel.is_set()):
            return
        now = time.monotonic()
        if now - self._cancel_sent_at >= POLL_SECONDS:
            self._cancel_sent_at = now
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(CANCEL_SIGNAL)

    # -- a crash

    def _death(self) -> WorkerCrashed:
        try:
            code: int | None = self.process.wait(CLOSE_SECONDS)
        except subprocess.TimeoutExpired:
            code = None
        how = _how_it_ended(code)
        build = self.build.get("llama_cpp_build", "unknown build")
        cpu = self.build.get("cpu") or _cpu_name()
        native = self._native_message()
        return WorkerCrashed(
            f"{self.WHO} crashed {self._doing()} ({how}) in llama.cpp {build} on {cpu}"
            + (f": {native}" if native else "")
            + f"; try {self.repack_off} (llama.cpp's repacked CPU kernels), and run "
            "`specdiff doctor` for a report"
        )

    def _doing(self) -> str:
        """What the worker was at, for the crash message."""
        return self._where() if self._streaming else "while loading or preparing the lanes"

    def _where(self) -> str:
        """The lane and step the decode loop was computing, as the worker marked it."""
        due = _DueStep.read(self._due)
        if due is None:
            return "before its first step"
        return f"in lane {due[0]} at step {due[1]}"

    def _native_message(self) -> str:
        """llama.cpp's last words (a GGML_ASSERT line), from the worker's log."""
        if self._log is None:
            return ""
        try:
            with self._log.open("rb") as handle:
                handle.seek(max(0, self._log.stat().st_size - LOG_TAIL_BYTES))
                tail = handle.read().decode("utf-8", "replace")
        except OSError:
            return ""
        lines = [line.strip() for line in tail.splitlines() if line.strip()]
        for line in reversed(lines):
            if "GGML_ASSERT" in line or "error" in line.lower():
                return printable(line)
        return ""

    def _crashed_result(
        self,
        crash: WorkerCrashed,
        prompt: str,
        tokens: list[int],
        started: str,
        max_tokens: int,
        stop: Sequence[str],
        near_tie: float,
        teacher_forced: bool,
    ) -> PairResult:
        """What arrived before the crash, as a result: every step kept, both lanes
        stopped as crashed, the crash named in both lanes' errors."""
        outcomes = {}
        lanes: tuple[tuple[LaneId, Lane], ...] = (("a", self.pair.a), ("b", self.pair.b))
        for lane_id, lane in lanes:
            live = self._live.get(lane_id, LiveStats(0.0))
            outcomes[lane_id] = LaneOutcome(
                lane_id,
                lane,
                steps=self._received[lane_id],
                stop_reason=CRASHED,
                error=str(crash),
                drafted=live.drafted,
                accepted=live.accepted,
                executed=self._executed.get(lane_id, {}),
                reported_tokens_per_second=live.tokens_per_second,
            )
        return PairResult(
            pair=self.pair,
            prompt=prompt,
            prompt_tokens=tokens,
            max_tokens=max_tokens,
            a=outcomes["a"],
            b=outcomes["b"],
            comparison=compare(outcomes["a"].steps, outcomes["b"].steps, near_tie),
            build=self.build,
            started=started,
            teacher_forced=teacher_forced,
            stop=list(stop),
        )

    # -- life cycle

    def close(self) -> None:
        """End the worker: asked to close when idle, killed when busy (loading, running,
        or a run left unfinished), with whatever it started."""
        process = getattr(self, "process", None)
        if process is not None and process.poll() is None and not self._busy:
            with contextlib.suppress(OSError):
                self._conn.send(("close", ()))
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(CLOSE_SECONDS)
        if process is not None:
            self._kill()
        self._conn.close()
        shutil.rmtree(self._folder, ignore_errors=True)

    def _kill(self) -> None:
        """The worker's whole session (a kernel probe it started too), then reap it."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(CLOSE_SECONDS)

    def __enter__(self) -> PairWorker:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _how_it_ended(code: int | None) -> str:
    if code is None:
        return "it stopped answering"
    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return f"exit status {code}"


def _cpu_name() -> str:
    # deferred: runtime is cheap to import (llama.cpp itself loads only on first use)
    from specdiff.engine.runtime import cpu_name

    return cpu_name()


# --- one function call in a worker process -------------------------------------------


def _serve_call(
    conn: Connection,
    cancel: threading.Event,
    function: Callable[..., Any],
    args: tuple[Any, ...],
    events: Sequence[str],
) -> None:
    """The child's side of `call_in_worker`: call, pass its events on, send what it returns."""
    fault = Fault.from_env()
    guard = threading.Lock()  # events may come from the function's own threads

    def handing_over(event: str) -> Callable[..., None]:
        def send(*payload: Any) -> None:
            if fault is not None:
                for step in _steps_in(payload):
                    fault.fire_at(step)
            with guard:
                conn.send(("event", event, payload))

        return send

    conn.send(("ready", _build_info()))
    handlers = {event: handing_over(event) for event in events}
    # a function returning None is answered like any other: the sentinel tells them apart
    value = _reporting(conn, lambda: (function(*args, cancel=cancel, **handlers),))
    if value is not None:
        conn.send(("ok", value[0]))


def _steps_in(payload: tuple[Any, ...]) -> Iterator[TokenStep]:
    """The steps an event hands over, alone or in a list: where a fault may fire."""
    for item in payload:
        if isinstance(item, TokenStep):
            yield item
        elif isinstance(item, (list, tuple)):
            yield from (step for step in item if isinstance(step, TokenStep))


def _build_info() -> dict[str, str]:
    """llama.cpp's build and the CPU, for a crash message; empty when llama.cpp will not load."""
    # deferred: only the child loads llama.cpp
    from specdiff.engine.runtime import build_info

    try:
        return build_info()
    except Exception:
        return {}


class _FunctionWorker(PairWorker):
    """A worker process that runs one function call instead of a pair: PairWorker's
    process, messages and crash report, asked something else."""

    WHO = "the worker"

    def __init__(self, doing: str, repack_off: str, cancel: threading.Event | None) -> None:
        self.doing = doing
        self.repack_off = repack_off
        self.cancel = cancel or threading.Event()
        self.build = {}
        self._cancel_sent_at = 0.0
        self._streaming = False
        self._spawn()

    def _doing(self) -> str:
        return f"while {self.doing}"

    def call(
        self,
        function: Callable[..., Any],
        args: Sequence[Any],
        events: Mapping[str, Callable[..., None]],
    ) -> Any:
        self._send("call", function, tuple(args), list(events))
        self.build = self._reply(_quiet, "ready")[1]
        # a cancel is passed on while the call runs, as while a pair streams
        self._streaming = True
        while True:
            message = self._next()
            if message[0] == "ok":
                return message[1]
            if message[0] == "event":
                events[message[1]](*message[2])
            else:
                self._unexpected(message)


def call_in_worker(
    function: Callable[..., T],
    args: Sequence[Any],
    events: Mapping[str, Callable[..., None]] | None = None,
    cancel: threading.Event | None = None,
    doing: str = "running",
    repack_off: str = "--lane repack=false",
) -> T:
    """`function(*args, cancel=EVENT, **events)` in a worker process, so llama.cpp runs
    there and not in the caller; its value comes back (it and its arguments pickle).

    Each of `events` is passed to the function as a keyword argument of that name, and
    the caller's callback receives what the function passes it. `cancel`, when set, sets
    the function's own cancel event. Its SpecdiffErrors are raised here; a crash raises
    WorkerCrashed naming what it was `doing` and `repack_off`, the option to try. A
    SPECDIFF_FAULT fires when an event hands over that lane's step.
    """
    events = dict(events or {})
    worker = _FunctionWorker(doing, repack_off, cancel)
    try:
        return cast(T, worker.call(function, args, events))
    finally:
        worker.close()
