"""The documentation's generated pictures are current: written again into a temporary
folder by docs/generate.py, each equals the committed one byte for byte. A stale picture
fails with the command that makes it current (python3 docs/generate.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import ROOT

IMAGES = ROOT / "docs" / "images"


def docs_generator() -> ModuleType:
    """docs/generate.py, imported by path (it is a script, not a package of the repo)."""
    spec = importlib.util.spec_from_file_location(
        "specdiff_docs_generate", ROOT / "docs" / "generate.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GENERATE = docs_generator()


def stale(written: list[Path]) -> list[str]:
    """The written pictures whose committed copy is missing or differs."""
    assert written, "the generator wrote nothing"
    problems = []
    for path in written:
        committed = IMAGES / path.name
        if not committed.exists():
            problems.append(f"{path.name}: not committed")
        elif committed.read_bytes() != path.read_bytes():
            problems.append(f"{path.name}: differs (run python3 docs/generate.py)")
    return problems


def test_the_report_and_concept_pictures_are_current(tmp_path: Path) -> None:
    written = GENERATE.write_report_pictures(tmp_path) + GENERATE.write_concept_pictures(tmp_path)
    assert {path.name for path in written} >= {
        "report-forked-by-length.svg",
        "concept-probabilities.svg",
        "concept-near-ties.svg",
        "concept-forecast.svg",
    }
    assert stale(written) == []


@pytest.mark.tui
def test_the_tui_screenshots_are_current(tmp_path: Path) -> None:
    written = GENERATE.write_screens(tmp_path)
    assert [path.name for path in written] == list(GENERATE.SCREENS)
    assert stale(written) == []


def test_a_changed_picture_is_stale(tmp_path: Path) -> None:
    # the comparison must be able to fail: a picture whose committed copy differs
    written = GENERATE.write_concept_pictures(tmp_path)
    changed = written[0]
    changed.write_text(changed.read_text(encoding="utf-8") + "<!-- -->\n", encoding="utf-8")
    assert stale([changed]) == [f"{changed.name}: differs (run python3 docs/generate.py)"]
