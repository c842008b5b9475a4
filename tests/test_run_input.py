"""Two sources of the prompt (--messages and --prompt / --prompt-file) are refused
before either is read: stdin is left unread, so a command whose stdin never ends (a
terminal, an open pipe) answers at once instead of waiting for it. Every pairing is
checked through `main()` with a stdin whose read fails the test; one real `specdiff`
process checks the same with a pipe left open."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.in_process import specdiff_here

MESSAGES = '[{"role": "user", "content": "Hi"}]'
REFUSAL = "specdiff: error: give the prompt once: --messages, or --prompt / --prompt-file"


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
    completed = specdiff_here(command, *sources, "--max-tokens", "4")
    assert completed.returncode == 2, completed.stdout + completed.stderr
    assert completed.stderr.strip() == REFUSAL


def test_a_process_refuses_two_sources_with_its_stdin_left_open() -> None:
    with subprocess.Popen(
        [sys.executable, "-m", "specdiff", "run", "--messages", "-", "--prompt-file", "-"],
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
    assert err.strip() == REFUSAL
