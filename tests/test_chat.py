"""Chat lanes: a conversation checked on the way in, carried to every lane and session,
and formatted the same way in-process and by llama-server."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from specdiff.chat import (
    BUILTIN_TEMPLATES,
    MAX_CONVERSATION_CHARS,
    MAX_MESSAGES,
    ChatError,
    Conversation,
    Message,
    box_json,
    conversation,
    looks_like_messages,
    messages_of,
    mixed_note,
    one_message,
    parse_messages,
    read_messages,
    typed_messages,
    unformatted_note,
)
from specdiff.engine.server.dialects import Chat
from specdiff.engine.server.lane import SERVER_TEMPLATE
from specdiff.errors import LaneConfigError
from specdiff.lanes import Lane, Pair
from specdiff.sessions.header import SessionHeader
from specdiff.suite import SuiteError
from specdiff.suite.prompts import load_suite_prompts
from tests.in_process import specdiff_here
from tests.llama_server_faults import FORMATTED, PROMPT_IDS, TEMPLATE_FAULTS, llama_server_faults
from tests.tui_driver import drive

USER = {"role": "user", "content": "Name a colour."}
SYSTEM = {"role": "system", "content": "Answer in one word."}
ASSISTANT = {"role": "assistant", "content": "Blue."}
CONVERSATIONS = {
    "one user message": [USER],
    "system and user": [SYSTEM, USER],
    "several turns": [SYSTEM, USER, ASSISTANT, {"role": "user", "content": "Another?"}],
    "several turns without system": [USER, ASSISTANT, {"role": "user", "content": "Another?"}],
}
BAD_MESSAGES = {
    "not a list": ({"role": "user", "content": "x"}, "must be a list"),
    "text": ("hello", "must be a list"),
    "a number": (3, "must be a list"),
    "empty": ([], "is empty"),
    "an item that is no object": (["hello"], "[0] must be an object"),
    "an unknown role": ([{"role": "bot", "content": "x"}], "[0].role must be one of"),
    "a missing role": ([{"content": "x"}], "[0].role must be one of"),
    "a role with escapes": ([{"role": "\x1b[2J", "content": "x"}], "[0].role"),
    "content that is a number": ([{"role": "user", "content": 5}], "[0].content must be text"),
    "content that is a list": ([{"role": "user", "content": ["x"]}], "[0].content must be text"),
    "missing content": ([{"role": "user"}], '[0] has no "content"'),
    "an unknown key": ([{"role": "user", "content": "x", "name": "n"}], "unknown key 'name'"),
    "a NUL character": ([{"role": "user", "content": "a\x00b"}], "NUL"),
    "a lone surrogate": ([{"role": "user", "content": "a\udc80"}], "lone surrogate"),
    "no user message": ([SYSTEM, ASSISTANT], "no user message"),
    "too many messages": ([USER] * (MAX_MESSAGES + 1), f"more than {MAX_MESSAGES}"),
    "too much text": (
        [{"role": "user", "content": "x" * (MAX_CONVERSATION_CHARS + 1)}],
        "longer than",
    ),
}


# --- messages, pure --------------------------------------------------------------------


@pytest.mark.parametrize("name", BAD_MESSAGES)
def test_a_bad_messages_list_is_one_line_naming_where(name: str) -> None:
    value, fragment = BAD_MESSAGES[name]
    with pytest.raises(ValueError) as caught:
        parse_messages(value, "--messages")
    message = str(caught.value)
    assert message.startswith("--messages") and fragment in message
    assert "\n" not in message and len(message) < 300


@pytest.mark.parametrize("name", CONVERSATIONS)
def test_a_conversation_keeps_its_messages_through_pickle_and_json(name: str) -> None:
    items = CONVERSATIONS[name]
    prompt = Conversation(parse_messages(items))
    assert prompt.to_json() == items
    # the raw-text rendition a lane without a template decodes
    assert prompt == "\n\n".join(item["content"] for item in items)
    again = pickle.loads(pickle.dumps(prompt))  # the lanes' worker receives it pickled
    assert isinstance(again, Conversation) and again.messages == prompt.messages
    assert json.loads(json.dumps(prompt)) == str(prompt)
    assert messages_of(prompt) == prompt.messages


@pytest.mark.parametrize("prompt", ["Once upon a time", "line one\nline two", "[not json"])
def test_a_plain_prompt_is_one_user_message(prompt: str) -> None:
    assert messages_of(prompt) == (Message("user", prompt),)
    assert one_message(prompt).messages == (Message("user", prompt),)
    assert not looks_like_messages(prompt)


@pytest.mark.parametrize("text", ["[1, 2, 3]", "[]", '["a", "b"]', "[true]", "[{]", "{}"])
def test_only_a_json_list_of_objects_looks_like_messages(text: str) -> None:
    assert not looks_like_messages(text)
    assert looks_like_messages("  " + json.dumps(CONVERSATIONS["one user message"]) + "\n")


@pytest.mark.parametrize("name", CONVERSATIONS)
def test_the_prompt_box_reads_a_messages_list_as_a_conversation(name: str) -> None:
    typed = typed_messages("  " + json.dumps(CONVERSATIONS[name]) + "\n")
    assert isinstance(typed, Conversation) and typed.to_json() == CONVERSATIONS[name]


@pytest.mark.parametrize(
    "text",
    [
        '[{"role": "bot", "content": "x"}]',
        '[{"role": "user", "content": 1}]',
        "[{}]",
        "Hello",
        "[{",
    ],
)
def test_the_prompt_box_refuses_a_broken_messages_list(text: str) -> None:
    with pytest.raises(ChatError, match="the prompt box"):
        typed_messages(text)


@pytest.mark.parametrize(
    "content",
    [
        "plain",
        "line\nbreak\ttab",
        "esc \x1b[31m red \x1b]52;c;eA==\x07",
        "c1 \x85 \x9b line sep \u2028 bidi \u202e rtl",
        "tag \U000e0001 and emoji \U0001f600 and 日本語",
        'quotes " and \\ backslash',
    ],
)
def test_the_prompt_box_shows_a_conversation_printable_and_reads_it_back(content: str) -> None:
    """Whatever the messages hold, the box's JSON is one printable line (nothing raw
    reaches the terminal) that reads back as the same conversation."""
    prompt = Conversation(parse_messages([SYSTEM, {"role": "user", "content": content}]))
    shown = box_json(prompt)
    assert shown.isprintable() and "\n" not in shown
    assert typed_messages(shown).messages == prompt.messages


@pytest.mark.parametrize("prompt", ["Hello", Conversation(parse_messages([USER, ASSISTANT, USER]))])
def test_system_opens_the_conversation(prompt: str) -> None:
    combined = conversation(prompt, "Be brief.")
    assert isinstance(combined, Conversation)
    assert combined.messages[0] == Message("system", "Be brief.")
    assert combined.messages[1:] == messages_of(prompt)
    assert conversation(prompt, None) is prompt


def test_system_twice_is_refused() -> None:
    with pytest.raises(ChatError, match="keep one"):
        conversation(Conversation(parse_messages([SYSTEM, USER])), "Be brief.")


@pytest.mark.parametrize(
    ("given", "hint"),
    [("gema", "did you mean 'gemma'"), ("LLAMA3", "did you mean 'llama3'"), ("chat-ml", "chatml")],
)
def test_an_unknown_template_name_gets_the_closest(given: str, hint: str) -> None:
    with pytest.raises(LaneConfigError) as caught:
        Lane(chat=given)
    assert hint in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("setting", ["", "true", "auto", "gemma", "chatml", "llama3"])
def test_known_template_settings_make_a_lane(setting: str) -> None:
    assert Lane(chat=setting).chat == setting


def test_a_server_lane_takes_the_servers_template() -> None:
    with pytest.raises(LaneConfigError, match="api=chat"):
        Lane(backend="server", endpoint="http://127.0.0.1:1", chat="gemma")


@pytest.mark.parametrize(
    ("a", "b", "noted"),
    [
        (Lane(chat="gemma"), Lane(), True),
        (Lane(), Lane(backend="server", endpoint="http://h:1", api="chat"), True),
        (Lane(chat="true"), Lane(backend="server", endpoint="http://h:1", api="chat"), False),
        (Lane(), Lane(backend="server", endpoint="http://h:1"), False),
        # two templates may format alike (chatml and a GGUF without one): run's summary
        # says whether the prompts differed
        (Lane(chat="gemma"), Lane(chat="chatml"), False),
        (Lane(chat="true"), Lane(chat="chatml"), False),
    ],
)
def test_a_chat_lane_beside_a_raw_one_is_noted(a: Lane, b: Lane, noted: bool) -> None:
    assert (mixed_note(a, b) is not None) == noted


@pytest.mark.parametrize(
    ("a", "b", "noted"),
    [
        (Lane(), Lane(), True),
        (Lane(chat="gemma"), Lane(), False),
        (Lane(), Lane(backend="server", endpoint="http://h:1", api="chat"), False),
        (Lane(), Lane(backend="server", endpoint="http://h:1"), True),
    ],
)
def test_a_conversation_no_lane_formats_is_noted(a: Lane, b: Lane, noted: bool) -> None:
    prompt = Conversation(parse_messages([SYSTEM, USER]))
    assert (unformatted_note(prompt, a, b) is not None) == noted
    assert unformatted_note("plain text", a, b) is None


@pytest.mark.parametrize("name", CONVERSATIONS)
def test_the_chat_api_sends_the_conversation(name: str) -> None:
    prompt = Conversation(parse_messages(CONVERSATIONS[name]))
    assert Chat().body(prompt, 4, 8, False)["messages"] == CONVERSATIONS[name]
    assert Chat().body("plain", 4, 8, False)["messages"] == [{"role": "user", "content": "plain"}]


# --- sessions and suites ---------------------------------------------------------------


def header(prompt: str, executed: dict[str, dict[str, Any]]) -> SessionHeader:
    return SessionHeader(
        pair=Pair("chat", Lane(chat="gemma"), Lane()),
        prompt=prompt,
        prompt_token_ids=(2, 105),
        max_tokens=4,
        stop=(),
        executed=executed,
        build={},
        created="",
    )


@pytest.mark.parametrize("name", CONVERSATIONS)
def test_a_session_header_keeps_the_conversation_and_each_formatted_prompt(name: str) -> None:
    prompt = Conversation(parse_messages(CONVERSATIONS[name]))
    formatted = {"text": "<start_of_turn>user\n...", "token_ids": [2, 105, 2364]}
    written = header(prompt, {"a": {"chat_prompt": formatted}, "b": {}}).to_json()
    assert written["messages"] == CONVERSATIONS[name]
    assert written["lane_prompts"] == {"a": formatted}
    assert "chat_prompt" not in written["executed"]["a"]  # kept apart from the settings
    read = SessionHeader.from_json(json.loads(json.dumps(written)))
    assert isinstance(read.prompt, Conversation) and read.prompt.to_json() == CONVERSATIONS[name]
    assert read.lane_prompts == {"a": formatted}


def test_a_session_without_a_conversation_reads_as_before() -> None:
    written = header("Once upon a time", {"a": {}, "b": {}}).to_json()
    assert "messages" not in written and "lane_prompts" not in written
    read = SessionHeader.from_json(written)
    assert read.prompt == "Once upon a time" and not isinstance(read.prompt, Conversation)


def write_set(tmp_path: Path, *records: object) -> str:
    path = tmp_path / "set.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return str(path)


def test_a_suite_line_may_give_messages(tmp_path: Path) -> None:
    source = write_set(
        tmp_path,
        {"id": "plain", "prompt": "Once upon a time"},
        *({"id": name, "messages": items} for name, items in CONVERSATIONS.items()),
    )
    prompts, _ = load_suite_prompts(source)
    assert not isinstance(prompts[0].prompt, Conversation)
    for entry, items in zip(prompts[1:], CONVERSATIONS.values()):
        assert isinstance(entry.prompt, Conversation) and entry.prompt.to_json() == items


@pytest.mark.parametrize(
    ("record", "fragment"),
    [
        ({"id": "x", "messages": "hello"}, '"messages" must be a list'),
        ({"id": "x", "messages": [{"role": "user", "content": 1}]}, '"messages"[0].content'),
        ({"id": "x", "messages": [USER], "prompt": "p"}, "not both"),
        ({"id": "x", "messages": [{"role": "user", "content": " "}]}, "holds no text"),
        ({"id": "x"}, 'missing "prompt"'),
    ],
)
def test_a_bad_messages_line_names_file_line_and_field(
    tmp_path: Path, record: dict[str, Any], fragment: str
) -> None:
    source = write_set(tmp_path, {"id": "ok", "prompt": "fine"}, record)
    with pytest.raises(SuiteError) as caught:
        load_suite_prompts(source)
    assert f"{source}:2:" in str(caught.value) and fragment in str(caught.value)


# --- the command line, a real process --------------------------------------------------


def specdiff(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "specdiff", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--messages", "[{]"], "--messages is not valid JSON"),
        (["--messages", '[{"role": "bot", "content": "x"}]'], "--messages[0].role"),
        (["--messages", "/nonexistent/chat.json"], "not found"),
        (["--messages", "-", "--prompt", "x"], "give the prompt once"),
        (["--messages", json.dumps([SYSTEM, USER]), "--system", "Be kind."], "keep one"),
        (["--both", "chat=gema"], "did you mean 'gemma'"),
        (["--messages", ""], "--messages is empty"),
        (["--messages", '[{"role": "user", "role": "system", "content": "x"}]'], "'role' twice"),
        (["--messages", "  "], "--messages is empty"),
        (["--messages", '"hi"'], "--messages must be a list"),
        (["--messages", "null"], "--messages must be a list"),
        (["--system", ""], "--system is empty"),
        (["--system", " \t"], "--system is empty"),
        (["--messages", '[{"role": "user", "content": ""}]'], "conversation holds no text"),
    ],
)
@pytest.mark.parametrize("command", ["run", "live"])
def test_run_and_live_refuse_a_bad_conversation_in_one_line(
    command: str, args: list[str], fragment: str
) -> None:
    # live refuses before its screen opens: nothing is drawn over the message
    completed = specdiff_here(command, *args, "--max-tokens", "4", stdin="")
    assert completed.returncode == 2, completed.stderr
    lines = [line for line in completed.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("specdiff: error: "), completed.stderr
    assert fragment in lines[0]


def test_run_reads_messages_from_stdin_and_refuses_a_broken_file(tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_bytes(b"\xff[]")
    completed = specdiff("run", "--messages", str(broken), "--max-tokens", "4")
    assert completed.returncode == 2 and "is not UTF-8 text" in completed.stderr
    completed = specdiff("run", "--messages", "-", "--max-tokens", "4", stdin="[]")
    assert completed.returncode == 2 and "--messages on stdin is empty" in completed.stderr


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["--messages", json.dumps(CONVERSATIONS["several turns"])],
            CONVERSATIONS["several turns"],
        ),
        (["--system", SYSTEM["content"], "--prompt", USER["content"]], [SYSTEM, USER]),
        (
            ["--system", SYSTEM["content"], "--messages", json.dumps([USER])],
            [SYSTEM, USER],
        ),
    ],
    ids=["messages", "system and prompt", "system and messages"],
)
async def test_live_opens_with_the_conversation_in_the_prompt_box(
    args: list[str], expected: list[dict[str, str]]
) -> None:
    """`specdiff live --system/--messages`: the box shows the conversation as the JSON
    list it reads back, and a run sends that conversation, edited or not."""
    from textual.widgets import Input

    from specdiff.cli import build_parser
    from specdiff.cli.live import live_app

    app = live_app(build_parser().parse_args(["live", "--no-start", *args]))
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        box = app.query_one("#prompt", Input)
        assert json.loads(box.value) == expected
        _, prompt, _ = drive(app).resolve_pair()
        assert isinstance(prompt, Conversation) and prompt.to_json() == expected
        box.value = json.dumps(expected[-1:])  # edited: the box's own list is sent
        _, prompt, _ = drive(app).resolve_pair()
        assert isinstance(prompt, Conversation) and prompt.to_json() == expected[-1:]


# --- the model -------------------------------------------------------------------------


@pytest.mark.model
def test_the_template_names_are_those_of_the_build() -> None:
    import ctypes

    import llama_cpp.llama_cpp as lib

    count = lib.llama_chat_builtin_templates(None, 0)
    names = (ctypes.c_char_p * count)()
    lib.llama_chat_builtin_templates(names, count)
    assert set(BUILTIN_TEMPLATES) == {name.decode() for name in names}


@pytest.fixture(scope="module")
def tokens_of(model_path: Path) -> Any:
    """llama-cpp-python's own tokenization of a formatted prompt, as a prompt: BOS first,
    special tokens parsed."""
    from llama_cpp import Llama

    vocabulary = Llama(str(model_path), vocab_only=True, verbose=False)
    return lambda text: vocabulary.tokenize(text.encode(), add_bos=True, special=True)


@pytest.mark.model
@pytest.mark.parametrize(
    ("settings", "conversations", "reference"),
    [
        # llama-cpp-python's gemma formatter drops a system message, llama.cpp's merges it
        (("gemma", "gemma"), ("one user message", "several turns without system"), "gemma"),
        # the bundled GGUF holds no template: llama.cpp formats it as chatml
        (("true", "chatml"), ("system and user", "several turns"), "chatml"),
    ],
)
def test_a_chat_lane_records_the_ids_llama_cpp_gives_its_formatted_prompt(
    tokens_of: Any, settings: tuple[str, str], conversations: tuple[str, ...], reference: str
) -> None:
    from llama_cpp.llama_chat_format import format_chatml, format_gemma

    from specdiff.engine.pairrun import PairRun
    from specdiff.reports.text import format_result

    # llama-cpp-python's own Python formatters, written apart from llama.cpp's
    formatter = {"gemma": format_gemma, "chatml": format_chatml}[reference]
    pair = Pair("chat", Lane(chat=settings[0], n_ctx=512), Lane(chat=settings[1], n_ctx=512))
    with PairRun(pair) as runner:
        for name in conversations:
            items = CONVERSATIONS[name]
            result = runner.run(Conversation(parse_messages(items)), 4)
            assert result.a.error is None and result.b.error is None
            for outcome in (result.a, result.b):
                recorded = outcome.executed["chat_prompt"]
                assert recorded["text"] == formatter(messages=items).prompt
                assert recorded["token_ids"] == tokens_of(recorded["text"])
            assert list(result.prompt_tokens) == result.a.executed["chat_prompt"]["token_ids"]
            saved = SessionHeader.from_json(json.loads(json.dumps(result.header().to_json())))
            assert saved.lane_prompts["b"] == result.b.executed["chat_prompt"]
            assert saved.prompt.to_json() == items
            # run's summary gives each lane's prompt where their templates made two
            sizes = [len(o.executed["chat_prompt"]["token_ids"]) for o in (result.a, result.b)]
            expected = (
                f"prompt: {sizes[0]} tokens formatted, the same in both lanes"
                if sizes[0] == sizes[1]
                else f"prompt: lane a {sizes[0]} tokens formatted, lane b {sizes[1]} tokens "
                "formatted (two different prompts)"
            )
            assert expected in format_result(result)


@pytest.mark.model
def test_a_raw_lane_beside_a_chat_lane_decodes_the_plain_text() -> None:
    from specdiff.engine.pairrun import PairRun
    from specdiff.reports.text import format_result

    prompt = Conversation(parse_messages(CONVERSATIONS["system and user"]))
    raw = Lane(n_ctx=512)
    with PairRun(Pair("chat-vs-raw", Lane(chat="gemma", n_ctx=512), raw)) as runner:
        mixed = runner.run(prompt, 8)
    with PairRun(Pair("raw", raw, raw)) as runner:
        plain = runner.run(str(prompt), 8)
    assert mixed.b.error is None and "chat_prompt" not in mixed.b.executed
    formatted = len(mixed.a.executed["chat_prompt"]["token_ids"])
    summary = format_result(mixed)
    assert f"prompt: lane a {formatted} tokens formatted, lane b raw text (two" in summary
    # each lane formats the prompt itself: the raw lane decodes the contents, a line apart
    assert mixed.b.token_ids == plain.b.token_ids


# --- llama-server ----------------------------------------------------------------------


@pytest.mark.model
@pytest.mark.server
@pytest.mark.parametrize(
    ("setting", "flags"),
    [
        # with --jinja llama-server would read the name as the template's own text
        ("gemma", ["--chat-template", "gemma", "--no-jinja"]),
        ("true", []),  # no template in the GGUF: chatml on both sides
    ],
)
def test_llama_server_and_an_in_process_chat_lane_decode_the_same_prompt(
    model_path: Path, setting: str, flags: list[str]
) -> None:
    from specdiff.engine.pairrun import PairRun
    from specdiff.engine.server.process import LlamaServer, find_llama_server

    arguments = ["--threads", "1", "--ctx-size", "512", *flags]
    with LlamaServer(find_llama_server(), model_path, arguments) as server:
        served = Lane(backend="server", endpoint=server.url, api="chat")
        pair = Pair("chat-server", served, Lane(chat=setting, n_ctx=512))
        with PairRun(pair) as runner:
            for name in ("system and user", "several turns"):
                items = CONVERSATIONS[name]
                prompt = Conversation(parse_messages(items))
                result = runner.run(prompt, 4)
                assert result.a.error is None and result.b.error is None
                local = result.b.executed["chat_prompt"]
                assert server_ids(server.url, items) == local["token_ids"]
                # the server lane records the prompt its server formatted, and being
                # lane a, its ids are the session's prompt ids
                served = result.a.executed["chat_prompt"]
                assert served == local and list(result.prompt_tokens) == local["token_ids"]
                saved = SessionHeader.from_json(json.loads(json.dumps(result.header().to_json())))
                assert saved.lane_prompts == {"a": served, "b": local}
                assert saved.executed["a"]["chat_template"] == SERVER_TEMPLATE
                # what the lane itself sends: the server counts as many prompt tokens
                body = {**Chat().body(prompt, 1, 2, False), "stream": False}
                usage = httpx.post(f"{server.url}/v1/chat/completions", json=body).json()
                assert usage["usage"]["prompt_tokens"] == len(local["token_ids"])


def server_ids(url: str, items: list[dict[str, str]]) -> list[int]:
    """The prompt llama-server renders for `items`, as it tokenizes a prompt."""
    text = httpx.post(f"{url}/apply-template", json={"messages": items}).json()["prompt"]
    answer = httpx.post(
        f"{url}/tokenize", json={"content": text, "add_special": True, "parse_special": True}
    )
    return list(answer.json()["tokens"])


# --- the TUI's prompt box --------------------------------------------------------------


@pytest.mark.parametrize(
    ("typed", "fragment"),
    [
        ('[{"role": "bot", "content": "x"}]', "role must be one of"),
        ('[{"role": "system", "content": "x"}]', "no user message"),
    ],
)
async def test_a_raw_prompt_that_looks_like_json_stays_text_until_switched(
    typed: str, fragment: str
) -> None:
    """A prompt's kind is known, never guessed from its text: a raw prompt shaped like a
    messages list opens (and would replay) as text; switched to messages, a broken list
    is refused and a good one taken."""
    from textual.widgets import Input

    from specdiff.errors import SpecdiffError

    app = _box_app(typed)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        assert drive(app).prompt_mode == "text"
        _, prompt, _ = drive(app).resolve_pair()
        assert prompt == typed and not isinstance(prompt, Conversation)
        drive(app).toggle_prompt_mode()
        with pytest.raises(SpecdiffError, match=fragment):
            drive(app).resolve_pair()
        good = CONVERSATIONS["several turns"]
        app.query_one("#prompt", Input).value = json.dumps(good)
        _, prompt, _ = drive(app).resolve_pair()
        assert isinstance(prompt, Conversation) and prompt.to_json() == good


def _box_app(prompt: str) -> Any:
    from specdiff.lanes import presets
    from specdiff.tui.app import make_app

    return make_app(presets(), "ubatch", prompt, 4, autostart=False)


@pytest.mark.parametrize(
    "prompt", ["Name a colour.", "esc \x1b[31m, a newline\nand a tab\t", "c1 \x85 bidi \u202e"]
)
@pytest.mark.parametrize("focus", ["prompt box", "panes"])
async def test_ctrl_o_reads_the_box_as_messages_and_back_keeping_the_prompt(
    prompt: str, focus: str
) -> None:
    """Text becomes a conversation of one user message and back, exactly (control
    characters the box shows as escapes included), from the box itself or the panes;
    the toggle's label and the box's text say which mode is on."""
    from textual.widgets import Button, Input

    app = _box_app(prompt)
    async with app.run_test(size=(120, 30)) as pilot:
        await pilot.pause()
        box, toggle = app.query_one("#prompt", Input), app.query_one("#prompt-mode", Button)
        if focus == "prompt box":
            box.focus()
        else:
            drive(app).panes()
        await pilot.pause()
        assert str(toggle.label) == "text"
        _, sent, _ = drive(app).resolve_pair()
        assert sent == prompt and not isinstance(sent, Conversation)
        await pilot.press("ctrl+o")
        assert str(toggle.label) == "messages" and box.value.isprintable()
        assert json.loads(box.value) == [{"role": "user", "content": prompt}]
        _, sent, _ = drive(app).resolve_pair()
        assert isinstance(sent, Conversation)
        assert sent.messages == (Message("user", prompt),)
        await pilot.press("ctrl+o")
        assert str(toggle.label) == "text"
        _, sent, _ = drive(app).resolve_pair()
        assert sent == prompt and not isinstance(sent, Conversation)


async def test_a_conversation_of_several_messages_stays_as_typed_when_read_as_text() -> None:
    from textual.widgets import Button, Input

    typed = json.dumps(CONVERSATIONS["several turns"])
    app = _box_app(Conversation(parse_messages(CONVERSATIONS["several turns"])))
    async with app.run_test(size=(120, 30)) as pilot:
        await pilot.pause()
        toggle = app.query_one("#prompt-mode", Button)
        assert str(toggle.label) == "messages"
        await pilot.click("#prompt-mode")
        assert str(toggle.label) == "text"
        assert json.loads(app.query_one("#prompt", Input).value) == json.loads(typed)
        _, sent, _ = drive(app).resolve_pair()
        assert not isinstance(sent, Conversation) and json.loads(sent) == json.loads(typed)


@pytest.mark.parametrize("typed", ["Hello", "[{", '[{"role": "user", "content": 1}]'])
async def test_a_box_in_messages_mode_refuses_what_is_no_conversation(typed: str) -> None:
    """The refusal names the problem and the way out (ctrl+o sends the box as text);
    the same text in text mode is sent as it is."""
    from textual.widgets import Input

    from specdiff.errors import SpecdiffError

    app = _box_app(Conversation(parse_messages([USER])))
    async with app.run_test(size=(120, 30)) as pilot:
        await pilot.pause()
        assert drive(app).prompt_mode == "messages"
        app.query_one("#prompt", Input).value = typed
        with pytest.raises(SpecdiffError, match="ctrl\\+o: send as text"):
            drive(app).resolve_pair()
        drive(app).toggle_prompt_mode()
        _, sent, _ = drive(app).resolve_pair()
        assert sent == typed and not isinstance(sent, Conversation)


async def test_a_typed_json_list_is_raw_text_in_text_mode() -> None:
    from textual.widgets import Input

    app = _box_app("Hello")
    async with app.run_test(size=(120, 30)) as pilot:
        await pilot.pause()
        typed = json.dumps([USER])
        app.query_one("#prompt", Input).value = typed
        _, sent, _ = drive(app).resolve_pair()
        assert sent == typed and not isinstance(sent, Conversation)


# --- a chat server's formatted prompt, whatever the server answers ------------------------


@pytest.mark.model
@pytest.mark.server
@pytest.mark.parametrize("mode", ["ok", "no-props", *TEMPLATE_FAULTS])
def test_a_chat_server_lane_keeps_only_a_formatted_prompt_it_can_trust(mode: str) -> None:
    """llama-server's /apply-template and /tokenize answers are kept only when they are
    text and ids of the vocabulary, no longer than a template makes a conversation;
    otherwise (or on a server without /props) the lane says the formatted prompt is
    unknown, in one printable line, and its prompt ids are the raw text's."""
    from specdiff.engine.server.lane import ServerLane  # deferred: it loads llama_cpp
    from tests.servers import fault_server

    serving = fault_server("ok") if mode == "no-props" else llama_server_faults(mode)
    prompt = Conversation(parse_messages(CONVERSATIONS["one user message"]))
    with serving as url:
        lane = ServerLane(Lane(backend="server", api="chat", endpoint=url, timeout=5), "a")
        try:
            ids = lane.tokenize(prompt)
            raw = lane.model.tokenize(str(prompt))
            executed = lane.executed()
        finally:
            lane.close()
    template = executed["chat_template"]
    if mode == "ok":
        assert template == SERVER_TEMPLATE and ids == PROMPT_IDS
        assert executed["chat_prompt"] == {"text": FORMATTED, "token_ids": PROMPT_IDS}
        return
    assert "chat_prompt" not in executed and ids == raw
    assert template.startswith("the server's own, not known here (") and template.isprintable()
    assert "prompt ids are the raw text's" in template and len(template) < 600


@pytest.mark.parametrize("bom", ["", "\ufeff"], ids=["plain", "byte-order mark"])
def test_messages_saved_with_or_without_a_byte_order_mark_read_alike(bom: str) -> None:
    """Notepad and other Windows editors start UTF-8 files with a byte-order mark: the
    conversation is the same either way."""
    text = bom + json.dumps(CONVERSATIONS["several turns"])
    conversation = read_messages(text, "--messages")
    read = [message.to_json() for message in conversation.messages]
    assert read == CONVERSATIONS["several turns"]


@pytest.mark.parametrize(
    "prompt", ["Write a poem.\nTitle: Sea\n", "tab\there", "esc \x1b[31m red", "nul \x00 del \x7f"]
)
async def test_an_edited_prompt_box_keeps_the_newlines_and_controls_it_showed(
    prompt: str,
) -> None:
    """The box shows a newline as ␤ and a control character as its picture; typing in it
    sends those characters again, not the pictures (nor an escape's backslash)."""
    from textual.widgets import Input

    app = _box_app(prompt)
    async with app.run_test(size=(120, 30)) as pilot:
        await pilot.pause()
        box = app.query_one("#prompt", Input)
        assert box.value.isprintable()
        box.value += " ok"
        _, sent, _ = drive(app).resolve_pair()
        assert sent == prompt + " ok"
        box.value = "a literal \\n and \\x1b stay as typed"
        _, sent, _ = drive(app).resolve_pair()
        assert sent == "a literal \\n and \\x1b stay as typed"
