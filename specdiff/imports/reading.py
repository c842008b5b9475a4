"""Reading another tool's files: whole, bounded, and refused in one line when they are not
what they should be (missing, a folder, not JSON)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from specdiff.errors import printable
from specdiff.files import read_limited
from specdiff.imports.records import ImportInputError

READ_LIMIT = 1 << 30
"""The largest file read: an evaluation's samples of some tens of thousands of items
fit with room to spare, and a mistaken path to a disk image does not fill memory."""


def read_text(path: Path, what: str) -> str:
    try:
        data = read_limited(path, READ_LIMIT)
    except FileNotFoundError:
        raise ImportInputError(f"{path} does not exist: give the {what}") from None
    except (OSError, ValueError) as error:
        reason = error.strerror if isinstance(error, OSError) else str(error)
        raise ImportInputError(f"{path} cannot be read ({reason}): give the {what}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ImportInputError(f"{path} is not UTF-8 text: give the {what}") from None


def read_json(path: Path, what: str, strict: bool = True) -> Any:
    """The JSON in `path`; with strict=False, None where it is not JSON."""
    text = read_text(path, what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        if not strict:
            return None
        raise ImportInputError(
            f"{path} is not JSON (line {error.lineno}: {error.msg}): give the {what}"
        ) from None


def json_lines(path: Path, what: str) -> Iterator[dict[str, Any]]:
    """Each line of a JSON Lines file as an object; blank lines skipped."""
    for number, line in enumerate(read_text(path, what).splitlines(), 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as error:
            raise ImportInputError(
                f"{path} line {number} is not JSON ({error.msg}): give the {what}"
            ) from None
        if not isinstance(value, dict):
            raise ImportInputError(
                f"{path} line {number} is {printable(line, 40)}, not a JSON object: give the {what}"
            )
        yield value


def text_of(value: object) -> str:
    """A prompt or answer as text: text as it is, anything else (a chat's messages, a
    structured answer) as its JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, ensure_ascii=False)
