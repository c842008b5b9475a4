"""Checking a session against a re-run of its lanes: the first step whose token came out
differently and its class (a drift is a fork between the recording and the re-run), what
changed in the build, the system and the lanes since the recording, and the likely cause
of a drift."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from specdiff.compare import ForkVerdict, fork_between, fork_sentence, fork_verdict
from specdiff.safe_text import visible
from specdiff.sessions.format import SessionHeader
from specdiff.sessions.store import Session
from specdiff.steps import TokenStep

BUILD_KEYS = ("llama_cpp_build", "llama_cpp_python", "system_info", "cpu", "specdiff")
"""What in the build and the machine can change a greedy decode."""
EXECUTED_KEYS = ("model_sha256", "threads", "n_batch", "n_ubatch", "repack")
"""What in a lane, as llama.cpp applied it, can change a greedy decode."""
CPU_KEYS = ("system_info", "cpu")
"""What names the machine: another CPU, or another instruction set, picks other kernels."""
FEATURE = re.compile(r"([A-Za-z0-9_]+) = 1\b")
"""One feature llama.cpp's system info reports on, e.g. `AVX512 = 1`."""
WIDEST_FIRST = ("AMX_INT8", "AVX512", "AVX2", "AVX", "SSE3", "SVE", "NEON")
"""Vector instruction sets, widest first: the one that names a CPU's kernels."""


@dataclass(frozen=True)
class Drift:
    """The first step of a lane where the re-run left the recording."""

    index: int
    lane: str
    recorded: int | None
    now: int | None
    """`recorded` and `now` are both None when the lane stopped at another length."""

    @property
    def length_changed(self) -> bool:
        return self.recorded is None


def lane_drift(lane: str, recorded: Sequence[int], rerun: Sequence[int]) -> Drift | None:
    """Where `rerun` first differs from `recorded`, or ends at another length."""
    for index, (old, new) in enumerate(zip(recorded, rerun)):
        if old != new:
            return Drift(index, lane, old, new)
    if len(recorded) != len(rerun):
        return Drift(min(len(recorded), len(rerun)), lane, None, None)
    return None


def first_drift(session: Session, rerun: Mapping[str, Sequence[int]]) -> Drift | None:
    """The earliest drift over both lanes (lane a's first at the same step); None when
    every recorded token came out again."""
    drifts = []
    for lane_id in ("a", "b"):
        recorded = [step.token_id for step in session.steps[lane_id]]
        fresh = rerun[lane_id]
        if session.stopped:
            fresh = fresh[: len(recorded)]  # a stopped or killed run is checked as far as it got
        drift = lane_drift(lane_id, recorded, fresh)
        if drift is not None:
            drifts.append(drift)
    return min(drifts, key=lambda drift: (drift.index, drift.lane), default=None)


def drift_verdict(
    session: Session, drift: Drift, rerun: Mapping[str, Sequence[TokenStep]]
) -> ForkVerdict | None:
    """The drift's class, read as a fork between the recorded step ("a") and the re-run's
    ("b"); None where the lane only stopped at another length."""
    if drift.length_changed:
        return None
    return fork_verdict(session.steps[drift.lane][drift.index], rerun[drift.lane][drift.index])


def drift_lines(
    session: Session, drift: Drift, rerun: Mapping[str, Sequence[TokenStep]]
) -> list[str]:
    """Where the re-run left the recording, and what kind of fork that is."""
    where = f"DRIFT at step {drift.index} of lane {drift.lane}"
    verdict = drift_verdict(session, drift, rerun)
    if verdict is None:
        return [f"{where}: the lane stopped at another length"]
    # the file name is what whoever shared the session called it
    name = visible(session.path.name)
    sides = ("the recording", "the re-run")
    recorded, now = session.steps[drift.lane][drift.index], rerun[drift.lane][drift.index]
    fork = fork_between(drift.index, recorded, now)
    return [
        f"{where}: recorded token {drift.recorded}, now {drift.now} ({name})",
        f"why: {fork_sentence(fork, verdict, sides)}",
        f"drift class: {verdict.describe(sides)}",
    ]


def environment_changes(
    header: SessionHeader,
    build: Mapping[str, Any],
    executed: Mapping[str, Mapping[str, Any]],
) -> list[str]:
    """One line per build, system or lane setting that differs from the recording."""
    changes = []
    for key in BUILD_KEYS:
        if header.build.get(key) != build.get(key):
            changes.append(f"{key}: {header.build.get(key)!r} -> {build.get(key)!r}")
    for lane_id in ("a", "b"):
        old = header.executed.get(lane_id, {})
        new = executed.get(lane_id, {})
        for key in EXECUTED_KEYS:
            if old.get(key) != new.get(key):
                changes.append(f"lane {lane_id} {key}: {old.get(key)!r} -> {new.get(key)!r}")
    return changes


def cpu_features(system_info: str) -> list[str]:
    """The features llama.cpp's system info reports as present, in its order."""
    return FEATURE.findall(system_info)


def _machine(name: str, features: Sequence[str], others: Sequence[str]) -> str:
    """A CPU by its name and the features the other machine lacks, or when it lacks none,
    its widest vector instructions."""
    own = [feature for feature in features if feature not in others]
    if not own:
        own = [feature for feature in WIDEST_FIRST if feature in features][:1]
    return ", ".join(part for part in (name, " ".join(own)) if part) or "unknown"


def likely_cause(recorded: Mapping[str, Any], build: Mapping[str, Any]) -> str | None:
    """Why a re-run drifted when the recording comes from another CPU, or None when the
    CPU and llama.cpp's view of it are the same: the same weights and settings on other
    instructions add in another order, and a near tie can then fall the other way."""
    if all(recorded.get(key) == build.get(key) for key in CPU_KEYS):
        return None
    old = cpu_features(str(recorded.get("system_info") or ""))
    new = cpu_features(str(build.get("system_info") or ""))
    # the recorded CPU's name comes from a file that may have been shared: shown escaped
    then = _machine(visible(str(recorded.get("cpu") or ""), limit=80), old, new)
    now = _machine(visible(str(build.get("cpu") or ""), limit=80), new, old)
    return (
        f"recorded on another CPU ({then} -> {now}): "
        "kernels that round differently change near ties"
    )
