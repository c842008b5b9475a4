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
from specdiff.errors import SpecdiffError
from specdiff.lanes import Lane, Pair, lane_from_dict
from specdiff.pairrun import PairResult
from specdiff.steps import Candidate, Probe, TokenStep

SCHEMA_VERSION = 1
SUFFIX = ".jsonl"
PARTIAL_SUFFIX = ".jsonl.partial"


class SessionError(SpecdiffError):
    """A session file that cannot be read, named with its line."""


def sessions_dir(override: str | Path | None = None) -> Path:
    """--sessions-dir, else ./sessions when it exists, else the user data directory."""
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
    safe_pair = re.sub(r"[^A-Za-z0-9._-]+", "-", pair).strip("-.") or "pair"
    return f"{when.strftime('%Y%m%dT%H%M%SZ')}-{safe_pair[:40]}-{digest}"


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
        return value.encode("utf-8")
    if isinstance(value, dict) and isinstance(value.get("hex"), str):
        return bytes.fromhex(value["hex"])
    raise ValueError(f"a token piece must be text or {{'hex': ...}}, got {value!r}")


def header_record(result: PairResult) -> dict[str, Any]:
    return {
        "type": "header",
        "schema": SCHEMA_VERSION,
        "specdiff": __version__,
        "created": result.started,
        "pair": result.pair.name,
        "description": result.pair.description,
        "prompt": result.prompt,
        "prompt_token_ids": result.prompt_tokens,
        "max_tokens": result.max_tokens,
        "lanes": {"a": result.a.lane.as_dict(), "b": result.b.lane.as_dict()},
        "executed": {"a": result.a.executed, "b": result.b.executed},
        "build": result.build,
    }


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
    }


def _line(handle: IO[str], record: dict[str, Any]) -> None:
    handle.write(json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n")
    handle.flush()


def save_result(result: PairResult, directory: str | Path | None = None) -> Path:
    """Write a finished run as a session; never overwrites; returns the final path."""
    folder = sessions_dir(directory)
    folder.mkdir(parents=True, exist_ok=True)
    base = session_name(result.pair.name, result.prompt)
    for attempt in range(1000):
        name = base if attempt == 0 else f"{base}-{attempt}"
        final = folder / f"{name}{SUFFIX}"
        partial = folder / f"{name}{PARTIAL_SUFFIX}"
        if final.exists():
            continue
        try:
            handle = partial.open("x", encoding="utf-8")
        except FileExistsError:
            continue
        with handle:
            _line(handle, header_record(result))
            for step in interleaved(result):
                _line(handle, step_record(step))
            _line(handle, footer_record(result))
            os.fsync(handle.fileno())
        try:
            os.link(partial, final)  # fails rather than replace a file that appeared meanwhile
        except FileExistsError:
            continue
        partial.unlink()
        return final
    raise SessionError(f"no free session name for {base} in {folder}")


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

    def comparison(self, threshold: float = DEFAULT_NEAR_TIE) -> Comparison:
        return compare(self.steps["a"], self.steps["b"], threshold)


def _step_from(record: dict[str, Any]) -> TokenStep:
    if "piece" in record:
        piece = str(record["piece"]).encode("utf-8")
    else:
        piece = bytes.fromhex(str(record["piece_hex"]))
    return TokenStep(
        lane=record["lane"],
        index=int(record["index"]),
        token_id=int(record["token_id"]),
        piece=piece,
        top=tuple(Candidate(int(t), float(v), _piece_from(p)) for t, v, p in record["top"]),
        drafted=bool(record["drafted"]),
        verify_width=int(record["verify_width"]),
        timestamp=float(record["timestamp"]),
        probes=tuple(Probe(int(t), float(v), int(r)) for t, v, r in record.get("probes", [])),
        logsumexp=None if record.get("logsumexp") is None else float(record["logsumexp"]),
    )


def load_session(path: str | Path) -> Session:
    """Read a session file; a partial one (no footer) loads with `partial` set."""
    path = Path(path)
    try:
        handle = path.open(encoding="utf-8")
    except FileNotFoundError:
        raise SessionError(f"session file not found: {path}") from None
    session: Session | None = None
    with handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                kind = record["type"]
                if session is None:
                    if kind != "header":
                        raise ValueError("the first line must be the header")
                    if record.get("schema") != SCHEMA_VERSION:
                        raise ValueError(f"schema version {record.get('schema')!r} is unknown")
                    session = Session(path, record)
                    Lane(**record["lanes"]["a"])
                    Lane(**record["lanes"]["b"])
                elif kind == "step":
                    step = _step_from(record)
                    if step.lane not in ("a", "b"):
                        raise ValueError(f"lane {step.lane!r} is not 'a' or 'b'")
                    if step.index != len(session.steps[step.lane]):
                        raise ValueError(f"step index {step.index} is out of order")
                    session.steps[step.lane].append(step)
                elif kind == "footer":
                    session.footer = record
                else:
                    raise ValueError(f"unknown record type {kind!r}")
            except (ValueError, KeyError, TypeError, SpecdiffError) as error:
                raise SessionError(f"{path}:{number}: {error}") from None
    if session is None:
        raise SessionError(f"{path}: empty file, not a session")
    return session
