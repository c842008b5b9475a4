"""Server lanes against a server that attacks them: every hostile answer of the fault
server in tests/servers.py, against the lane itself and against `run`, `suite`,
`repeat --endpoint` and the TUI. Each ends its lane with one line, or at the token
budget; nothing a server sends reaches the terminal as an escape sequence, and no secret
reaches a file or the screen."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from specdiff.engine.server.client import (
    MAX_IDENTITY_BYTES,
    MAX_LINE_BYTES,
    MESSAGE_CHARS,
    MIN_SECRET_CHARS,
    ServerClient,
    ServerError,
    credentials,
    split_lines,
)
from specdiff.engine.server.dialects import (
    MAX_PIECE_BYTES,
    Chat,
    Completions,
    LlamaServer,
    Unusable,
)
from specdiff.engine.server.lane import EchoGuard, ServerLane
from specdiff.errors import LaneConfigError
from specdiff.lanes import Lane, Pair, has_masked_credentials, presets, without_credentials
from specdiff.sessions.store import load_session
from specdiff.steps import Candidate, TokenStep
from tests.conftest import wait_for
from tests.servers import PASSWORD, WRONG_PROPS, fault_server
from tests.tui_driver import drive

KEY = "sk-specdiff-hostile-0123456789abcdef"
"""The API key lane a sends: the echo-key server sends it back everywhere it can."""
KEY_ENV = "SPECDIFF_HOSTILE_KEY"
BUDGET = 6

FAILURES = {
    "nan": "nan as a log-probability (top_logprobs), not a finite number",
    "inf": "-inf as a log-probability (top_logprobs), not a finite number",
    "echo-key": "the server's text holds the API key or the endpoint's password",
    "newline-error": "HTTP 500: out of memory at line 2 ",
    "redirect": "the server redirects to http://***@127.0.0.1:9/v1/completions (HTTP 307)",
    "giant-event": "the server sent a line longer than 1024 KiB after 1 tokens",
}
"""What ends lane a in each mode that fails it; `endless` ends at the budget instead."""
MODES = ["endless", *FAILURES]
CONTROL = re.compile(rb"[\x00-\x08\x0b-\x1f\x7f]")
"""A byte no output may hold: control characters other than tab and newline, and DEL."""
SECRETS = (KEY, PASSWORD, "hunter2-redirect")


@pytest.fixture(scope="module")
def steady() -> Iterator[str]:
    """A well-behaved server for lane b: four tokens and a finish."""
    with fault_server("steady") as url:
        yield url


@pytest.fixture
def hostile(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """(mode, URL) of a fault server in the mode the test is parametrised with."""
    with fault_server(request.param) as url:
        yield request.param, url


def assert_clean(*outputs: bytes) -> None:
    """No escape reached the terminal, and no secret either."""
    for output in outputs:
        assert not CONTROL.search(output), output[-400:]
        assert "Traceback" not in output.decode("utf-8", "replace"), output[-400:]
        for secret in SECRETS:
            assert secret.encode() not in output, output[-400:]


def assert_no_secret_in(folder: Path) -> None:
    for file in folder.rglob("*"):
        if file.is_file():
            data = file.read_bytes()
            for secret in SECRETS:
                assert secret.encode() not in data and secret[:8].encode() not in data, file


def specdiff(*arguments: str) -> subprocess.CompletedProcess[bytes]:
    environment = dict(os.environ, **{KEY_ENV: KEY})
    return subprocess.run(
        [sys.executable, "-m", "specdiff", *arguments],
        capture_output=True,
        env=environment,
        timeout=240,
        check=False,
    )


def hostile_lane(url: str) -> list[str]:
    """Lane options for lane a on the hostile server, with a key and a password to echo."""
    return [
        "--lane-a",
        f"endpoint={with_password(url)}",
        "--lane-a",
        f"api_key_env={KEY_ENV}",
        "--lane-a",
        "timeout=3",
    ]


def with_password(url: str) -> str:
    return url.replace("http://", f"http://specdiff:{PASSWORD}@")


# --- the lane itself ---------------------------------------------------------------


@pytest.mark.server
@pytest.mark.model
@pytest.mark.parametrize("hostile", [*MODES, "keepalive", "giant-body"], indirect=True)
def test_the_lane_ends_in_one_line_or_at_the_budget(hostile: tuple[str, str], monkeypatch) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    mode, url = hostile
    lane = ServerLane(Lane(backend="server", endpoint=url, api_key_env=KEY_ENV, timeout=1))
    try:
        if mode == "endless":
            steps = list(lane.generate("Hello", BUDGET))
            assert [s.index for s in steps] == list(range(BUDGET))
            assert lane.generation.stop_reason == "length"
            return
        with pytest.raises(ServerError) as caught:
            list(lane.generate("Hello", BUDGET))
        identity = json.dumps(lane.executed())
    finally:
        lane.close()
    message = str(caught.value)
    expected = {
        **FAILURES,
        "keepalive": "no token for 1 s, only keep-alives",
        "giant-body": 'HTTP 500: {"error": {"message": "xxxx',
    }[mode]
    assert expected in message and len(message) <= MESSAGE_CHARS, message
    assert_clean(message.encode(), identity.encode())


def assert_typed(identity: dict) -> None:
    """A server's identity as a header keeps it: short texts, counts, switches."""
    for key, value in identity.items():
        if key == "models":
            assert all(isinstance(model, str) for model in value)
        elif key == "slots":
            for slot in value:
                assert all(type(v) is bool or _count(v) for v in slot.values()), slot
        elif key == "speculative":
            assert all(isinstance(v, (str, int, float, bool)) for v in value.values()), value
        else:
            assert isinstance(value, (str, bool)) or _count(value), (key, value)
    assert len(json.dumps(identity)) < 4000


def _count(value: object) -> bool:
    return type(value) is int and 0 <= value <= 1 << 31


@pytest.mark.server
@pytest.mark.model
@pytest.mark.parametrize("hostile", list(WRONG_PROPS), indirect=True)
def test_props_and_slots_of_the_wrong_type_are_left_out(
    hostile: tuple[str, str], tmp_path: Path
) -> None:
    mode, url = hostile
    lane = ServerLane(Lane(backend="server", endpoint=url, api="llama-server", timeout=3))
    try:
        assert_typed(lane.identity)
    finally:
        lane.close()
    # both lanes on the server: each is answered with another shape of wrong /props
    done = specdiff(
        "run", "--pair", "servers", "--lane-a", f"endpoint={url}", "--lane-b",
        f"endpoint={url}", "--max-tokens", str(BUDGET), "--save", "--sessions-dir",
        str(tmp_path),
    )  # fmt: skip
    assert_clean(done.stdout, done.stderr)
    assert done.returncode in (0, 1), done.stderr
    (saved,) = tmp_path.glob("*.jsonl")
    for executed in load_session(saved).header.executed.values():
        assert_typed(executed["server"])


SECRET_DISGUISES = {
    "echo-escaped": "an event of an unexpected shape",
    "echo-basic": "HTTP 500: bad credentials in header Basic ***",
    "trickle": "an event took over 1 s to arrive after 1 tokens",
    "redirect-control": "the server redirects to an address that is not a URL",
}
"""What ends the lane when a server hides a secret in another form, or never finishes a
line, or redirects to no URL at all."""


@pytest.mark.server
@pytest.mark.model
@pytest.mark.parametrize("hostile", [*SECRET_DISGUISES, "echo-finish"], indirect=True)
def test_a_secret_in_disguise_is_masked_and_a_trickle_times_out(
    hostile: tuple[str, str], monkeypatch
) -> None:
    """The key as JSON escapes, the password as base64 basic auth, the key as a finish
    reason: none reaches a message or the record; an event line that never ends fails
    the lane after `timeout` even though every read brings a byte."""
    monkeypatch.setenv(KEY_ENV, KEY)
    mode, url = hostile
    endpoint = with_password(url) if mode == "echo-basic" else url
    lane = ServerLane(Lane(backend="server", endpoint=endpoint, api_key_env=KEY_ENV, timeout=1))
    try:
        if mode == "echo-finish":
            steps = list(lane.generate("Hello", BUDGET))
            assert len(steps) == 1 and lane.generation.stop_reason == "ended"
            return
        with pytest.raises(ServerError) as caught:
            list(lane.generate("Hello", BUDGET))
    finally:
        lane.close()
    message = str(caught.value)
    assert SECRET_DISGUISES[mode] in message, message
    assert_clean(message.encode())
    undone = message.encode().decode("unicode_escape")  # what a reader of the escapes sees
    assert KEY not in undone and PASSWORD not in undone, message
    assert base64.b64encode(f"specdiff:{PASSWORD}".encode()).decode() not in message


@pytest.mark.server
@pytest.mark.model
@pytest.mark.parametrize("hostile", ["echo-key"], indirect=True)
@pytest.mark.parametrize("secret", ["key", "url"])
def test_an_echoed_secret_is_masked_and_never_kept(
    hostile: tuple[str, str], secret: str, monkeypatch
):
    """The key (a bearer token) or the URL's password (basic auth) comes back in the
    server's model list, its /props and its text: masked in the identity, and the text
    ends the lane before any step holding it is passed on."""
    monkeypatch.setenv(KEY_ENV, KEY)
    _, url = hostile
    lane = Lane(backend="server", endpoint=url, api_key_env=KEY_ENV)
    if secret == "url":
        lane = Lane(backend="server", endpoint=with_password(url))
    server = ServerLane(lane)
    steps = []
    try:
        with pytest.raises(ServerError, match="holds the API key or the endpoint's password"):
            steps.extend(server.generate("Hello", 40))
        executed = json.dumps(server.executed())
    finally:
        server.close()
    assert "***" in executed and "b1 ***" in executed
    assert_clean(executed.encode(), b"".join(step.piece for step in steps))
    assert b"".join(step.piece for step in steps) == b" The key is "


# --- the commands -------------------------------------------------------------------


@pytest.mark.server
@pytest.mark.model
@pytest.mark.parametrize("hostile", MODES, indirect=True)
def test_run_saves_a_readable_session_without_the_secret(
    hostile: tuple[str, str], steady: str, tmp_path: Path
) -> None:
    mode, url = hostile
    done = specdiff(
        "run", "--pair", "servers", *hostile_lane(url), "--lane-b", f"endpoint={steady}",
        "--max-tokens", str(BUDGET), "--save", "--sessions-dir", str(tmp_path),
    )  # fmt: skip
    assert_clean(done.stdout, done.stderr)
    (saved,) = tmp_path.glob("*.jsonl")
    session = load_session(saved)
    assert session.footer is not None
    if mode == "endless":
        assert done.returncode == 1  # lane b's four tokens differ
        assert len(session.steps["a"]) == BUDGET
        assert session.footer.stop_reasons[0] == "length"
    else:
        assert done.returncode == 2
        errors = [line for line in done.stderr.decode().splitlines() if "error:" in line]
        assert len(errors) == 1 and FAILURES[mode] in errors[0], done.stderr
        assert session.footer.errors[0] and FAILURES[mode] in session.footer.errors[0]
        assert len(session.steps["a"]) < BUDGET
    assert len(session.steps["b"]) == 4
    assert_no_secret_in(tmp_path)


@pytest.mark.server
@pytest.mark.model
@pytest.mark.parametrize("hostile", MODES, indirect=True)
def test_a_suite_marks_the_failed_runs_and_resumes(
    hostile: tuple[str, str], steady: str, tmp_path: Path
) -> None:
    mode, url = hostile
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"id": "one", "prompt": "Hello"}\n{"id": "two", "prompt": "Once"}\n')
    report = tmp_path / "report"
    options = [
        str(prompts), "--pair", "servers", *hostile_lane(url), "--lane-b", f"endpoint={steady}",
        "--max-tokens", str(BUDGET), "--report", str(report),
    ]  # fmt: skip
    done = specdiff("suite", *options)
    assert_clean(done.stdout, done.stderr)
    # 0: every run finished (forks are what a suite measures); 1: lane a failed on some
    assert done.returncode == (0 if mode == "endless" else 1), done.stderr
    summary = json.loads((report / "report.json").read_text())["pairs"][0]["summary"]
    assert summary["prompts"] == 2
    assert summary["failed"] == (0 if mode == "endless" else 2)
    for session in (report / "sessions").rglob("*.jsonl"):
        assert len(load_session(session).steps["a"]) <= BUDGET
    # suite.json keeps lane a's endpoint as http://***@...: a resume is given it again
    resumed = specdiff("suite", *options, "--resume")
    assert_clean(resumed.stdout, resumed.stderr)
    assert resumed.returncode in (0, 1), resumed.stderr
    assert_no_secret_in(tmp_path)


@pytest.mark.server
@pytest.mark.model
@pytest.mark.parametrize("hostile", ["password"], indirect=True)
def test_a_resumed_suite_keeps_the_password_it_is_given(
    hostile: tuple[str, str], steady: str, tmp_path: Path
) -> None:
    """suite.json keeps the endpoint without its password; a resume given the options
    again runs with them, so its runs are not refused."""
    _, url = hostile
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"id": "one", "prompt": "Hello"}\n{"id": "two", "prompt": "Once"}\n')
    report = tmp_path / "report"
    options = [
        str(prompts), "--pair", "servers", "--lane-a", f"endpoint={with_password(url)}",
        "--lane-b", f"endpoint={steady}", "--max-tokens", str(BUDGET), "--report", str(report),
    ]  # fmt: skip
    assert specdiff("suite", *options).returncode == 0
    (missing, *_) = (report / "sessions").rglob("*.jsonl")
    missing.unlink()
    resumed = specdiff("suite", *options, "--resume")
    assert_clean(resumed.stdout, resumed.stderr)
    assert resumed.returncode == 0, resumed.stderr
    summary = json.loads((report / "report.json").read_text())["pairs"][0]["summary"]
    assert summary["prompts"] == 2 and summary["failed"] == 0
    assert_no_secret_in(tmp_path)


@pytest.mark.server
@pytest.mark.model
@pytest.mark.parametrize("hostile", MODES, indirect=True)
def test_repeat_against_a_hostile_server_finishes(hostile: tuple[str, str]) -> None:
    mode, url = hostile
    done = specdiff(
        "repeat", "--endpoint", with_password(url), "--lane", f"api_key_env={KEY_ENV}",
        "--lane", "timeout=3", "-n", "3", "--concurrency", "2", "--max-tokens", str(BUDGET),
        "--json", "--quiet",
    )  # fmt: skip
    assert_clean(done.stdout, done.stderr)
    if mode == "endless":
        data = json.loads(done.stdout)
        assert done.returncode == 0 and data["runs"] == 3 and data["unique"] == 1
        assert data["groups"][0]["tokens"] == BUDGET
    else:
        assert done.returncode == 2
        err = done.stderr.decode().strip()
        assert len(err.splitlines()) == 1 and FAILURES[mode] in err, err


@pytest.mark.server
@pytest.mark.model
@pytest.mark.parametrize("hostile", MODES, indirect=True)
async def test_live_shows_one_line_and_stays_responsive(
    hostile: tuple[str, str], steady: str, monkeypatch
) -> None:
    from specdiff.tui.app import make_app
    from specdiff.tui.widgets import TokenView

    monkeypatch.setenv(KEY_ENV, KEY)
    mode, url = hostile
    lane_a = Lane(backend="server", endpoint=with_password(url), api_key_env=KEY_ENV, timeout=3)
    known = presets()
    known["hostile"] = Pair("hostile", lane_a, Lane(backend="server", endpoint=steady), "")
    app = make_app(known, "hostile", "Hello", BUDGET)
    async with app.run_test(size=(120, 36)) as pilot:
        screen = drive(app)
        await wait_for(pilot, lambda: screen.result is not None and not screen.running, timeout=60)
        error = drive(app).lanes["a"].error
        if mode == "endless":
            assert error is None and len(drive(app).lanes["a"].steps) == BUDGET
        else:
            assert error is not None and FAILURES[mode] in error and "\n" not in error
            trailer = app.query_one("#lane-a TokenView", TokenView).trailer
            assert trailer is not None and "\x1b" not in str(trailer)
        assert len(drive(app).lanes["b"].steps) == 4
        shown = json.dumps([str(step.piece) for step in drive(app).lanes["a"].steps])
        assert KEY not in shown and KEY not in (error or "")
        title = str(app.query_one("#lane-a .lane-title").render())
        assert "***@127.0.0.1" in title and PASSWORD not in title
        theme = app.theme
        await pilot.press("t")  # the app still answers keys
        await pilot.pause()
        assert app.theme != theme


@pytest.mark.server
@pytest.mark.model
@pytest.mark.parametrize("token_id", [-1, "n_vocab", 1 << 40, True, None, "7"])
def test_a_token_id_outside_the_vocabulary_is_refused_before_llama_cpp_sees_it(
    steady: str, token_id: object
) -> None:
    """llama.cpp aborts the process on a piece asked for an id outside its vocabulary."""
    lane = ServerLane(Lane(backend="server", endpoint=steady))
    try:
        wanted = lane.model.n_vocab if token_id == "n_vocab" else token_id
        with pytest.raises(ServerError, match="outside the tokenizer's vocabulary"):
            lane.vocab.piece(wanted)
    finally:
        lane.close()


# --- pure: the pieces that bound what a server sends ---------------------------------


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 64])
@pytest.mark.parametrize("ending", [b"\n", b"\r\n", b"\r"])
def test_lines_split_alike_however_the_bytes_arrive(chunk: int, ending: bytes) -> None:
    lines = ['data: {"a": 1}', "", ": ping", "data: [DONE]"]
    data = ending.join(line.encode() for line in lines) + ending
    chunks = [data[i : i + chunk] for i in range(0, len(data), chunk)]
    got = [line for line in split_lines(chunks, RuntimeError) if line]
    assert got == [line for line in lines if line]


@pytest.mark.parametrize("newline", [False, True])
def test_a_line_past_the_limit_raises_without_being_held(newline: bool) -> None:
    """An endless line (or a giant one) fails once it passes the limit; the generator
    never asks for the rest."""
    asked = 0

    def endless() -> Iterator[bytes]:
        nonlocal asked
        while True:
            asked += 1
            yield b"x" * 65536 + (b"\n" if newline and asked == 40 else b"")

    with pytest.raises(RuntimeError):
        list(split_lines(endless(), RuntimeError))
    assert asked * 65536 <= MAX_LINE_BYTES + 65536


def steps_of(pieces: list[bytes]) -> list[TokenStep]:
    return [
        TokenStep("a", i, i, piece, (Candidate(i, -0.5, piece),), False, 1, 0.0)
        for i, piece in enumerate(pieces)
    ]


SPLITS = {
    "whole": [b"key: ", KEY.encode(), b"."],
    "in threes": [b"key: ", *(KEY[i : i + 3].encode() for i in range(0, len(KEY), 3))],
    "one byte each": [bytes([c]) for c in f"x{KEY}y".encode()],
    "inside a piece": [b"a", f"b{KEY}c".encode()],
}


@pytest.mark.parametrize("pieces", SPLITS.values(), ids=SPLITS)
def test_an_echoed_secret_ends_the_stream_and_nothing_of_it_passes(pieces: list[bytes]) -> None:
    guard = EchoGuard([KEY], RuntimeError)
    passed: list[TokenStep] = []
    with pytest.raises(RuntimeError, match="holds the API key"):
        for step in steps_of(pieces):
            passed.extend(guard.admit(step))
    text = b"".join(step.piece for step in passed)
    assert KEY[:2].encode() not in text


NEAR_MISSES = {
    "a prefix, then another word": [b"sk-", b"spec", b"diff", b" is a tool"],
    "the key's start at the very end": [b"ends with ", b"sk"],
    "no secret at all": [b"plain", b" text"],
}


@pytest.mark.parametrize("pieces", NEAR_MISSES.values(), ids=NEAR_MISSES)
def test_text_that_only_resembles_a_secret_passes_whole_and_in_order(
    pieces: list[bytes],
) -> None:
    guard = EchoGuard([KEY], RuntimeError)
    steps = steps_of(pieces)
    passed = [released for step in steps for released in guard.admit(step)]
    passed += guard.finish()
    assert passed == steps


def test_a_stream_cut_inside_a_secret_keeps_none_of_it() -> None:
    guard = EchoGuard([KEY], RuntimeError)
    passed = [s for step in steps_of([b"x ", KEY[:12].encode()]) for s in guard.admit(step)]
    with pytest.raises(RuntimeError):
        guard.finish()
    assert b"".join(step.piece for step in passed) == b"x "


RELEASES = {
    "the key's first characters": ([b"x ", KEY[:3].encode()], 2),
    "most of the key": ([b"x ", KEY[:12].encode()], 1),
    "nothing held": ([b"plain", b" text"], 2),
}
"""Pieces before a cancel, and how many of their steps a cancel passes on."""


@pytest.mark.parametrize("pieces, passed_count", RELEASES.values(), ids=RELEASES)
def test_a_cancel_passes_on_the_held_steps_unless_they_hold_most_of_a_secret(
    pieces: list[bytes], passed_count: int
) -> None:
    """A cancel cuts the stream, not the server: steps held for a chance match of a
    secret's start are passed on, without failing anything; most of a secret is not."""
    guard = EchoGuard([KEY], RuntimeError)
    steps = steps_of(pieces)
    passed = [released for step in steps for released in guard.admit(step)]
    passed += guard.release()
    assert passed == steps[:passed_count]
    assert guard.release() == [] and guard.finish() == []


SHORT_KEYS = ["EMPTY", "test", "x", "sk-1234"]
"""Keys local servers take as placeholders: shorter than any secret that is guarded."""


@pytest.mark.parametrize("key", SHORT_KEYS)
def test_a_placeholder_key_is_neither_masked_nor_guarded(key: str) -> None:
    assert len(key) < MIN_SECRET_CHARS
    client = ServerClient(Lane(backend="server", endpoint="http://127.0.0.1:9"), key)
    try:
        text = f"the {key} answer: {key}"
        assert client.secrets == [] and client.mask(text) == text
        guard = EchoGuard(client.secrets, RuntimeError)
        steps = steps_of([b"the ", key.encode(), b" answer"])
        assert [s for step in steps for s in guard.admit(step)] + guard.finish() == steps
    finally:
        client.close()


@pytest.mark.parametrize("key", ["12345678", KEY])
def test_a_key_of_secret_length_is_masked_and_guarded(key: str) -> None:
    assert len(key) >= MIN_SECRET_CHARS
    client = ServerClient(Lane(backend="server", endpoint="http://127.0.0.1:9"), key)
    try:
        assert client.mask(f"the {key} answer") == "the *** answer"
        guard = EchoGuard(client.secrets, RuntimeError)
        with pytest.raises(RuntimeError, match="holds the API key"):
            for step in steps_of([b"the ", key.encode(), b" answer"]):
                guard.admit(step)
    finally:
        client.close()


@pytest.mark.server
@pytest.mark.model
@pytest.mark.parametrize("hostile", ["echo-key"], indirect=True)
@pytest.mark.parametrize("key", SHORT_KEYS[:2])
def test_a_server_that_says_a_placeholder_key_runs_to_its_end(
    hostile: tuple[str, str], key: str, monkeypatch
) -> None:
    monkeypatch.setenv(KEY_ENV, key)
    _, url = hostile
    lane = ServerLane(Lane(backend="server", endpoint=url, api_key_env=KEY_ENV, timeout=3))
    try:
        steps = list(lane.generate("Hello", 40))
        identity = lane.executed()["server"]
    finally:
        lane.close()
    assert b"".join(step.piece for step in steps) == f" The key is {key}.".encode()
    assert identity["models"][0].startswith(key)


@pytest.mark.server
@pytest.mark.parametrize("mode, truncated", [("giant-body", True), ("steady", False)])
def test_an_identity_past_its_bound_says_it_was_cut(mode: str, truncated: bool) -> None:
    """/props past MAX_IDENTITY_BYTES is read up to it, and the identity says so
    rather than silently lacking what the body held."""
    with fault_server(mode) as url:
        client = ServerClient(Lane(backend="server", endpoint=url), "")
        try:
            identity = client.identity()
        finally:
            client.close()
    assert identity["models"] == [f"fault-{mode}"]
    assert identity.get("identity_truncated", False) is truncated
    assert MAX_IDENTITY_BYTES > 1 << 16  # larger than an error body's bound


@pytest.mark.parametrize(
    "endpoint, masked",
    [
        ("http://***@127.0.0.1:9", True),
        ("https://***@host/v1", True),
        ("http://user:***@127.0.0.1:9", False),  # a password of three stars, as typed
        ("http://127.0.0.1:9/***@", False),
        ("http://127.0.0.1:9", False),
    ],
)
def test_an_endpoint_saved_without_its_credentials_is_refused_before_any_request(
    endpoint: str, masked: bool
) -> None:
    lane = Lane(backend="server", endpoint=endpoint)
    assert has_masked_credentials(endpoint) is masked
    if not masked:
        lane.check_credentials("a")
        return
    with pytest.raises(LaneConfigError, match="saved without its credentials") as caught:
        ServerLane(lane, "b")
    assert "--lane-b endpoint=" in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "url, shown, secret",
    [
        ("http://user:pa%40ssword@host:8080/v1", "http://***@host:8080/v1", "pa@ssword"),
        ("https://tok3n-0123456789@host", "https://***@host", "tok3n-0123456789"),
        ("http://admin@host:8080", "http://***@host:8080", None),  # a user name alone
        ("http://user:pass@host", "http://***@host", None),  # too short to be told from text
        ("http://host:8080/path?x=a@b", "http://host:8080/path?x=a@b", None),
        ("http://127.0.0.1:8080", "http://127.0.0.1:8080", None),
    ],
)
def test_url_credentials_are_masked_wherever_the_url_is_shown(
    url: str, shown: str, secret: str | None
) -> None:
    assert without_credentials(url) == shown
    assert Lane(backend="server", endpoint=url).as_dict()["endpoint"] == shown
    assert (secret in credentials(url)) if secret else not credentials(url)


@pytest.mark.parametrize(
    "value", [float("nan"), float("inf"), float("-inf"), 1e300, -1e7, "0.5", True, None, 10**400]
)
def test_a_log_probability_must_be_a_finite_number(value: object) -> None:
    event = {
        "choices": [
            {
                "text": " a",
                "logprobs": {
                    "tokens": [" a"],
                    "token_logprobs": [-0.1],
                    "top_logprobs": [{" a": value, " b": -1.0}],
                },
            }
        ]
    }
    with pytest.raises(Unusable):
        Completions().parse(event)
    event["choices"][0]["logprobs"]["top_logprobs"] = [{" a": -0.1}]
    event["choices"][0]["logprobs"]["token_logprobs"] = [value]
    with pytest.raises(Unusable):
        Completions().parse(event)


@pytest.mark.parametrize("size", [MAX_PIECE_BYTES + 1, 1 << 20])
def test_a_token_longer_than_any_token_is_refused(size: int) -> None:
    entry = {"id": 1, "token": "x" * size, "logprob": -0.1, "top_logprobs": []}
    with pytest.raises(Unusable):
        Chat().parse({"choices": [{"delta": {"content": "x"}, "logprobs": {"content": [entry]}}]})
    entry = {"id": 1, "token": "x", "bytes": [120] * size, "logprob": -0.1}
    with pytest.raises(Unusable):
        Chat().parse({"choices": [{"delta": {"content": "x"}, "logprobs": {"content": [entry]}}]})


def refuse_piece(token_id: int) -> bytes:
    raise AssertionError(f"asked for the piece of {token_id}: the event should fail first")


@pytest.mark.parametrize(
    "entry",
    [
        {"id": 5, "token": "a", "logprob": float("nan"), "top_logprobs": []},
        {"id": 5, "token": "a", "logprob": -0.1, "top_logprobs": [{"id": 6, "logprob": "-1"}]},
        {"id": 5, "token": "a", "bytes": [97] * (MAX_PIECE_BYTES + 1), "logprob": -0.1},
    ],
    ids=["nan chosen", "text as a number", "oversized bytes"],
)
def test_llama_server_events_are_checked_like_the_others(entry: dict) -> None:
    event = {"content": "a", "tokens": [5], "completion_probabilities": [entry]}
    with pytest.raises(Unusable):
        LlamaServer(refuse_piece).parse(event)


@pytest.mark.parametrize(
    "reason, recorded",
    [
        ("length", "length"),
        ("stop", "eos"),
        ("content_filter", "content_filter"),
        ("hunter_two_secret", "ended"),  # a key echoed as a reason reads like one
        ("\x1b]0;title\x07", "ended"),
        ("x" * 100, "ended"),
        (7, "ended"),
    ],
)
def test_a_finish_reason_is_recorded_only_when_it_is_a_known_one(
    reason: object, recorded: str
) -> None:
    choice = {"text": "", "finish_reason": reason, "logprobs": None}
    assert Completions().parse({"choices": [choice]}).finish == recorded
