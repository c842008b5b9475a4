"""Saving a pair run and reading it back (the format the TUI saves with `s`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from specdiff.engine.pairrun import PairRun
from specdiff.lanes import presets
from specdiff.results import PairResult
from specdiff.sessions.store import SessionError, load_session, save_result, session_name
from tests.conftest import ForkingPrompt


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
