"""One saved session as a self-contained report: Markdown, HTML or JSON.

Every number comes from the session's own records through compare.py and the text
summary's formatting, so a report says exactly what `specdiff run` and the TUI say.
A report needs nothing beside itself: the margin plot is inline SVG (a data URI in
Markdown), the HTML has inline CSS and no scripts, and nothing refers to the network.

This module picks the format and writes the file; what every format shows is computed
in `export_content`, and each format lays it out in its own module.
"""

from __future__ import annotations

import math
from pathlib import Path

from specdiff.compare import DEFAULT_NEAR_TIE
from specdiff.errors import SpecdiffError, did_you_mean
from specdiff.files import lost_output, write_text_atomic
from specdiff.reports._markup import without_surrogates
from specdiff.reports.export_content import AUTOPSY_HEADING, session_report, token_texts
from specdiff.reports.export_html import html_document
from specdiff.reports.export_json import json_document
from specdiff.reports.export_markdown import markdown_document
from specdiff.safe_text import terminal_text
from specdiff.sessions.store import Session

__all__ = [
    "AUTOPSY_HEADING",
    "FORMATS",
    "ExportError",
    "check_output",
    "export_session",
    "report_format",
    "token_texts",
    "write_report",
]


FORMATS = ("md", "html", "json")


SUFFIX_FORMATS = {".md": "md", ".markdown": "md", ".html": "html", ".htm": "html", ".json": "json"}


class ExportError(SpecdiffError):
    """A report that cannot be made or written: bad format, or an output in the way."""


def report_format(requested: str | None, output: str | None) -> str:
    """--format if given, else what --output's suffix says, else Markdown."""
    if requested is not None:
        wanted = requested.strip().lower()
        if wanted not in FORMATS:
            raise ExportError(
                f"unknown format {requested!r}; {did_you_mean(wanted, FORMATS)}choose one of "
                f"{', '.join(FORMATS)}"
            )
        return wanted
    if output and output != "-":
        return SUFFIX_FORMATS.get(Path(output).suffix.lower(), "md")
    return "md"


_RENDERERS = {"md": markdown_document, "html": html_document, "json": json_document}


def export_session(session: Session, fmt: str, near_tie: float = DEFAULT_NEAR_TIE) -> str:
    """The session as one self-contained document in the format named (md, html, json)."""
    renderer = _RENDERERS.get(fmt)
    if renderer is None:
        raise ExportError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if near_tie < 0 or not math.isfinite(near_tie):
        raise ExportError(f"the near-tie threshold must be a number >= 0, got {near_tie}")
    # a prompt or header read from JSON may hold lone surrogates, which no encoder writes
    document = without_surrogates(renderer(session_report(session, near_tie)))
    # a report is read in a terminal too (`export` prints it): whatever control
    # character a shared file slipped past the markup is shown as its escape
    return document if fmt == "json" else terminal_text(document)


def check_output(path: Path, force: bool) -> None:
    """Refuse, before any work, an output that cannot or must not be written."""
    if path.is_dir():
        raise ExportError(f"{path} is a folder; give --output a file name")
    # a dangling link counts: writing would replace the link a user put there
    if (path.exists() or path.is_symlink()) and not force:
        raise ExportError(f"{path} already exists; pass --force to overwrite it")
    parent = path.parent
    if not parent.is_dir():
        raise ExportError(
            f"cannot write {path}: the folder {parent} does not exist; create it first"
        )


def write_report(text: str, path: Path, force: bool = False) -> None:
    """Write the report whole or not at all: a failure never leaves a half-written report
    (or a damaged older one), and without force a file that appears meanwhile is kept."""
    check_output(path, force)
    try:
        write_text_atomic(path, text, overwrite=force)
    except FileExistsError:
        raise ExportError(f"{path} already exists; pass --force to overwrite it") from None
    except OSError as error:
        failed = ExportError(f"cannot write {path}: {error.strerror or error}")
        raise lost_output(error) or failed from None
