"""Two sources of the prompt (--messages and --prompt / --prompt-file) are refused
before either is read, in real `specdiff` processes: stdin is left unread, so a
command whose stdin never ends (a terminal, an open pipe) answers at once instead of
waiting for it."""

from __future__ import annotations

import subprocess
import sys

import pytest

MESSAGES = '[{"role": "user", "content": "Hi"}]'


@pytest.mark.parametrize("command", ["run", "live"])
@pytest.mark.parametrize(
    "sources",
    [
        ["--prompt-file", "-", "--messages", MESSAGES],
        ["--messages", "-", "--prompt-file", "-"],
        ["--messages", "-", "--prompt", "Hi"],
        ["--prompt-file", "-", "--messages", "absent.json"],
    ],
    ids=["file-stdin", "both-stdin", "messages-stdin", "messages-file"],
)
def test_two_prompt_sources_are_refused_before_stdin_is_read(
    command: str, sources: list[str]
) -> None:
    with subprocess.Popen(
        [sys.executable, "-m", "specdiff", command, *sources, "--max-tokens", "4"],
        stdin=subprocess.PIPE,  # left open: reading it would wait forever
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as process:
        try:
            # not communicate(): it would close stdin, and a read would see its end
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            pytest.fail("specdiff read stdin before refusing two prompt sources")
        out, err = process.stdout.read(), process.stderr.read()
    assert process.returncode == 2, out + err
    assert err.strip() == (
        "specdiff: error: give the prompt once: --messages, or --prompt / --prompt-file"
    )
