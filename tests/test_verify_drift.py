"""The comparison behind `specdiff verify`, without a model: a recorded session against
token ids that stand in for a re-run."""

from __future__ import annotations

from pathlib import Path

from specdiff.sessions.store import load_session
from specdiff.sessions.verify import (
    Drift,
    cpu_features,
    environment_changes,
    first_drift,
    lane_drift,
    likely_cause,
)

ROOT = Path(__file__).resolve().parent.parent
UBATCH = next(path for path in sorted((ROOT / "sessions").glob("*.jsonl")) if "ubatch" in path.name)


def recorded_ids(session) -> dict[str, list[int]]:
    return {lane: [step.token_id for step in session.steps[lane]] for lane in ("a", "b")}


def test_the_same_tokens_do_not_drift() -> None:
    session = load_session(UBATCH)
    assert first_drift(session, recorded_ids(session)) is None


def test_the_earliest_changed_step_is_named_with_both_tokens() -> None:
    session = load_session(UBATCH)
    rerun = recorded_ids(session)
    rerun["b"][7] += 1
    rerun["a"][9] += 1
    assert first_drift(session, rerun) == Drift(7, "b", rerun["b"][7] - 1, rerun["b"][7])


def test_lane_a_comes_first_at_the_same_step() -> None:
    assert lane_drift("a", [1, 2], [1, 3]) == Drift(1, "a", 2, 3)
    session = load_session(UBATCH)
    rerun = recorded_ids(session)
    rerun["a"][3] += 1
    rerun["b"][3] += 1
    drift = first_drift(session, rerun)
    assert drift is not None and (drift.index, drift.lane) == (3, "a")


def test_another_length_is_a_drift_unless_the_run_was_stopped() -> None:
    drift = lane_drift("b", [1, 2, 3], [1, 2])
    assert drift == Drift(2, "b", None, None) and drift.length_changed
    session = load_session(UBATCH)
    rerun = recorded_ids(session)
    rerun["a"].append(5)
    assert first_drift(session, rerun) == Drift(len(session.steps["a"]), "a", None, None)
    session.footer = None  # killed mid-run: checked as far as it got
    assert first_drift(session, rerun) is None


def test_environment_changes_name_build_and_lane_settings() -> None:
    header = load_session(UBATCH).header
    assert environment_changes(header, header.build, header.executed) == []
    build = dict(header.build, cpu="another cpu")
    executed = {"a": dict(header.executed["a"], threads=99), "b": header.executed["b"]}
    changes = environment_changes(header, build, executed)
    assert changes == [
        f"cpu: {header.build.get('cpu')!r} -> 'another cpu'",
        f"lane a threads: {header.executed['a'].get('threads')!r} -> 99",
    ]


AVX2 = (
    "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | "
    "LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 |"
)
AVX512 = (
    "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | "
    "AVX512 = 1 | AVX512_VBMI = 1 | AVX512_VNNI = 1 | AVX512_BF16 = 1 | AMX_INT8 = 0 | "
    "LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 |"
)


def test_cpu_features_are_those_reported_present() -> None:
    assert cpu_features(AVX2)[:4] == ["SSE3", "SSSE3", "AVX", "AVX2"]
    features = cpu_features(AVX512)
    assert "AVX512_BF16" in features and "AMX_INT8" not in features
    assert cpu_features("") == []


def test_another_cpu_is_named_with_what_sets_the_machines_apart() -> None:
    xeon = {"cpu": "Intel(R) Xeon(R) Platinum 8480+", "system_info": AVX512}
    epyc = {"cpu": "AMD EPYC", "system_info": AVX2}
    assert likely_cause(xeon, epyc) == (
        "recorded on another CPU (Intel(R) Xeon(R) Platinum 8480+, AVX512 AVX512_VBMI "
        "AVX512_VNNI AVX512_BF16 -> AMD EPYC, AVX2): kernels that round differently "
        "change near ties"
    )
    cause = likely_cause(epyc, xeon)
    assert cause is not None and "(AMD EPYC, AVX2 -> Intel(R) Xeon(R)" in cause


def test_the_same_cpu_is_no_cause_and_either_difference_is() -> None:
    build = load_session(UBATCH).header.build
    assert likely_cause(build, dict(build)) is None
    # other keys (the platform string, Python) say nothing about the kernels
    assert likely_cause(build, dict(build, platform="elsewhere", python="3.99")) is None
    renamed = likely_cause(build, dict(build, cpu="another cpu"))
    assert renamed is not None and "-> another cpu, AVX2)" in renamed
    assert likely_cause(build, dict(build, system_info=AVX512)) is not None


def test_a_recording_without_cpu_details_still_names_the_change() -> None:
    cause = likely_cause({}, {"cpu": "AMD EPYC", "system_info": AVX2})
    assert cause is not None and cause.startswith("recorded on another CPU (unknown -> AMD EPYC")
