"""A suite's report folder: started new, cleared with --force or resumed from its
suite.json; where each run's session file lies in it."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specdiff.errors import LaneConfigError, SpecdiffError, printable
from specdiff.files import write_text_atomic
from specdiff.sessions.store import SUFFIX, safe_name
from specdiff.suite import SuiteError
from specdiff.suite.prompts import SuitePrompt
from specdiff.suite.settings import SuiteSettings, check_resume, settings_from_json

SUITE_FILE = "suite.json"
SHARD_FILE = "shard.json"
"""In a shard's folder: which shard of the suite it is, and where it ran (suite.shards)."""
SESSIONS_FOLDER = "sessions"
REPORT_FILES = ("report.json", "report.md", "report.html", "results.csv")


def session_path(report_dir: Path, label: str, prompt: SuitePrompt) -> Path:
    """The session file of one prompt's run under one pair (variant)."""
    return report_dir / SESSIONS_FOLDER / safe_name(label) / f"{prompt.file_stem}{SUFFIX}"


def prepare_report_dir(
    report_dir: Path,
    settings: SuiteSettings | None,
    prompts: Sequence[SuitePrompt] | None,
    resume: bool,
    force: bool,
    allow_servers: bool = False,
) -> SuiteSettings:
    """Check the report folder for a new or resumed suite; returns the settings to run.

    New: the folder must not exist (or --force clears specdiff's files from it).
    Resume: the folder's suite.json must exist and, when the command gives settings and
    prompts, agree with them; without them, its server lanes run only with
    `allow_servers` (the file picks the endpoints and the key variables).
    """
    if resume:
        if force:
            raise SuiteError("--resume continues a suite and --force replaces it; pick one")
        stored = read_suite_file(report_dir)
        try:
            stored_settings = settings_from_json(stored)
        except (ValueError, KeyError, TypeError, AttributeError, SpecdiffError) as error:
            raise SuiteError(
                f"{report_dir / SUITE_FILE}: cannot read it ({printable(str(error))}); "
                "start the suite again in a new --report folder"
            ) from None
        if settings is not None and prompts is not None:
            check_resume(stored, settings, prompts, report_dir)
            # the same settings, with what suite.json leaves out: an endpoint's credentials
            return settings
        check_stored_servers(stored_settings, report_dir / SUITE_FILE, allow_servers)
        return stored_settings
    assert settings is not None
    _clear_report_dir(report_dir, force)
    return settings


def check_stored_servers(settings: SuiteSettings, suite_file: Path, allow_servers: bool) -> None:
    """Refuse, before any model loads, to re-run server lanes taken from suite.json: one
    whose endpoint was saved without its credentials, and any without --allow-servers
    (a shared suite.json would send the prompts where it says), as verify and replay do."""
    for pair in settings.pairs:
        try:
            pair.a.check_credentials("a")
            pair.b.check_credentials("b")
        except LaneConfigError as error:
            raise SuiteError(
                f"{suite_file}: {error}, with PROMPTS and the suite's other options as before"
            ) from None
        refusal = pair.servers_named(str(suite_file))
        if refusal is not None and not allow_servers:
            raise SuiteError(refusal)


def read_suite_file(report_dir: Path) -> dict[str, Any]:
    """The stopped suite's suite.json, as written by `write_settings`."""
    suite_file = report_dir / SUITE_FILE
    try:
        stored = json.loads(suite_file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SuiteError(
            f"{report_dir} holds no stopped suite ({SUITE_FILE} is missing); "
            "drop --resume to start one"
        ) from None
    except (OSError, ValueError, RecursionError) as error:
        reason = "nested too deep" if isinstance(error, RecursionError) else str(error)
        raise SuiteError(f"{suite_file}: cannot read it ({printable(reason)})") from None
    if not isinstance(stored, dict):
        raise SuiteError(f"{suite_file}: cannot read it (not a JSON object)")
    return stored


def write_settings(
    report_dir: Path, settings: SuiteSettings, prompts: Sequence[SuitePrompt]
) -> None:
    text = json.dumps(settings.as_json(prompts), indent=1, ensure_ascii=False)
    write_text_atomic(report_dir / SUITE_FILE, text + "\n")


def _clear_report_dir(report_dir: Path, force: bool) -> None:
    """Make an empty report folder for a new suite; --force removes only the files a
    suite writes from one that exists."""
    if report_dir.exists():
        if not force:
            raise SuiteError(
                f"the report folder {report_dir} already exists; pass --force to replace "
                "its report, --resume to continue a stopped suite, or name a new folder"
            )
        if not report_dir.is_dir():
            raise SuiteError(f"{report_dir} is a file; name a folder for --report")
        for name in (SUITE_FILE, SHARD_FILE, *REPORT_FILES):
            (report_dir / name).unlink(missing_ok=True)
        shutil.rmtree(report_dir / SESSIONS_FOLDER, ignore_errors=True)
    try:
        report_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise SuiteError(f"cannot create {report_dir}: {error.strerror}") from None
