"""How the status line shows a file it wrote: the middle of the folders goes, never the
file name (pure rules, no Textual)."""

from __future__ import annotations

from pathlib import Path

import pytest

from specdiff.tui.paths import elided_path, line_with_path, shown_path

LONG = (
    "/srv/data/people/someone/.local/share/specdiff/sessions/20261129T095647Z-ubatch-cd1458d9.html"
)


@pytest.mark.parametrize("width", [20, 40, 60, 79])
def test_a_long_path_loses_the_middle_of_its_folders_never_its_file_name(width: int) -> None:
    shown = elided_path(LONG, width)
    name = Path(LONG).name
    assert shown.endswith(name)
    assert len(shown) <= max(width, len(name))
    if width < len(name) + 3:  # no room for a hint of the folders
        assert shown == name
    else:
        assert "…" in shown and shown.endswith(f"/{name}")
    if width >= 60:  # room for both ends: the path still starts where it did
        assert shown.startswith("/srv/") and len(shown) == width


def test_a_path_that_fits_is_shown_whole() -> None:
    assert elided_path("/tmp/x/report.html", 80) == "/tmp/x/report.html"


def test_the_home_folder_is_written_as_a_tilde(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/home/ada")
    monkeypatch.chdir("/")  # every path is inside /, yet / is no folder to be relative to
    assert shown_path("/home/ada/sessions/a.jsonl") == "~/sessions/a.jsonl"
    assert shown_path("/home/adam/a.jsonl") == "/home/adam/a.jsonl"


def test_a_path_inside_the_current_folder_is_shown_relative_to_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a session shown from a checkout reads the same wherever the checkout lies
    inside = tmp_path / "sessions" / "a.jsonl"
    monkeypatch.chdir(tmp_path)
    assert shown_path(inside) == "sessions/a.jsonl"
    assert shown_path(str(tmp_path)) == str(tmp_path)  # the folder itself: no empty name
    monkeypatch.chdir(tmp_path / "..")
    assert shown_path(inside) == f"{tmp_path.name}/sessions/a.jsonl"


def test_a_path_outside_the_current_folder_stays_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    monkeypatch.setenv("HOME", "/home/ada")
    assert shown_path(tmp_path / "there" / "a.jsonl") == str(tmp_path / "there" / "a.jsonl")


def test_a_status_line_with_a_path_fits_its_width() -> None:
    line = line_with_path("report written: ", LONG, " (and the run beside it)", 80)
    assert len(line) == 80
    assert line.startswith("report written: /")
    assert "20261129T095647Z-ubatch-cd1458d9.html (and the run beside it)" in line
