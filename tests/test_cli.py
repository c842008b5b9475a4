"""`specdiff run` and `specdiff models` as a user runs them: real processes, real model."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from specdiff.cli import main
from tests.conftest import ForkingPrompt
from tests.fixtures import model_with_changed_token
from tests.in_process import specdiff_here


def specdiff(
    *args: str, stdin: str | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "specdiff", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )


def assert_one_line_error(completed: subprocess.CompletedProcess, *fragments: str) -> None:
    assert completed.returncode == 2, completed.stderr
    lines = [line for line in completed.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("specdiff: error:")]
    assert len(errors) == 1, completed.stderr
    assert "Traceback" not in completed.stderr
    for fragment in fragments:
        assert fragment in errors[0], errors[0]


@pytest.mark.model
def test_run_json_identical_lanes_exit_zero() -> None:
    completed = specdiff(
        "run",
        "--pair",
        "threads",
        "--both",
        "threads=2",
        "--both",
        "threads_batch=2",
        "--prompt",
        "The capital of France is",
        "--max-tokens",
        "8",
        "--json",
        "--quiet",
    )
    assert completed.returncode == 0, completed.stderr
    data = json.loads(completed.stdout)
    assert data["identical"] is True and data["fork"] is None
    a, b = data["lanes"]["a"], data["lanes"]["b"]
    assert a["token_ids"] == b["token_ids"] and len(a["token_ids"]) == 8
    assert a["tokens_per_second"] > 0 and a["executed"]["model_sha256"]
    for key in ("llama_cpp_build", "system_info", "cpu", "llama_cpp_python"):
        assert data["build"][key]
    for key in ("threads", "n_batch", "n_ubatch", "flash_attn", "type_k", "type_v", "repack"):
        assert key in a["executed"]


@pytest.mark.model
def test_run_reports_a_fork_and_exits_one(
    tmp_path: Path, forking_prompt: Callable[[str, int], ForkingPrompt]
) -> None:
    """On a prompt where ubatch 512 vs 2 forks on this CPU: the fork's tokens, probes,
    ranks and margins as run --json reports them."""
    prompt = tmp_path / "prompt.txt"
    prompt.write_text(forking_prompt("ubatch", 40).prompt, encoding="utf-8")
    completed = specdiff(
        "run",
        "--pair",
        "ubatch",
        "--prompt-file",
        str(prompt),
        "--max-tokens",
        "40",
        "--json",
    )
    assert completed.returncode == 1, completed.stdout + completed.stderr
    data = json.loads(completed.stdout)
    fork = data["fork"]
    assert data["lanes"]["a"]["token_ids"][fork["index"]] == fork["token_a"] != fork["token_b"]
    assert (
        data["lanes"]["a"]["token_ids"][: fork["index"]]
        == data["lanes"]["b"]["token_ids"][: fork["index"]]
    )
    for side in ("a", "b"):
        assert fork[side]["own"]["rank"] == 1
        assert fork[side]["other"]["logit"] is not None  # probed even outside the top-k
        own, other = fork[side]["own"]["probability"], fork[side]["other"]["probability"]
        assert 0 < other <= own < 1
        # top-1 minus top-2: no more than the gap to the other lane's pick, which is #2 or lower
        gap = fork[side]["own"]["logit"] - fork[side]["other"]["logit"]
        assert 0 <= fork[side]["margin"] <= gap + 1e-6
    assert 0 <= data["after_fork"]["similarity"] <= 1


@pytest.mark.model
def test_run_human_summary_and_stdin_prompt() -> None:
    completed = specdiff(
        "run",
        "--pair",
        "spec-vs-plain",
        "--prompt-file",
        "-",
        "--max-tokens",
        "24",
        stdin="Copy: red green blue red green blue red green blue red",
    )
    assert completed.returncode in (0, 1), completed.stderr
    out = completed.stdout
    assert "lane a  speculative · ngram 3 · 15 drafts" in out
    assert "acceptance" in out and "tok/s" in out and "executed:" in out
    assert "running spec-vs-plain" in completed.stderr  # progress goes to stderr


@pytest.mark.model
def test_models_lists_the_bundled_model() -> None:
    completed = specdiff("models")
    assert completed.returncode == 0, completed.stderr
    assert "default (bundled)" in completed.stdout and "Q4_K_M" in completed.stdout
    assert "a5fd3b62230a" in completed.stdout


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["run", "--pair", "nope"], ["unknown pair 'nope'", "spec-vs-plain"]),
        (["run", "--lane-a", "colour=red"], ["unknown lane key 'colour'"]),
        (["run", "--lane-b", "n_ubatch=0"], ["'n_ubatch' must be between 1"]),
        (["run", "--max-tokens", "-5"], ["--max-tokens: must be from 1 to"]),
        (["run", "--prompt", "   "], ["the prompt is empty"]),
        (["run", "--prompt-file", "/nonexistent/p.txt"], ["prompt file not found"]),
        (["run", "--model", "/nonexistent/m.gguf"], ["model file not found"]),
        (["run", "--max-tokens", "many"], ["must be a whole number"]),
        (["run", "--bogus"], ["unrecognized arguments: --bogus"]),
        (["run", "--near-tie", "-1"], ["--near-tie: must be a finite number of at least 0"]),
        (["run", "--pairs", "/nonexistent/pairs.toml"], ["pairs file not found"]),
        (["models", "variants", "--to", "q3_x"], ["unknown variant 'q3_x'"]),
        (["live", "--pair", "nope"], ["unknown pair 'nope'"]),
        (["--lane-b", "flash_attn=maybe"], ["allowed: 'off', 'on', 'auto'"]),
        (["live", "--max-tokens", "0"], ["--max-tokens: must be from 1 to"]),
    ],
)
def test_bad_input_is_one_line_and_exit_two(args: list[str], fragments: list[str]) -> None:
    assert_one_line_error(specdiff_here(*args), *fragments)


def test_not_a_gguf_file(tmp_path: Path) -> None:
    path = tmp_path / "model.gguf"
    path.write_text("hello\n", encoding="utf-8")
    assert_one_line_error(specdiff("run", "--model", str(path)), "is not a GGUF model")


@pytest.mark.model
def test_truncated_gguf(tmp_path: Path, model_path: Path) -> None:
    path = tmp_path / "model.gguf"
    with model_path.open("rb") as source:
        path.write_bytes(source.read(model_path.stat().st_size // 2))
    assert_one_line_error(specdiff("run", "--model", str(path)), "is truncated")


@pytest.mark.model
def test_draft_with_a_different_vocabulary(tmp_path: Path, model_path: Path) -> None:
    other = model_with_changed_token(model_path, tmp_path / "draft.gguf")
    completed = specdiff("run", "--pair", "draft-vs-plain", "--lane-a", f"draft_model={other}")
    assert_one_line_error(completed, "different vocabulary")


@pytest.mark.model
def test_prompt_longer_than_n_ctx() -> None:
    completed = specdiff("run", "--both", "n_ctx=32", "--prompt", "word " * 60)
    assert_one_line_error(completed, "longer than lane a's n_ctx (32)")


@pytest.mark.model
def test_pairs_file_from_the_command_line(tmp_path: Path) -> None:
    pairs = tmp_path / "pairs.toml"
    pairs.write_text("[pairs.kv]\nb = { type_k = 'q8_0' }\n", encoding="utf-8")
    completed = specdiff(
        "run",
        "--pairs",
        str(pairs),
        "--pair",
        "kv",
        "--prompt",
        "Hello",
        "--max-tokens",
        "4",
        "--json",
        "--quiet",
    )
    assert completed.returncode in (0, 1), completed.stderr
    assert json.loads(completed.stdout)["lanes_differ_in"] == ["type_k"]


@pytest.mark.model
def test_default_run_forks_on_the_default_prompt() -> None:
    """`specdiff run` with no options is the demo: spec-vs-plain on the default prompt,
    200 tokens, exiting 1 when it shows a fork. Whether it forks depends on the CPU
    (where rounding lands), so a CPU on which it does not is reported, not failed."""
    completed = specdiff("run", "--json", "--quiet")
    assert completed.returncode in (0, 1), completed.stdout[-2000:] + completed.stderr
    data = json.loads(completed.stdout)
    assert data["pair"] == "spec-vs-plain" and data["generated"] == [200, 200]
    assert completed.returncode == (0 if data["fork"] is None else 1)
    if data["fork"] is None:
        pytest.skip(f"the default prompt does not fork on this CPU ({data['build']['cpu']})")
    print(f"default prompt forks at token {data['fork']['index']}")


@pytest.mark.model
def test_interrupt_mid_generation_keeps_what_was_produced(tmp_path: Path) -> None:
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "specdiff", "run", "--max-tokens", "3000", "--quiet"),
            *("--json", "--save", "--sessions-dir", str(tmp_path)),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # the interrupt comes once the saved session holds a step of lane b, however long the
    # model took to load on a busy machine
    deadline = time.monotonic() + 240
    while not any('"lane":"b"' in path.read_text() for path in tmp_path.glob("*.jsonl*")):
        assert process.poll() is None, process.communicate()[1]
        assert time.monotonic() < deadline, "lane b produced no step in 240 s"
        time.sleep(0.2)
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert "specdiff: interrupted" in stderr and "Traceback" not in stderr
    assert "Exception ignored" not in stderr
    data = json.loads(stdout)
    assert data["cancelled"] is True
    assert 0 < len(data["lanes"]["b"]["token_ids"]) < 3000
    assert data["lanes"]["a"]["stop_reason"] == "cancelled"


def test_theme_default_from_the_config_file(tmp_path: Path, monkeypatch) -> None:
    from specdiff.cli.common import config_theme
    from specdiff.config import ConfigError

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert config_theme() is None
    config = tmp_path / "specdiff" / "config.toml"
    config.parent.mkdir()
    config.write_text('theme = "specdiff-light"\n', encoding="utf-8")
    assert config_theme() == "specdiff-light"
    config.write_text("theme = [\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="cannot read the config file"):
        config_theme()


@pytest.mark.parametrize(
    "text, message",
    [
        ("theme = 3\n", "theme must be a non-empty string"),
        (
            'sessions-dir = "x"\n',
            "unknown setting 'sessions-dir'; did you mean 'sessions_dir'? known: theme, "
            "sessions_dir",
        ),
    ],
)
def test_bad_config_settings_are_one_line_errors(tmp_path, monkeypatch, capsys, text, message):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    config = tmp_path / "specdiff" / "config.toml"
    config.parent.mkdir()
    config.write_text(text, encoding="utf-8")
    assert main(["sessions"]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_prompt_on_stdin_that_is_not_utf8() -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "specdiff", "run", "--prompt-file", "-"],
        input=b"\xff\xfe\xfa not text",
        capture_output=True,
        timeout=120,
    )
    assert completed.returncode == 2
    stderr = completed.stderr.decode()
    assert "the prompt on stdin is not UTF-8 text" in stderr and "Traceback" not in stderr


@pytest.mark.model
def test_output_into_a_closed_pipe_is_quiet() -> None:
    completed = subprocess.run(
        f"{sys.executable} -m specdiff run --max-tokens 4 --quiet --json | head -c 5",
        shell=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "Traceback" not in completed.stderr and "BrokenPipe" not in completed.stderr
