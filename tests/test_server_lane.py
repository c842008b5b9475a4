"""Server lanes against real servers on loopback: llama-cpp-python's OpenAI server, and a
small server that fails on purpose."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from specdiff.cli import main
from specdiff.engine.pairrun import PairRun
from specdiff.engine.server.lane import ServerLane
from specdiff.engine.server.vocab import UNKNOWN_TOKEN
from specdiff.lanes import Lane, presets
from specdiff.prompts import DEFAULT_PROMPT
from specdiff.sessions.store import load_session
from specdiff.steps import TokenStep
from tests.conftest import wait_for
from tests.servers import fault_server, free_port, llama_cpp_server, report_agreement
from tests.tui_driver import drive

TOKENS = 40


@pytest.fixture(scope="module")
def server(model_path: Path):
    with llama_cpp_server(model_path) as (url, _process):
        yield url


def server_lane(url: str, **settings: object) -> Lane:
    return Lane(backend="server", endpoint=url, **settings)


def server_vs_local(url: str) -> list[str]:
    """`specdiff run` arguments: lane a on the server, lane b the in-process plain lane."""
    return [
        "run", "--pair", "spec-vs-plain", "--lane-a", "backend=server",
        "--lane-a", "speculation=none", "--lane-a", f"endpoint={url}", "--quiet",
    ]  # fmt: skip


def servers_run(*lane_arguments: str) -> list[str]:
    """`specdiff run --pair servers` arguments, five tokens, quiet."""
    return ["run", "--pair", "servers", *lane_arguments, "--max-tokens", "5", "--quiet"]


def one_line_error(capsys, code: int) -> str:
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.mark.server
@pytest.mark.model
def test_a_server_lane_streams_tokens_with_top_k_and_margins(server: str) -> None:
    lane = ServerLane(server_lane(server), "a")
    try:
        steps = list(lane.generate(DEFAULT_PROMPT, TOKENS))
    finally:
        lane.close()
    assert len(steps) == TOKENS
    assert [s.index for s in steps] == list(range(TOKENS))
    for step in steps:
        assert len(step.top) == 8 and step.top[0].token_id == step.token_id
        assert step.token_id != UNKNOWN_TOKEN and step.margin >= 0
        assert [c.logit for c in step.top] == sorted((c.logit for c in step.top), reverse=True)
        assert all(c.logit <= 0 for c in step.top)  # log-probabilities
    assert lane.executed()["server"]["models"]


@pytest.mark.server
@pytest.mark.model
def test_the_server_lane_matches_the_in_process_lane(server: str, capsys) -> None:
    pair = presets()["spec-vs-plain"]
    pair = type(pair)("server-vs-local", server_lane(server), Lane(), "")
    with PairRun(pair) as runner:
        result = runner.run(DEFAULT_PROMPT, 80)
    fork = report_agreement(result, "llama-cpp-python's server", capsys)
    assert result.a.error is None and result.b.error is None
    # the same model and settings: equal, or parted only at a near tie
    assert fork is None or min(fork.a.margin, fork.b.margin) < 0.5


@pytest.mark.server
@pytest.mark.model
def test_run_and_save_with_a_server_lane(server: str, tmp_path: Path, capsys) -> None:
    code = main(
        [*server_vs_local(server), "--max-tokens", "24", "--save", "--sessions-dir", str(tmp_path)]
    )
    assert code in (0, 1)
    out = capsys.readouterr().out
    assert f"server {server} (completions API)" in out
    (saved,) = tmp_path.glob("*.jsonl")
    session = load_session(saved)
    executed = session.header.executed["a"]
    assert executed["backend"] == "server" and executed["endpoint"] == server
    assert executed["server"]["models"]
    assert len(session.steps["a"]) == 24


@pytest.mark.server
@pytest.mark.model
async def test_the_tui_runs_a_server_lane(server: str) -> None:
    from specdiff.tui.app import make_app

    known = presets()
    known["server-vs-local"] = type(known["ubatch"])(
        "server-vs-local", server_lane(server), Lane(), "a server against the engine"
    )
    app = make_app(known, "server-vs-local", DEFAULT_PROMPT, 20)

    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: not drive(app).running and drive(app).result is not None)
        assert len(drive(app).lanes["a"].steps) == 20 and drive(app).lanes["a"].error is None
        assert len(drive(app).lanes["b"].steps) == 20


@pytest.mark.server
@pytest.mark.model
def test_a_server_killed_mid_stream_fails_its_lane_only(model_path: Path) -> None:
    with llama_cpp_server(model_path) as (url, process):
        pair = type(presets()["ubatch"])("kill", server_lane(url), Lane(), "")
        with PairRun(pair) as runner:
            killed = threading.Event()

            def on_step(step: TokenStep) -> None:
                if step.lane == "a" and step.index == 5:
                    process.kill()
                    killed.set()

            result = runner.run(DEFAULT_PROMPT, 200, on_step=on_step)
    assert killed.is_set()
    assert result.a.error is not None
    assert "connection broke" in result.a.error or "cannot connect" in result.a.error
    assert 6 <= len(result.a.steps) < 200
    assert result.b.error is None and len(result.b.steps) == 200


@pytest.mark.model
def test_a_server_that_is_not_running(capsys) -> None:
    port = free_port()
    err = one_line_error(
        capsys,
        main(
            servers_run(
                "--lane-a",
                f"endpoint=http://127.0.0.1:{port}",
                "--lane-b",
                f"endpoint=http://127.0.0.1:{port}",
                "--lane-a",
                "retries=0",
            )
        ),
    )
    assert "cannot connect (connection refused); is the server running?" in err


@pytest.mark.server
@pytest.mark.model
@pytest.mark.parametrize(
    "mode, settings, message",
    [
        ("http500", {}, "HTTP 500: out of memory (injected)"),
        ("nologprobs", {}, "without log-probabilities"),
        ("malformed", {}, "malformed JSON in an event"),
        ("slow", {"timeout": 1}, "no data for 1 s after 1 tokens"),
        ("die", {}, "the stream ended after 3 tokens without its end marker"),
    ],
)
def test_server_faults_are_one_line_lane_errors(mode: str, settings: dict, message: str):
    with fault_server(mode) as url:
        lane = ServerLane(server_lane(url, **settings), "a")
        try:
            with pytest.raises(Exception) as caught:
                list(lane.generate("Hello", 10))
        finally:
            lane.close()
    text = str(caught.value)
    assert message in text and "\n" not in text, text
    assert type(caught.value).__name__ == "ServerError"


@pytest.mark.server
@pytest.mark.model
def test_a_wrong_api_key_is_refused_without_leaking_it(
    model_path: Path, tmp_path: Path, capsys, monkeypatch
) -> None:
    secret = "sk-specdiff-test-5d1e"
    with llama_cpp_server(model_path, "--api_key", "the-right-key") as (url, _process):
        keyed = [*server_vs_local(url), "--lane-a", "api_key_env=SPECDIFF_TEST_KEY"]
        monkeypatch.setenv("SPECDIFF_TEST_KEY", secret)
        code = main(
            [*keyed, "--max-tokens", "5", "--save", "--sessions-dir", str(tmp_path), "--json"]
        )
        captured = capsys.readouterr()
        assert code == 2
        assert "refused the API key (HTTP 401); check $SPECDIFF_TEST_KEY" in captured.err
        assert secret not in captured.err + captured.out
        for file in tmp_path.iterdir():
            assert secret not in file.read_text(encoding="utf-8")
        monkeypatch.setenv("SPECDIFF_TEST_KEY", "the-right-key")
        assert main([*keyed, "--max-tokens", "5", "--json"]) in (0, 1)
        data = json.loads(capsys.readouterr().out)
        assert "the-right-key" not in json.dumps(data)


def test_an_unset_key_variable_is_named(capsys, monkeypatch) -> None:
    monkeypatch.delenv("SPECDIFF_MISSING_KEY", raising=False)
    err = one_line_error(
        capsys,
        main(servers_run("--lane-a", "api_key_env=SPECDIFF_MISSING_KEY")),
    )
    assert "SPECDIFF_MISSING_KEY (api_key_env) is not set" in err


@pytest.mark.server
@pytest.mark.model
def test_repeat_against_a_server_counts_completions(server: str, capsys) -> None:
    code = main(
        [
            "repeat",
            "--endpoint",
            server,
            "-n",
            "3",
            "--concurrency",
            "2",
            "--max-tokens",
            "16",
            "--json",
            "--quiet",
        ]
    )
    data = json.loads(capsys.readouterr().out)
    assert data["runs"] == 3 and data["endpoint"] == server and data["concurrency"] == 2
    assert sum(group["count"] for group in data["groups"]) == 3
    assert all(group["tokens"] == 16 for group in data["groups"])
    assert code == (0 if data["unique"] == 1 else 1)
    with capsys.disabled():
        print(f"\nrepeat x3 against llama-cpp-python's server: {data['unique']} unique")
