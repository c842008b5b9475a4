"""The documentation's commands work as a reader runs them: in order, after saving
sessions of their own, and a second time.

The fast checks read every ```sh block of README.md and docs/: each `specdiff` command
parses, none relies on a shell pattern (one that matched the demo matches the reader's
saved runs too), every session it names is there when the reader gets to it, and no two
commands write the same report unless each replaces it. The slow one runs the
walk-through itself, from a fresh clone, with its own words, step 5 twice.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import pytest

from specdiff.cli import build_parser
from specdiff.cli.session_arg import session_path
from specdiff.cli.suite_merge import merge_arguments
from specdiff.errors import SpecdiffError
from specdiff.sessions.store import session_name
from tests.conftest import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
TUTORIAL = ROOT / "docs" / "tutorial.md"
SH_BLOCK = re.compile(r"^```sh\n(.*?)^```", re.MULTILINE | re.DOTALL)
PATTERN = re.compile(r"[*?\[]")
SESSION_COMMANDS = frozenset({"replay", "verify", "export"})
PLACEHOLDERS = frozenset({"SESSION"})
"""Words the pages define as "put yours here"; not run, not resolved."""


@dataclass(frozen=True)
class Command:
    page: Path
    block: int
    line: str

    @property
    def words(self) -> list[str]:
        return shlex.split(self.line, comments=True)

    @property
    def name(self) -> str:
        """The command: `live` for the bare one, as main() reads it."""
        words = self.words
        return "live" if len(words) < 2 or words[1].startswith("--") else words[1]

    def __str__(self) -> str:
        return f"{self.page.relative_to(ROOT)}: {self.line}"


def sh_blocks(page: Path) -> list[list[str]]:
    """Each ```sh block of `page` as its command lines, continuations joined."""
    blocks = []
    for match in SH_BLOCK.finditer(page.read_text(encoding="utf-8")):
        joined = match.group(1).replace("\\\n", " ")
        blocks.append([line for line in joined.splitlines() if line.strip()])
    return blocks


def commands(page: Path) -> list[Command]:
    """The `specdiff` commands of a page, in reading order."""
    return [
        Command(page, number, line)
        for number, block in enumerate(sh_blocks(page))
        for line in block
        if line.split(maxsplit=1)[0] == "specdiff"
    ]


def parsed(command: Command) -> argparse.Namespace:
    arguments = command.words[1:]
    if not arguments or arguments[0].startswith("--"):
        arguments = ["live", *arguments]  # as main() does: the bare command is the TUI
    # as main() does: `suite merge` is the merge command, not a suite of prompts "merge"
    return build_parser().parse_args(merge_arguments(arguments))


ALL = [command for page in PAGES for command in commands(page)]


def test_the_pages_hold_commands_to_check() -> None:
    assert len(ALL) > 50
    assert {"replay", "verify", "export", "sessions"} <= {c.name for c in ALL}


@pytest.mark.parametrize("command", ALL, ids=str)
def test_every_command_parses(command: Command) -> None:
    parsed(command)


def test_no_command_relies_on_a_shell_pattern() -> None:
    """`sessions/*spec-vs-plain*.jsonl` is the demo until the reader saves a run of that
    pair; then it is two files, and a command that takes one refuses."""
    patterns = [str(c) for c in ALL if any(map(is_pattern, raw_words(c.line)))]
    assert patterns == []


def raw_words(line: str) -> list[str]:
    """The words of a command line with their quotes on: the shell expands only the
    unquoted ones."""
    lexer = shlex.shlex(line, posix=False)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    return list(lexer)


def is_pattern(word: str) -> bool:
    return word[0] not in "'\"" and PATTERN.search(word) is not None


def saved_run(folder: Path, pair: str, when: datetime) -> Path:
    """A file as `specdiff run --save` names it: the demo of `pair` saved at `when`."""
    demo = next((ROOT / "sessions").glob(f"*-{pair}-*.jsonl"))
    lines = demo.read_text(encoding="utf-8").splitlines(keepends=True)
    header = json.loads(lines[0])
    header["created"] = when.isoformat(timespec="seconds")
    path = folder / f"{session_name(pair, header['prompt'], when)}.jsonl"
    path.write_text(json.dumps(header) + "\n" + "".join(lines[1:]), encoding="utf-8")
    return path


@pytest.fixture
def checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder like a clone: the demo sessions in ./sessions, no config file."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.chdir(tmp_path)
    shutil.copytree(ROOT / "sessions", tmp_path / "sessions")
    return tmp_path


def session_references(page: Path) -> Iterator[tuple[Command, str | None]]:
    """Each command of `page` in order, with the session it names (None for one that
    names none, or a placeholder)."""
    for command in commands(page):
        args = parsed(command)
        named = getattr(args, "session", None) if command.name in SESSION_COMMANDS else None
        if command.name == "export" and args.format == "llm-comparator":
            named = None  # it names a suite folder, which a suite command of the page wrote
        yield command, None if named in PLACEHOLDERS else named


def test_the_tutorial_names_its_sessions_in_order_and_twice(checkout: Path) -> None:
    """Each session the walk-through names exists when the reader gets to it: a save
    (simulated) makes the next number, and a second pass over step 5 finds them again."""
    saves = 0
    for round_ in range(2):
        for command, named in session_references(TUTORIAL):
            if "--save" in command.words:
                saves += 1
                when = datetime.now(timezone.utc).replace(second=saves % 60)
                saved_run(checkout / "sessions", parsed(command).pair or "spec-vs-plain", when)
            if named is not None:
                path = session_path(argparse.Namespace(session=named, more_sessions=[]))
                assert path.is_file(), (round_, str(command))
    assert saves == 2


@pytest.mark.parametrize("saved", [0, 2], ids=["fresh clone", "after two saves"])
def test_every_page_names_sessions_that_are_there(checkout: Path, saved: int) -> None:
    """A demo named by its file or its number is still that demo after the reader has
    saved runs of every pair (the list is oldest first)."""
    now = datetime.now(timezone.utc)
    for number in range(saved):
        for pair in ("spec-vs-plain", "cache-vs-fresh", "ubatch"):
            saved_run(checkout / "sessions", pair, now.replace(second=number))
    demos = {path.name for path in (ROOT / "sessions").glob("*.jsonl")}
    for page in PAGES:
        if page == TUTORIAL:
            continue  # its session 4 is the reader's own save: the test above
        for command, named in session_references(page):
            if named is None:
                continue
            try:
                path = session_path(argparse.Namespace(session=named, more_sessions=[]))
            except SpecdiffError as error:
                pytest.fail(f"{command}: {error}")
            assert path.name in demos, str(command)


def written_by(command: Command) -> Path | None:
    """The report folder or file a command writes, where it names one."""
    args = parsed(command)
    if command.name == "suite" and not getattr(args, "resume", False):  # merge: no resume
        return Path(args.report)
    if command.name == "export" and args.output not in (None, "-"):
        return Path(args.output)
    return None


def test_no_two_commands_write_the_same_report_unless_each_replaces_it() -> None:
    """Run in order, a second command writing the same folder or file would refuse."""
    writers: dict[Path, set[str]] = {}
    for command in ALL:
        target = written_by(command)
        if target is not None:
            writers.setdefault(target, set()).add(command.line.split("#")[0].strip())
    shared = {
        str(target): sorted(lines)
        for target, lines in writers.items()
        if len(lines) > 1 and not all("--force" in line.split() for line in lines)
    }
    assert shared == {}


def test_the_tutorial_can_be_run_twice() -> None:
    """What the walk-through writes, it replaces when the reader runs it again."""
    once = [str(c) for c in commands(TUTORIAL) if written_by(c) and not parsed(c).force]
    assert once == []


# --- the walk-through itself ---------------------------------------------------------

DRAW_TIMEOUT_S = 240
"""How long an interactive step may take to draw, or to quit, before the test gives up."""


def tutorial_steps() -> list[list[str]]:
    """The walk-through's ```sh blocks, in order, as the lines a reader types."""
    return sh_blocks(TUTORIAL)


def is_interactive(line: str) -> bool:
    words = shlex.split(line, comments=True)
    return words[1:2] == ["replay"] or words[1:] == [] or words[1].startswith("--")


class Terminal:
    """A tmux server of its own (its own socket, no user config) with one 100x30 pane
    running one command in `directory`; its exit status is written to `scratch`."""

    def __init__(self, directory: Path, scratch: Path, environment: dict[str, str]) -> None:
        self.socket = f"specdiff-docs-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.directory = directory
        self.scratch = scratch
        self.environment = environment

    def tmux(self, *args: str) -> str:
        done = subprocess.run(
            ["tmux", "-L", self.socket, "-f", os.devnull, *args],
            capture_output=True,
            text=True,
            timeout=20,
            env=self.environment,
        )
        return done.stdout

    def run_until_quit(self, line: str, drawn: str) -> int:
        """Run `line` in a shell in the pane, wait for `drawn` on screen, press q, and
        return the shell's exit status."""
        status = self.scratch / f"status-{uuid.uuid4().hex[:8]}"
        script = f"{line}\necho $? > {shlex.quote(str(status))}\n"
        self.tmux("new-session", "-d", "-x", "100", "-y", "30", "-s", "t",
                  "-c", str(self.directory), f"sh -c {shlex.quote(script)}")  # fmt: skip
        try:
            self.wait(lambda: drawn in self.screen().lower(), f"{line!r} to draw {drawn!r}")
            self.tmux("send-keys", "-t", "t", "q")
            self.wait(status.exists, f"{line!r} to quit on q")
            return int(status.read_text(encoding="utf-8"))
        finally:
            self.tmux("kill-server")

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "t")

    def wait(self, condition: Callable[[], object], what: str) -> None:
        deadline = time.monotonic() + DRAW_TIMEOUT_S
        while not condition():
            assert time.monotonic() < deadline, f"timed out waiting for {what}: {self.screen()}"
            time.sleep(0.3)


def run_line(line: str, clone: Path, scratch: Path, environment: dict[str, str]) -> int:
    """One line of the walk-through, in a shell, as the reader types it."""
    if is_interactive(line):
        return Terminal(clone, scratch, environment).run_until_quit(line, "fork at token")
    done = subprocess.run(
        ["sh", "-c", line], cwd=clone, env=environment, capture_output=True, text=True,
        timeout=1800,
    )  # fmt: skip
    assert done.returncode in (0, 1), f"{line}\n{done.stdout}\n{done.stderr}"
    return done.returncode


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    """A fresh clone of the commit checked out here, as a reader starts from (what is not
    committed is not in it)."""
    target = tmp_path / "specdiff"
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    subprocess.run(["git", "clone", "--quiet", "--no-checkout", str(ROOT), str(target)], check=True)
    subprocess.run(["git", "-C", str(target), "checkout", "--quiet", head], check=True)
    return target


@pytest.mark.model
@pytest.mark.tui
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_the_walk_through_runs_in_order_from_a_fresh_clone(clone: Path, tmp_path: Path) -> None:
    """Every command of docs/tutorial.md, in order, in the clone, by a shell, with the
    tutorial's own words; the TUI replay under tmux, quit with q; step 5 twice."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # `specdiff` as the reader has it after `pip install -e .` in the clone
    (bin_dir / "specdiff").write_text(
        f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m specdiff "$@"\n', encoding="utf-8"
    )
    (bin_dir / "specdiff").chmod(0o755)
    environment = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(clone),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
    }
    steps = tutorial_steps()
    save_step = next(i for i, block in enumerate(steps) if any("--save" in b for b in block))
    codes: dict[str, list[int]] = {}
    for index, block in enumerate(steps):
        for _ in range(2 if index == save_step else 1):
            for line in block:
                codes.setdefault(line, []).append(run_line(line, clone, tmp_path, environment))
    saved = [p.name for p in (clone / "sessions").glob("*.jsonl")]
    assert len(saved) == 5, saved  # the three demos and step 5's two saves
    verify = next(line for line in steps[save_step] if " verify " in line)
    assert codes[verify] == [0, 0], "a session verified on the machine that recorded it"
    assert (clone / "fork.html").is_file()
