"""The fork autopsy on the real model: taps that change nothing, a lane that matches
itself bit for bit, an independent reference that sums the same tensors alike, and
`specdiff explain` on a fork found on this CPU at run time."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from specdiff.cli import main
from specdiff.lanes import Lane, presets
from tests.servers import probed_repack

pytestmark = pytest.mark.model

PROMPT = "The three primary colours are"
REFERENCE = Path(__file__).with_name("reference_taps.py")


def test_a_lane_against_itself_is_identical_in_every_tensor(model_path: Path) -> None:
    from specdiff.engine.autopsy import compare_taps
    from specdiff.engine.llama.context import ModelPool
    from specdiff.engine.llama.taps import tap_step

    lane = presets()["spec-vs-plain"].a  # speculative: the step may sit in a wide batch
    pool = ModelPool()
    try:
        first = tap_step(lane, "a", PROMPT, 12, 6, pool)
        again = tap_step(lane, "a", PROMPT, 12, 6, pool)
    finally:
        pool.close()
    compared = compare_taps(first, again)
    assert len(compared) >= 18 * 10  # every layer's named activations, not a handful
    assert [t.name for t in compared if not t.identical] == []
    assert all(t.max_abs == 0.0 and t.rel_l2 == 0.0 for t in compared)
    assert first.logits.tobytes() == again.logits.tobytes()


def test_tapping_changes_nothing(model_path: Path) -> None:
    from specdiff.engine.llama.context import ModelPool
    from specdiff.engine.llama.lane import LocalLane
    from specdiff.engine.llama.taps import tap_step

    lane = presets()["spec-vs-plain"].a
    pool = ModelPool()
    try:
        recorded = LocalLane(lane, "a", pool)
        try:
            steps = list(recorded.generate(recorded.tokenize(PROMPT), 12))
        finally:
            recorded.close()
        taps = tap_step(lane, "a", PROMPT, 12, 6, pool)
    finally:
        pool.close()
    assert taps.neutral  # the untapped replay and the tapped one, bit for bit
    output = taps.tensor("result_output")
    assert output is not None and output.values.tobytes() == taps.tapped_logits.tobytes()
    step = steps[6]
    assert taps.token_id == step.token_id
    # the run's own logits (no callback in its context) against the tapped replay's
    assert [float(taps.tapped_logits[c.token_id]) for c in step.top] == [c.logit for c in step.top]


def test_an_independent_reference_sums_the_same_tensors_alike(model_path: Path) -> None:
    from specdiff.engine.llama.context import ModelPool
    from specdiff.engine.llama.taps import tap_step

    lane = Lane()
    pool = ModelPool()
    try:
        taps = tap_step(lane, "b", PROMPT, 4, 1, pool)
    finally:
        pool.close()
    last = max(int(t.name.rsplit("-", 1)[1]) for t in taps.tensors if t.name.startswith("l_out-"))
    names = [
        "attn_norm-0",
        "kqv_out-0",
        "ffn_out-0",
        "l_out-0",
        f"ffn_out-{last}",
        f"l_out-{last}",
        "result_norm",
        "result_output",
    ]
    completed = subprocess.run(
        [
            *(sys.executable, str(REFERENCE), str(model_path)),
            "on" if probed_repack(model_path) else "off",  # the kernels the lane ran
            *(str(lane.threads), PROMPT, *names),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    reference = json.loads(completed.stdout.strip().splitlines()[-1])
    assert sorted(reference["sums"]) == sorted(names)
    ours = {}
    for name in names:
        tapped = taps.tensor(name)
        assert tapped is not None, name
        ours[name] = math.fsum(tapped.values.tolist())
    assert ours == reference["sums"]


def test_explain_names_the_first_differing_tensor_and_a_settings_table(
    forking_prompt, capsys: pytest.CaptureFixture[str]
) -> None:
    # ubatch at 40 tokens: the fork other tests search for, found once per test run
    found = forking_prompt("ubatch", 40)
    code = main(
        [
            "explain",
            "--pair",
            "ubatch",
            "--prompt",
            found.prompt,
            "--max-tokens",
            "40",
            "--max-runs",
            "3",
            "--no-cache",
            "--quiet",
            "--json",
        ]
    )
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["fork"] == found.fork_index
    assert len(data["settings"]) == 3
    assert data["settings"][0]["setting"] == "as given"
    assert data["settings"][0]["fork"] == found.fork_index
    assert all(isinstance(entry["identical"], bool) for entry in data["settings"])
    first = data["first_difference"]
    assert first is not None
    assert first["name"] and first["op"] and first["max_abs"] > 0 and first["rel_l2"] > 0
    assert data["layers"] and all(entry["max_abs"] >= 0 for entry in data["layers"])
    assert data["tapping_neutral"] is True
    assert data["margin"]["token_a"] != data["margin"]["token_b"]
    assert [entry["scope"] for entry in data["settings"]] == ["as given", "lane b", "both lanes"]
    assert len(data["not_tried"]) >= 1  # the budget of 3 left kernel switches out


def test_identical_lanes_have_nothing_to_explain(
    model_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        [
            "explain",
            "--pair",
            "spec-vs-plain",
            "--lane-a",
            "speculation=none",
            "--prompt",
            PROMPT,
            "--max-tokens",
            "6",
            "--no-cache",
            "--quiet",
        ]
    )
    assert code == 0
    assert "Nothing to explain" in capsys.readouterr().out
