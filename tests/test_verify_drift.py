"""The comparison behind `specdiff verify`, without a model: a recorded session against
token ids that stand in for a re-run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdiff.compare import (
    AMBIGUOUS,
    DEFAULT_NEAR_TIE,
    DEFAULT_SPLIT_THRESHOLD,
    NEAR_TIE,
    fork_verdict,
    run_fork,
)
from specdiff.fork_words import quoted_piece
from specdiff.sessions.store import SessionError, load_session
from specdiff.sessions.verify import (
    Drift,
    cpu_features,
    drift_lines,
    environment_changes,
    first_drift,
    lane_drift,
    likely_cause,
    recorded_fork_lines,
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


DEMOS = sorted((ROOT / "sessions").glob("*.jsonl"))


def _edited(path: Path, target: Path, edit) -> Path:
    """A copy of a recorded session with its header and footer records edited."""
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    edit(records[0], records[-1])
    target.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return target


@pytest.mark.parametrize("scale", [None, 0.5, 2.0], ids=["old-file", "below-gap", "above-gap"])
@pytest.mark.parametrize("path", DEMOS, ids=lambda p: p.name.split("-", 1)[1])
def test_the_recorded_class_and_its_why_read_one_verdict(
    path: Path, scale: float | None, tmp_path: Path
) -> None:
    """The run's --near-tie is kept beside its class: the class line and the why line
    are one verdict at that threshold (the default for a file older than it), whether
    it makes the fork a near tie or not."""
    session = load_session(path)
    fork = run_fork(session.steps["a"], session.steps["b"])
    assert fork is not None, "the demo sessions fork"
    gap = fork_verdict(session.steps["a"][fork.index], session.steps["b"][fork.index]).other_gap
    assert gap is not None and 0 < gap < DEFAULT_SPLIT_THRESHOLD / 2
    near_tie = DEFAULT_NEAR_TIE if scale is None else gap * scale
    kind = NEAR_TIE if gap < near_tie else AMBIGUOUS

    def record(header: dict, footer: dict) -> None:
        footer["fork_class"] = kind
        if scale is not None:
            footer["near_tie"] = near_tie

    session = load_session(_edited(path, tmp_path / path.name, record))
    assert session.summary().near_tie == (None if scale is None else pytest.approx(near_tie))
    class_line, why = recorded_fork_lines(session)
    assert class_line == f"recorded fork at token {fork.index}: {kind}"
    label = "near tie flipped" if kind == NEAR_TIE else "ambiguous"
    assert why.startswith(f"why: {label}: ")


@pytest.mark.parametrize("value", ["0.5", -0.1, 2e6, True, [0.5]])
def test_a_recorded_near_tie_of_the_wrong_kind_is_one_line(value, tmp_path: Path) -> None:
    def record(header: dict, footer: dict) -> None:
        footer["near_tie"] = value

    with pytest.raises(SessionError) as refused:
        load_session(_edited(DEMOS[0], tmp_path / "bad.jsonl", record))
    message = str(refused.value)
    assert "near_tie" in message and ":" in message and "\n" not in message


def test_a_run_without_a_fork_has_no_recorded_fork_lines(tmp_path: Path) -> None:
    session = load_session(UBATCH)
    session.steps["b"] = list(session.steps["a"])
    assert recorded_fork_lines(session) == []


CPU = {"name": "CPU", "description": "AMD EPYC 7B13", "type": "cpu"}
RTX = {"name": "CUDA0", "description": "NVIDIA GeForce RTX 3090", "type": "gpu"}
H200 = {"name": "CUDA0", "description": "NVIDIA H200", "type": "gpu"}
PLACED = {"gpu_layers": -1, "main_gpu": 0, "split_mode": "layer", "layers_offloaded": 19}


def _memory(device: dict, free: int) -> dict:
    return device | {"memory_free": free, "memory_total": 1 << 35}


def _placed_session(tmp_path: Path, devices: list[dict], **placement) -> Path:
    def record(header: dict, footer: dict) -> None:
        for lane in ("a", "b"):
            header["executed"][lane].update(PLACED | placement, devices=devices)

    return _edited(UBATCH, tmp_path / "placed.jsonl", record)


@pytest.mark.parametrize(
    ("now", "changed", "cause"),
    [
        ({"devices": [CPU, RTX]}, [], None),
        ({"devices": [_memory(CPU, 5), _memory(RTX, 7)]}, [], None),
        ({"devices": [CPU, H200]}, ["devices"], "recorded on another GPU ("),
        ({"devices": [CPU]}, ["devices"], "recorded on another GPU ("),
        ({"gpu_layers": 0, "layers_offloaded": 0}, ["gpu_layers", "layers_offloaded"], "offload"),
        ({"split_mode": "row"}, ["split_mode"], "recorded with other offload (lane a split_mode"),
        ({"main_gpu": 1}, ["main_gpu"], "recorded with other offload (lane a main_gpu 0 -> 1"),
    ],
    ids=["same", "memory-only", "other-gpu", "gpu-gone", "offload-off", "split", "main-gpu"],
)
def test_gpu_placement_is_compared_and_named_as_a_cause(now, changed, cause, tmp_path: Path):
    """Device names and descriptions, layers asked for and offloaded, split mode and
    main GPU are compared with the recording (free memory is not); another GPU or
    other offload is named as the likely cause."""
    recorded = load_session(_placed_session(tmp_path, [_memory(CPU, 1), _memory(RTX, 2)]))
    header = recorded.header
    lanes = {lane: {**header.executed[lane], "devices": [CPU, RTX], **now} for lane in "ab"}
    changes = environment_changes(header, header.build, lanes)
    assert [c.split(": ")[0] for c in changes] == [
        f"lane {lane} {key}" for lane in "ab" for key in changed
    ]
    found = likely_cause(header.build, header.build, header.executed, lanes)
    assert (found is None) == (cause is None)
    if cause is not None:
        assert cause in found and "round differently" in found and found.isprintable()


def test_a_recording_without_placement_names_no_gpu_change() -> None:
    """A file written before placement was kept says nothing about it."""
    header = load_session(UBATCH).header
    lanes = {lane: {**header.executed[lane], **PLACED, "devices": [H200]} for lane in "ab"}
    assert environment_changes(header, header.build, lanes) == []
    assert likely_cause(header.build, header.build, header.executed, lanes) is None


def test_another_cpu_and_another_gpu_are_both_named(tmp_path: Path) -> None:
    header = load_session(_placed_session(tmp_path, [CPU, RTX])).header
    lanes = {lane: {**header.executed[lane], "devices": [CPU, H200]} for lane in "ab"}
    cause = likely_cause(
        header.build, dict(header.build, cpu="another cpu"), header.executed, lanes
    )
    assert cause is not None
    assert cause.startswith("recorded on another CPU (") and "; recorded on another GPU (" in cause
    assert "NVIDIA GeForce RTX 3090" in cause and "NVIDIA H200" in cause


def test_hostile_device_names_reach_the_line_escaped(tmp_path: Path) -> None:
    hostile = {"name": "\x1b]52;c;aGk=\x07", "description": "\x1b[2J" + "x" * 500}
    header = load_session(_placed_session(tmp_path, [CPU, hostile])).header
    lanes = {lane: {**header.executed[lane], "devices": [CPU]} for lane in "ab"}
    cause = likely_cause(header.build, header.build, header.executed, lanes)
    assert cause is not None and cause.isprintable() and "\x1b" not in cause
    assert len(cause) < 500


def test_a_drift_names_both_tokens_as_text_with_their_ids() -> None:
    """The re-run of lane b gives lane a's token at the fork: the line shows each token
    as text, its id in brackets, never a bare id."""
    session = load_session(UBATCH)
    fork = run_fork(session.steps["a"], session.steps["b"])
    assert fork is not None, "the demo session forks"
    rerun = {"a": list(session.steps["a"]), "b": list(session.steps["b"])}
    rerun["b"][fork.index] = session.steps["a"][fork.index]
    ids = {lane: [s.token_id for s in steps] for lane, steps in rerun.items()}
    drift = first_drift(session, ids)
    assert drift is not None and (drift.index, drift.lane) == (fork.index, "b")
    head = drift_lines(session, drift, rerun)[0]
    recorded = f"{quoted_piece(fork.piece_b)} [{fork.token_b}]"
    now = f"{quoted_piece(fork.piece_a)} [{fork.token_a}]"
    assert head.startswith(f"DRIFT at step {fork.index} of lane b: recorded {recorded}, now {now}")
