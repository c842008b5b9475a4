"""File paths as the status line shows them: a path too long for the line loses the
middle of its folders, never its file name, which is what the reader needs to find the
file again. Plain Python (no Textual), tested in the fast tier."""

from __future__ import annotations

from pathlib import Path

ELLIPSIS = "…"


def shown_path(path: str | Path) -> str:
    """`path` as the reader would type it: relative to the current folder when it lies
    inside it (what `specdiff replay sessions/x.jsonl` was given), else with the home
    folder written as ~ (shorter, and the same on every line)."""
    text = str(path)
    try:
        here = Path.cwd().resolve()
        inside = Path(text).resolve().relative_to(here) if here.parent != here else None
    except (OSError, ValueError):
        inside = None  # outside the current folder, or the folder is gone
    if inside is not None and inside.parts:
        return str(inside)
    home = str(Path.home())
    if home not in ("", "/") and (text == home or text.startswith(home + "/")):
        return "~" + text[len(home) :]
    return text


def elided_path(path: str | Path, width: int) -> str:
    """`path` in at most `width` columns where it can be: the middle of its folders
    becomes "…", or where that leaves no room the folders go; the file name is kept
    whole even when it alone is wider."""
    text = shown_path(path)
    if len(text) <= width:
        return text
    name = Path(text).name
    folders = text[: len(text) - len(name)]  # ends with the separator before the name
    room = width - len(name) - len(ELLIPSIS)
    if room < 2:
        return name  # no room for a hint of the folders: the name is what matters
    head = room // 2
    tail = room - head
    return folders[:head] + ELLIPSIS + folders[len(folders) - tail :] + name


def line_with_path(before: str, path: str | Path, after: str, width: int) -> str:
    """`before` + the path + `after`, the path elided so the whole fits `width` where
    it can (the file name is never cut)."""
    room = max(0, width - len(before) - len(after))
    return f"{before}{elided_path(path, room)}{after}"
