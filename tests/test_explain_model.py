"""The fork autopsy on the real model: taps that change nothing, a lane that matches
itself bit for bit, an independent reference that sums the same tensors alike, and
`specdiff explain` on a fork found on this CPU at run time."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from specdiff.autopsy import Autopsy, AutopsyInterrupted, AutopsyStage
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


@pytest.fixture(scope="module")
def ubatch_autopsy(forking_prompt) -> tuple[Autopsy, list[AutopsyStage], int, str]:
    """One autopsy of the ubatch fork found on this CPU (the pair as given and one
    setting moved), made in this process with its progress kept: the autopsy, its
    stages, the budget and the prompt."""
    from specdiff.engine.autopsy import explain_pair  # deferred: llama.cpp loads here

    found = forking_prompt("ubatch", 40)
    stages: list[AutopsyStage] = []
    autopsy = explain_pair(presets()["ubatch"], found.prompt, 40, 2, progress=stages.append)
    assert autopsy.fork == found.fork_index
    return autopsy, stages, 40, found.prompt


def test_the_progress_carries_an_estimate_once_the_pair_as_given_has_run(
    ubatch_autopsy,
) -> None:
    autopsy, stages, _, _ = ubatch_autopsy
    assert [(stage.run, stage.runs) for stage in stages] == [(1, 2), (2, 2), (None, 2)]
    assert stages[0].seconds_left is None  # nothing measured yet: no guess
    assert stages[0].line() == "run 1/2: the pair as given"
    for stage in stages[1:]:
        assert stage.seconds_left is not None and stage.seconds_left > 0
        assert " · about " in stage.line() and stage.line().endswith(
            " left · fewer --max-tokens is faster"
        )
    assert stages[2].doing == f"tapping both lanes at token {autopsy.fork}"


def test_a_trial_stops_at_its_fork_and_forks_where_run_does(ubatch_autopsy) -> None:
    """The pair as given streamed up to its fork and no further, where the search's run
    to the whole budget forked; a moved setting's trial forks where a run of its lanes
    to the whole budget does, and decodes the whole budget only where they agree."""
    from specdiff.engine.autopsy import plan_moves  # deferred, as above
    from specdiff.engine.pairrun import PairRun

    autopsy, _, max_tokens, prompt = ubatch_autopsy
    as_given, *moved_trials = autopsy.trials
    assert as_given.fork is not None and autopsy.fork == as_given.fork
    assert as_given.tokens_a == as_given.tokens_b == as_given.fork + 1 < max_tokens
    moved = {move.setting: move.pair for move in plan_moves(presets()["ubatch"])}
    assert moved_trials
    for trial in moved_trials:
        lanes = moved[trial.setting]
        assert lanes is not None
        with PairRun(lanes) as runner:
            whole = runner.run(prompt, max_tokens)
        fork = whole.comparison.fork
        assert trial.fork == (None if fork is None else fork.index), trial.setting
        if trial.fork is not None:
            assert trial.tokens_a == trial.tokens_b == trial.fork + 1 < max_tokens
        else:
            assert (trial.tokens_a, trial.tokens_b) == (len(whole.a.steps), len(whole.b.steps))


def test_a_cancel_during_the_sweep_interrupts_it_and_caches_nothing_of_that_run(
    forking_prompt, tmp_path: Path
) -> None:
    """The user's cancel, set as run 2 begins, ends the autopsy (a trial's own stop at
    its fork must not pass for it, nor it for an answer): no record, and the cache
    holds the pair as given only."""
    from specdiff.engine.autopsy import explain_pair  # deferred, as above

    found = forking_prompt("ubatch", 40)
    cancel = threading.Event()

    def progress(stage: AutopsyStage) -> None:
        if stage.run == 2:
            cancel.set()

    with pytest.raises(AutopsyInterrupted):
        explain_pair(
            presets()["ubatch"],
            found.prompt,
            40,
            3,
            str(tmp_path),
            cancel=cancel,
            progress=progress,
        )
    (cache,) = tmp_path.glob("*.json")
    (entry,) = json.loads(cache.read_text()).values()
    assert entry["fork"] == found.fork_index
