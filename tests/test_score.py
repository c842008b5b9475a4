"""specdiff score's statistics, chunking and input checks (fast tier), and the command
on the real model (model marker)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from specdiff.cli import main
from specdiff.cli.score import read_text
from specdiff.errors import PromptError
from specdiff.fork_words import counted
from specdiff.lanes import presets
from specdiff.reports.score import score_json
from specdiff.scoring import (
    ROWS_PER_BLOCK,
    ScoreResult,
    plan_chunks,
    score_rows,
    summarise,
)
from tests.conftest import ROOT

VOCAB = 262_144
"""Gemma 3's vocabulary: the size the sums must keep their digits over."""


def reference_kld(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """KL(a||b) per row, every step in float64: the definition, written plainly."""
    log_a = a.astype(np.float64)
    log_a -= log_a.max(axis=1, keepdims=True)
    log_a -= np.log(np.exp(log_a).sum(axis=1, keepdims=True))
    log_b = b.astype(np.float64)
    log_b -= log_b.max(axis=1, keepdims=True)
    log_b -= np.log(np.exp(log_b).sum(axis=1, keepdims=True))
    return (np.exp(log_a) * (log_a - log_b)).sum(axis=1)


def logit_rows(kind: str, rows: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Two lanes' rows of one class: near-identical (numerics), quantization-sized,
    peaked (one token far ahead), flat, and different vocabularies of tie."""
    a = (rng.standard_normal((rows, VOCAB)) * 3).astype(np.float32)
    if kind == "numerics":
        b = a + (rng.standard_normal(a.shape) * 1e-3).astype(np.float32)
    elif kind == "quantization":
        b = a + (rng.standard_normal(a.shape) * 0.1).astype(np.float32)
    elif kind == "peaked":
        a[:, 7] += 40
        b = a + (rng.standard_normal(a.shape) * 0.3).astype(np.float32)
    elif kind == "flat":
        a = np.zeros_like(a)
        b = (rng.standard_normal(a.shape) * 0.05).astype(np.float32)
    else:  # "shifted": the same distribution, every logit moved by a constant
        b = a + np.float32(5.0)
    return a, b


@pytest.mark.parametrize("kind", ["numerics", "quantization", "peaked", "flat", "shifted"])
def test_kld_matches_the_float64_definition(kind):
    rng = np.random.default_rng(len(kind))
    rows = 2
    a, b = logit_rows(kind, rows, rng)
    expected = reference_kld(a, b)
    scores = score_rows(a.copy(), b.copy(), list(range(rows)), 10)
    got = np.array([score.kld for score in scores])
    assert [score.position for score in scores] == list(range(10, 10 + rows))
    # float32 elementwise, float64 sums: within a part in 10^4 of the definition, and
    # a few 1e-8 absolute (the float32 rounding of shifted logits), far below any real
    # pair's divergence
    assert np.all(np.abs(got - expected) <= 1e-4 * expected + 5e-8), (got, expected)
    assert np.all(got >= 0)


@pytest.mark.parametrize("kind", ["numerics", "quantization", "peaked", "flat"])
def test_tops_margins_and_token_figures(kind):
    rng = np.random.default_rng(7)
    a, b = logit_rows(kind, 2, rng)
    tokens = [int(t) for t in rng.integers(0, VOCAB, 2)]
    before = a.copy()
    scores = score_rows(a, b, tokens, 0)
    assert np.array_equal(a, before), "the rows are left as they were given"
    for k, score in enumerate(scores):
        ordered = np.sort(a[k].astype(np.float64))[::-1]
        assert score.top_a == int(a[k].argmax()) and score.top_b == int(b[k].argmax())
        assert math.isclose(score.margin_a, ordered[0] - ordered[1], abs_tol=1e-6)
        assert math.isclose(score.logit_delta, abs(float(a[k, tokens[k]]) - float(b[k, tokens[k]])))
        log_p = a[k].astype(np.float64) - np.log(np.exp(a[k].astype(np.float64)).sum())
        assert math.isclose(score.logprob_a, log_p[tokens[k]], abs_tol=1e-5)
        assert score.same_top == (score.top_a == score.top_b)


@pytest.mark.parametrize("rows", [1, ROWS_PER_BLOCK, ROWS_PER_BLOCK * 2 + 3])
def test_identical_rows_score_zero_and_no_flips(rows):
    a = (np.random.default_rng(3).standard_normal((rows, 512)) * 3).astype(np.float32)
    scores = score_rows(a.copy(), a.copy(), list(range(rows)), 0)
    assert [score.position for score in scores] == list(range(rows))
    assert all(score.kld == 0.0 and score.logit_delta == 0.0 for score in scores)
    summary = summarise(scores)
    assert summary.flips == 0 and summary.same_top_percent == 100.0
    assert summary.perplexity_a == summary.perplexity_b


@pytest.mark.parametrize("count", [1, 2, 10, 101])
def test_summary_statistics(count):
    rng = np.random.default_rng(count)
    a = rng.standard_normal((count, 64)).astype(np.float32)
    b = rng.standard_normal((count, 64)).astype(np.float32)
    scores = score_rows(a, b, [0] * count, 0)
    summary = summarise(scores)
    values = np.array([score.kld for score in scores])
    assert summary.positions == count
    assert math.isclose(summary.mean_kld, values.mean(), rel_tol=1e-12)
    for figure, share in (("median_kld", 50), ("p90_kld", 90), ("p99_kld", 99)):
        assert math.isclose(getattr(summary, figure), np.percentile(values, share), rel_tol=1e-12)
    assert summary.max_kld == values.max()
    flips = sum(not score.same_top for score in scores)
    assert summary.flips == flips
    assert math.isclose(summary.same_top_percent, 100 * (count - flips) / count)


@pytest.mark.parametrize("tokens", [2, 3, 17, 128, 129, 257, 1000])
@pytest.mark.parametrize("chunk", [16, 64, 128])
def test_every_position_is_scored_once(tokens, chunk):
    chunks = plan_chunks(tokens, chunk, "all")
    predicted = [
        piece.start + row + 1
        for piece in chunks
        for row in range(piece.first_scored, piece.length - 1)
    ]
    assert predicted == list(range(1, tokens))
    assert all(2 <= piece.length <= chunk for piece in chunks)


@pytest.mark.parametrize("tokens", [16, 127, 128, 300, 1000])
@pytest.mark.parametrize("chunk", [16, 128])
def test_perplexity_convention(tokens, chunk):
    """Whole chunks only, side by side, each scoring rows n_ctx/2 .. n_ctx-2, as
    llama-perplexity's kl_divergence does."""
    chunks = plan_chunks(tokens, chunk, "perplexity")
    assert len(chunks) == tokens // chunk
    for number, piece in enumerate(chunks):
        assert (piece.start, piece.length, piece.first_scored) == (
            number * chunk,
            chunk,
            chunk // 2,
        )


def specdiff(*arguments: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "specdiff", "score", *arguments],
        capture_output=True,
        text=True,
        input=stdin,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=600,
        check=False,
    )


BAD_INPUTS = {
    "missing file": (["{tmp}/missing.txt"], "text file not found"),
    "missing folder": (["missing-folder/"], "text file not found"),
    "folder": (["{tmp}/folder"], "is a folder"),
    "not utf-8": (["{tmp}/latin.txt"], "not UTF-8"),
    "blank file": (["{tmp}/blank.txt"], "empty"),
    "blank text": (["   "], "empty"),
    "unknown pair": (["some text", "--pair", "no-such-pair"], "unknown pair"),
    "n_ctx too small": (["some text", "--n-ctx", "8"], "--n-ctx"),
    "n_ctx not a number": (["some text", "--n-ctx", "lots"], "--n-ctx"),
    "server lanes": (["some text", "--pair", "servers"], "in-process lanes only"),
    "unknown lane key": (["some text", "--lane-b", "nonsense=1"], "nonsense"),
    "negative flips": (["some text", "--flips", "-1"], "--flips"),
    "empty text": ([""], "empty"),
    "--out a folder": (["some text", "--out", "{tmp}/folder"], "--out: "),
    "--out in a missing folder": (["some text", "--out", "{tmp}/none/r.txt"], "does not exist"),
    "--out a device": (["some text", "--out", "/dev/null"], "character device"),
    "--out a pipe": (["some text", "--out", "{tmp}/pipe"], "named pipe"),
    "--out the text": (["{tmp}/text.txt", "--out", "{tmp}/./text.txt"], "the text being scored"),
    "--out a link to the text": (["{tmp}/text.txt", "--out", "{tmp}/link.txt"], "being scored"),
}


@pytest.fixture
def inputs_folder(tmp_path):
    (tmp_path / "folder").mkdir()
    (tmp_path / "latin.txt").write_bytes("caf\xe9 au lait".encode("latin-1"))
    (tmp_path / "blank.txt").write_text(" \n\t\n", encoding="utf-8")
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "text.txt").write_text("a text a report must not replace", encoding="utf-8")
    (tmp_path / "link.txt").symlink_to(tmp_path / "text.txt")
    return tmp_path


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_is_one_line_and_exit_2(case, inputs_folder, capsys):
    """Refused before any model loads: this tier never loads llama.cpp."""
    arguments, says = BAD_INPUTS[case]
    code = main(["score", *(a.replace("{tmp}", str(inputs_folder)) for a in arguments)])
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 2 and captured.out == ""
    assert len(lines) == 1 and lines[0].startswith("specdiff: error:"), lines
    assert says in lines[0], lines
    assert (inputs_folder / "text.txt").read_text() == "a text a report must not replace"


def test_a_real_process_refuses_empty_stdin_in_one_line():
    done = specdiff("-", stdin="  \n")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        "specdiff: error: the text to score is empty; give some text or a file holding it"
    ]


SAMPLE = (
    "def add(a, b):\n    return a + b\n\n# The sum of two numbers, as a small test of "
    "the scorer: every token of this text is forced through both lanes."
)


@pytest.mark.model
def test_lanes_alike_in_scoring_score_zero():
    """A pair whose lanes differ only in what a teacher-forced evaluation does not use
    (drafts here; a cached prefix is the same case) computes the same distributions: KLD
    0 at every position, and says so."""
    done = specdiff(SAMPLE, "--pair", "spec-vs-plain", "--n-ctx", "32", "--json")
    assert done.returncode == 0, done.stderr
    assert "differ only in what a teacher-forced evaluation does not use" in done.stderr
    report = json.loads(done.stdout)
    assert report["summary"]["max_kld"] == 0.0 and report["summary"]["flips"] == 0
    assert len(report["positions"]) == report["tokens"] - 1


@pytest.mark.model
def test_a_context_far_beyond_the_text_reserves_memory_for_the_text_only():
    """--n-ctx 1048576 on a ten-token text: the lanes' KV memory is sized to the text
    (a context of the chunk's size took 22 GB, and the kernel killed the worker)."""
    import resource

    done = specdiff(SAMPLE, "--pair", "quant", "--n-ctx", "1048576", "--json")
    assert done.returncode in (0, 1), done.stderr
    assert json.loads(done.stdout)["chunk"] == 1048576
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    assert peak_kib < 4 * 1024 * 1024, f"{peak_kib} KiB"


@pytest.mark.model
@pytest.mark.parametrize("like_perplexity", [False, True])
def test_score_report_holds_together(tmp_path, like_perplexity):
    """Q4_K_M vs Q8_0: the JSON's positions, summary and flips agree with each other and
    with the chunk plan; the text report says the same, token text escaped."""
    text = tmp_path / "text.txt"
    text.write_text((SAMPLE + "\x1b]0;title\x07\n") * 2, encoding="utf-8")
    out = tmp_path / "report.json"
    options = ["--pair", "quant", "--n-ctx", "32"]
    options += ["--like-perplexity"] if like_perplexity else []
    done = specdiff(str(text), *options, "--json", "--out", str(out))
    assert done.returncode in (0, 1), done.stderr
    report = json.loads(done.stdout)
    assert json.loads(out.read_text(encoding="utf-8")) == report
    positions = report["positions"]
    chunks = plan_chunks(report["tokens"], 32, report["convention"])
    assert len(positions) == sum(piece.length - 1 - piece.first_scored for piece in chunks)
    values = [position["kld"] for position in positions]
    assert math.isclose(report["summary"]["mean_kld"], sum(values) / len(values))
    assert report["summary"]["max_kld"] > 0, "two quantizations never agree exactly"
    flips = [position["position"] for position in positions if not position["same_top"]]
    assert [flip["position"] for flip in report["flips"]] == flips
    assert report["summary"]["flips"] == len(flips)
    assert done.returncode == (1 if flips else 0)
    if like_perplexity:
        shown = specdiff(str(text), *options, "--quiet")
        assert f"({counted(len(flips), 'flip')})" in shown.stdout and "\x1b" not in shown.stdout


@pytest.mark.parametrize("name", ["quant", "ubatch", "threads"])
def test_the_json_report_names_what_each_lane_is(name):
    """Most scoring pairs differ in quantization or batch sizes, which a lane's plain
    description leaves out: the JSON must tell lane a from lane b."""
    pair = presets()[name]
    lanes = score_json(pair, ScoreResult(tokens=2, chunk=16, convention="all"))["lanes"]
    assert lanes["a"] != lanes["b"], lanes


@pytest.mark.parametrize("word", ["3.14", "v1.2", "1e-9", "x", "naïve", "and/or", "10.0.0.1"])
def test_a_lone_word_that_names_no_file_is_scored_as_text(word, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert read_text(word) == word


@pytest.mark.parametrize("word", ["notes.txt", "data/", "~/missing.md", "a.py", "r.jsonl"])
def test_a_lone_missing_file_name_is_refused(word, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(PromptError, match="text file not found"):
        read_text(word)
