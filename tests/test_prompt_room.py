"""Context room is checked per lane, with the prompt as that lane formats it: a chat
lane's template adds tokens a raw lane does not have, so a chat lane whose formatted
prompt overflows its n_ctx is refused before either lane decodes, by name, and leaves
no session file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from specdiff.engine.pairrun import PairRun
from specdiff.lanes import Lane, Pair

PROMPT = "The history of the Roman Empire"
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def lengths() -> tuple[int, int]:
    """The prompt's length raw and as the gemma template formats it."""
    with PairRun(Pair("raw-vs-chat", Lane(n_ctx=512), Lane(chat="gemma", n_ctx=512))) as run:
        raw = run.tokenize(PROMPT)
        formatted = run.lane_tokens["b"]
    assert len(formatted) > len(raw) + 1, "the template adds tokens"
    return len(raw), len(formatted)


@pytest.mark.model
@pytest.mark.parametrize("chat_lane", ["a", "b"])
@pytest.mark.parametrize("room", ["raw-fits-exactly", "chat-one-short"])
def test_a_chat_lane_that_overflows_its_n_ctx_is_refused_by_name(
    lengths: tuple[int, int], chat_lane: str, room: str, tmp_path: Path
) -> None:
    """n_ctx is chosen so that the raw prompt and its budget fit, while the formatted
    one and its budget do not, from either end of that range: only the chat lane's own
    ids show it."""
    raw, formatted = lengths
    n_ctx = raw + MAX_TOKENS if room == "raw-fits-exactly" else formatted + MAX_TOKENS - 1
    assert raw + MAX_TOKENS <= n_ctx < formatted + MAX_TOKENS
    raw_lane = "b" if chat_lane == "a" else "a"
    command = [sys.executable, "-m", "specdiff", "run", "--prompt", PROMPT, "--quiet"]
    command += ["--max-tokens", str(MAX_TOKENS), "--save", "--sessions-dir", str(tmp_path)]
    command += [f"--lane-{chat_lane}", "chat=gemma", "--both", f"n_ctx={n_ctx}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stdout + done.stderr
    # a note that the lanes format the prompt differently may come first
    errors = [line for line in done.stderr.splitlines() if not line.startswith("specdiff: note")]
    assert len(errors) == 1 and "Traceback" not in done.stderr
    assert f"lane {chat_lane}'s n_ctx ({n_ctx})" in errors[0]
    assert f"lane {raw_lane}" not in errors[0] and f"({formatted} tokens)" in errors[0]
    assert list(tmp_path.rglob("*.jsonl")) == []


@pytest.mark.model
@pytest.mark.parametrize("setting", ["no-such-template", "{{ messages }}", "chatml2"])
def test_a_template_llama_cpp_does_not_know_is_refused_in_one_plain_line(setting: str) -> None:
    """The lane keys only let built-in names through; a template text llama.cpp's
    formatter cannot read is refused naming what was asked for, read as a sentence."""
    from specdiff.engine.llama.templates import ChatTemplate
    from specdiff.errors import LaneConfigError

    with PairRun(Pair("raw", Lane(n_ctx=512), Lane(n_ctx=512))) as run:
        pointer = run.lanes["b"].model.pointer
        with pytest.raises(LaneConfigError) as refused:
            ChatTemplate(pointer, setting, "b")
    message = str(refused.value)
    assert message == (
        f"lane b: llama.cpp's chat formatter does not recognise the template chat={setting} "
        "names; name a built-in one instead, e.g. chat=chatml"
    )
