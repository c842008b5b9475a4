"""A real terminal: replaying a shared session whose prompt and tokens hold OSC 52
(write the clipboard) and OSC 0/2 (set the window title) sequences, under tmux with
both honoured, leaves tmux's paste buffers empty and the pane's title as it was, and
no such sequence is ever written to the terminal.

A second case writes the same bytes raw to the same terminal and expects the harm:
it shows the harness would see the attack if specdiff let it through.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = [
    pytest.mark.tui,
    pytest.mark.skipif(
        shutil.which("tmux") is None,
        reason="tmux is not installed (apt-get install tmux; .ci/run does): "
        "the real-terminal check needs it",
    ),
]

SESSION = Path(__file__).parent / "data" / "ubatch-roman-empire.jsonl"
CLIPBOARD = "\x1b]52;c;aGk=\x07"
"""OSC 52: put "hi" on the clipboard (tmux stores it as a paste buffer)."""
TITLES = ("\x1b]0;PWNED\x07", "\x1b]2;PWNED\x1b\\")
"""OSC 0 and OSC 2 (the second ended by ST): set the title."""
KNOWN_TITLE = "specdiff-test-title"


class Tmux:
    """A tmux server of its own (its own socket, no user config) with one 80x24 pane."""

    def __init__(self, directory: Path) -> None:
        self.socket = f"specdiff-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.directory = directory

    def __call__(self, *args: str) -> str:
        done = subprocess.run(
            ["tmux", "-L", self.socket, "-f", os.devnull, *args],
            capture_output=True,
            text=True,
            timeout=20,
        )
        return done.stdout

    def start(self, command: str) -> None:
        """The pane waits for a line on its input before `command`, so the options and
        the known title are set before anything runs in it."""
        script = self.directory / "pane.sh"
        script.write_text(f"read go\nexec {command}\n", encoding="utf-8")
        self("new-session", "-d", "-x", "80", "-y", "24", "-s", "t", "-c", str(ROOT),
             f"sh {shlex.quote(str(script))}")  # fmt: skip
        for option, value in (
            ("set-clipboard", "on"),
            ("set-titles", "on"),
            ("allow-rename", "on"),
            ("remain-on-exit", "on"),
        ):
            self("set-option", "-g", option, value)
        self("select-pane", "-t", "t", "-T", KNOWN_TITLE)
        self("pipe-pane", "-t", "t", "-o", f"cat >> {shlex.quote(str(self.raw_path))}")
        assert self.title() == KNOWN_TITLE
        self("send-keys", "-t", "t", "go", "Enter")

    @property
    def raw_path(self) -> Path:
        return self.directory / "terminal.raw"

    def title(self) -> str:
        return self("display-message", "-p", "-t", "t", "#{pane_title}").strip()

    def buffers(self) -> str:
        return self("list-buffers").strip()

    def screen(self) -> str:
        return self("capture-pane", "-p", "-t", "t")

    def dead(self) -> bool:
        return self("display-message", "-p", "-t", "t", "#{pane_dead}").strip() == "1"

    def wait(self, condition: Callable[[], bool], what: str, seconds: float = 60) -> None:
        deadline = time.monotonic() + seconds
        while not condition():
            assert time.monotonic() < deadline, f"timed out waiting for {what}: {self.screen()}"
            time.sleep(0.2)

    def stop(self) -> None:
        self("kill-server")


@pytest.fixture
def tmux(tmp_path: Path) -> Iterator[Tmux]:
    terminal = Tmux(tmp_path)
    try:
        yield terminal
    finally:
        terminal.stop()


def hostile_session(path: Path) -> Path:
    """The recorded session with the sequences in its prompt, pair name and every token."""
    attack = CLIPBOARD + "".join(TITLES)
    records = [json.loads(line) for line in SESSION.read_text(encoding="utf-8").splitlines()]
    records[0].update(prompt=f"The history {attack}", pair=f"ubatch{attack}")
    for record in records[1:]:
        if record["type"] == "step":
            record["piece"] = record["piece"] + attack
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def test_a_replayed_session_cannot_write_the_clipboard_or_the_title(tmux, tmp_path) -> None:
    session = hostile_session(tmp_path / "shared.jsonl")
    command = f"{shlex.quote(sys.executable)} -m specdiff replay {shlex.quote(str(session))}"
    tmux.start(command + " --instant")
    # the escapes are on screen as text once the replay has drawn its tokens
    tmux.wait(lambda: "\\x1b]52;c;" in tmux.screen(), "the replay to draw")
    tmux("send-keys", "-t", "t", "q")
    tmux.wait(tmux.dead, "the replay to quit")
    assert tmux.buffers() == "", "OSC 52 reached the terminal: the clipboard was written"
    assert tmux.title() == KNOWN_TITLE, "OSC 0/2 reached the terminal: the title changed"
    raw = tmux.raw_path.read_bytes()
    assert raw, "pipe-pane recorded the terminal's output"
    for sequence in (b"\x1b]52;", b"\x1b]0;", b"\x1b]2;", b"\xc2\x9b"):
        assert sequence not in raw, sequence


def test_the_same_bytes_written_raw_do_the_harm(tmux, tmp_path) -> None:
    """The harness sees the attack: without specdiff in between, both land."""
    raw = tmp_path / "raw.txt"
    raw.write_text(CLIPBOARD + TITLES[0] + "done\n", encoding="utf-8")
    tmux.start(f"cat {shlex.quote(str(raw))}")
    tmux.wait(tmux.dead, "cat to finish")
    tmux.wait(lambda: tmux.buffers() != "", "the clipboard write", seconds=5)
    assert tmux.title() == "PWNED"


DEMO_SESSIONS = sorted((ROOT / "sessions").glob("*.jsonl"))


@pytest.mark.parametrize("path", DEMO_SESSIONS, ids=lambda p: p.name.split("-", 1)[1])
def test_at_80x24_the_fork_help_and_quit_are_on_screen(tmux, path) -> None:
    """A demo session replayed with --instant in a real 80x24 terminal: the fork named
    on screen with both panes showing it, `?` and `q` in the footer, and help scrolled
    to its last row."""
    from specdiff.compare import compare
    from specdiff.glossary import GLOSSARY
    from specdiff.sessions.store import load_session
    from specdiff.tui.help import END_ROW

    session = load_session(path)
    fork = compare(session.steps["a"], session.steps["b"]).fork
    assert fork is not None
    command = f"{shlex.quote(sys.executable)} -m specdiff replay {shlex.quote(str(path))}"
    tmux.start(command + " --instant")
    named = f"fork at token {fork.index}"
    # drawn in full: the fork named and the footer, the last thing on screen, drawn
    tmux.wait(lambda: named in tmux.screen().lower() and "palette" in tmux.screen(), "the fork")
    lines = [line for line in tmux.screen().splitlines() if line.strip()]
    assert "? help" in lines[-1] and "q quit" in lines[-1], lines[-1]
    # both panes show the fork's pick (the pane rows are the lines framed twice)
    panes = [line for line in lines if line.count("│") == 4]
    for piece, column in ((fork.piece_a, slice(0, 40)), (fork.piece_b, slice(40, 80))):
        word = piece.decode("utf-8", "replace").strip()
        assert any(word in line[column] for line in panes), word
    tmux("send-keys", "-t", "t", "?")
    tmux.wait(lambda: "specdiff keys" in tmux.screen(), "help to open")
    # help opens on how to close and scroll it (a note of another CPU may cover that
    # row for a while); its last glossary entry is further down
    last_entry = " ".join(GLOSSARY[-1].definition.split()[:3])
    assert last_entry not in tmux.screen()  # 80x24 is too short for all of help at once
    tmux("send-keys", "-t", "t", "End")
    tmux.wait(
        lambda: last_entry in tmux.screen() and END_ROW in tmux.screen(), "help's last rows"
    )
    tmux("send-keys", "-t", "t", "Escape")
    tmux.wait(lambda: END_ROW not in tmux.screen(), "help to close")
    tmux("send-keys", "-t", "t", "q")
    tmux.wait(tmux.dead, "the replay to quit")
