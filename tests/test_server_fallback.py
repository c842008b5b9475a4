"""A llama-server that dies by a signal before /health answers (llama.cpp's repacked CPU
kernels on Xeons with AMX: SIGILL at start) is started once more with --no-repack.

No CPU here crashes on its own, so a wrapper script stands in for the crash: it kills
itself with SIGILL unless --no-repack (or --version) is among its arguments, and runs
the real llama-server otherwise. specdiff needs no switch of its own for it."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from specdiff.cli import main
from specdiff.engine.server.process import LlamaServer, ServerProcessError, find_llama_server

SERVER_ARGUMENTS = ["--threads", "1", "--ctx-size", "512", "--parallel", "1"]


def crashing_wrapper(folder: Path, real: Path | None) -> Path:
    """A llama-server that dies by SIGILL when it would repack; with `real`, it runs the
    real binary when asked not to repack. Each start's arguments go to starts.log."""
    script = folder / "llama-server"
    forward = f'exec {shlex.quote(str(real))} "$@"' if real else "kill -ILL $$"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {shlex.quote(str(folder / "starts.log"))}\n'
        f'case " $* " in *" --no-repack "*|*" --version "*) {forward};; esac\n'
        "kill -ILL $$\n"
    )
    script.chmod(0o755)
    return script


def starts(folder: Path) -> list[str]:
    return (folder / "starts.log").read_text().splitlines()


def test_a_server_killed_by_a_signal_each_time_is_tried_twice_and_named(tmp_path: Path) -> None:
    said: list[str] = []
    server = LlamaServer(
        crashing_wrapper(tmp_path, None),
        tmp_path / "model.gguf",
        ["--threads", "1"],
        say=said.append,
    )
    with pytest.raises(ServerProcessError) as caught:
        server.start(wait_seconds=30)
    assert "killed by SIGILL at start, also with --no-repack" in str(caught.value)
    first, second = starts(tmp_path)
    assert "--no-repack" not in first.split() and second.split()[-1] == "--no-repack"
    assert len(said) == 1 and "SIGILL" in said[0] and "--no-repack" in said[0]
    assert server.fell_back and not server.repack


def test_a_server_that_exits_with_a_status_is_not_tried_again(tmp_path: Path) -> None:
    script = tmp_path / "llama-server"
    script.write_text(
        f'#!/bin/sh\necho "$*" >> {shlex.quote(str(tmp_path / "starts.log"))}\n'
        "echo 'error: invalid argument: --x' >&2\nexit 1\n"
    )
    script.chmod(0o755)
    said: list[str] = []
    server = LlamaServer(script, tmp_path / "model.gguf", say=said.append)
    refused = r"refused to start \(exited with status 1\): error: invalid argument: --x$"
    with pytest.raises(ServerProcessError, match=refused):
        server.start(wait_seconds=30)
    assert len(starts(tmp_path)) == 1 and said == [] and server.repack


def test_repack_is_off_for_either_spelling_or_the_environment(monkeypatch) -> None:
    monkeypatch.delenv("LLAMA_ARG_REPACK", raising=False)
    assert LlamaServer(Path("x"), Path("m")).repack
    assert not LlamaServer(Path("x"), Path("m"), ["-nr"]).repack
    monkeypatch.setenv("LLAMA_ARG_REPACK", "0")
    assert not LlamaServer(Path("x"), Path("m")).repack


@pytest.mark.model
@pytest.mark.server
def test_a_server_killed_at_start_runs_with_no_repack(tmp_path: Path, model_path: Path) -> None:
    said: list[str] = []
    wrapper = crashing_wrapper(tmp_path, find_llama_server())
    with LlamaServer(wrapper, model_path, SERVER_ARGUMENTS, say=said.append) as server:
        import httpx

        assert httpx.get(f"{server.url}/health", timeout=5).status_code == 200
    assert server.fell_back and not server.repack
    assert [line.split()[-1] for line in starts(tmp_path)] == ["1", "--no-repack"]
    (line,) = said
    assert "killed by SIGILL" in line and "--no-repack" in line


@pytest.mark.model
@pytest.mark.server
def test_serve_pair_records_the_no_repack_restart_in_the_session(tmp_path: Path, capsys) -> None:
    from specdiff.sessions.store import load_session

    wrapper = crashing_wrapper(tmp_path, find_llama_server())
    sessions = tmp_path / "sessions"
    code = main(
        ["serve-pair", "--llama-server", str(wrapper), "--ctx-size", "512",
         "run", "--prompt", "The history of the Roman Empire", "--max-tokens", "8",
         "--json", "--save", "--sessions-dir", str(sessions), "--quiet"]
    )  # fmt: skip
    captured = capsys.readouterr()
    assert code in (0, 1), captured.err
    restarts = [line for line in captured.err.splitlines() if "again with --no-repack" in line]
    assert len(restarts) == 2  # one line for each server
    data = json.loads(captured.out)
    (saved,) = sessions.glob("*.jsonl")
    header = load_session(saved).header
    for lane_id in ("a", "b"):
        assert data["lanes"][lane_id]["executed"]["repack"] == "off"
        assert header.executed[lane_id]["repack"] == "off"
        assert getattr(header.pair, lane_id).repack == "off"
        assert header.executed[lane_id]["backend"] == "server"
