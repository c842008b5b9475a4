"""The fork autopsy's records, words and charts (pure), and `specdiff explain`'s refusals
of bad input, which come before any model loads."""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from specdiff.autopsy import (
    DRAFT_KEY,
    Autopsy,
    AutopsyError,
    AutopsyStage,
    ForkMargin,
    LayerGrowth,
    SettingTrial,
    TensorDifference,
    draft_verdict,
)
from specdiff.autopsy.progress import duration
from specdiff.cli import main
from specdiff.engine.autopsy import plan_moves
from specdiff.lanes import Lane, Pair, presets
from specdiff.reports.autopsy import format_autopsy, growth_svg, sparkline

if TYPE_CHECKING:
    from specdiff.engine.llama.taps import StepTaps
    from specdiff.lanes import LaneId


def trial(setting: str, scope: str, fork: int | None, speed: float = 50.0) -> SettingTrial:
    return SettingTrial(setting, "repack", "off", scope, fork, 64, 64, speed, 40.0)


def tensor(name: str, layer: int | None, op: str, delta: float) -> TensorDifference:
    return TensorDifference(name, layer, op, (640, 8), (640, 1), delta == 0, delta, delta / 10)


def made(**changes: object) -> Autopsy:
    fields: dict[str, object] = {
        "pair": "spec-vs-plain",
        "max_tokens": 64,
        "fork": 30,
        "trials": (
            trial("as given", "as given", 30, 60.0),
            trial("lane b's speculation = lane a's (ngram)", "lane b", None),
            trial("repack off", "both lanes", None, 48.0),
            trial("flash_attn on", "both lanes", 25),
        ),
        "max_runs": 8,
        "tensors": (
            tensor("attn_norm-0", 0, "RMS_NORM", 0.0),
            tensor("kqv_out-0", 0, "CONT", 0.0),
            tensor("ffn_out-0", 0, "MUL_MAT", 9.5e-7),
            tensor("l_out-0", 0, "ADD", 2e-6),
            tensor("kqv_out-1", 1, "CONT", 0.0),
            tensor("l_out-1", 1, "ADD", 1e-4),
        ),
        "layers": (LayerGrowth(0, 2e-6, 1e-7), LayerGrowth(1, 1e-4, 1e-6)),
        "margin": ForkMargin(11, 22, "' the'", "' a'", (0.41, 0.39), (0.38, 0.40), 0.06, 0.21, 0.3),
        "verify_width": (8, 1),
    }
    fields.update(changes)
    return Autopsy(**fields)


def test_the_cause_names_the_setting_the_operation_and_the_margin_probabilities_first() -> None:
    cause = made().cause()
    assert cause.index("41%") < cause.index("logits (the model's raw scores")
    assert "The fork disappears with repack off (lane a at 0.80x its speed)" in cause
    assert "the matrix multiply of layer 0's feed-forward output (ffn_out-0, MUL_MAT)" in cause
    assert "in the last bits" in cause
    assert "8 tokens wide and lane b 1" in cause
    assert "attention stays identical" in cause
    assert "0.21 logits" in cause and "more than the 0.06 margin" in cause


def test_no_single_setting_and_attention_that_differs_are_said_so() -> None:
    trials = (trial("as given", "as given", 30), trial("repack off", "both lanes", 31))
    tensors = (tensor("kqv_out-0", 0, "CONT", 1e-3), tensor("l_out-0", 0, "ADD", 1e-3))
    cause = made(trials=trials, tensors=tensors).cause()
    assert "No single setting of the 1 tried removes the fork." in cause
    assert "attention stays identical" not in cause
    assert "attention output (kqv_out-0, CONT)" in cause


def test_only_the_lanes_own_difference_removing_the_fork_is_named() -> None:
    trials = (trial("as given", "as given", 30), trial("speculation", "lane b", None))
    assert "only making the lanes' own difference the same does" in made(trials=trials).cause()


def test_nothing_to_explain() -> None:
    autopsy = Autopsy("spec-vs-plain", 64, None, (trial("as given", "as given", None),), 8)
    assert autopsy.nothing_to_explain
    assert autopsy.cause().startswith("Nothing to explain")
    assert autopsy.to_json()["first_difference"] is None
    assert format_autopsy(autopsy).startswith("explain spec-vs-plain: Nothing to explain")


def test_first_difference_growth_and_panel() -> None:
    autopsy = made()
    assert autopsy.first_difference is not None
    assert autopsy.first_difference.name == "ffn_out-0"
    assert autopsy.growth_series() == [2e-6, 1e-4, 0.3]
    panel = autopsy.panel_text()
    assert "fork gone with: lane b's speculation" in panel
    assert "first differing tensor: ffn_out-0 (MUL_MAT)" in panel
    assert "350%" in panel


def test_json_round_trip_and_acceptance_keys() -> None:
    autopsy = made()
    data = json.loads(json.dumps(autopsy.to_json(), allow_nan=False))
    assert [entry["identical"] for entry in data["settings"]] == [False, True, True, False]
    assert data["settings"][0]["fork"] == 30
    first = data["first_difference"]
    assert (first["name"], first["layer"], first["op"]) == ("ffn_out-0", 0, "MUL_MAT")
    assert first["max_abs"] == 9.5e-7 and first["rel_l2"] == 9.5e-8
    assert data["layers"] == [
        {"layer": 0, "max_abs": 2e-6, "rel_l2": 1e-7},
        {"layer": 1, "max_abs": 1e-4, "rel_l2": 1e-6},
    ]
    assert Autopsy.from_json(data) == autopsy


def test_a_layer_whose_reference_is_all_zeros_survives_json() -> None:
    # relative L2 against a tensor of zeros is inf, which strict JSON cannot hold
    autopsy = made(layers=(LayerGrowth(0, 2e-6, math.inf),))
    data = json.loads(json.dumps(autopsy.to_json(), allow_nan=False))
    assert data["layers"] == [{"layer": 0, "max_abs": 2e-6, "rel_l2": None}]
    assert Autopsy.from_json(data) == autopsy


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("fork", "30", "field 'fork' must be a whole number"),
        ("settings", {}, "field 'settings' must be a list"),
        ("schema", 99, "schema is not 1"),
        (
            "layers",
            [{"layer": 0, "max_abs": True, "rel_l2": 0}],
            r"field 'layers\[0\]\.max_abs' must be a number",
        ),
    ],
)
def test_a_damaged_autopsy_is_one_line(field: str, value: object, message: str) -> None:
    data = made().to_json()
    data[field] = value
    with pytest.raises(AutopsyError, match=message):
        Autopsy.from_json(data)


def test_text_report_and_svg() -> None:
    text = format_autopsy(made())
    assert "forks at 30" in text and "identical" in text
    assert "first differing tensor: ffn_out-0 (MUL_MAT, layer 0)" in text
    assert "attention outputs (kqv_out): identical in every layer" in text
    svg = growth_svg(made())
    root = ET.fromstring(svg)
    assert root.tag.endswith("svg")
    assert "margin at the fork" in svg
    assert sparkline([0.0, 1e-6, 1e-3, 1.0]) == " ▁▄█"


def test_the_sweep_moves_the_lanes_difference_then_kernels_in_both_lanes() -> None:
    pair = presets()["spec-vs-plain"]
    moves = plan_moves(pair)
    first = moves[0]
    assert (first.key, first.scope) == ("speculation", "lane b")
    assert first.pair.b.speculation == pair.a.speculation
    kernels = [m for m in moves if m.scope == "both lanes"]
    assert [m.key for m in kernels] == [
        "repack",
        "n_ubatch",
        "flash_attn",
        "threads",
        "type_k",
        "spec_drafts",
    ]
    for move in kernels:
        assert getattr(move.pair.a, move.key) == getattr(move.pair.b, move.key)
    same = Pair("same", Lane(), Lane())
    assert all(m.scope == "both lanes" for m in plan_moves(same))


def test_explain_refuses_a_budget_of_zero(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "--max-runs", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--max-runs" in err[0] and "must be from 1" in err[0]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--draft-lengths", "1,2"], "needs servers specdiff starts"),
        (["--svg", "growth.svg"], "needs in-process lanes"),
    ],
    ids=["draft-lengths-without-serve-pair", "svg"],
)
def test_explain_on_server_lanes_refuses_what_only_serve_pair_or_part_2_can_do(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    lanes = ["--lane-a", "endpoint=http://127.0.0.1:9", "--lane-b", "endpoint=http://127.0.0.1:9"]
    assert main(["explain", "--pair", "servers", *lanes, *args, "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


@pytest.mark.parametrize(
    ("lengths", "message"),
    [
        ("", "is empty"),
        (" , ", "is empty"),
        ("1,0", "from 1 to 256"),
        ("2,x", "from 1 to 256"),
        ("2,2", "lists 2 twice"),
    ],
    ids=["empty", "commas-only", "zero", "not-a-number", "twice"],
)
def test_bad_draft_lengths_are_one_line_before_any_server_starts(
    lengths: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    command = ["serve-pair", "--llama-server", "/no/such/binary", "explain"]
    assert main([*command, "--draft-lengths", lengths]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--draft-lengths" in err[0] and message in err[0]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-runs", "0"], "must be from 1"),
        (["a-session.jsonl"], "not a session file"),
        (["--svg", "growth.svg"], "drop --svg"),
    ],
    ids=["budget-0", "session", "svg"],
)
def test_serve_pair_explain_refuses_before_any_server_starts(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve-pair", "--llama-server", "/no/such/binary", "explain", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def drafts(*outcomes: tuple[str, int | None, int]) -> tuple[SettingTrial, ...]:
    """Trials of a draft-length sweep: (draft length, fork, tokens of lane b)."""
    return tuple(
        SettingTrial(f"draft length {k}", DRAFT_KEY, k, "server a", fork, 32, b, 9.0, 8.0)
        for k, fork, b in outcomes
    )


def test_a_fork_that_stays_put_at_every_draft_length_is_numerics() -> None:
    verdict = draft_verdict(drafts(("1", 12, 32), ("2", 12, 32), ("4", 12, 32)))
    assert verdict is not None
    assert "stays at token 12" in verdict and "(1, 2, 4)" in verdict
    assert "a numerics fork (the verify batch's arithmetic), not the accept/rollback" in verdict
    autopsy = made(trials=drafts(("1", 12, 32), ("2", 12, 32)), fork=12, tensors=(), margin=None)
    assert "numerics fork" in autopsy.cause()


def test_a_fork_that_moves_or_disappears_with_the_draft_length_is_not_called_numerics() -> None:
    moved = draft_verdict(drafts(("1", 12, 32), ("2", 20, 32)))
    assert moved is not None and "moves with the draft length" in moved
    assert "forks at 12 with draft length 1; forks at 20 with draft length 2" in moved
    gone = draft_verdict(drafts(("1", 12, 32), ("2", None, 32)))
    assert gone is not None and "disappears" in gone and "identical with draft length 2" in gone
    for verdict in (moved, gone):
        assert "numerics fork" not in verdict


def test_a_sweep_without_a_fork_or_with_one_length_says_so() -> None:
    agree = draft_verdict(drafts(("1", None, 32), ("2", None, 32)))
    assert agree == "The lanes agree at every draft length tried (1, 2)."
    shorter = draft_verdict(drafts(("1", None, 30), ("2", None, 32)))
    assert shorter is not None and "differ only in length" in shorter
    alone = draft_verdict(drafts(("1", 12, 32)))
    assert alone is not None and "Fewer than two draft lengths ran" in alone
    failed = replace(drafts(("2", None, 32))[0], error="server a refused")
    assert "Fewer than two" in str(draft_verdict((*drafts(("1", 12, 32)), failed)))
    assert draft_verdict(made().trials) is None
    nothing = made(fork=None, trials=drafts(("1", None, 32), ("2", 7, 32)))
    assert "Nothing to explain" in nothing.cause() and "disappears" in nothing.cause()


def test_a_server_sweep_round_trips_and_shows_its_table_and_part_2_note() -> None:
    note = "part 2 (which layer and operation) needs both lanes in-process"
    autopsy = Autopsy("servers", 32, 12, drafts(("1", 12, 32), ("2", 12, 32)), 8, part2_note=note)
    data = json.loads(json.dumps(autopsy.to_json()))
    assert data["first_difference"] is None and data["layers"] == []
    assert [(s["value"], s["fork"]) for s in data["settings"]] == [("1", 12), ("2", 12)]
    assert Autopsy.from_json(data) == autopsy
    text = format_autopsy(autopsy)
    assert "draft length 2" in text and "forks at 12" in text and note in text
    assert "computed 0 tokens wide" not in text
    quiet = format_autopsy(
        replace(autopsy, fork=None, trials=drafts(("1", None, 32), ("2", 5, 32)))
    )
    assert "forks at 5" in quiet and "identical" in quiet
    over = replace(autopsy, fork=None, not_tried=("draft length 8 (over --max-runs)",))
    assert "not tried: draft length 8 (over --max-runs)" in format_autopsy(over)


def saved_session(folder: Path, lane: Lane, teacher_forced: bool = False) -> Path:
    """A session cut short after its header: it still names its lanes and prompt."""
    from specdiff.sessions.header import SessionHeader
    from specdiff.sessions.store import SessionWriter

    pair = Pair("plain", lane, lane)
    writer = SessionWriter(str(folder), pair.name, "Hello")
    writer.header(
        SessionHeader(
            pair=pair,
            prompt="Hello",
            prompt_token_ids=(2, 9259),
            max_tokens=8,
            stop=(),
            executed={"a": {"model_path": lane.model}, "b": {"model_path": lane.model}},
            build={},
            created="2026-12-02T00:00:00+00:00",
            teacher_forced=teacher_forced,
        )
    )
    writer.handle.close()
    return Path(writer.partial)


def test_explain_refuses_a_session_whose_model_is_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = saved_session(tmp_path, Lane(model=str(tmp_path / "gone.gguf")))
    assert main(["explain", str(saved), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "lane a's model file" in err[0] and "gone.gguf" in err[0] and "is missing" in err[0]


def test_explain_refuses_a_teacher_forced_session(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # its fork is a flip under forcing, which free re-runs would not reproduce
    saved = saved_session(tmp_path, Lane(), teacher_forced=True)
    assert main(["explain", str(saved), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is teacher-forced" in err[0] and "--pair" in err[0]


def test_explain_refuses_a_session_and_a_prompt_together(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["explain", "some.jsonl", "--prompt", "Hi"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not both" in err[0]


def test_a_difference_inherited_through_the_kv_memory_is_said_so() -> None:
    tensors = (
        tensor("l_out-9", 9, "ADD", 0.0),
        tensor("kqv_out-10", 10, "CONT", 3.6e-4),
        tensor("l_out-10", 10, "ADD", 1e-3),
    )
    cause = made(tensors=tensors, verify_width=(1, 1)).cause()
    assert "The first tapped tensor that differs is layer 10's attention output" in cause
    assert "its last operation only moves data" in cause
    assert "Both lanes computed this step 1 token wide" in cause
    assert "keys and values earlier steps left in the KV memory" in cause
    assert "when lane a computes the step" not in cause


def test_keys_that_only_make_a_lane_together_are_moved_together() -> None:
    moves = plan_moves(presets()["ubatch"])
    first = moves[0]
    assert first.setting == "lane b's n_batch, n_ubatch = lane a's (512, 512)"
    assert first.pair is not None and first.error is None
    assert (first.pair.b.n_batch, first.pair.b.n_ubatch) == (512, 512)
    assert [m.scope for m in moves].count("lane b") == 1


def test_a_move_that_makes_no_valid_lane_is_a_failed_trial_not_a_stop() -> None:
    from specdiff.engine.autopsy import _move

    pair = presets()["spec-vs-plain"]
    move = _move("n_ubatch 1024", "n_ubatch", "1024", "both lanes", pair, None, {"n_ubatch": 1024})
    assert move.pair is None
    assert move.error is not None and "must not exceed n_batch" in move.error


def test_server_lanes_of_ones_own_say_why_no_setting_was_tried() -> None:
    autopsy = made(
        pair="servers",
        trials=(trial("as given", "as given", 30),),
        not_tried=("the draft-length sweep: it runs under specdiff serve-pair explain",),
        tensors=(),
        margin=None,
        part2_note="part 2 needs both lanes in-process",
    )
    assert "cannot restart servers it did not start" in autopsy.cause()
    budget = made(trials=(trial("as given", "as given", 30),), not_tried=("repack off",))
    assert "the run budget allowed only the run as given" in budget.cause()


def cache_taps(
    history: int, values_a: list[float], values_b: list[float]
) -> tuple[StepTaps, StepTaps]:
    """Two lanes' taps of one K cache write: `history` leading values of earlier calls."""
    import numpy as np

    from specdiff.engine.llama.taps import RowTarget, StepTaps, TappedTensor

    def lane(lane_id: LaneId, values: list[float]) -> StepTaps:
        target = RowTarget(3, 0, (True,), 512, start=2, position=2)
        written = np.array(values, dtype=np.float32)
        cache = TappedTensor("cache_k_l10", 0, "SET_ROWS", (2, 4096, 1, 1), written, 10, history)
        logits = np.zeros(4, dtype=np.float32)
        return StepTaps(lane_id, 3, target, logits, logits, [cache])

    return lane("a", values_a), lane("b", values_b)


def test_a_cache_that_differs_in_cells_earlier_calls_wrote_is_kv_history() -> None:
    from specdiff.engine.autopsy import compare_taps

    a, b = cache_taps(4, [1, 2, 3, 4, 5, 6], [1, 2, 3, 4.5, 5, 6])
    (history,) = compare_taps(a, b)
    assert (history.name, history.layer, history.op) == ("cache_k_l10", 10, "SET_ROWS")
    assert not history.identical and history.kv_history and history.max_abs == 0.5
    a, b = cache_taps(4, [1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6.5])
    (own,) = compare_taps(a, b)
    assert not own.identical and not own.kv_history  # only the step's own cell differs
    a, b = cache_taps(4, [1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6])
    (same,) = compare_taps(a, b)
    assert same.identical and not same.kv_history


def test_kv_history_survives_json_and_an_older_record_reads_without_it() -> None:
    cache = replace(tensor("cache_k_l10", 10, "SET_ROWS", 0.5), kv_history=True)
    autopsy = made(tensors=(tensor("l_out-9", 9, "ADD", 0.0), cache))
    data = json.loads(json.dumps(autopsy.to_json(), allow_nan=False))
    assert data["first_difference"]["name"] == "cache_k_l10"
    assert data["first_difference"]["kv_history"] is True
    assert Autopsy.from_json(data) == autopsy
    assert "kv_history" not in data["tensors"][0]  # written only where true
    for entry in data["tensors"]:
        entry.pop("kv_history", None)
    assert Autopsy.from_json(data).first_difference == replace(cache, kv_history=False)


def history_autopsy() -> Autopsy:
    """The shape explain finds on spec-vs-plain: layer 10's caches differ in cells earlier
    calls wrote, and attention's scores, softmax, sum and output differ after them."""
    history = [
        replace(tensor(name, 10, "SET_ROWS", delta), kv_history=True)
        for name, delta in (("cache_k_l10", 0.5), ("cache_v_l10", 0.25))
    ]
    after = [
        tensor("kq-10", 10, "MUL_MAT", 1e-3),
        tensor("kq_soft_max-10", 10, "SOFT_MAX", 1e-4),
        tensor("kqv-10", 10, "MUL_MAT", 1e-4),
        tensor("kqv_out-10", 10, "CONT", 1e-4),
        tensor("l_out-10", 10, "ADD", 1e-3),
    ]
    return made(tensors=(tensor("l_out-9", 9, "ADD", 0.0), *history, *after))


def test_a_first_difference_in_the_caches_history_names_the_cache_and_the_calls() -> None:
    cause = history_autopsy().cause()
    assert "The first difference is in layer 10's K cache (cache_k_l10)" in cause
    assert "entries written by earlier decode calls, not computed in this step" in cause
    assert "computed the earlier tokens differently (by each lane's own settings)" in cause
    assert (
        "reaches the attention scores (kq), the softmax (kq_soft_max), the weighted sum "
        "(kqv) and attention's output (kqv_out)"
    ) in cause
    assert "lane a computes this step 8 tokens wide and lane b 1" in cause
    assert "The first operation that differs" not in cause and "SET_ROWS operation" not in cause
    pair = presets()["spec-vs-plain"]
    named = history_autopsy().with_lanes(pair.a, pair.b).cause()
    assert "by each lane's own settings" not in named
    assert "checked its drafted tokens up to" in named and "one token at a time" in named


def test_the_caches_history_is_shown_beside_the_first_tensor_and_in_the_legend() -> None:
    autopsy = history_autopsy()
    assert "first differing tensor: cache_k_l10 (SET_ROWS) |Δ| 0.5, KV history" in (
        autopsy.panel_text()
    )
    legend = autopsy.legend()
    assert legend[0].startswith("SET_ROWS: the operation that last wrote the first")
    assert "a write into the KV cache" in legend[0]
    assert legend[1].startswith("KV history: the difference lies in KV cache entries")
    own = made(tensors=(tensor("cache_k_l10", 10, "SET_ROWS", 0.5),))
    assert "KV history" not in own.panel_text() and "KV history" not in " ".join(own.legend())
    assert "the write into the KV cache of layer 10's K cache (cache_k_l10, SET_ROWS)" in (
        own.cause()
    )


def test_an_older_record_whose_first_difference_is_kqv_out_keeps_its_sentence() -> None:
    pair = presets()["spec-vs-plain"]
    tensors = (tensor("l_out-9", 9, "ADD", 0.0), tensor("kqv_out-10", 10, "CONT", 3.6e-4))
    cause = made(tensors=tensors, verify_width=(1, 1)).with_lanes(pair.a, pair.b).cause()
    assert "The first tapped tensor that differs is layer 10's attention output" in cause
    assert "the attention before it (its scores, softmax and weighted sum)." in cause
    assert "not tapped" not in cause
    assert "Both lanes computed this step 1 token wide" in cause
    assert "checked its drafted tokens up to" in cause


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("cache_k_l10", "K cache"),
        ("cache_v_l3 (view)", "V cache"),
        ("kq-10", "attention scores"),
        ("kq_soft_max-10", "attention weights (the softmax of its scores)"),
        ("kqv-10", "attention's weighted sum of values"),
        ("kqv_out-10", "attention output"),
        ("Kcur-0 (view)", "attention key"),
        ("node_42", "an unnamed intermediate tensor"),
        ("mystery-3", "mystery"),
    ],
)
def test_tensor_words_know_the_caches_and_attentions_inner_tensors(name: str, words: str) -> None:
    from specdiff.autopsy.words import op_meaning, op_words, tensor_words

    assert tensor_words(name) == words
    assert op_words("SET_ROWS") == "the write into the KV cache"
    assert op_meaning("SET_ROWS").startswith("a write into the KV cache")
    assert op_words("SOFT_MAX") == "the softmax" and op_meaning("SOFT_MAX")


def test_a_stage_says_the_time_left_in_seconds_then_minutes_and_nothing_before_a_measure() -> None:
    assert AutopsyStage("the pair as given", 1, 8).line() == "run 1/8: the pair as given"
    assert AutopsyStage("repack off", 3, 8, 39.6).line() == (
        "run 3/8: repack off · about 40 s left · fewer --max-tokens is faster"
    )
    taps = AutopsyStage("tapping both lanes at token 30", None, 8, 0.2)
    assert taps.line("max tokens") == (
        "tapping both lanes at token 30 · about 1 s left · fewer max tokens is faster"
    )
    assert taps.done == 8 and AutopsyStage("repack off", 3, 8).done == 2
    assert [duration(s) for s in (119.4, 120, 1000)] == ["119 s", "2 min", "17 min"]
