"""Repeat mode on the real model: the same prompt beside other sequences in the batch,
its runs continuously batched, and sweeps of the companions; the options' refusals."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.dom.minidom
from pathlib import Path

import pytest

from specdiff.cli import main
from specdiff.engine.llama.batched import BatchedLane, BatchedRun
from specdiff.engine.llama.lane import LocalLane
from specdiff.errors import PromptError
from specdiff.lanes import Lane
from specdiff.prompts import DEFAULT_PROMPT
from specdiff.repeat import companions_for
from specdiff.repeat_summary import (
    RepeatResult,
    first_split,
    format_summary,
    format_sweep,
    summary,
    sweep_summary,
)
from specdiff.reports.repeat import sweep_chart
from specdiff.steps import Candidate, TokenStep, text_of


@pytest.mark.model
def test_alone_in_its_batches_a_run_equals_the_plain_lane() -> None:
    lane = Lane()
    plain = LocalLane(lane, "a")
    try:
        prompt = plain.tokenize(DEFAULT_PROMPT)
        expected = [step.token_id for step in plain.generate(prompt, 40)]
    finally:
        plain.close()
    with BatchedLane(lane, 2) as batched:
        alone = batched.run(prompt, [], 40)
        again = batched.run(prompt, [], 40)
        beside = batched.run(prompt, [batched.tokenize("Once upon a time")], 40)
    assert alone.token_ids == expected == again.token_ids
    assert set(alone.widths) == {1} and set(beside.widths) == {2}
    assert len(beside.steps) == 40


def plain_decode(max_tokens: int) -> tuple[list[int], str]:
    """The default prompt's greedy tokens and text from the plain lane: one sequence,
    alone."""
    plain = LocalLane(Lane(), "a")
    try:
        steps = list(plain.generate(plain.tokenize(DEFAULT_PROMPT), max_tokens))
    finally:
        plain.close()
    return [step.token_id for step in steps], text_of(steps)


@pytest.mark.model
@pytest.mark.parametrize(("runs", "batch"), [(3, 1), (7, 3)])
def test_continuous_batching_keeps_every_run_and_the_batch_full(runs: int, batch: int) -> None:
    expected, _ = plain_decode(16)
    ended: list[tuple[int, BatchedRun]] = []
    with BatchedLane(Lane(), batch - 1) as batched:
        prompt = batched.tokenize(DEFAULT_PROMPT)
        batched.run_continuous(prompt, runs, 16, lambda number, run: ended.append((number, run)))
    assert sorted(number for number, _ in ended) == list(range(runs))
    for _, run in ended:
        assert 0 < len(run.steps) <= 16 and len(run.widths) == len(run.steps)
        assert [step.index for step in run.steps] == list(range(len(run.steps)))
        assert max(run.widths) <= batch and run.companions == max(run.widths) - 1
    # runs enter one per decode call, beside the runs already in flight
    assert max(max(run.widths) for _, run in ended) == min(batch, runs)
    if batch == 1:  # alone in its calls, a run is the plain lane's greedy decode
        assert all(run.token_ids == expected for _, run in ended)


@pytest.mark.model
@pytest.mark.parametrize(("batch", "text"), [(256, DEFAULT_PROMPT), (3, "")])
def test_continuous_batching_without_a_shared_prefix(batch: int, text: str) -> None:
    """At llama.cpp's 256 sequences no id is left for the shared prompt, and a one-token
    prompt has nothing to share: both decode each run's whole prompt in its own rows."""
    ended: list[BatchedRun] = []
    with BatchedLane(Lane(n_ctx=8192, n_batch=1024), batch - 1) as batched:
        prompt = batched.tokenize(text)
        assert (len(prompt) == 1) == (text == "")
        batched.run_continuous(prompt, 4, 6, lambda _, run: ended.append(run))
    assert len(ended) == 4 and all(0 < len(run.steps) <= 6 for run in ended)
    assert max(max(run.widths) for run in ended) == min(batch, 4)


@pytest.mark.model
def test_a_batched_run_alone_is_the_plain_lane_and_all_share_its_first_pick() -> None:
    """The shared prompt is decoded as the plain lane decodes it: a run with no other
    in flight is the plain lane's greedy decode, and every run's first pick is its."""
    expected, _ = plain_decode(16)
    alone: list[BatchedRun] = []
    together: list[BatchedRun] = []
    with BatchedLane(Lane(), 3) as batched:
        prompt = batched.tokenize(DEFAULT_PROMPT)
        batched.run_continuous(prompt, 1, 16, lambda _, run: alone.append(run))
        batched.run_continuous(prompt, 6, 16, lambda _, run: together.append(run))
    assert alone[0].token_ids == expected and set(alone[0].widths) == {1}
    assert {run.token_ids[0] for run in together} == {expected[0]}
    assert max(max(run.widths) for run in together) == 4


@pytest.mark.model
def test_continuous_batching_refuses_what_one_call_or_the_kv_memory_cannot_hold() -> None:
    # llama.cpp aborts the process making a context of more sequences than n_ubatch
    with pytest.raises(
        PromptError, match="64 sequences in one context need n_ubatch of at least 65"
    ):
        BatchedLane(Lane(n_batch=32, n_ubatch=32), 63)
    with BatchedLane(Lane(n_ctx=256), 7) as batched:
        prompt = batched.tokenize(DEFAULT_PROMPT)
        needed = len(prompt) + 8 * 64
        with pytest.raises(PromptError, match=f"need {needed} KV cells; n_ctx is 256"):
            batched.run_continuous(prompt, 4, 64, lambda *_: None)


@pytest.mark.model
def test_continuous_batching_takes_a_prompt_longer_than_a_batch() -> None:
    """The shared prompt is decoded once in n_batch pieces: a prompt of more rows than
    one call holds still runs batched, and every run of it continues the same text."""
    ended: list[BatchedRun] = []
    with BatchedLane(Lane(n_batch=32, n_ubatch=32), 2) as batched:
        prompt = batched.tokenize("The Roman Empire was large and old. " * 12)
        assert len(prompt) > 2 * 32
        batched.run_continuous(prompt, 5, 6, lambda _, run: ended.append(run))
    assert len(ended) == 5 and all(len(run.steps) == 6 for run in ended)


def test_companions_rotate_and_grow_with_the_run_number() -> None:
    assert [companions_for(r, 3, 12) for r in range(5)] == [[], [1], [2, 3], [3, 4, 5], []]
    assert [companions_for(r, 2, 12, exact=True) for r in range(3)] == [[0, 1], [1, 2], [2, 3]]


def test_first_split() -> None:
    assert first_split([[1, 2, 3], [1, 2, 3]]) is None
    assert first_split([[1, 2, 3], [1, 5, 3], [1, 2, 4]]) == 1
    assert first_split([[1, 2], [1, 2, 3]]) == 2


def test_the_summary_groups_runs_and_reads_each_pick_at_the_split() -> None:
    """Three runs in two completions that part at token 2 (and one that ends there): the
    groups, the split and each group's pick there, whatever this CPU's kernels do."""
    runs = [fake_run([1, 2, 3, 4], 0), fake_run([1, 2, 5, 6], 1), fake_run([1, 2, 3, 4], 2)]
    runs.append(fake_run([1, 2], 3))
    result = RepeatResult(Lane(), "p", 4, 3, runs, [[], ["c1"], ["c1", "c2"], ["c1"] * 3])
    data = summary(result)
    assert data["unique"] == 3 and data["first_split"] == 2
    assert [group["runs"] for group in data["groups"]] == [[0, 2], [1], [3]]
    assert [group.get("at_split", {}).get("token_id") for group in data["groups"]] == [3, 5, None]
    assert all(group["at_split"]["margin"] == 1.0 for group in data["groups"][:2])
    alike = summary(RepeatResult(Lane(), "p", 4, 1, runs[:1] * 2, [[], ["c1"]]))
    assert alike["unique"] == 1 and alike["first_split"] is None
    assert not any("at_split" in group for group in alike["groups"])


@pytest.mark.model
def test_repeat_reports_unique_completions_and_the_split(capsys) -> None:
    code = main(
        ["repeat", "-n", "4", "--companions", "3", "--max-tokens", "40", "--json", "--quiet"]
    )
    data = json.loads(capsys.readouterr().out)
    assert data["runs"] == 4 and sum(g["count"] for g in data["groups"]) == 4
    assert data["unique"] == len(data["groups"])
    assert sorted(r for g in data["groups"] for r in g["runs"]) == [0, 1, 2, 3]
    assert [r["companions"] for r in data["per_run"]][0] == []
    assert code == (0 if data["unique"] == 1 else 1)
    # whether the runs split depends on this CPU's kernels: both outcomes are checked
    # alike here, and test_the_summary_groups_runs_and_reads_each_pick_at_the_split
    # checks a split on every machine
    split = data["first_split"]
    assert (split is None) == (data["unique"] == 1)
    at_split = [g["at_split"] for g in data["groups"] if "at_split" in g]
    assert (at_split == []) == (split is None)
    assert all(point["margin"] >= 0 for point in at_split)
    print(
        f"\nrepeat, 4 runs beside 0..3 sequences: {data['unique']} unique, split at "
        f"{data['first_split']}"
    )


@pytest.mark.model
@pytest.mark.parametrize("mode", [["--batch", "64"], ["--companions", "40"]])
def test_repeat_refuses_more_sequences_than_n_ubatch_in_one_line(mode: list[str]) -> None:
    """llama.cpp aborts the worker making such a context: refused before it is made."""
    lanes = ["--lane", "n_ubatch=32", "--lane", "n_batch=32"]
    done = subprocess.run(
        [sys.executable, "-m", "specdiff", "repeat", "-n", "2", "--max-tokens", "4", *mode, *lanes],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    errors = [line for line in done.stderr.splitlines() if line.startswith("specdiff: error:")]
    assert done.returncode == 2 and len(errors) == 1, done.stderr
    assert "need n_ubatch of at least" in errors[0] and "Traceback" not in done.stderr


def test_repeat_refuses_a_speculative_lane_and_bad_counts(capsys) -> None:
    for arguments, message in (
        (["--lane", "speculation=ngram"], "repeat runs a plain lane"),
        (["-n", "0"], "--runs: must be from 1 to"),
        (["--companions", "-1"], "--companions: must be from 0 to"),
    ):
        assert main(["repeat", "--quiet", *arguments]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--companions", ""], "--companions: needs whole numbers separated by commas"),
        (["--companions", "0,,3"], "--companions: needs whole numbers separated by commas"),
        (["--companions", "1,"], "--companions: needs whole numbers separated by commas"),
        (["--companions", "0,-1"], "--companions: must be from 0 to 255, got -1"),
        (["--companions", "0,1,1"], "--companions: lists 1 twice"),
        (["--companions", "0,one"], "--companions: must be a whole number, got 'one'"),
        (["--companions", "0,1.5"], "--companions: must be a whole number, got '1.5'"),
        (["--concurrency", "1,0", "--endpoint", "http://127.0.0.1:9"], "must be from 1 to"),
        (["--concurrency", "2,2", "--endpoint", "http://127.0.0.1:9"], "lists 2 twice"),
        (["--concurrency", "1,x", "--endpoint", "http://127.0.0.1:9"], "a whole number"),
        (["--concurrency", "1,2"], "--concurrency needs --endpoint"),
        (["--companions", "1", "--endpoint", "http://127.0.0.1:9"], "with --endpoint use"),
        (["--batch", "0"], "--batch: must be from 1 to 256"),
        (["--batch", "4", "--companions", "1"], "drop --companions"),
        (["--batch", "4", "--endpoint", "http://127.0.0.1:9"], "use --concurrency"),
        (["--plot", "s.svg"], "--plot draws a sweep"),
        (["--plot", "s.svg", "--batch", "4"], "--plot draws a sweep"),
        (["--plot", "s.png", "--companions", "0,1"], "name a .svg file"),
        (["--plot", "no/such/s.svg", "--companions", "0,1"], "folder no/such does not exist"),
        (["--batch", "255", "--max-tokens", "200"], "raise n_ctx"),
        (["--endpoint", ""], "a server lane needs endpoint="),
        (["--endpoint", "  "], "a server lane needs endpoint="),
        (["--endpoint", "http://127.0.0.1:9,"], "ends in a comma"),
        (["--plot", "{tmp}", "--companions", "0,1"], "is a folder"),
        (["--plot", "/dev/null", "--companions", "0,1"], "character device"),
        (["--lane", "chat=chatml"], "chat would change nothing"),
        (["--lane", "chat=true"], "chat would change nothing"),
    ],
)
def test_repeat_options_are_refused_in_one_line(capsys, tmp_path, arguments, message) -> None:
    code = main(["repeat", "--quiet", *(a.replace("{tmp}", str(tmp_path)) for a in arguments)])
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in captured.err, captured.err
    assert message in lines[0] and captured.out == ""


def fake_run(tokens: list[int], companions: int) -> BatchedRun:
    """A run with the given token ids, each step a clear pick (margin 1)."""
    run = BatchedRun(companions)
    for index, token in enumerate(tokens):
        top = (Candidate(token, 2.0, b"t"), Candidate(token + 1000, 1.0, b"u"))
        run.steps.append(TokenStep("a", index, token, b"t", top, False, 1, 0.0))
    return run


@pytest.mark.parametrize(
    ("points", "departs", "splits", "shares"),
    [
        ([[[1, 2, 3]] * 3, [[1, 2, 3]] * 3], [None, None], [None, None], [1.0, 1.0]),
        ([[[1, 2, 3]] * 3, [[1, 2, 3], [1, 5, 3], [1, 2, 3]]], [None, 1], [None, 1], [1, 2 / 3]),
        ([[[1, 2], [1, 2], [1, 4]], [[1, 4]] * 2], [1, 1], [1, None], [2 / 3, 1.0]),
        ([[[1, 2, 3]] * 2, [[1, 2]] * 2, [[7]]], [None, 2, 0], [None, None, None], [1, 1, 1]),
    ],
)
def test_a_sweep_counts_splits_and_departures_per_value(
    points: list[list[list[int]]], departs: list, splits: list, shares: list, tmp_path: Path
) -> None:
    values = [0, 1, 3][: len(points)]
    results = []
    for value, completions in zip(values, points):
        runs = [fake_run(tokens, value) for tokens in completions]
        results.append(RepeatResult(Lane(), "p", 3, value, runs, [[]] * len(runs)))
    data = sweep_summary(results, values, len(points[0]))
    assert [p["departs_at"] for p in data["points"]] == departs
    assert [p["first_split"] for p in data["points"]] == splits
    assert [p["largest_share"] for p in data["points"]] == pytest.approx(shares)
    assert [p["unique"] for p in data["points"]] == [len({tuple(c) for c in p}) for p in points]
    assert not data["cancelled"] and data["sweep"] == "companions"
    table = format_sweep(data).splitlines()
    assert len(table) == 2 + len(values)
    chart = sweep_chart(data)
    xml.dom.minidom.parseString(chart)  # one well-formed SVG document
    assert all(f">{value}</text>" in chart for value in values)


def test_a_stopped_sweep_says_so_and_charts_the_values_it_reached() -> None:
    done = RepeatResult(Lane(), "p", 2, 0, [fake_run([1, 2], 0)], [[]])
    stopped = RepeatResult(Lane(), "p", 2, 3, [], [], cancelled=True)
    data = sweep_summary([done, stopped], [0, 3, 7], 4)
    assert data["cancelled"] and len(data["points"]) == 2
    assert data["points"][1]["unique"] == 0 and data["points"][1]["first_split"] is None
    assert format_sweep(data).endswith("stopped: the table covers the runs that finished")
    xml.dom.minidom.parseString(sweep_chart(data))


@pytest.mark.model
def test_a_companion_sweep_reports_each_value_and_plots_it(capsys, tmp_path: Path) -> None:
    plot = tmp_path / "sweep.svg"
    argv = ["repeat", "-n", "2", "--companions", "0,2", "--max-tokens", "12", "--json"]
    code = main([*argv, "--plot", str(plot)])
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert data["sweep"] == "companions" and data["values"] == [0, 2]
    assert [p["runs"] for p in data["points"]] == [2, 2]
    for point in data["points"]:
        per_run = point["summary"]["per_run"]
        assert [len(run["companions"]) for run in per_run] == [point["value"]] * 2
    alone = data["points"][0]
    assert alone["unique"] == 1 and alone["departs_at"] is None  # alone, greedy is fixed
    assert code == (0 if max(p["unique"] for p in data["points"]) == 1 else 1)
    # the progress goes to stderr, not a line per run: here one at each tenth of 4 runs
    progress = [line for line in captured.err.splitlines() if " runs · " in line]
    assert progress and progress[-1].lstrip("[█░] ").startswith("4/4 runs")
    chart = plot.read_text()
    xml.dom.minidom.parseString(chart)
    assert ">0</text>" in chart and ">2</text>" in chart
    with capsys.disabled():
        print("\n" + format_sweep(data))


@pytest.mark.model
def test_batched_runs_report_groups_and_the_alone_run_equals_the_plain_lane(capsys) -> None:
    expected, text = plain_decode(12)
    code = main(["repeat", "-n", "5", "--batch", "3", "--max-tokens", "12", "--json", "--quiet"])
    data = json.loads(capsys.readouterr().out)
    assert data["runs"] == 5 and data["batch"] == 3
    assert sum(g["count"] for g in data["groups"]) == 5
    assert sorted(r for g in data["groups"] for r in g["runs"]) == list(range(5))
    largest = max(g["count"] for g in data["groups"])
    assert data["largest_share"] == pytest.approx(largest / 5)
    assert code == (0 if data["unique"] == 1 else 1)
    main(["repeat", "-n", "2", "--batch", "1", "--max-tokens", "12", "--json", "--quiet"])
    alone = json.loads(capsys.readouterr().out)
    assert alone["unique"] == 1 and alone["groups"][0]["tokens"] == len(expected)
    assert alone["groups"][0]["text"] == text
    with capsys.disabled():
        print(f"\nrepeat -n 5 --batch 3: {data['unique']} unique, split {data['first_split']}")


def worded_run(words: list[str], companions: int) -> BatchedRun:
    """A run whose tokens are `words`, one id per distinct word."""
    run = BatchedRun(companions)
    for index, word in enumerate(words):
        token = sum(word.encode()) + 7 * len(word)
        top = (Candidate(token, 2.0, word.encode()), Candidate(token + 1, 1.0, b"?"))
        run.steps.append(TokenStep("a", index, token, word.encode(), top, False, 1, 0.0))
    return run


def test_a_group_alike_at_first_is_shown_from_where_it_differs() -> None:
    """Two completions that share their first 60 characters: the lone run's line says
    'run', not 'runs', and shows the text from just before it leaves the larger group's,
    with the token where it does."""
    shared = [" The", " ship", " sailed", " out", " of", " the", " harbour", " at", " dawn,"]
    shared += [" and", " the", " crew", " watched", " the", " coast"]
    common, lone = [*shared, " fade", " away."], [*shared, " vanish", " slowly."]
    runs = [worded_run(common, 0), worded_run(lone, 1), worded_run(common, 2)]
    data = summary(RepeatResult(Lane(), "p", 20, 2, runs, [[]] * 3))
    assert data["unique"] == 2 and data["groups"][1]["departs_at"] == len(shared)
    lines = format_summary(data).splitlines()
    largest = next(line for line in lines if line.startswith("  #1: "))
    alone = next(line for line in lines if line.startswith("  #2: "))
    assert largest.startswith("  #1: 2 runs (runs 0, 2;") and "differs" not in largest
    assert alone.startswith("  #2: 1 run (run 1;")
    assert f"differs from #1 at token {len(shared)}: '…" in alone
    assert "vanish slowly." in alone and "fade" not in alone
