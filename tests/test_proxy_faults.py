"""`specdiff proxy` when a lane fails, a lane holds a key, or the client asks for the noise
floor: the client gets lane a's error as a 502 that names the lane (lane a's answer when
only lane b fails), every pair is saved, failed or not, no key or password a lane
authenticates with is written anywhere, and with --control each pair has lane a's cold
second run."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from specdiff.sessions.records import NOISE_FLOOR
from specdiff.sessions.store import load_session
from tests.proxies import RunningProxy, running_proxy
from tests.servers import PASSWORD, fault_server

pytestmark = [pytest.mark.model, pytest.mark.server]

KEY = "sk-specdiff-proxy-0123456789abcdef"
KEY_ENV = "SPECDIFF_PROXY_TEST_KEY"
BODY = {"model": "servers", "prompt": "Say hello.", "max_tokens": 5, "temperature": 0}


@pytest.fixture
def keyed_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The key lane a reads from its environment, as the proxy's child inherits it."""
    monkeypatch.setenv(KEY_ENV, KEY)


def lanes(a: str, b: str) -> list[str]:
    return ["--pair", "servers", "--lane-a", f"endpoint={a}", "--lane-b", f"endpoint={b}"]


def only_session(proxy: RunningProxy) -> Path:
    (path,) = proxy.sessions()
    return path


def test_lane_a_failing_is_a_502_naming_it_and_the_pair_is_saved_as_failed(tmp_path) -> None:
    with (
        fault_server("http500") as failing,
        fault_server("steady") as steady,
        running_proxy(tmp_path, *lanes(failing, steady)) as proxy,
    ):
        answer = httpx.post(f"{proxy.url}/completions", json=BODY, timeout=120)
        streaming = {**BODY, "stream": True}
        streamed = httpx.post(f"{proxy.url}/completions", json=streaming, timeout=120)
        assert proxy.stop() == 130
    assert answer.status_code == streamed.status_code == 502
    for response in (answer, streamed):
        error = response.json()["error"]
        assert error["code"] == "lane_failed", error
        assert error["message"].startswith("lane a failed: ") and "HTTP 500" in error["message"]
    paths = proxy.sessions()
    assert len(paths) == 2, "a failed pair is saved, never dropped"
    for path in paths:
        session = load_session(path)
        assert "HTTP 500" in (session.summary().errors[0] or ""), session.summary()
        assert session.steps["b"], "lane b's tokens are kept beside lane a's failure"
    report = json.loads((proxy.report / "report.json").read_text())
    assert report["finished"] == 2


def test_lane_b_failing_still_answers_with_lane_a_and_saves_the_failure(tmp_path) -> None:
    with (
        fault_server("steady") as steady,
        fault_server("http500") as failing,
        running_proxy(tmp_path, *lanes(steady, failing)) as proxy,
    ):
        answer = httpx.post(f"{proxy.url}/completions", json=BODY, timeout=120)
        assert proxy.stop() == 130
    assert answer.status_code == 200, answer.text
    session = load_session(only_session(proxy))
    text = b"".join(step.piece for step in session.steps["a"]).decode()
    assert text and answer.json()["choices"][0]["text"] == text
    assert "HTTP 500" in (session.summary().errors[1] or ""), session.summary()


def test_no_key_or_password_a_lane_uses_is_written_anywhere(tmp_path, keyed_environment) -> None:
    """Lane a authenticates with a bearer key and the URL's password, on a server that
    echoes them back in its model list, its /props and its text."""
    with fault_server("echo-key") as echoing, fault_server("steady") as steady:
        keyed = echoing.replace("http://", f"http://specdiff:{PASSWORD}@")
        options = [*lanes(keyed, steady), "--lane-a", f"api_key_env={KEY_ENV}"]
        with running_proxy(tmp_path, *options) as proxy:
            # the server's text reaches the key after a few tokens
            body = {**BODY, "max_tokens": 40}
            answer = httpx.post(f"{proxy.url}/completions", json=body, timeout=120)
            models = httpx.get(f"{proxy.url}/models", timeout=30)
            assert proxy.stop() == 130
    assert answer.status_code == 502 and models.status_code == 200
    assert "holds the API key or the endpoint's password" in answer.json()["error"]["message"]
    written = [answer.content, models.content]
    written += [f.read_bytes() for f in tmp_path.rglob("*") if f.is_file()]
    assert len(proxy.sessions()) == 1
    for data in written:
        for secret in (KEY, PASSWORD):
            assert secret.encode() not in data and secret[:8].encode() not in data


def test_control_runs_lane_a_again_cold_beside_each_pair(tmp_path) -> None:
    """Both lanes on a server that answers each request differently: a vs b forks, and
    so does lane a's cold second run, so the fork is the noise floor."""
    with fault_server("drift") as drifting:
        options = [*lanes(drifting, drifting), "--control"]
        with running_proxy(tmp_path, *options) as proxy:
            answer = httpx.post(f"{proxy.url}/completions", json=BODY, timeout=120)
            assert proxy.stop() == 130
    assert answer.status_code == 200, answer.text
    summary = load_session(only_session(proxy)).summary()
    assert summary.control is not None and summary.control.fork_index == 2
    assert summary.control_label == NOISE_FLOOR
    report = json.loads((proxy.report / "suite.json").read_text())
    assert report["control"] is True
    assert "a vs a' forked (noise floor rate) | 1/1 |" in (proxy.report / "report.md").read_text()
