"""What `specdiff proxy` reads from a client and writes back, without a model: the checks
of a request's fields, the text cut at a stop string, the answer's fields, and the
command's refusals before anything loads."""

from __future__ import annotations

import json
import os
import socket
import threading

import httpx
import pytest

from specdiff.chat import Conversation
from specdiff.cli import main
from specdiff.cli.proxy import client_key
from specdiff.lanes import presets
from specdiff.proxy.answers import Answer, TextCutter, Usage
from specdiff.proxy.requests import ApiError, read_body
from specdiff.proxy.server import MAX_BODY, ProxyServer
from specdiff.proxy.service import ProxySettings, Service
from specdiff.steps import Candidate, TokenStep


def body(**fields) -> bytes:
    return json.dumps({"model": "m", **fields}).encode()


REFUSED = {
    "not json": (b"{", "completions", None),
    "not an object": (b"[1]", "completions", None),
    "no model": (json.dumps({"prompt": "x"}).encode(), "completions", "model"),
    "token ids": (body(prompt=[1, 2]), "completions", "prompt"),
    "empty prompt": (body(prompt=" "), "completions", "prompt"),
    "two choices": (body(prompt="x", n=2), "completions", "n"),
    "echo": (body(prompt="x", echo=True), "completions", "echo"),
    "no tokens": (body(prompt="x", max_tokens=0), "completions", "max_tokens"),
    "text tokens": (body(prompt="x", max_tokens="9"), "completions", "max_tokens"),
    "five stops": (body(prompt="x", stop=list("abcde")), "completions", "stop"),
    "many logprobs": (body(prompt="x", logprobs=6), "completions", "logprobs"),
    "hot": (body(prompt="x", temperature=3), "completions", "temperature"),
    "stream text": (body(prompt="x", stream="yes"), "completions", "stream"),
    "no user": (body(messages=[{"role": "system", "content": "x"}]), "chat", "messages"),
    "image part": (
        body(messages=[{"role": "user", "content": [{"type": "image_url"}]}]),
        "chat",
        "messages",
    ),
    "chat logprobs": (
        body(messages=[{"role": "user", "content": "x"}], logprobs=True, top_logprobs=21),
        "chat",
        "top_logprobs",
    ),
    "tools": (body(messages=[{"role": "user", "content": "x"}], tools=[{}]), "chat", "tools"),
}


@pytest.mark.parametrize("case", REFUSED, ids=list(REFUSED))
def test_a_bad_field_is_one_openai_error_naming_it(case: str) -> None:
    raw, endpoint, param = REFUSED[case]
    with pytest.raises(ApiError) as caught:
        read_body(raw, endpoint)
    error = caught.value
    assert error.status == 400 and error.param == param
    assert set(error.body()["error"]) == {"message", "type", "param", "code"}
    assert "\n" not in error.message


def test_a_request_reads_as_the_lanes_run_it() -> None:
    request = read_body(
        body(prompt=["Once"], max_tokens=5, stop="\n", logprobs=2, top_p=0.9), "completions"
    )
    assert (request.prompt, request.max_tokens, request.stop, request.logprobs) == (
        "Once", 5, ("\n",), 2,
    )  # fmt: skip
    assert not request.sampled and not request.stream
    chat = read_body(
        body(
            messages=[
                {"role": "developer", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
            ],
            temperature=0.7,
            stream=True,
            stream_options={"include_usage": True},
        ),
        "chat",
    )
    assert isinstance(chat.prompt, Conversation)
    assert chat.prompt.to_json() == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
    ]
    assert chat.sampled and chat.include_usage and chat.logprobs is None


def cut(pieces: list[bytes], stop: list[str]) -> tuple[list[str], bool]:
    cutter = TextCutter(stop)
    given = [cutter.feed(piece) for piece in pieces]
    return [*given, cutter.flush()], cutter.stopped


def test_text_ends_where_a_stop_string_begins_even_across_tokens() -> None:
    given, stopped = cut([b"one", b" tw", b"o END", b" more"], ["two END"])
    assert "".join(given) == "one " and stopped
    # text that only looked like the stop's start comes out once the next token says so
    given, stopped = cut([b"a t", b"x"], ["two"])
    assert given[0] == "a " and "".join(given) == "a tx" and not stopped


def test_a_character_split_between_tokens_comes_out_whole() -> None:
    euro = "€".encode()
    given, _ = cut([euro[:1], euro[1:], b"!"], [])
    assert given[0] == "" and "".join(given) == "€!"


def step(index: int, piece: bytes) -> TokenStep:
    top = (Candidate(7, 2.0, piece), Candidate(8, 1.0, b"x"))
    return TokenStep("a", index, 7, piece, top, False, 1, 0.0)


def test_an_answer_holds_logprobs_only_when_asked() -> None:
    plain = Answer(read_body(body(prompt="x"), "completions"), server=False)
    plain.add(step(0, b"Hi"))
    response = plain.response("length", Usage(3, 1))
    assert set(response["choices"][0]) == {"index", "text", "finish_reason"}
    assert response["usage"] == {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
    asked = Answer(read_body(body(prompt="x", logprobs=1), "completions"), server=False)
    asked.add(step(0, b"Hi"))
    logprobs = asked.response("eos", Usage(3, 1))["choices"][0]["logprobs"]
    assert logprobs["tokens"] == ["Hi"] and list(logprobs["top_logprobs"][0]) == ["Hi"]
    # a softmax over the top two logits, 2.0 and 1.0
    assert logprobs["token_logprobs"][0] == pytest.approx(-0.3133, abs=1e-4)


@pytest.mark.parametrize(
    ("arguments", "words"),
    [
        (["--host", "0.0.0.0"], "--api-key"),
        (["--api-key", " "], "--api-key is empty"),
        (["--host", "0.0.0.0", "--api-key-env", "SPECDIFF_NO_SUCH_KEY"], "the variable is not set"),
        (["--api-key", "k", "--api-key-env", "SPECDIFF_KEY"], "not allowed with argument"),
        (["--concurrency", "2"], "needs server lanes"),
    ],
)
def test_the_command_refuses_before_anything_loads(arguments, words, capsys) -> None:
    assert main(["proxy", *arguments]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1


def test_the_key_can_come_from_a_variable_kept_off_the_command_line(monkeypatch, capsys) -> None:
    monkeypatch.setenv("SPECDIFF_PROXY_KEY", "sesame")
    assert client_key(None, "SPECDIFF_PROXY_KEY") == "sesame"
    # read once: the workers the proxy starts inherit no key of the clients'
    assert "SPECDIFF_PROXY_KEY" not in os.environ
    assert client_key("given", None) == "given"
    monkeypatch.setenv("SPECDIFF_PROXY_KEY", " ")
    assert main(["proxy", "--api-key-env", "SPECDIFF_PROXY_KEY"]) == 2
    err = capsys.readouterr().err
    assert "SPECDIFF_PROXY_KEY: the variable is empty" in err and err.count("\n") == 1


def test_a_host_without_an_ipv4_address_is_named_not_the_port(capsys, tmp_path) -> None:
    code = main(["proxy", "--host", "::1", "--port", "0", "--report", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 2 and "give --host an IPv4 address" in err and err.count("\n") == 1


def test_a_report_folder_that_cannot_be_made_is_said_at_start(capsys, tmp_path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    code = main(["proxy", "--port", "0", "--report", str(blocked / "report")])
    err = capsys.readouterr().err
    assert code == 2 and f"cannot create {blocked / 'report'}" in err, err
    assert err.count("\n") == 2  # the loading line, then the error


def test_a_port_in_use_is_one_line(capsys, tmp_path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = main(["proxy", "--port", str(port), "--report", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 2 and f"cannot listen on 127.0.0.1:{port}" in err and err.count("\n") == 1
    assert not (tmp_path / "r").exists()


def test_an_existing_report_folder_is_refused(capsys, tmp_path) -> None:
    assert main(["proxy", "--report", str(tmp_path)]) == 2
    assert "already exists" in capsys.readouterr().err


@pytest.fixture
def keyed_proxy(tmp_path):
    """The HTTP front with a key, its pair never loaded: every answer below comes before
    a request would reach the lanes."""
    settings = ProxySettings(presets()["spec-vs-plain"], tmp_path / "suite", 8, 0.5)
    server = ProxyServer(("127.0.0.1", 0), Service(settings), "sesame")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.port}/v1"
    server.shutdown()
    server.server_close()


def test_a_keyed_proxy_answers_only_the_bearer_of_its_key(keyed_proxy) -> None:
    assert httpx.get(f"{keyed_proxy}/models", timeout=10).status_code == 401
    wrong = httpx.get(f"{keyed_proxy}/models", headers={"Authorization": "Bearer sesam"})
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
    right = httpx.get(f"{keyed_proxy}/models", headers={"Authorization": "Bearer sesame"})
    assert right.status_code == 200
    # the scheme's name is case-insensitive, the key is not
    lower = httpx.get(f"{keyed_proxy}/models", headers={"Authorization": "bearer sesame"})
    assert lower.status_code == 200
    upper = httpx.get(f"{keyed_proxy}/models", headers={"Authorization": "Bearer SESAME"})
    assert upper.status_code == 401
    assert [m["id"] for m in right.json()["data"]] == ["spec-vs-plain"]


def test_errors_come_before_the_pair_loads(keyed_proxy) -> None:
    key = {"Authorization": "Bearer sesame"}
    route = httpx.post(f"{keyed_proxy}/embeddings", json={}, headers=key)
    assert route.status_code == 404 and "/v1/completions" in route.json()["error"]["message"]
    model = httpx.post(
        f"{keyed_proxy}/chat/completions",
        json={"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]},
        headers=key,
    )
    assert model.status_code == 404 and model.json()["error"]["param"] == "model"
    huge = httpx.post(
        f"{keyed_proxy}/completions", content=b"x" * (MAX_BODY + 1), headers=key, timeout=30
    )
    assert huge.status_code == 413
    # a POST route asked with GET, and the SDK's models.retrieve
    asked = httpx.get(f"{keyed_proxy}/completions", headers=key)
    assert asked.status_code == 405 and "takes POST" in asked.json()["error"]["message"]
    one = httpx.get(f"{keyed_proxy}/models/spec-vs-plain", headers=key)
    assert one.status_code == 200 and one.json()["id"] == "spec-vs-plain"
