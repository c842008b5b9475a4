"""Sessions: one pair run as one JSONL file.

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
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any

from specdiff import __version__
from specdiff.compare import DEFAULT_NEAR_TIE, Comparison, compare
from specdiff.engine.pairrun import PairResult
from specdiff.errors import SpecdiffError
from specdiff.lanes import Pair, lane_from_dict
from specdiff.steps import Candidate, Probe, TokenStep

SCHEMA_VERSION = 1
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
    """Time, pair and a short hash of the prompt; only [A-Za-z0-9._-]."""
    when = when or datetime.now(timezone.utc)
    digest = hashlib.sha256(prompt.encode("utf-8")).hexdigest()[:8]
    return f"{when.strftime('%Y%m%dT%H%M%SZ')}-{safe_name(pair)[:40]}-{digest}"


def safe_name(text: str) -> str:
    """Only [A-Za-z0-9._-], no leading dot or dash: safe as a file name anywhere."""
    # cut before stripping, so that applying it twice gives the same name
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text)[:120].strip("-.") or "session"


def step_record(step: TokenStep) -> dict[str, Any]:
    record: dict[str, Any] = {
        "type": "step",
        "lane": step.lane,
        "index": step.index,
        "token_id": step.token_id,
        "top": [[c.token_id, c.logit, _piece_field(c.piece)] for c in step.top],
        "drafted": step.drafted,
        "verify_width": step.verify_width,
        "timestamp": step.timestamp,
    }
    piece = _piece_field(step.piece)
    if isinstance(piece, str):
        record["piece"] = piece
    else:
        record["piece_hex"] = piece["hex"]
    if step.probes:
        record["probes"] = [[p.token_id, p.logit, p.rank] for p in step.probes]
    if step.logsumexp is not None:
        record["logsumexp"] = step.logsumexp
    return record


def _piece_field(piece: bytes) -> str | dict[str, str]:
    """Token bytes as text where they are UTF-8, else as hex: exact either way."""
    try:
        return piece.decode("utf-8")
    except UnicodeDecodeError:
        return {"hex": piece.hex()}


def _piece_from(value: object) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    if isinstance(value, dict) and isinstance(value.get("hex"), str):
        return bytes.fromhex(value["hex"])
    raise ValueError(f"a token piece must be text or {{'hex': ...}}, got {value!r}")


def header_record(
    pair: Pair,
    prompt: str,
    prompt_tokens: list[int],
    max_tokens: int,
    stop: list[str],
    executed: dict[str, dict[str, Any]],
    build: dict[str, str],
    created: str,
    teacher_forced: bool = False,
) -> dict[str, Any]:
    """Everything needed to re-run the session: prompt, limits, both lanes in full, and
    what executed them."""
    header = {
        "type": "header",
        "schema": SCHEMA_VERSION,
        "specdiff": __version__,
        "created": created,
        "pair": pair.name,
        "description": pair.description,
        "prompt": prompt,
        "prompt_token_ids": prompt_tokens,
        "max_tokens": max_tokens,
        "stop": stop,
        "lanes": {"a": pair.a.as_dict(), "b": pair.b.as_dict()},
        "executed": executed,
        "build": build,
    }
    if teacher_forced:
        header["teacher_forced"] = True
    return header


def result_header(result: PairResult, stop: list[str] | None = None) -> dict[str, Any]:
    return header_record(
        result.pair,
        result.prompt,
        result.prompt_tokens,
        result.max_tokens,
        stop or [],
        {"a": result.a.executed, "b": result.b.executed},
        result.build,
        result.started,
        result.teacher_forced,
    )


def footer_record(result: PairResult) -> dict[str, Any]:
    comparison = result.comparison
    fork = comparison.fork
    return {
        "type": "footer",
        "identical": comparison.identical,
        "fork_index": None if fork is None else fork.index,
        "fork_margins": None if fork is None else [fork.a.margin, fork.b.margin],
        "generated": [comparison.length_a, comparison.length_b],
        "tokens_per_second": [result.a.tokens_per_second, result.b.tokens_per_second],
        "output_sha256": [
            hashlib.sha256(b"".join(s.piece for s in outcome.steps)).hexdigest()
            for outcome in (result.a, result.b)
        ],
        "stop_reasons": [result.a.stop_reason, result.b.stop_reason],
        "errors": [result.a.error, result.b.error],
        "cancelled": result.cancelled,
        "drafted": [result.a.drafted, result.b.drafted],
        "accepted": [result.a.accepted, result.b.accepted],
    }


def _line(handle: IO[str], record: dict[str, Any]) -> None:
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
    ) -> None:
        """`name` (sanitised) replaces the generated time-pair-hash name."""
        self.folder = sessions_dir(directory)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise SessionError(
                f"cannot create the sessions folder {self.folder}: {error.strerror}"
            ) from None
        self.base = session_name(pair_name, prompt) if name is None else safe_name(name)
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

    def write(self, record: dict[str, Any]) -> None:
        _line(self.handle, record)

    def step(self, step: TokenStep) -> None:
        _line(self.handle, step_record(step))

    def finish(self, footer: dict[str, Any]) -> Path:
        _line(self.handle, footer)
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


def save_result(
    result: PairResult, directory: str | Path | None = None, stop: list[str] | None = None
) -> Path:
    """Write a finished run as a session; never overwrites; returns the final path."""
    writer = SessionWriter(directory, result.pair.name, result.prompt)
    writer.write(result_header(result, stop))
    for step in interleaved(result):
        writer.step(step)
    return writer.finish(footer_record(result))


def interleaved(result: PairResult) -> Iterable[TokenStep]:
    """Both lanes' steps in the order a pair run produces them (a's i, then b's i)."""
    a, b = result.a.steps, result.b.steps
    for index in range(max(len(a), len(b))):
        if index < len(a):
            yield a[index]
        if index < len(b):
            yield b[index]


@dataclass
class Session:
    path: Path
    header: dict[str, Any]
    steps: dict[str, list[TokenStep]] = field(default_factory=lambda: {"a": [], "b": []})
    footer: dict[str, Any] | None = None
    order: list[str] = field(default_factory=list)
    """The lane of each step line, in file order: the order they were produced."""

    @property
    def partial(self) -> bool:
        return self.footer is None

    @property
    def pair(self) -> Pair:
        lanes = self.header["lanes"]
        return Pair(
            str(self.header["pair"]),
            lane_from_dict(lanes["a"]),
            lane_from_dict(lanes["b"]),
            str(self.header.get("description", "")),
        )

    @property
    def prompt(self) -> str:
        return str(self.header["prompt"])

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


MAX_TOKEN_ID = 1 << 31
MAX_INDEX = 1 << 24


def _int(record: dict[str, Any], key: str, low: int, high: int) -> int:
    value = record[key]
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{key} must be a whole number from {low} to {high}, got {value!r}")
    return value


def _float(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what} must be a number, got {value!r}")
    number = float(value)
    if number != number:  # NaN: never produced by a real run
        raise ValueError(f"{what} must not be NaN")
    return number


def _pairs(value: object, width: int, what: str) -> list[list[Any]]:
    if not isinstance(value, list) or not all(
        isinstance(item, list) and len(item) == width for item in value
    ):
        raise ValueError(f"{what} must be a list of {width}-item lists")
    return value


def _candidates(top: object) -> tuple[Candidate, ...]:
    # The hot loop of loading (eight candidates a step): checks inlined, no helper calls.
    if type(top) is not list or not top:
        raise ValueError("top must be a list holding at least the chosen token")
    candidates = []
    for item in top:
        if type(item) is not list or len(item) != 3:
            raise ValueError("top must be a list of [id, logit, piece] lists")
        token_id, logit, piece = item
        if type(token_id) is not int or not 0 <= token_id <= MAX_TOKEN_ID:
            raise ValueError(f"a candidate id must be from 0 to {MAX_TOKEN_ID}, got {token_id!r}")
        if type(logit) is not float:
            logit = _float(logit, "a logit")
        elif logit != logit:
            raise ValueError("a logit must not be NaN")
        piece = piece.encode("utf-8", "surrogatepass") if type(piece) is str else _piece_from(piece)
        candidates.append(Candidate(token_id, logit, piece))
    return tuple(candidates)


def _step_from(record: dict[str, Any]) -> TokenStep:
    if "piece" in record:
        piece = _piece_from(record["piece"])
    elif "piece_hex" in record:
        piece = _piece_from({"hex": record["piece_hex"]})
    else:
        raise ValueError("missing field 'piece' (or 'piece_hex')")
    top = record["top"]
    probes = _pairs(record.get("probes", []), 3, "probes")
    drafted = record["drafted"]
    if not isinstance(drafted, bool):
        raise ValueError(f"drafted must be true or false, got {drafted!r}")
    lse = record.get("logsumexp")
    return TokenStep(
        lane=record["lane"],
        index=_int(record, "index", 0, MAX_INDEX),
        token_id=_int(record, "token_id", 0, MAX_TOKEN_ID),
        piece=piece,
        top=_candidates(top),
        drafted=drafted,
        verify_width=_int(record, "verify_width", 1, MAX_INDEX),
        timestamp=_float(record["timestamp"], "timestamp"),
        probes=tuple(
            Probe(
                _int({"id": t}, "id", 0, MAX_TOKEN_ID),
                _float(v, "a probe logit"),
                _int({"rank": r}, "rank", 1, MAX_TOKEN_ID),
            )
            for t, v, r in probes
        ),
        logsumexp=None if lse is None else _float(lse, "logsumexp"),
    )


MAX_LINE_BYTES = 4 * 1024 * 1024
"""No real record comes near this (a step is ~1 KB, a header ~10 KB plus the prompt)."""


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


class SessionStream:
    """Reads a session in pieces: the header at once, then steps as they are asked for.

    A replay shows its first frame after reading the first steps and reads the rest
    while it plays; the checks are load_session's, line by line.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            self.handle = self.path.open("rb")
        except FileNotFoundError:
            raise SessionError(f"session file not found: {self.path}") from None
        except OSError as error:
            raise SessionError(f"cannot read session file {self.path}: {error.strerror}") from None
        self.number = 0
        self.done = False
        self._pending: SessionError | None = None
        try:
            header = None
            while header is None:
                record = self._next_record()
                if record is None:
                    raise SessionError(f"{self.path}: empty file, not a session")
                header = self._header(record)
        except BaseException:
            self.close()
            raise
        self.session = Session(self.path, header)

    def _next_record(self) -> dict[str, Any] | None:
        while True:
            raw = self.handle.readline(MAX_LINE_BYTES + 1)
            if not raw:
                return None
            self.number += 1
            try:
                if len(raw) > MAX_LINE_BYTES:
                    raise ValueError(f"line longer than {MAX_LINE_BYTES} bytes")
                line = raw.decode("utf-8")
                if not line.strip():
                    continue
                record = json.loads(line)
                if not isinstance(record, dict):
                    raise ValueError("a line must hold a JSON object")
                return record
            except UnicodeDecodeError:
                raise SessionError(f"{self.path}:{self.number}: not UTF-8 text") from None
            except (ValueError, TypeError, OverflowError) as error:
                raise SessionError(f"{self.path}:{self.number}: {_reason(error)}") from None

    def _header(self, record: dict[str, Any]) -> dict[str, Any]:
        try:
            if record["type"] != "header":
                raise ValueError("the first line must be the header")
            if record.get("schema") != SCHEMA_VERSION:
                raise ValueError(f"schema version {record.get('schema')!r} is unknown")
            for lane_id in ("a", "b"):
                lane_from_dict(record["lanes"][lane_id])
            if not isinstance(record["prompt"], str):
                raise ValueError("the prompt must be text")
            if not isinstance(record["pair"], str):
                raise ValueError("the pair must be a name")
            max_tokens = record["max_tokens"]
            if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
                raise ValueError(f"max_tokens must be a whole number >= 1, got {max_tokens!r}")
        except (ValueError, KeyError, TypeError, OverflowError, SpecdiffError) as error:
            raise SessionError(f"{self.path}:{self.number}: {_reason(error)}") from None
        return record

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
                    self.close()
                    break
                try:
                    kind = record["type"]
                    if kind == "step":
                        step = _step_from(record)
                        if step.lane not in ("a", "b"):
                            raise ValueError(f"lane {step.lane!r} is not 'a' or 'b'")
                        if step.index != len(session.steps[step.lane]):
                            raise ValueError(f"step index {step.index} is out of order")
                        session.steps[step.lane].append(step)
                        session.order.append(step.lane)
                        steps.append(step)
                    elif kind == "footer":
                        session.footer = record
                    elif kind == "header":
                        raise ValueError("a second header")
                    else:
                        raise ValueError(f"unknown record type {kind!r}")
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
