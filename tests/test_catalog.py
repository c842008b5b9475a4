"""`specdiff sessions`: listing a folder of sessions and opening one from it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from specdiff.cli import main
from specdiff.sessions.catalog import list_sessions, resolve_in
from specdiff.sessions.records import RunSummary
from specdiff.sessions.store import SessionError, load_session

DEMOS = sorted((Path(__file__).resolve().parent.parent / "sessions").glob("*.jsonl"))


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    directory = tmp_path / "saved"
    directory.mkdir()
    for demo in DEMOS:
        shutil.copy(demo, directory / demo.name)
    return directory


def partial_copy(source: Path, target: Path, steps: int) -> None:
    lines = source.read_text(encoding="utf-8").splitlines(keepends=True)
    target.write_text("".join(lines[: 1 + steps]), encoding="utf-8")


def test_the_list_shows_date_pair_prompt_fork_and_tokens(folder: Path, capsys) -> None:
    assert main(["sessions", "--sessions-dir", str(folder)]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = [line for line in out if line[:3].strip().isdigit()]
    assert len(rows) == len(DEMOS) == 3
    for demo in DEMOS:
        session = load_session(demo)
        fork = session.comparison().fork
        row = next(line for line in rows if f" {session.pair.name} " in line)
        assert f"token {fork.index}" in row
        assert f"{len(session.steps['a'])}/{len(session.steps['b'])}" in row
        assert session.header.created[:10] in row
        assert "The history of the Roman" in row


def test_partial_and_unreadable_files_are_listed_as_such(folder: Path, capsys) -> None:
    partial_copy(DEMOS[0], folder / "killed.jsonl.partial", steps=9)
    (folder / "broken.jsonl").write_bytes(b"\xff\xfe not a session\n")
    (folder / "notes.txt").write_text("not listed", encoding="utf-8")
    assert main(["sessions", "--sessions-dir", str(folder)]) == 0
    out = capsys.readouterr().out
    killed = next(line for line in out.splitlines() if "  partial  " in line)
    assert "5/4" in killed  # lanes interleave a, b, a, ...: nine steps are 5 of a, 4 of b
    assert "broken.jsonl: unreadable" in out
    assert "notes.txt" not in out
    assert len([i for i in list_sessions(folder) if i.problem is None]) == 4


def test_json_listing(folder: Path, capsys) -> None:
    assert main(["sessions", "--sessions-dir", str(folder), "--json"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {Path(r["path"]).name for r in records} == {demo.name for demo in DEMOS}
    assert all(r["fork_index"] is not None and not r["partial"] for r in records)
    assert main(["sessions", "--sessions-dir", str(folder), "list", "--json"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 3


def test_an_empty_or_missing_folder_says_how_to_save(tmp_path: Path, capsys) -> None:
    for directory in (tmp_path, tmp_path / "missing"):
        assert main(["sessions", "--sessions-dir", str(directory)]) == 0
        assert "no sessions in" in capsys.readouterr().out
        assert not (tmp_path / "missing").exists()


def test_the_config_file_names_the_folder(folder: Path, tmp_path: Path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    config = tmp_path / "config" / "specdiff" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(f"sessions_dir = {json.dumps(str(folder))}\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert main(["sessions"]) == 0
    assert f"sessions in {folder}" in capsys.readouterr().out


def test_open_resolves_a_number_or_a_name_in_the_folder(folder: Path) -> None:
    infos = list_sessions(folder)
    assert resolve_in(folder, "2", infos) == infos[1].path
    name = DEMOS[0].name
    assert resolve_in(folder, name, infos) == (folder / name).resolve()


@pytest.mark.parametrize(
    "reference, message",
    [
        ("0", "no session number 0"),
        ("4", "no session number 4"),
        ("nothing.jsonl", "no session 'nothing.jsonl'"),
        ("../outside.jsonl", "is outside the sessions folder"),
        ("/etc/passwd", "is outside the sessions folder"),
        ("link.jsonl", "is outside the sessions folder"),
    ],
)
def test_open_refuses_what_is_not_a_session_of_the_folder(
    folder: Path, capsys, reference: str, message: str
) -> None:
    outside = folder.parent / "outside.jsonl"
    shutil.copy(DEMOS[0], outside)
    (folder / "link.jsonl").symlink_to(outside)
    with pytest.raises(SessionError, match=message):
        resolve_in(folder, reference, list_sessions(folder))
    assert main(["sessions", "--sessions-dir", str(folder), "open", reference]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_open_checks_the_pace_before_opening(folder: Path, capsys) -> None:
    assert main(["sessions", "--sessions-dir", str(folder), "open", "1", "--speed", "-2"]) == 2
    err = capsys.readouterr().err
    assert "--speed" in err and "at least 0.01" in err


def test_a_number_in_another_script_or_a_nul_byte_is_one_line(folder: Path, capsys) -> None:
    for reference in ("²", "a\x00b"):
        assert main(["sessions", "--sessions-dir", str(folder), "open", reference]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "Traceback" not in err


def test_a_partial_session_cut_mid_line_is_listed_as_partial(folder: Path) -> None:
    text = DEMOS[0].read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    (folder / "cut.jsonl.partial").write_text("".join(lines[:8]) + lines[8][:40], "utf-8")
    (info,) = [i for i in list_sessions(folder) if i.path.name == "cut.jsonl.partial"]
    assert info.problem is None and info.partial and info.diverged == "partial"


@pytest.mark.parametrize("ended_early", [False, True])
def test_a_long_partial_is_counted_from_its_last_steps(tmp_path: Path, ended_early: bool) -> None:
    """Each lane's count comes from its last step near the end of the file; a lane whose
    steps all lie before that window is unknown, not miscounted."""
    lines = DEMOS[0].read_text(encoding="utf-8").splitlines()
    header, step = lines[0], json.loads(lines[1])
    records = []
    for index in range(1500):
        for lane in ("a", "b"):
            if lane == "a" and ended_early and index >= 5:
                continue
            records.append(json.dumps({**step, "lane": lane, "index": index}))
    path = tmp_path / "long.jsonl.partial"
    path.write_text("\n".join([header, *records]) + "\n" + records[-1][:40], encoding="utf-8")
    (info,) = list_sessions(tmp_path)
    assert info.partial and info.problem is None
    assert info.generated == ((None if ended_early else 1500), 1500)
    session = load_session(path)
    assert len(session.steps["a"]) == (5 if ended_early else 1500)
    assert session.cut_line == len(records) + 2


def suite_tree(root: Path) -> dict[str, str]:
    """A suite's report folder: sessions/PAIR/*.jsonl, with traps around it: a folder
    three levels down, a symlink loop and a symlinked folder outside. Returns each
    listed file's name and the folder it lies in, relative to root/sessions."""
    sessions = root / "sessions"
    placed = {}
    for demo, pair in zip(DEMOS, ("spec-vs-plain", "ubatch", "ubatch")):
        (sessions / pair).mkdir(parents=True, exist_ok=True)
        shutil.copy(demo, sessions / pair / demo.name)
        placed[demo.name] = pair
    deep = sessions / "a" / "b" / "c"
    deep.mkdir(parents=True)
    shutil.copy(DEMOS[0], deep / "too-deep.jsonl")
    (sessions / "ubatch" / "loop").symlink_to(sessions, target_is_directory=True)
    outside = root.parent / f"{root.name}-outside"
    outside.mkdir()
    shutil.copy(DEMOS[0], outside / "elsewhere.jsonl")
    (sessions / "linked").symlink_to(outside, target_is_directory=True)
    return placed


@pytest.mark.parametrize("listed", ["report", "sessions"])
def test_a_suites_pair_subfolders_are_listed_with_their_folder(
    tmp_path: Path, capsys, listed: str
) -> None:
    root = tmp_path / "report"
    placed = suite_tree(root)
    directory = root if listed == "report" else root / "sessions"
    prefix = "sessions/" if listed == "report" else ""
    infos = list_sessions(directory)
    found = {info.path.name: info.folder for info in infos}
    assert found == {name: prefix + pair for name, pair in placed.items()}
    assert main(["sessions", "--sessions-dir", str(directory)]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line[:3].strip().isdigit()]
    head = next(line for line in out.splitlines() if line.startswith("  #"))
    assert len(rows) == len(placed) and "folder" in head
    assert all(f"  {prefix}{pair}" in out for pair in placed.values())
    assert main(["sessions", "--sessions-dir", str(directory), "--json"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {r["folder"] for r in records} == {prefix + pair for pair in placed.values()}
    # what the list shows, open opens: by number, and by its path in the folder
    assert resolve_in(directory, "1", infos) == infos[0].path
    relative = f"{infos[0].folder}/{infos[0].path.name}"
    assert resolve_in(directory, relative, infos) == infos[0].path.resolve()


def test_a_flat_folder_shows_no_folder_column(folder: Path, capsys) -> None:
    assert main(["sessions", "--sessions-dir", str(folder)]) == 0
    head = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("  #"))
    assert "date (UTC)" in head and "folder" not in head
    assert {info.folder for info in list_sessions(folder)} == {""}


def test_a_link_that_loops_is_skipped_and_named_like_a_dangling_one(folder: Path, capsys) -> None:
    """One bad link must not hide every session: it is left out of the list, `--json`
    and `open`, with a line on stderr naming it, as a link to a missing file is."""
    (folder / "loop.jsonl").symlink_to("loop.jsonl")
    (folder / "gone.jsonl").symlink_to(folder / "missing.jsonl")
    assert main(["sessions", "--sessions-dir", str(folder)]) == 0
    captured = capsys.readouterr()
    rows = [line for line in captured.out.splitlines() if line[:3].strip().isdigit()]
    assert len(rows) == len(DEMOS) and "loop.jsonl" not in captured.out
    assert captured.err.splitlines() == [
        "specdiff: note: skipped gone.jsonl: a symbolic link to a missing file",
        "specdiff: note: skipped loop.jsonl: a symbolic link that loops",
    ]
    assert main(["sessions", "--sessions-dir", str(folder), "--json"]) == 0
    captured = capsys.readouterr()
    records = [json.loads(line) for line in captured.out.splitlines()]
    assert {Path(r["path"]).name for r in records} == {demo.name for demo in DEMOS}
    assert len(captured.err.splitlines()) == 2
    # open gets past the listing to its own checks, and names the loop when asked for it
    assert main(["sessions", "--sessions-dir", str(folder), "open", "1", "--speed", "-2"]) == 2
    assert "--speed" in capsys.readouterr().err
    assert main(["sessions", "--sessions-dir", str(folder), "open", "loop.jsonl"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "specdiff: error: loop.jsonl is a symbolic link that loops, not a session"


def stopped_early_copy(source: Path, target: Path, *, as_written_before: bool) -> None:
    """`source`'s header with the footer of a run stopped before its first token: as
    specdiff writes it now, or as earlier releases wrote it (called identical)."""
    header = source.read_text(encoding="utf-8").splitlines()[0]
    footer = RunSummary.of_steps([], [], cancelled=True, stop_reasons=("cancelled",) * 2)
    record = footer.to_json()
    if as_written_before:
        record.pop("stopped_before_first_token", None)
        record["identical"] = True
    target.write_text(f"{header}\n{json.dumps(record)}\n", encoding="utf-8")


@pytest.mark.parametrize("as_written_before", [False, True], ids=["now", "before"])
def test_a_run_stopped_before_its_first_token_is_listed_as_such(
    folder: Path, capsys, as_written_before: bool
) -> None:
    path = folder / "stopped.jsonl"
    stopped_early_copy(DEMOS[0], path, as_written_before=as_written_before)
    assert main(["sessions", "--sessions-dir", str(folder)]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if "stopped before any token" in line)
    assert " 0/0 " in row and "identical" not in row
    head = next(line for line in out.splitlines() if line.startswith("  #"))
    # the columns after the verdict still line up under their heads
    assert row.index(" 0/0 ") + len(" 0/0") == head.index("tokens") + len("tokens")
    assert main(["sessions", "--sessions-dir", str(folder), "--json"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    (record,) = [r for r in records if r["path"].endswith("stopped.jsonl")]
    assert record["stopped_before_first_token"] is True and record["identical"] is False
    assert not any(r["stopped_before_first_token"] for r in records if r is not record)
    summary = load_session(path).summary()
    assert summary.stopped_before_first_token and not summary.identical


def test_a_run_stopped_after_agreeing_tokens_is_not_called_identical(folder: Path, capsys) -> None:
    """A Ctrl+C after some agreeing tokens says nothing of the tokens never made."""
    lines = DEMOS[0].read_text(encoding="utf-8").splitlines()
    footer = json.loads(lines[-1])
    footer.update(identical=True, fork_index=None, fork_margins=None, fork_class=None)
    finished = folder / "finished.jsonl"
    finished.write_text("\n".join([*lines[:-1], json.dumps(footer)]) + "\n", encoding="utf-8")
    footer["cancelled"] = True
    stopped = folder / "stopped-agreeing.jsonl"
    stopped.write_text("\n".join([*lines[:-1], json.dumps(footer)]) + "\n", encoding="utf-8")
    assert main(["sessions", "--sessions-dir", str(folder)]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert "identical" not in next(line for line in rows if "stopped, same so far" in line)
    assert sum("identical" in line for line in rows) == 1
    assert main(["sessions", "--sessions-dir", str(folder), "--json"]) == 0
    records = {
        Path(r["path"]).name: r for r in map(json.loads, capsys.readouterr().out.splitlines())
    }
    assert records["stopped-agreeing.jsonl"]["cancelled"] is True
    assert records["finished.jsonl"]["cancelled"] is False
