"""Saving a pair run and reading it back (the format the TUI saves with `s`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from specdiff.engine.pairrun import PairRun
from specdiff.lanes import Pair, presets
from specdiff.results import PairResult
from specdiff.sessions.catalog import list_sessions
from specdiff.sessions.header import SessionHeader
from specdiff.sessions.records import RunSummary
from specdiff.sessions.store import (
    Session,
    SessionError,
    load_session,
    save_result,
    session_name,
)
from tests.conftest import ForkingPrompt

DEMO_SESSION = sorted((Path(__file__).resolve().parent.parent / "sessions").glob("*.jsonl"))[0]


@pytest.fixture(scope="module")
def forked_result(forking_prompt: Callable[[str, int], ForkingPrompt]) -> PairResult:
    with PairRun(presets()["ubatch"]) as runner:
        return runner.run(forking_prompt("ubatch", 40).prompt, 40)


@pytest.mark.model
def test_round_trip_keeps_every_step_and_the_summary(forked_result, tmp_path: Path) -> None:
    path = save_result(forked_result, tmp_path)
    assert path.suffix == ".jsonl" and not list(tmp_path.glob("*.partial"))
    session = load_session(path)
    assert not session.partial
    assert session.steps["a"] == forked_result.a.steps
    assert session.steps["b"] == forked_result.b.steps
    assert session.comparison() == forked_result.comparison
    assert session.pair == forked_result.pair
    assert session.footer.fork_index == forked_result.comparison.fork.index


@pytest.mark.model
def test_saving_never_overwrites(forked_result, tmp_path: Path) -> None:
    first = save_result(forked_result, tmp_path)
    second = save_result(forked_result, tmp_path)
    assert first != second and first.exists() and second.exists()


@pytest.mark.model
def test_a_session_without_footer_loads_as_partial(forked_result, tmp_path: Path) -> None:
    path = save_result(forked_result, tmp_path)
    lines = path.read_text(encoding="utf-8").splitlines()
    cut = tmp_path / "cut.jsonl"
    cut.write_text("\n".join(lines[:11]) + "\n", encoding="utf-8")
    session = load_session(cut)
    assert session.partial and len(session.steps["a"]) + len(session.steps["b"]) == 10


@pytest.mark.model
def test_a_broken_line_is_named(forked_result, tmp_path: Path) -> None:
    path = save_result(forked_result, tmp_path)
    lines = path.read_text(encoding="utf-8").splitlines()
    lines[3] = lines[3][:20]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(SessionError, match=f"{path.name}:4:"):
        load_session(path)


def test_names_are_sanitised() -> None:
    name = session_name("../../etc/passwd pair", "prompt")
    assert "/" not in name and name.endswith(name[-8:])
    assert all(c.isalnum() or c in "._-" for c in name)


@dataclass(frozen=True)
class SavedRun:
    """A session read back, offered to `save_result` as a run is: the fields a
    PairResult gives it."""

    session: Session
    header_record: SessionHeader

    @property
    def pair(self) -> Pair:
        return self.session.pair

    @property
    def prompt(self) -> str:
        return self.session.prompt

    @property
    def a(self) -> SimpleNamespace:
        return SimpleNamespace(steps=self.session.steps["a"])

    @property
    def b(self) -> SimpleNamespace:
        return SimpleNamespace(steps=self.session.steps["b"])

    def header(self) -> SessionHeader:
        return self.header_record

    def summary(self) -> RunSummary:
        return self.session.summary()


@pytest.mark.parametrize(
    "started, stamp, listed",
    [
        ("2026-11-29T09:56:47+00:00", "20261129T095647Z", "2026-11-29 09:56"),
        # a start written with another zone is named and listed in UTC alike
        ("2026-01-02T03:04:05+02:00", "20260102T010405Z", "2026-01-02 01:04"),
    ],
)
def test_a_run_saved_later_is_named_and_listed_by_its_start(
    tmp_path: Path, started: str, stamp: str, listed: str
) -> None:
    """The TUI saves a run when asked, minutes or days after it started: its file is
    named by the time the list shows, the run's start, not the time it was saved."""
    session = load_session(DEMO_SESSION)
    run = SavedRun(session, replace(session.header, created=started))
    path = save_result(run, tmp_path)
    assert path.name.startswith(f"{stamp}-{session.pair.name}-")
    (info,) = list_sessions(tmp_path)
    assert info.when == listed and info.path == path
