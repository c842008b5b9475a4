"""Values on the command line and in a --pairs file that specdiff must refuse in one
line with exit 2, before any model, server or file is touched: numbers that are not
finite or out of range, and pairs files that are not files, not text, not TOML or of
the wrong shape."""

from __future__ import annotations

import argparse
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from specdiff.cli import build_parser, main
from specdiff.cli.options import MAX_TOKENS_LIMIT, finite_number, whole_number
from specdiff.lanes import MAX_PAIRS_FILE_BYTES

NOT_FINITE = ["nan", "-inf", "Infinity", "1e999"]
NOT_A_NUMBER = ["abc", " ", "1,5", "\x1b]52;c;aGk=\x07"]

# (the command and what it needs to parse, the option)
NEAR_TIE = [
    (["run"], "--near-tie"),
    (["live"], "--near-tie"),
    (["export", "session.jsonl"], "--near-tie"),
    (["suite", "coding", "--report", "out"], "--near-tie"),
]
TOKEN_BUDGETS = [
    (["run"], "--max-tokens"),
    (["live"], "--max-tokens"),
    (["suite", "coding", "--report", "out"], "--max-tokens"),
    (["repeat"], "--max-tokens"),
]
COUNTS = [
    *TOKEN_BUDGETS,
    (["repeat"], "--runs"),
    (["repeat"], "--companions"),
    (["repeat"], "--concurrency"),
    (["serve-pair"], "--ctx-size"),
    (["serve-pair"], "--threads"),
    (["models", "variants", "--to", "f16"], "--threads"),
]


def refused(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """main's one error line for argv, which must exit 2 without a traceback."""
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specdiff: error: "), captured.err
    assert "Traceback" not in captured.err and captured.out == ""
    assert not any(ord(c) < 0x20 or c == "\x7f" for c in lines[0]), lines[0]
    return lines[0]


@pytest.mark.parametrize(("command", "option"), NEAR_TIE)
@pytest.mark.parametrize("value", ["nan", "-1", "abc"])
def test_near_tie_must_be_finite_and_not_negative(capsys, command, option, value) -> None:
    error = refused(capsys, [*command, f"{option}={value}"])
    assert f"argument {option}: must be a finite number of at least 0" in error


@pytest.mark.parametrize("value", [*NOT_FINITE, *NOT_A_NUMBER, "-1", "-1e-300", "-0.5"])
def test_finite_number_refuses_every_kind_of_non_number(value: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="must be a finite number"):
        finite_number(0.0)(value)


@pytest.mark.parametrize("value", [*NOT_FINITE, *NOT_A_NUMBER, "1.5", "2e3", "", "-"])
def test_whole_number_refuses_every_kind_of_non_count(value: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="must be a whole number"):
        whole_number(0, 10)(value)


@pytest.mark.parametrize(("command", "option"), NEAR_TIE)
@pytest.mark.parametrize(("value", "expected"), [("0", 0.0), ("0.25", 0.25), ("1e3", 1000.0)])
def test_near_tie_takes_any_finite_number_from_zero(command, option, value, expected) -> None:
    args = build_parser().parse_args([*command, option, value])
    assert args.near_tie == expected


@pytest.mark.parametrize(("command", "option"), COUNTS)
@pytest.mark.parametrize("value", ["inf", "1.5", "ten"])
def test_counts_must_be_whole_numbers(capsys, command, option, value) -> None:
    error = refused(capsys, [*command, f"{option}={value}"])
    assert f"{option}: must be a whole number" in error


@pytest.mark.parametrize(("command", "option"), TOKEN_BUDGETS)
@pytest.mark.parametrize("value", ["0", "-1", str(MAX_TOKENS_LIMIT + 1), "9" * 40])
def test_token_budget_must_fit_a_context(capsys, command, option, value) -> None:
    error = refused(capsys, [*command, option, value])
    assert f"{option}: must be from 1 to {MAX_TOKENS_LIMIT}" in error


@pytest.mark.parametrize(
    ("command", "option", "value", "bounds"),
    [
        (["repeat"], "--runs", "0", "1 to"),
        (["repeat"], "-n", "-3", "1 to"),
        (["repeat"], "--companions", "-1", "0 to 255"),
        (["repeat"], "--companions", "256", "0 to 255"),
        (["repeat"], "--concurrency", "0", "1 to"),
        (["serve-pair"], "--ctx-size", "15", "16 to"),
        (["serve-pair"], "--threads", "-1", "0 to"),
        (["models", "variants", "--to", "f16"], "--threads", "5000", "0 to"),
    ],
)
def test_counts_out_of_range(capsys, command, option, value, bounds) -> None:
    error = refused(capsys, [*command, option, value])
    assert "must be from " + bounds in error


@pytest.mark.parametrize("value", ["nan", "inf", "fast", "0", "-0", "-2", "0.001"])
def test_replay_speed_must_be_finite_and_at_least_a_hundredth(capsys, value: str) -> None:
    error = refused(capsys, ["replay", "session.jsonl", f"--speed={value}"])
    assert "--speed: must be a finite number of at least 0.01" in error


# argv as Python sees bytes that are not UTF-8: each such byte a lone surrogate
NOT_UTF8 = [b"ab\xffc".decode("utf-8", "surrogateescape"), "\udc80", "x\ud800"]


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--prompt"],
        ["live", "--prompt"],
        ["run", "--stop"],
        ["suite", "coding", "--report", "out", "--stop"],
    ],
)
@pytest.mark.parametrize("value", NOT_UTF8)
def test_text_that_is_not_utf8_is_refused(capsys, argv: list[str], value: str) -> None:
    assert "is not UTF-8 text" in refused(capsys, [*argv, value])


def test_number_types_at_their_bounds() -> None:
    budget = whole_number(1, 10)
    assert (budget("1"), budget(" 10 "), budget("0007")) == (1, 10, 7)
    for text in ("0", "11", "1.0", "ten"):
        with pytest.raises(argparse.ArgumentTypeError):
            budget(text)
    above = finite_number(0.0, above=True)
    at_least = finite_number(0.0)
    assert (above("5e-324"), at_least("0"), at_least("-0.0")) == (5e-324, 0.0, -0.0)
    with pytest.raises(argparse.ArgumentTypeError):
        above("0")


# -- --pairs FILE -----------------------------------------------------------------------
PAIRS_SHAPES = [
    ("from = ['ubatch']", "pairs.x.from must be text in quotes, got an array"),
    ("from = { name = 'ubatch' }", "pairs.x.from must be text in quotes, got a table"),
    ("from = 3", "pairs.x.from must be text in quotes, got a number"),
    ("from = true", "pairs.x.from must be text in quotes, got true/false"),
    ("from = 1979-05-27", "pairs.x.from must be text in quotes, got a date or time"),
    ("from = 'no-such-pair'", "unknown pair 'no-such-pair'"),
    ("description = ['a', 'b']", "pairs.x.description must be text in quotes, got an array"),
    ("description = 4.5", "pairs.x.description must be text in quotes, got a number"),
    ("a = 'n_ubatch=2'", "pairs.x.a must be a table of lane keys"),
    ("b = [1, 2]", "pairs.x.b must be a table of lane keys"),
    ("a = { n_ctx = 'big' }", "pairs.x.a: lane key 'n_ctx' must be a whole number"),
    ("a = { n_ctx = [1, 2] }", "pairs.x.a: lane key 'n_ctx' must be a whole number"),
    ("a = { n_ctx = 1.5 }", "pairs.x.a: lane key 'n_ctx' must be a whole number"),
    ("b = { model = 3 }", "pairs.x.b: lane key 'model' must be a string"),
    ("b = { model = { path = 'x' } }", "pairs.x.b: lane key 'model' must be a string"),
    ("b = { spec_adaptive = 'yes' }", "pairs.x.b: lane key 'spec_adaptive' must be true or"),
    ("b = { threads = 99999999999999999999 }", "'threads' must be between 1 and 1024"),
    ("b = { n_batch = 2 }", "pairs.x.b: n_ubatch (512) must not exceed n_batch (2)"),
    ("b = { colour = 'red' }", "pairs.x.b: unknown lane key 'colour'"),
    ("c = {}", "pairs.x has unknown key 'c'"),
]


def pairs_file(folder: Path, text: str) -> Path:
    path = folder / "pairs.toml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(("line", "message"), PAIRS_SHAPES)
def test_pairs_table_of_the_wrong_shape(tmp_path, capsys, line: str, message: str) -> None:
    path = pairs_file(tmp_path, f"[pairs.x]\n{line}\n")
    error = refused(capsys, ["run", "--pairs", str(path)])
    assert str(path) in error and message in error


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("pairs = 3\n", "[pairs] must hold tables like [pairs.my-pair]"),
        ("pairs = ['x']\n", "[pairs] must hold tables like [pairs.my-pair]"),
        ("[pairs]\nx = 3\n", "pairs.x must be a table"),
        ("[pairs]\nx = 'spec-vs-plain'\n", "pairs.x must be a table"),
        ("defaults = 'n_ctx=1'\n", "[defaults] must be a table of lane keys"),
        ("defaults = [1]\n", "[defaults] must be a table of lane keys"),
        ("[defaults]\nn_ctx = 'x'\n", "lane key 'n_ctx' must be a whole number"),
        ("[defaults]\nflash_attn = 'maybe'\n", "lane key 'flash_attn' cannot be 'maybe'"),
        ("[defaults]\nn_ubatch = 1024\n", "[defaults] on pair"),
        ("[defaults]\nwho = 1\n", "defaults: unknown lane key 'who'"),
        ("[lanes]\n", "unknown table 'lanes'"),
        ("[pairs.x\n", "not valid TOML"),
        pytest.param("a = " + "[" * 5000 + "]" * 5000 + "\n", "nested too deep", id="arrays"),
        pytest.param("a = " + "{b = " * 3000 + "1" + "}" * 3000, "nested too deep", id="tables"),
    ],
)
def test_pairs_file_of_the_wrong_shape(tmp_path, capsys, text: str, message: str) -> None:
    path = pairs_file(tmp_path, text)
    error = refused(capsys, ["run", "--pairs", str(path)])
    assert str(path) in error and message in error


@pytest.mark.parametrize(
    ("content", "message"),
    [
        pytest.param(b"\xff\xfe[pairs.x]\n", "not UTF-8 text", id="utf16-bom"),
        pytest.param(bytes(range(256)), "not UTF-8 text", id="binary"),
        pytest.param(b"[pairs.x]\x00\n", "not valid TOML", id="nul"),
        pytest.param(b"x" * (MAX_PAIRS_FILE_BYTES + 1), "is larger than", id="one-byte-over"),
        pytest.param(b"#" * MAX_PAIRS_FILE_BYTES * 3, "is larger than", id="three-times"),
    ],
)
def test_pairs_file_that_is_not_text(tmp_path, capsys, content: bytes, message: str) -> None:
    path = tmp_path / "pairs.toml"
    path.write_bytes(content)
    error = refused(capsys, ["run", "--pairs", str(path)])
    assert str(path) in error and message in error


def test_pairs_file_as_large_as_allowed_is_read(tmp_path: Path) -> None:
    filler = "# padding\n" * ((MAX_PAIRS_FILE_BYTES - 100) // 10)
    path = pairs_file(tmp_path, filler + "[pairs.x]\nfrom = 'ubatch'\n")
    assert path.stat().st_size <= MAX_PAIRS_FILE_BYTES
    assert build_parser().parse_args(["run", "--pairs", str(path)]).pairs == str(path)
    from specdiff.lanes import load_pairs_file

    assert load_pairs_file(path)["x"].b.n_ubatch == 2


@pytest.mark.parametrize("kind", ["folder", "fifo", "device", "dangling link", "missing"])
def test_pairs_path_that_is_not_a_file(tmp_path: Path, kind: str) -> None:
    """In a real process with a timeout: a FIFO with no writer must not block the read."""
    path = tmp_path / "pairs.toml"
    expected = {
        "folder": "is a folder, not a file",
        "fifo": "is a named pipe (FIFO), not a file",
        "device": "is a character device, not a file",
        "dangling link": "pairs file not found",
        "missing": "pairs file not found",
    }[kind]
    if kind == "folder":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        path.symlink_to(os.devnull)
    elif kind == "dangling link":
        path.symlink_to(tmp_path / "nowhere.toml")
    completed = subprocess.run(
        [sys.executable, "-m", "specdiff", "run", "--pairs", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.returncode == 2, completed.stderr
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0] and str(path) in lines[0], lines
    if kind == "fifo":
        assert stat.S_ISFIFO(path.stat().st_mode)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file whatever its permissions")
def test_pairs_file_without_read_permission(tmp_path, capsys) -> None:
    path = pairs_file(tmp_path, "[pairs.x]\nfrom = 'ubatch'\n")
    path.chmod(0)
    error = refused(capsys, ["run", "--pairs", str(path)])
    assert f"cannot read the pairs file {path}: Permission denied" in error


@pytest.mark.parametrize(
    "command",
    [["run"], ["live"], ["suite", "coding", "--report", "out"], ["repeat"], ["serve-pair"]],
)
@pytest.mark.parametrize("value", ["", "  "])
def test_an_empty_model_is_refused_not_read_as_the_bundled_one(capsys, command, value) -> None:
    """An unset shell variable ($MODEL) must not quietly run the bundled model."""
    error = refused(capsys, [*command, "--model", value])
    assert "argument --model: is empty" in error
