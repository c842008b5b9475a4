"""Session files written and read as they stream: one pair run as one JSONL file.

Line 1 is a header (schema version, specdiff version, prompt, both lanes in full, what
executed, build), then one line per TokenStep in the order they were produced, then a
footer with the summary. A writer flushes every line, so a crash loses at most the
line being written; it writes to ``NAME.jsonl.partial`` and renames to ``NAME.jsonl``
when the run ends, so a finished session appears atomically and an unfinished one is
recognisable by its name and its missing footer.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any, BinaryIO, Protocol

from specdiff.compare import DEFAULT_NEAR_TIE, Comparison, compare
from specdiff.errors import SpecdiffError
from specdiff.files import naming, open_for_reading
from specdiff.lanes import Pair
from specdiff.sessions.codec import step_from, step_record
from specdiff.sessions.header import SessionHeader
from specdiff.sessions.records import RunSummary
from specdiff.steps import TokenStep

SUFFIX = ".jsonl"
PARTIAL_SUFFIX = ".jsonl.partial"


class SessionError(SpecdiffError):
    """A session file that cannot be read, named with its line."""


def sessions_dir(override: str | Path | None = None) -> Path:
    """--sessions-dir, else `sessions_dir` in the config file, else ./sessions when it
    exists, else the user data directory."""
    from specdiff.config import config_value

    override = override or config_value("sessions_dir")
    if override:
        return Path(override).expanduser()
    local = Path("sessions")
    if local.is_dir():
        return local
    import platformdirs

    return Path(platformdirs.user_data_dir("specdiff")) / "sessions"


def session_name(pair: str, prompt: str, when: datetime | None = None) -> str:
    """Time (UTC), pair and a short hash of the prompt; only [A-Za-z0-9._-]."""
    when = (when or datetime.now(timezone.utc)).astimezone(timezone.utc)
    digest = hashlib.sha256(prompt.encode("utf-8")).hexdigest()[:8]
    return f"{when.strftime('%Y%m%dT%H%M%SZ')}-{safe_name(pair)[:40]}-{digest}"


def start_time(created: str) -> datetime | None:
    """A header's `created` (ISO 8601) as a time, None where it is not one; a time
    without a zone is UTC, as specdiff writes it."""
    try:
        when = datetime.fromisoformat(created)
    except ValueError:
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)


def safe_name(text: str) -> str:
    """Only [A-Za-z0-9._-], no leading dot or dash: safe as a file name anywhere."""
    # cut before stripping, so that applying it twice gives the same name
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text)[:120].strip("-.") or "session"


def _line(handle: IO[str], record: dict[str, Any]) -> None:
    with naming(handle.name):  # a full disk names the session file, not "the output"
        handle.write(json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n")
        handle.flush()


class SessionWriter:
    """Writes a session as it happens: every line flushed, so a crash or a kill leaves
    ``NAME.jsonl.partial`` with every step written so far (a valid partial session);
    `finish` adds the footer and renames it to ``NAME.jsonl``, never over another file."""

    def __init__(
        self,
        directory: str | Path | None,
        pair_name: str,
        prompt: str,
        name: str | None = None,
        started: str | None = None,
    ) -> None:
        """`name` (sanitised) replaces the generated time-pair-hash name; `started`, the
        header's `created`, is the time in that name (the list shows it), else now."""
        self.folder = sessions_dir(directory)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise SessionError(
                f"cannot create the sessions folder {self.folder}: {error.strerror}"
            ) from None
        when = None if started is None else start_time(started)
        self.base = session_name(pair_name, prompt, when) if name is None else safe_name(name)
        for attempt in range(1000):
            name = self.base if attempt == 0 else f"{self.base}-{attempt}"
            self.final = self.folder / f"{name}{SUFFIX}"
            self.partial = self.folder / f"{name}{PARTIAL_SUFFIX}"
            if self.final.exists():
                continue
            try:
                self.handle: IO[str] = self.partial.open("x", encoding="utf-8")
            except FileExistsError:
                continue
            except OSError as error:
                raise SessionError(f"cannot write {self.partial}: {error.strerror}") from None
            return
        raise SessionError(f"no free session name for {self.base} in {self.folder}")

    def header(self, header: SessionHeader) -> None:
        _line(self.handle, header.to_json())

    def step(self, step: TokenStep) -> None:
        _line(self.handle, step_record(step))

    def finish(self, summary: RunSummary) -> Path:
        _line(self.handle, summary.to_json())
        os.fsync(self.handle.fileno())
        self.handle.close()
        final = self.final
        try:
            while True:
                try:
                    os.link(self.partial, final)  # fails rather than replace an existing file
                    break
                except FileExistsError:
                    final = final.with_name(f"{final.stem}-{os.getpid()}{SUFFIX}")
            self.partial.unlink()
        except OSError as error:
            raise SessionError(
                f"the session is complete in {self.partial} but could not be renamed to "
                f"{final.name}: {error.strerror}"
            ) from None
        return final

    def abandon(self) -> None:
        """The run never started (bad input): leave no file behind."""
        self.handle.close()
        self.partial.unlink(missing_ok=True)


class _LaneSteps(Protocol):
    @property
    def steps(self) -> Sequence[TokenStep]: ...


class FinishedRun(Protocol):
    """What `save_result` writes: a `specdiff.results.PairResult`, read only through
    these (the results module sits above the session files and imports them)."""

    @property
    def pair(self) -> Pair: ...

    @property
    def prompt(self) -> str: ...

    @property
    def a(self) -> _LaneSteps: ...

    @property
    def b(self) -> _LaneSteps: ...

    def header(self) -> SessionHeader: ...

    def summary(self) -> RunSummary: ...


def save_result(result: FinishedRun, directory: str | Path | None = None) -> Path:
    """Write a finished run as a session, named by the time it started (as the list
    shows it), not the time it is saved; never overwrites; returns the final path."""
    header = result.header()
    writer = SessionWriter(directory, result.pair.name, result.prompt, started=header.created)
    writer.header(header)
    for step in interleaved(result):
        writer.step(step)
    return writer.finish(result.summary())


def interleaved(result: FinishedRun) -> Iterable[TokenStep]:
    """Both lanes' steps in the order a pair run produces them (a's i, then b's i)."""
    a, b = result.a.steps, result.b.steps
    for index in range(max(len(a), len(b))):
        if index < len(a):
            yield a[index]
        if index < len(b):
            yield b[index]


@dataclass
class Session:
    """A session file as read: its header, each lane's steps, and its footer (None
    while the run was still going or was killed)."""

    path: Path
    header: SessionHeader
    steps: dict[str, list[TokenStep]] = field(default_factory=lambda: {"a": [], "b": []})
    footer: RunSummary | None = None
    order: list[str] = field(default_factory=list)
    """The lane of each step line, in file order: the order they were produced."""
    cut_line: int | None = None
    """The number of the last line when the file ends inside it (a disk that filled, a
    crash mid-write, a copy cut short): the session holds every line before it."""

    @property
    def partial(self) -> bool:
        return self.footer is None

    @property
    def pair(self) -> Pair:
        return self.header.pair

    @property
    def prompt(self) -> str:
        return self.header.prompt

    @property
    def stopped(self) -> bool:
        """The run did not finish: killed (no footer), cancelled, or crashed."""
        return self.footer is None or self.footer.cancelled or self.footer.crashed

    def summary(self) -> RunSummary:
        """What the steps read imply, with the footer's measurements (speeds, times,
        drafts, errors) where there is one: the comparison is always recomputed, so a
        file whose footer was written by an older release, or lost, reads the same."""
        derived = RunSummary.of_steps(
            self.steps["a"],
            self.steps["b"],
            teacher_forced=self.header.teacher_forced,
            cancelled=self.footer is not None and self.footer.cancelled,
        )
        if self.footer is None:
            return derived
        # the footer's class used the run's own near-tie threshold, so it stands where it
        # classes the fork the steps show; a file written before classes were recorded,
        # or whose footer names another fork, gets one from its steps
        keeps_class = (
            self.footer.fork_class is not None
            and derived.fork_index is not None
            and self.footer.fork_index == derived.fork_index
        )
        kept = self.footer if keeps_class else derived
        return replace(
            self.footer,
            identical=derived.identical,
            fork_index=derived.fork_index,
            fork_margins=derived.fork_margins,
            generated=derived.generated,
            output_sha256=derived.output_sha256,
            fork_class=kept.fork_class,
            near_tie=kept.near_tie,
        )

    @property
    def cut_note(self) -> str | None:
        """Where the file was cut, for the reader to say: None when it ends whole."""
        if self.cut_line is None:
            return None
        where = "before the first step"
        if self.order:
            lane_id = self.order[-1]
            where = f"after step {self.steps[lane_id][-1].index} of lane {lane_id}"
        return f"cut {where}: line {self.cut_line} is incomplete"

    def recorded_steps(self) -> list[TokenStep]:
        """Both lanes' steps in the order they were produced."""
        if len(self.order) != len(self.steps["a"]) + len(self.steps["b"]):
            return sorted(self.steps["a"] + self.steps["b"], key=lambda step: step.timestamp)
        taken = {"a": 0, "b": 0}
        ordered = []
        for lane_id in self.order:
            ordered.append(self.steps[lane_id][taken[lane_id]])
            taken[lane_id] += 1
        return ordered

    def comparison(self, threshold: float = DEFAULT_NEAR_TIE) -> Comparison:
        return compare(self.steps["a"], self.steps["b"], threshold)


MAX_LINE_BYTES = 4 * 1024 * 1024
"""No real record comes near this (a step is ~1 KB, a header ~10 KB plus the prompt)."""
BOM = b"\xef\xbb\xbf"


def parse_line(raw: bytes, first: bool = False) -> dict[str, Any] | None:
    """One line of a session file as a JSON object, None for a blank line; ValueError
    saying what is wrong with it. `raw` holds at most MAX_LINE_BYTES + 1 bytes: one
    more says the line is longer than any record."""
    if len(raw) > MAX_LINE_BYTES:
        raise ValueError(f"line longer than {MAX_LINE_BYTES} bytes")
    if first and raw.startswith(BOM):  # an editor that saved the file may add one
        raw = raw[len(BOM) :]
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("not UTF-8 text") from None
    if not line.strip():
        return None
    try:
        record = json.loads(line)
    except RecursionError:
        raise ValueError("JSON nested too deep to be a session record") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"not valid JSON: {error.msg} at column {error.colno}") from None
    if not isinstance(record, dict):
        raise ValueError("a line must hold a JSON object")
    return record


def ends_mid_line(raw: bytes) -> bool:
    """The file ends inside this line: no newline, and not stopped by the length limit
    (readline stops only there, at a newline, or at the end of the file)."""
    return not raw.endswith(b"\n") and len(raw) <= MAX_LINE_BYTES


def load_session(path: str | Path) -> Session:
    """Read a session file; a partial one (no footer) loads with `partial` set.

    Every problem is a SessionError naming the file and line: bytes that are not UTF-8,
    a line longer than MAX_LINE_BYTES, JSON that does not parse, a record of the wrong
    shape, steps out of order.
    """
    with SessionStream(path) as stream:
        while not stream.done:
            stream.read(1 << 30)
        return stream.session


def open_regular(path: Path) -> BinaryIO:
    """The session file opened for reading, refused unless it is a regular file: a named
    pipe would block the open until some writer came, and a device never ends."""
    try:
        descriptor, kind = open_for_reading(path)
    except FileNotFoundError:
        raise SessionError(f"session file not found: {path}") from None
    except OSError as error:
        raise SessionError(f"cannot read session file {path}: {error.strerror}") from None
    if kind is not None:
        os.close(descriptor)
        raise SessionError(f"{path} is {kind}, not a session file; name a .jsonl session file")
    return os.fdopen(descriptor, "rb")


class SessionStream:
    """Reads a session in pieces: the header at once, then steps as they are asked for.

    A replay shows its first frame after reading the first steps and reads the rest
    while it plays; the checks are load_session's, line by line.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.handle = open_regular(self.path)
        self.number = 0
        self.done = False
        self.cut_line: int | None = None
        self._pending: SessionError | None = None
        try:
            record = self._next_record()
            if record is None:
                raise SessionError(self._no_header())
            header = self._header(record)
        except BaseException:
            self.close()
            raise
        self.session = Session(self.path, header)

    def _no_header(self) -> str:
        if self.cut_line is not None:
            return f"{self.path}: the file ends inside its header line; it holds no session"
        return f"{self.path}: empty file, not a session"

    def _next_record(self) -> dict[str, Any] | None:
        """The next record; None at the end of the file, or at a last line the file ends
        inside (`cut_line` then names it)."""
        while True:
            try:
                raw = self.handle.readline(MAX_LINE_BYTES + 1)
            except OSError as error:
                raise SessionError(f"cannot read {self.path}: {error.strerror}") from None
            if not raw:
                return None
            self.number += 1
            try:
                record = parse_line(raw, first=self.number == 1)
            except ValueError as error:
                if ends_mid_line(raw):
                    self.cut_line = self.number
                    return None
                raise SessionError(f"{self.path}:{self.number}: {error}") from None
            if record is not None:
                return record

    def _header(self, record: dict[str, Any]) -> SessionHeader:
        try:
            return SessionHeader.from_json(record)
        except (ValueError, KeyError, TypeError, OverflowError, SpecdiffError) as error:
            raise SessionError(f"{self.path}:{self.number}: {_reason(error)}") from None

    def read(self, limit: int) -> list[TokenStep]:
        """Up to `limit` more steps (fewer at the end, where `done` becomes True).

        A bad line ends the reading: the steps before it are returned first, and the
        SessionError naming it is raised by the next call."""
        self.check()
        session = self.session
        steps: list[TokenStep] = []
        try:
            while len(steps) < limit:
                record = self._next_record()
                if record is None:
                    self.done = True
                    session.cut_line = self.cut_line
                    self.close()
                    break
                try:
                    kind = record.get("type")
                    if session.footer is not None:
                        raise ValueError("a line after the footer, which ends a session")
                    if kind == "step":
                        step = step_from(record)
                        if step.index != len(session.steps[step.lane]):
                            raise ValueError(f"step index {step.index} is out of order")
                        session.steps[step.lane].append(step)
                        session.order.append(step.lane)
                        steps.append(step)
                    elif kind == "footer":
                        session.footer = RunSummary.from_json(record)
                    elif kind == "header":
                        raise ValueError("a second header")
                    else:
                        raise ValueError(f"unknown record type {kind!r:.40}")
                except (ValueError, KeyError, TypeError, OverflowError, SpecdiffError) as error:
                    raise SessionError(f"{self.path}:{self.number}: {_reason(error)}") from None
        except SessionError as error:
            self.close()
            if not steps:
                raise
            self._pending = error
        except BaseException:
            self.close()
            raise
        return steps

    def check(self) -> None:
        """Raise the error that ended the reading, if a bad line did."""
        if self._pending is not None:
            raise self._pending

    def close(self) -> None:
        self.handle.close()

    def __enter__(self) -> SessionStream:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _reason(error: Exception) -> str:
    if isinstance(error, KeyError):
        return f"missing field {error.args[0]!r}"
    return str(error) or type(error).__name__
