"""Checking a session against a re-run of its lanes: the first step whose token came out
differently and its class (a drift is a fork between the recording and the re-run), what
changed in the build, the system and the lanes since the recording (the CPU, and where
llama.cpp put the layers), and the likely cause of a drift."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from specdiff.compare import DEFAULT_NEAR_TIE, ForkVerdict, fork_between, fork_verdict, run_fork
from specdiff.fork_words import fork_sentence, quoted_piece, verdict_description
from specdiff.safe_text import visible
from specdiff.sessions.header import SessionHeader
from specdiff.sessions.store import Session
from specdiff.steps import TokenStep

BUILD_KEYS = ("llama_cpp_build", "llama_cpp_python", "system_info", "cpu", "specdiff")
"""What in the build and the machine can change a greedy decode."""
PLACEMENT_KEYS = ("gpu_layers", "layers_offloaded", "split_mode", "main_gpu")
"""Where llama.cpp put a lane's layers: layers on another device run other kernels."""
EXECUTED_KEYS = ("model_sha256", "threads", "n_batch", "n_ubatch", "repack", *PLACEMENT_KEYS)
"""What in a lane, as llama.cpp applied it, can change a greedy decode."""
DEVICE_KEYS = ("name", "description")
"""What names a device llama.cpp registered; its free memory changes between any two
runs on the same machine, so it is no part of what changed."""
DEVICES_SHOWN = 160
"""Characters of a device list a line shows: names come from a file that may be shared."""
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
        f"{where}: recorded {token_shown(recorded)}, now {token_shown(now)} ({name})",
        f"why: {fork_sentence(fork, verdict, sides)}",
        f"drift class: {verdict_description(verdict, sides)}",
    ]


def token_shown(step: TokenStep) -> str:
    """A token as a reader knows it, its id beside it: `' that' [1234]`."""
    return f"{quoted_piece(step.piece)} [{step.token_id}]"


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
            if _changed(old, new, key):
                changes.append(f"lane {lane_id} {key}: {old.get(key)!r} -> {new.get(key)!r}")
        if _changed(old, new, "devices"):
            changes.append(f"lane {lane_id} devices: {_devices_text(old)} -> {_devices_text(new)}")
    return changes


def _changed(old: Mapping[str, Any], new: Mapping[str, Any], key: str) -> bool:
    """A lane setting differs from the recording. A recording made before placement was
    kept says nothing about it: its absence is no change."""
    if key == "devices":
        return key in old and device_names(old) != device_names(new)
    if key in PLACEMENT_KEYS and key not in old:
        return False
    return old.get(key) != new.get(key)


def device_names(executed: Mapping[str, Any]) -> list[str]:
    """The devices a lane's llama.cpp registered, as `name (description)`."""
    devices = executed.get("devices")
    if not isinstance(devices, list):
        return []
    names = []
    for device in devices:
        if isinstance(device, Mapping):
            name, description = (str(device.get(key) or "") for key in DEVICE_KEYS)
            names.append(f"{name} ({description})" if description else name)
    return names


def _devices_text(executed: Mapping[str, Any]) -> str:
    return visible(", ".join(device_names(executed)) or "none", limit=DEVICES_SHOWN)


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


def likely_cause(
    recorded: Mapping[str, Any],
    build: Mapping[str, Any],
    recorded_lanes: Mapping[str, Mapping[str, Any]] | None = None,
    lanes: Mapping[str, Mapping[str, Any]] | None = None,
) -> str | None:
    """Why a re-run drifted: the recording comes from another CPU, from another GPU, or
    with the layers placed otherwise (`recorded_lanes` and `lanes` are the executed
    tables); None when none of these changed. The same weights and settings on other
    kernels add in another order, and a near tie can then fall the other way."""
    causes = [_cpu_cause(recorded, build), _placement_cause(recorded_lanes or {}, lanes or {})]
    return "; ".join(cause for cause in causes if cause) or None


def _placement_cause(
    recorded: Mapping[str, Mapping[str, Any]], lanes: Mapping[str, Mapping[str, Any]]
) -> str | None:
    """Another GPU (the devices llama.cpp registered differ), or other offload (a lane's
    layers placed otherwise), or None."""
    moved = []
    for lane_id in ("a", "b"):
        old, new = recorded.get(lane_id, {}), lanes.get(lane_id, {})
        if _changed(old, new, "devices"):
            return (
                f"recorded on another GPU ({_devices_text(old)} -> {_devices_text(new)}): "
                "kernels that round differently change near ties"
            )
        moved += [
            f"lane {lane_id} {key} {old.get(key)!r} -> {new.get(key)!r}"
            for key in PLACEMENT_KEYS
            if _changed(old, new, key)
        ]
    if not moved:
        return None
    # the recorded values come from a file that may have been shared
    return (
        f"recorded with other offload ({visible(', '.join(moved), limit=DEVICES_SHOWN)}): "
        "layers on another device run kernels that round differently"
    )


def _cpu_cause(recorded: Mapping[str, Any], build: Mapping[str, Any]) -> str | None:
    """Another CPU, or llama.cpp's view of it: None when both are the same."""
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


def recorded_fork_lines(session: Session) -> list[str]:
    """The recorded fork's class and why it happened, both from one verdict at one
    near-tie threshold: the one the class was recorded at (the run's --near-tie), the
    default for files written before it was kept. Empty where the lanes did not fork."""
    a, b = session.steps["a"], session.steps["b"]
    forced = session.header.teacher_forced
    fork = run_fork(a, b, forced)
    if fork is None:
        return []
    recorded = session.summary().near_tie
    near_tie = DEFAULT_NEAR_TIE if recorded is None else recorded
    verdict = fork_verdict(a[fork.index], b[fork.index], forced, near_tie)
    return [
        f"recorded fork at token {fork.index}: {verdict.kind}",
        f"why: {fork_sentence(fork, verdict, teacher_forced=forced)}",
    ]
