"""`specdiff proxy` on the bundled model, driven by the OpenAI Python SDK and by plain HTTP
as clients send it: the answers are lane a's, every pair lands in a suite folder that
`specdiff suite` reads and that agrees with a suite run of the same prompts, and bad
requests each get one OpenAI-style error."""

from __future__ import annotations

import json
import threading

import httpx
import openai
import pytest

from specdiff.cli import main
from specdiff.prompts import load as load_prompts
from specdiff.proxy.server import MAX_BODY
from specdiff.sessions.store import load_session
from tests.conftest import wait_until
from tests.proxies import running_proxy

pytestmark = [pytest.mark.model, pytest.mark.server]

PAIR = "spec-vs-plain"
PROMPT = load_prompts("open")[0]["prompt"]


@pytest.fixture(scope="module")
def proxy(tmp_path_factory):
    with running_proxy(tmp_path_factory.mktemp("proxy")) as running:
        yield running


@pytest.fixture(scope="module")
def client(proxy) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.url, api_key="unused", max_retries=0)


def lane_text(path, lane: str) -> str:
    session = load_session(path)
    return b"".join(step.piece for step in session.steps[lane]).decode("utf-8", "replace")


def session_of(proxy, prompt_text: str, *under: str):
    """The one session of the suite (or its sub-suite `under`) whose prompt is `prompt_text`."""
    hits = [p for p in proxy.sessions(*under) if load_session(p).header.prompt == prompt_text]
    assert len(hits) == 1, [p.name for p in proxy.sessions(*under)]
    return hits[0]


def test_a_completion_is_lane_as_answer_saved_as_a_session(proxy, client) -> None:
    answer = client.completions.create(model=PAIR, prompt=PROMPT, max_tokens=12, temperature=0)
    choice = answer.choices[0]
    path = session_of(proxy, PROMPT)
    assert choice.text == lane_text(path, "a")
    assert choice.finish_reason == "length" and choice.logprobs is None
    assert answer.usage.completion_tokens == 12
    assert answer.usage.prompt_tokens == len(load_session(path).header.prompt_token_ids)
    assert answer.model == PAIR and answer.object == "text_completion"
    assert [m.id for m in client.models.list().data] == [PAIR]


def test_the_answer_holds_no_field_the_client_did_not_ask_for(proxy) -> None:
    body = {"model": PAIR, "prompt": "One, two,", "max_tokens": 3}
    data = httpx.post(f"{proxy.url}/completions", json=body, timeout=120).json()
    assert set(data) == {"id", "object", "created", "model", "choices", "usage"}
    assert set(data["choices"][0]) == {"index", "text", "finish_reason"}
    asked = httpx.post(f"{proxy.url}/completions", json={**body, "logprobs": 2}, timeout=120)
    logprobs = asked.json()["choices"][0]["logprobs"]
    assert len(logprobs["tokens"]) == 3 and all(len(top) <= 2 for top in logprobs["top_logprobs"])
    assert all(value <= 0 for value in logprobs["token_logprobs"])


def test_a_streamed_chat_answer_is_the_whole_one_in_pieces(proxy, client) -> None:
    messages = [{"role": "user", "content": "Name a colour."}]
    whole = client.chat.completions.create(model=PAIR, messages=messages, max_tokens=10)
    stream = client.chat.completions.create(
        model=PAIR, messages=messages, max_tokens=10, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    # a chat request runs on the pair formatting the conversation: a suite of its own.
    # The bundled Gemma GGUF carries no template, and llama.cpp's stand-in (chatml) is
    # a format Gemma never learned: it gets Gemma's turns, and answers in words
    sessions = proxy.sessions("chat")
    assert len(sessions) == 2
    header = load_session(sessions[0]).header
    assert header.pair.a.chat == header.pair.b.chat == "gemma"
    assert header.executed["a"]["chat_template"] == "gemma"
    assert "<|im_" not in text and "<start_of_turn>" not in text


BAD_REQUESTS = {
    "not JSON": (b"{not json", 400, "invalid_json", None),
    "wrong type": (json.dumps({"model": PAIR, "prompt": "x", "max_tokens": "ten"}).encode(),
                   400, None, "max_tokens"),
    "wrong prompt": (json.dumps({"model": PAIR, "prompt": [1, 2, 3]}).encode(), 400, None,
                     "prompt"),
    "huge body": (b" " * (MAX_BODY + 1), 413, "request_too_large", None),
    "unknown model": (json.dumps({"model": "gpt-4", "prompt": "x"}).encode(), 404,
                      "model_not_found", "model"),
}  # fmt: skip


@pytest.mark.parametrize("case", BAD_REQUESTS, ids=list(BAD_REQUESTS))
def test_a_bad_request_gets_one_openai_style_error(proxy, case: str) -> None:
    body, status, code, param = BAD_REQUESTS[case]
    reply = httpx.post(
        f"{proxy.url}/completions",
        content=body,
        headers={"Content-Type": "application/json"},
        timeout=60,
    )
    assert reply.status_code == status
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code and error["param"] == param
    assert error["message"] and "\n" not in error["message"]


def test_the_sdk_raises_the_error_the_proxy_gives(client) -> None:
    with pytest.raises(openai.NotFoundError, match="not served here"):
        client.completions.create(model="gpt-4", prompt="x", max_tokens=2)


def test_a_sampled_request_is_saved_apart(proxy, client) -> None:
    prompt = "Write a word:"
    client.completions.create(model=PAIR, prompt=prompt, max_tokens=4, temperature=0.8)
    assert session_of(proxy, prompt, "sampled")
    assert all(load_session(p).header.prompt != prompt for p in proxy.sessions())
    wait_until(lambda: "sampled" in proxy.stderr(), "the proxy to say where it went")


def test_past_the_queue_limit_a_request_gets_429(tmp_path) -> None:
    with running_proxy(tmp_path, "--max-queue", "0") as proxy:
        first = httpx.Client(timeout=300)
        body = {"model": PAIR, "prompt": PROMPT, "max_tokens": 300, "stream": True}
        with first.stream("POST", f"{proxy.url}/completions", json=body) as running:
            lines = running.iter_lines()
            assert next(lines).startswith("data: ")  # the first request runs now
            refused = httpx.post(f"{proxy.url}/completions", json=body, timeout=60)
            assert refused.status_code == 429
            assert refused.json()["error"]["code"] == "rate_limit_exceeded"
        # the first client left mid-stream: its pair is cancelled, and the proxy goes on
        wait_until(lambda: "r000001 cancelled" in proxy.stderr(), "the cancel to be said")
        again = httpx.post(f"{proxy.url}/completions", json={**body, "stream": False,
                           "max_tokens": 2}, timeout=120)  # fmt: skip
        assert again.status_code == 200
        assert [p.stem for p in proxy.sessions()] == ["r000002"]


def test_the_proxy_suite_is_the_suite_run_of_its_prompts(tmp_path, forking_prompt) -> None:
    pair = "ubatch"  # the pair forking_prompt searches most often: its search is kept
    fork = forking_prompt(pair, 40)
    prompts = [fork.prompt, *[e["prompt"] for e in load_prompts("open")[1:3]]]
    with running_proxy(tmp_path, "--pair", pair, "--max-tokens", "40") as proxy:
        client = openai.OpenAI(base_url=proxy.url, api_key="unused", max_retries=0)
        threads = [
            threading.Thread(
                target=client.completions.create,
                kwargs={"model": pair, "prompt": prompt, "max_tokens": 40},
            )
            for prompt in prompts
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert proxy.stop() == 130
    assert (proxy.report / "report.html").exists()
    served = json.loads((proxy.report / "report.json").read_text())
    assert served["finished"] == 3 and served["complete"]
    other = tmp_path / "suite-run"
    code = main(["suite", str(proxy.report / "prompts.jsonl"), "--pair", pair,
                 "--report", str(other), "--quiet"])  # fmt: skip
    assert code in (0, 1)
    ran = json.loads((other / "report.json").read_text())

    def forks(report: dict) -> dict[str, int | None]:
        return {r["prompt_id"]: r["fork_index"] for r in report["prompts"]}

    assert forks(served) == forks(ran)
    assert fork.fork_index in forks(served).values()
    # the proxy's folder is a suite: its report is written again from its sessions
    assert main(["suite", "--resume", "--report", str(proxy.report), "--quiet"]) in (0, 1)


def test_any_kind_of_request_may_come_first(tmp_path) -> None:
    """Chat, sampled chat and completions each fill a folder inside another's; whichever
    comes first, the others still find theirs."""
    with running_proxy(tmp_path, "--max-tokens", "2") as proxy:
        url = proxy.url
        chat = {"model": PAIR, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        answers = [
            httpx.post(f"{url}/chat/completions", json={**chat, "temperature": 0.8}, timeout=120),
            httpx.post(f"{url}/chat/completions", json=chat, timeout=120),
            httpx.post(
                f"{url}/completions",
                json={"model": PAIR, "prompt": "Hello", "max_tokens": 2},
                timeout=120,
            ),  # fmt: skip
        ]
        assert proxy.stop() == 130
    assert [a.status_code for a in answers] == [200, 200, 200], [a.text for a in answers]
    for under in [("chat", "sampled"), ("chat",), ()]:
        assert len(proxy.sessions(*under)) == 1, under
        assert (proxy.report.joinpath(*under) / "report.md").exists()
