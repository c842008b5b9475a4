"""Every reader on every file of a hostile corpus: the listing, export in each format,
replay and verify. Each exits 0 or 2 (one line on stderr for 2), never a traceback,
and nothing it writes holds a control character a terminal would act on."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from specdiff.cli import main
from specdiff.cli.replay import open_for_replay
from specdiff.lanes import presets
from specdiff.sessions.catalog import list_sessions
from specdiff.sessions.store import SessionError, load_session
from specdiff.sessions.verify import environment_changes, first_drift, likely_cause
from specdiff.tui.app import make_app
from specdiff.tui.widgets import TokenView
from tests.conftest import ROOT
from tests.hostile_corpus import ESCAPES, FIXTURE, Case, corpus
from tests.tui_driver import drive

CASES = corpus()
BY_NAME = {case.name: case for case in CASES}
UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
"""What must never reach a terminal: C0 controls but tab and newline, DEL, C1 controls."""
UNSAFE_BYTES = re.compile(rb"[\x00-\x08\x0b-\x1f\x7f]")


def test_the_corpus_is_large_and_holds_every_outcome() -> None:
    assert len(CASES) >= 60 and len(BY_NAME) == len(CASES)
    assert {case.expect for case in CASES} == {"", "ok", "cut", "bad"}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every case as a file, named after it."""
    directory = tmp_path_factory.mktemp("hostile")
    for case in CASES:
        (directory / f"{case.name}.jsonl").write_bytes(case.make())
    return directory


def path_of(folder: Path, case: Case) -> Path:
    return folder / f"{case.name}.jsonl"


def assert_safe(code: int, out: str, err: str) -> None:
    """Exit 0 or 2, one line for 2, no traceback, nothing a terminal would act on."""
    assert code in (0, 2), (code, err)
    assert "Traceback" not in err
    if code == 2:
        assert err.startswith("specdiff: error: ") and len(err.strip().splitlines()) == 1, err
    for text in (out, err):
        assert not UNSAFE.search(text), UNSAFE.findall(text)[:5]


def outcome(case: Case, code: int) -> None:
    if case.expect in ("ok", "cut"):
        assert code == 0
    elif case.expect == "bad":
        assert code == 2


def load_outcome(path: Path) -> str:
    try:
        session = load_session(path)
    except SessionError as error:
        assert "\n" not in str(error) and str(path) in str(error)
        return "bad"
    return "ok" if session.cut_line is None else "cut"


def test_loading_gives_the_expected_outcome(folder: Path) -> None:
    found = {case.name: load_outcome(path_of(folder, case)) for case in CASES}
    wrong = {
        name: outcome
        for name, outcome in found.items()
        if outcome != BY_NAME[name].expect and not (BY_NAME[name].expect == "" and outcome != "cut")
    }
    assert not wrong


def test_the_listing_shows_every_file_and_marks_the_unreadable(folder: Path, capsys) -> None:
    assert main(["sessions", "--sessions-dir", str(folder)]) == 0
    out, err = capsys.readouterr()
    assert_safe(0, out, err)
    rows = [line for line in out.splitlines() if re.match(r"\s*\d+  ", line)]
    assert len(rows) == len(CASES)
    assert main(["sessions", "--sessions-dir", str(folder), "--json"]) == 0
    out, err = capsys.readouterr()
    assert_safe(0, out, err)
    listed = {Path(json.loads(line)["path"]).name for line in out.splitlines()}
    assert listed == {f"{case.name}.jsonl" for case in CASES}
    infos = {info.path.name: info for info in list_sessions(folder)}
    for case in CASES:
        info = infos[f"{case.name}.jsonl"]
        if case.expect == "cut":
            assert info.problem is None and info.partial, case.name
        if case.expect in ("ok", "cut"):
            assert info.problem is None, (case.name, info.problem)  # what loads, lists
        if case.name in ("file-deep-header", "file-binary-garbage", "file-empty"):
            assert info.problem is not None


def test_listing_reads_a_bounded_part_of_a_huge_partial_file(tmp_path: Path) -> None:
    """A partial session of 1 GB with no newline after its header (a sparse file, so
    the test writes almost nothing) lists in bounded memory."""
    path = tmp_path / "huge.jsonl.partial"
    with path.open("wb") as handle:
        handle.write(FIXTURE.read_bytes().split(b"\n", 1)[0] + b"\n")
        handle.truncate(1 << 30)
    tracemalloc.start()
    try:
        (info,) = list_sessions(tmp_path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert info.problem is None and info.partial and info.generated == (None, None)
    assert peak < 32 * 1024 * 1024


@pytest.mark.parametrize("fmt", ["md", "html", "json"])
def test_export_handles_every_file(folder: Path, capsysbinary, fmt: str) -> None:
    for case in CASES:
        code = main(["export", str(path_of(folder, case)), "--format", fmt])
        captured = capsysbinary.readouterr()
        out, err = captured.out.decode("utf-8"), captured.err.decode("utf-8")
        assert_safe(code, out, err)
        outcome(case, code)
        if case.expect == "cut":
            assert "cut " in out and "is incomplete" in out, case.name
        if case.expect == "ok" and fmt == "json":
            assert '"cut": null' in out


def test_verify_refuses_every_bad_file_before_any_lane_runs(folder: Path, capsys) -> None:
    for case in CASES:
        if case.expect != "bad":
            continue
        code = main(["verify", str(path_of(folder, case))])
        out, err = capsys.readouterr()
        assert_safe(code, out, err)
        assert code == 2, case.name


BUILD_NOW = {
    "llama_cpp_build": "0.5.0-dev",
    "system_info": "CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | AVX512 = 1 |",
    "cpu": "Intel Xeon",
}


def test_verify_reads_every_loadable_file_up_to_the_rerun(folder: Path) -> None:
    """What verify computes from a file once its lanes have run: the drift, what changed
    in the build and the lanes, the likely cause; here against a re-run that changed
    every lane's first token, on another CPU."""
    loaded = set()
    for case in CASES:
        try:
            session = load_session(path_of(folder, case))
        except SessionError:
            continue
        loaded.add(case.name)
        rerun = {lane: [step.token_id + 1 for step in session.steps[lane]] + [7] for lane in "ab"}
        drift = first_drift(session, rerun)
        # every recorded token changed and each lane got one more: a drift at step 0, but
        # for a stopped run that recorded nothing (it is checked only as far as it got)
        silent = session.stopped and not any(session.steps[lane] for lane in "ab")
        assert (None if drift is None else drift.index) == (None if silent else 0), case.name
        lines = environment_changes(session.header, BUILD_NOW, {"a": {}, "b": {}})
        cause = likely_cause(session.header.build, BUILD_NOW)
        for line in [*lines, cause or ""]:
            assert not UNSAFE.search(line), (case.name, line)
    assert {case.name for case in CASES if case.expect in ("ok", "cut")} <= loaded


def replayable() -> list[Case]:
    return [case for case in CASES if case.expect in ("ok", "cut", "")]


async def test_replay_shows_every_loadable_file(folder: Path) -> None:
    """One app, every loadable file shown in turn (an app a file costs 0.4 s)."""
    first = load_session(FIXTURE)
    app = make_app(presets(), first.pair.name, first.prompt, 60, session=first)
    async with app.run_test(size=(100, 30)) as pilot:
        for case in replayable():
            try:
                session, stream = open_for_replay(path_of(folder, case))
            except SessionError:
                assert case.expect == ""
                continue
            stream.close()
            drive(app).view.session = session
            drive(app).show_session(session)
            await pilot.pause()
            status = app.query_one("#status").plain  # all of it, not what fits
            assert drive(app).load_error is None and not UNSAFE.search(status), case.name
            if case.expect == "cut":
                assert "is incomplete" in status, case.name
            for view in app.query(TokenView):
                drawn = "".join(text for line in view.lines for _, text in line)
                assert not UNSAFE.search(drawn), case.name


def test_replay_refuses_every_bad_file_with_one_line(folder: Path, capsys) -> None:
    for case in CASES:
        if case.expect != "bad":
            continue
        code = main(["replay", str(path_of(folder, case))])
        out, err = capsys.readouterr()
        assert_safe(code, out, err)
        assert code == 2, case.name


@pytest.mark.parametrize(
    "name",
    ["file-deep-header", "escapes-pieces", "cut-0.5"],
)
def test_the_real_command_line_exits_cleanly(folder: Path, name: str) -> None:
    """In a process of its own, as a user runs it: the exit code and every byte."""
    case = BY_NAME[name]
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    commands = [["export", "--format", "md"], ["verify"]] if case.expect == "bad" else [["export"]]
    for command in commands:
        done = subprocess.run(
            [sys.executable, "-m", "specdiff", *command, str(path_of(folder, case))],
            capture_output=True,
            timeout=60,
            env=environment,
            cwd=ROOT,
        )
        assert done.returncode == (2 if case.expect == "bad" else 0), done.stderr
        assert b"Traceback" not in done.stderr
        assert not UNSAFE_BYTES.search(done.stdout + done.stderr)
        if done.returncode == 2:
            assert len(done.stderr.strip().splitlines()) == 1


def test_escape_sequences_in_a_file_reach_the_report_as_visible_text(folder: Path) -> None:
    from specdiff.reports.export import export_session

    session = load_session(path_of(folder, BY_NAME["escapes-prompt"]))
    for fmt in ("md", "html", "json"):
        report = export_session(session, fmt)
        assert not UNSAFE.search(report) and "\x1b" not in report
    assert "]52;c;aGk=" in export_session(session, "md")
    assert session.prompt == ESCAPES  # the record keeps what was stored


@pytest.mark.model
@pytest.mark.parametrize("name", ["escapes-prompt", "escapes-cpu"])
def test_verify_runs_a_file_with_escapes_and_prints_them_escaped(folder: Path, name: str) -> None:
    """Verify for real (the lanes re-run on the bundled model): the prompt's escape
    sequences go to the model as text, and whatever verify prints shows them escaped."""
    done = subprocess.run(
        [sys.executable, "-m", "specdiff", "verify", str(path_of(folder, BY_NAME[name]))],
        capture_output=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
    )
    assert done.returncode in (0, 1), done.stderr
    assert b"Traceback" not in done.stderr
    assert not UNSAFE_BYTES.search(done.stdout + done.stderr)
    assert re.search(rb"^(verified|DRIFT)", done.stdout, re.MULTILINE)


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_a_saved_autopsy_with_a_number_json_cannot_hold_stops_every_export_in_one_line(
    tmp_path: Path, literal: str
) -> None:
    """In a process of its own: Python's json reads these, the autopsy's reader does not,
    and no format gets as far as drawing one."""
    session = tmp_path / "ubatch-roman-empire.jsonl"
    session.write_bytes((ROOT / "tests" / "data" / session.name).read_bytes())
    saved = (ROOT / "tests" / "data" / "ubatch-roman-empire.autopsy.json").read_text("utf-8")
    record = json.loads(saved)
    record["margin"]["margin"] = "@"
    autopsy = tmp_path / "ubatch-roman-empire.autopsy.json"
    autopsy.write_text(json.dumps(record).replace('"@"', literal), encoding="utf-8")
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    for fmt in ("html", "md", "json"):
        done = subprocess.run(
            [sys.executable, "-m", "specdiff", "export", str(session), "--format", fmt],
            capture_output=True,
            timeout=60,
            env=environment,
            cwd=tmp_path,
        )
        assert done.returncode == 2 and done.stdout == b"", (fmt, done.stderr)
        assert b"Traceback" not in done.stderr
        lines = done.stderr.decode("utf-8").strip().splitlines()
        assert len(lines) == 1 and "field 'margin.margin' must be a finite number" in lines[0]
        assert sorted(path.name for path in tmp_path.iterdir()) == [autopsy.name, session.name]
