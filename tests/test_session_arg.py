"""The SESSION of `replay`, `verify` and `export`: a file, or its number or file name in
`specdiff sessions`, with one line naming the fix when it names none or several."""

from __future__ import annotations

import json
import shutil
from datetime import datetime, timezone
from pathlib import Path

import pytest

from specdiff.cli import main
from specdiff.sessions.store import session_name
from tests.conftest import ROOT

DEMOS = sorted((ROOT / "sessions").glob("*.jsonl"))
SPEC_DEMO = next(path for path in DEMOS if "-spec-vs-plain-" in path.name)


def saved_run(folder: Path) -> Path:
    """What `specdiff run --save` writes on the default pair and prompt today: the demo's
    lines under today's name and date, so it sorts after the demos."""
    lines = SPEC_DEMO.read_text(encoding="utf-8").splitlines(keepends=True)
    header = json.loads(lines[0])
    path = folder / f"{session_name(header['pair'], header['prompt'])}.jsonl"
    header["created"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    path.write_text(json.dumps(header) + "\n" + "".join(lines[1:]), encoding="utf-8")
    return path


@pytest.fixture
def checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder like the repository's: the demos in ./sessions and one run saved beside
    them; no config file names another sessions folder."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sessions").mkdir()
    for demo in DEMOS:
        shutil.copy(demo, tmp_path / "sessions" / demo.name)
    saved_run(tmp_path / "sessions")
    return tmp_path


def exported_file(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["export", *args, "--format", "json"]) == 0
    return str(json.loads(capsys.readouterr().out)["source"]["file"])


def one_line_error(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(list(args)) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    return lines[0]


def test_the_demos_are_1_to_3_and_a_saved_run_is_4(checkout: Path, capsys) -> None:
    """The tutorial's `specdiff verify 4` after `run --save` in a fresh clone."""
    names = [demo.name for demo in DEMOS]
    saved = next(path.name for path in (checkout / "sessions").iterdir() if path.name not in names)
    assert [exported_file(capsys, str(n)) for n in (1, 2, 3, 4)] == [*names, saved]


def test_a_file_name_in_the_list_names_its_session(checkout: Path, capsys) -> None:
    assert exported_file(capsys, DEMOS[2].name) == DEMOS[2].name


def test_an_existing_path_is_opened_as_given(checkout: Path, capsys) -> None:
    """A file named like a number is that file, not the list's session of that number."""
    shutil.copy(DEMOS[2], checkout / "1")
    assert exported_file(capsys, "1") == "1"
    assert exported_file(capsys, f"sessions/{DEMOS[0].name}") == DEMOS[0].name


def test_serve_replay_takes_a_number_too(checkout: Path, capsys) -> None:
    """Its visitors' apps run `specdiff replay` with the same words, in the same folder."""
    line = one_line_error(capsys, "serve", "replay", "5")
    assert "no session number 5" in line and "4 saved" in line


@pytest.mark.parametrize("command", ["replay", "verify", "export", "serve replay"])
def test_a_pattern_that_matched_several_files_is_one_line(checkout: Path, capsys, command) -> None:
    """The shell expands the pattern into the demo and the saved run: the command names
    both and the fix, before any model, screen or server."""
    matched = sorted(str(path) for path in Path("sessions").glob("*spec-vs-plain*.jsonl"))
    assert len(matched) == 2
    line = one_line_error(capsys, *command.split(), *matched)
    assert "2 sessions given" in line and "`specdiff sessions`" in line
    assert all(path in line for path in matched)


def test_many_files_are_counted_not_listed(checkout: Path, capsys) -> None:
    matched = sorted(str(path) for path in Path("sessions").iterdir())
    line = one_line_error(capsys, "verify", *matched)
    assert f"{len(matched)} sessions given" in line and "and 2 more" in line


@pytest.mark.parametrize("command", ["replay", "verify", "export"])
def test_a_pattern_that_matched_nothing_is_one_line(checkout: Path, capsys, command) -> None:
    line = one_line_error(capsys, command, "sessions/*no-such-pair*.jsonl")
    assert "no file matches sessions/*no-such-pair*.jsonl" in line
    assert "`specdiff sessions`" in line


def test_a_number_past_the_list_says_how_many_there_are(checkout: Path, capsys) -> None:
    line = one_line_error(capsys, "export", "5")
    assert "no session number 5" in line and "4 saved" in line


@pytest.mark.parametrize("reference", ["nope.jsonl", "elsewhere/nope.jsonl", "../nope.jsonl"])
def test_a_name_that_is_neither_file_nor_listed_is_one_line(
    checkout: Path, capsys, reference: str
) -> None:
    line = one_line_error(capsys, "replay", reference)
    assert f"session file not found: {reference}, here or in" in line
    assert "`specdiff sessions` lists" in line


def test_sessions_dir_picks_the_list_a_number_refers_to(checkout: Path, capsys) -> None:
    """As `specdiff sessions --sessions-dir DIR` numbers them."""
    other = checkout / "elsewhere"
    other.mkdir()
    shutil.copy(DEMOS[2], other / DEMOS[2].name)
    assert exported_file(capsys, "1", "--sessions-dir", str(other)) == DEMOS[2].name
    line = one_line_error(capsys, "verify", "2", "--sessions-dir", str(other))
    assert "no session number 2" in line and "1 saved" in line
