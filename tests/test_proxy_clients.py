"""Real clients through `specdiff proxy`: llama.cpp's own server behind server lanes (the
client's answer is the one that server gives when called directly), lm-evaluation-harness
and promptfoo (each item of their evals lands in the proxy's suite as a session)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from specdiff.cli import main
from specdiff.engine.server.process import LlamaServer, find_llama_server
from specdiff.prompts import load as load_prompts
from specdiff.sessions.store import load_session
from tests.conftest import ROOT
from tests.eval_runs import TASK, write_task
from tests.proxies import running_proxy

pytestmark = [pytest.mark.model, pytest.mark.server]

DATA = ROOT / "tests" / "data"
LM_EVAL_TASK = DATA / "lm_eval" / "specdiff_words.jsonl"
PROMPTFOO_CONFIG = DATA / "promptfoo" / "promptfooconfig.yaml"


def offline_environment(home: Path) -> dict[str, str]:
    """Nothing may reach the network: the hubs offline, a home of the test's own."""
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HOME": str(home / "hf"),
        "HOME": str(home),
        "PROMPTFOO_DISABLE_TELEMETRY": "1",
        "PROMPTFOO_DISABLE_UPDATE": "1",
        "OPENAI_API_KEY": "unused",
    }


def lane_a_text(path: Path) -> str:
    steps = load_session(path).steps["a"]
    return b"".join(step.piece for step in steps).decode("utf-8", "replace")


def test_behind_server_lanes_the_answer_is_the_servers_own(tmp_path, model_path) -> None:
    prompt = load_prompts("open")[1]["prompt"]
    # one slot: the lanes' requests take turns, each decoded alone as the direct call is
    # (two in one batch would round differently, which is what specdiff finds)
    arguments = ["--threads", "1", "--parallel", "1"]
    with LlamaServer(find_llama_server(), model_path, arguments) as server:
        body = {"prompt": prompt, "max_tokens": 16, "temperature": 0}
        direct = httpx.post(f"{server.url}/v1/completions", json=body, timeout=120)
        # llama-server's own API: its /v1/completions gives no top-k log-probabilities
        lanes = ["--pair", "servers", "--both", f"endpoint={server.url}", "--both",
                 "api=llama-server"]  # fmt: skip
        with running_proxy(tmp_path, *lanes) as proxy:
            model = {"model": "servers"}
            proxied = httpx.post(f"{proxy.url}/completions", json={**body, **model}, timeout=300)
            hot = {**body, **model, "temperature": 0.8, "max_tokens": 4}
            sampled = httpx.post(f"{proxy.url}/completions", json=hot, timeout=300)
    assert direct.status_code == proxied.status_code == sampled.status_code == 200, proxied.text
    text = direct.json()["choices"][0]["text"]
    assert text and proxied.json()["choices"][0]["text"].encode() == text.encode()
    assert len(proxy.sessions()) == 1
    # the temperature reached both servers' requests, and the pair is saved apart
    (path,) = proxy.sessions("sampled")
    lanes = load_session(path).header.pair
    assert json.loads(lanes.a.request) == json.loads(lanes.b.request) == {"temperature": 0.8}


def run_lm_eval_through(
    proxy_url: str, pair: str, tasks: Path, output: Path, home: Path
) -> list[dict[str, Any]]:
    """lm-evaluation-harness's task (in `tasks`) through the proxy at `proxy_url`: its
    logged samples."""
    model_args = (
        f"base_url={proxy_url}/completions,model={pair},"
        "tokenizer_backend=None,tokenized_requests=False"
    )
    ran = subprocess.run(
        [
            sys.executable,
            "-m",
            "lm_eval",
            "--model",
            "local-completions",
            "--model_args",
            model_args,
            "--tasks",
            TASK,
            "--include_path",
            str(tasks),
            "--log_samples",
            "--output_path",
            str(output),
        ],  # fmt: skip
        cwd=ROOT,
        env=offline_environment(home),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert ran.returncode == 0, ran.stderr[-2000:]
    (samples,) = output.glob(f"*/samples_{TASK}_*.jsonl")
    return [json.loads(line) for line in samples.read_text().splitlines()]


def lane_texts(path: Path) -> dict[str, str]:
    steps = load_session(path).steps
    return {
        lane: b"".join(step.piece for step in steps[lane]).decode("utf-8", "replace")
        for lane in "ab"
    }


NEVER = "<specdiff: a stop string no text holds>"


def task_with(fork: str, folder: Path, max_tokens: int) -> Path:
    """The committed task's questions, plus a prompt that forks here, as a task in
    `folder` (the committed runs' task, eval_runs.write_task): each answer is its lane's
    whole text, cut by a stop string no text holds, so the fork is in it."""
    committed = LM_EVAL_TASK.read_text(encoding="utf-8").splitlines()
    docs = [json.loads(line) for line in committed]
    items = [(f"Question: {d['question']}\nAnswer:", d["answer"]) for d in docs]
    return write_task(folder, max_tokens, [*items, (fork, "-")], until=(NEVER,))


def test_lm_eval_through_the_proxy_imports_as_the_proxys_own_suite(
    tmp_path, capsys, forking_prompt
) -> None:
    """The task served as lane a, then as lane b: each run's answers are its lane's texts
    in the proxy's sessions, and `import lm-eval` of the two runs finds different
    answers on exactly the items whose sessions' lanes differ, one of them at least: the
    task holds a prompt that forks on this machine."""
    pair, budget = "ubatch", 40  # as the proxy suite test: the search is made once
    fork = forking_prompt(pair, budget)
    tasks = task_with(fork.prompt, tmp_path / "task", budget)
    items = (tasks / "items.jsonl").read_text(encoding="utf-8").splitlines()
    runs: dict[str, list[dict[str, Any]]] = {}
    texts: dict[str, dict[str, dict[str, str]]] = {}
    for served in "ab":
        where = tmp_path / served
        where.mkdir()
        options = ["--pair", pair, "--max-tokens", str(budget), "--serve", served]
        with running_proxy(where, *options) as proxy:
            runs[served] = run_lm_eval_through(proxy.url, pair, tasks, where / "lm-eval", where)
            assert proxy.stop() == 130
        sessions = proxy.sessions()
        assert len(runs[served]) == len(items) == len(sessions)
        report = json.loads((proxy.report / "report.json").read_text())
        assert report["finished"] == len(items)
        by_prompt = {load_session(p).header.prompt: lane_texts(p) for p in sessions}
        for sample in runs[served]:
            prompt = sample["arguments"]["gen_args_0"]["arg_0"]
            assert sample["resps"][0][0] == by_prompt[prompt][served]
        texts[served] = by_prompt
    # both proxies ran the same pair on the same prompts: the lanes agree run to run
    assert texts["a"] == texts["b"]
    differ = [
        sample["doc_id"]
        for sample in runs["a"]
        if len(set(texts["a"][sample["arguments"]["gen_args_0"]["arg_0"]].values())) == 2
    ]
    assert len(items) - 1 in differ, "the forking prompt's lanes differ in their texts"
    code = main(
        [
            "import",
            "lm-eval",
            str(tmp_path / "a" / "lm-eval"),
            str(tmp_path / "b" / "lm-eval"),
        ]
    )
    out = capsys.readouterr().out
    assert out.startswith(f"{len(differ)} of {len(items)} items differ"), out
    assert code == 1


def test_promptfoo_runs_its_eval_through_the_proxy(tmp_path, promptfoo: Path) -> None:
    with running_proxy(tmp_path, "--max-tokens", "8") as proxy:
        config = tmp_path / "promptfooconfig.yaml"
        text = PROMPTFOO_CONFIG.read_text(encoding="utf-8")
        config.write_text(text.replace("127.0.0.1:8090", f"127.0.0.1:{proxy.port}"))
        ran = subprocess.run(
            [
                str(promptfoo),
                "eval",
                "-c",
                str(config),
                "-o",
                str(tmp_path / "out.json"),
                "--no-cache",
            ],  # fmt: skip
            cwd=tmp_path,
            env=offline_environment(tmp_path),
            capture_output=True,
            text=True,
            timeout=900,
        )
        # 100: an assertion of the eval failed, which the bundled model may well do
        assert ran.returncode in (0, 100), ran.stdout[-2000:] + ran.stderr[-2000:]
        assert proxy.stop() == 130
    results = json.loads((tmp_path / "out.json").read_text())["results"]["results"]
    # failureReason 2 is an error (the provider's); 1 an assertion that failed
    assert [r["failureReason"] for r in results if r["failureReason"] == 2] == []
    outputs = sorted(r["response"]["output"] for r in results)
    assert outputs == sorted(lane_a_text(path) for path in proxy.sessions())
