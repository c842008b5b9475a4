"""One step's line in a session file: `step_record` writes a TokenStep as JSON (a piece
that is not UTF-8 as hex), `step_from` reads one back through the field checks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from specdiff.sessions.checks import (
    MAX_CANDIDATES,
    MAX_INDEX,
    MAX_LOGIT,
    MAX_PIECE_BYTES,
    MAX_SOURCE_CHARS,
    MAX_TOKEN_ID,
    check_bool,
    check_float,
    check_int,
    check_list,
    check_text,
)
from specdiff.sessions.format import LANE_IDS
from specdiff.steps import Candidate, Probe, TokenStep

# --- steps ----------------------------------------------------------------------------


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
    if step.source:
        record["source"] = step.source
    return record


def _piece_field(piece: bytes) -> str | dict[str, str]:
    """Token bytes as text where they are UTF-8, else as hex: exact either way."""
    try:
        return piece.decode("utf-8")
    except UnicodeDecodeError:
        return {"hex": piece.hex()}


def _piece_from(value: object) -> bytes:
    if isinstance(value, str):
        return _bounded_piece(value.encode("utf-8", "surrogatepass"))
    if isinstance(value, dict) and isinstance(value.get("hex"), str):
        try:
            piece = bytes.fromhex(value["hex"])
        except ValueError:
            raise ValueError(
                f"a token's hex piece must be pairs of hex digits, got {value['hex']!r:.40}"
            ) from None
        return _bounded_piece(piece)
    raise ValueError(f"a token piece must be text or {{'hex': ...}}, got {value!r:.60}")


def _bounded_piece(piece: bytes) -> bytes:
    if len(piece) > MAX_PIECE_BYTES:
        raise ValueError(f"a token piece must be at most {MAX_PIECE_BYTES} bytes, got {len(piece)}")
    return piece


def _candidates(top: object) -> tuple[Candidate, ...]:
    # The hot loop of loading (eight candidates a step): checks inlined, no helper calls.
    if type(top) is not list or not top:
        raise ValueError("top must be a list holding at least the chosen token")
    if len(top) > MAX_CANDIDATES:
        raise ValueError(f"top holds more than {MAX_CANDIDATES} candidates")
    candidates = []
    for item in top:
        if type(item) is not list or len(item) != 3:
            raise ValueError("top must be a list of [id, logit, piece] lists")
        token_id, logit, piece = item
        if type(token_id) is not int or not 0 <= token_id <= MAX_TOKEN_ID:
            raise ValueError(f"a candidate id must be from 0 to {MAX_TOKEN_ID}, got {token_id!r}")
        if type(logit) is not float or not -MAX_LOGIT <= logit <= MAX_LOGIT:  # NaN fails too
            logit = check_logit(logit, "a logit")
        piece = piece.encode("utf-8", "surrogatepass") if type(piece) is str else _piece_from(piece)
        if len(piece) > MAX_PIECE_BYTES:
            _bounded_piece(piece)
        candidates.append(Candidate(token_id, logit, piece))
    return tuple(candidates)


def check_logit(value: object, what: str) -> float:
    """A logit, log-probability or normaliser: finite and within MAX_LOGIT, so that the
    margins and probabilities computed from it stay finite."""
    number = check_float(value, what)
    if not -MAX_LOGIT <= number <= MAX_LOGIT:
        raise ValueError(f"{what} must be between -{MAX_LOGIT:g} and {MAX_LOGIT:g}, got {number}")
    return number


def _probes(value: object) -> tuple[Probe, ...]:
    probes = []
    items = check_list(value, "probes")
    if len(items) > MAX_CANDIDATES:
        raise ValueError(f"probes holds more than {MAX_CANDIDATES} entries")
    for item in items:
        if not isinstance(item, list) or len(item) != 3:
            raise ValueError("probes must be a list of [id, logit, rank] lists")
        token_id, logit, rank = item
        probes.append(
            Probe(
                check_int(token_id, "a probe id", 0, MAX_TOKEN_ID),
                check_logit(logit, "a probe logit"),
                check_int(rank, "a probe rank", 1, MAX_TOKEN_ID),
            )
        )
    return tuple(probes)


def step_from(record: Mapping[str, Any]) -> TokenStep:
    """One step line; raises ValueError naming the bad field, KeyError a missing one."""
    if "piece" in record:
        piece = _piece_from(record["piece"])
    elif "piece_hex" in record:
        piece = _piece_from({"hex": record["piece_hex"]})
    else:
        raise ValueError("missing field 'piece' (or 'piece_hex')")
    lane = record["lane"]
    if lane not in LANE_IDS:
        raise ValueError(f"lane {lane!r:.20} is not 'a' or 'b'")
    lse = record.get("logsumexp")
    return TokenStep(
        lane=lane,
        index=check_int(record["index"], "index", 0, MAX_INDEX),
        token_id=check_int(record["token_id"], "token_id", 0, MAX_TOKEN_ID),
        piece=piece,
        top=_candidates(record["top"]),
        drafted=check_bool(record["drafted"], "drafted"),
        verify_width=check_int(record["verify_width"], "verify_width", 1, MAX_INDEX),
        timestamp=check_float(record["timestamp"], "timestamp"),
        probes=_probes(record.get("probes", [])),
        logsumexp=None if lse is None else check_logit(lse, "logsumexp"),
        source=_source(record.get("source", "")),
    )


def _source(value: object) -> str:
    """Where a step's candidates came from, as the fork panel and reports quote it."""
    text = check_text(value, "source")
    if len(text) > MAX_SOURCE_CHARS:
        raise ValueError(f"source must be at most {MAX_SOURCE_CHARS} characters, got {len(text)}")
    return text
