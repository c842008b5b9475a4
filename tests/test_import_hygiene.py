"""The layers hold when modules are imported: the headless core never loads Textual (it
runs in suites, CI jobs and other programs that have no screen), reading and exporting
sessions never loads llama.cpp, and lint-imports keeps the contracts in pyproject.toml."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT, pyproject

PACKAGE = ROOT / "specdiff"
# the front ends: the TUI, and the command line that starts it (__main__ runs it)
FRONT_ENDS = ("tui", "cli", "__main__")
SESSION_READERS = [
    "specdiff.sessions",
    "specdiff.reports",
    "specdiff.sessions.store",
    "specdiff.sessions.catalog",
    "specdiff.reports.export",
]

# Imports the given modules one by one in a fresh interpreter and prints the first whose
# import loaded the watched package (nothing when none did).
FIRST_LOADER = """
import importlib, sys
watched, modules = sys.argv[1], sys.argv[2:]
for module in modules:
    importlib.import_module(module)
    if any(m == watched or m.startswith(watched + ".") for m in sys.modules):
        print(module)
        break
"""


def core_modules() -> list[str]:
    """Every module under specdiff/ but the front ends, found on disk rather than with
    pkgutil.walk_packages, which skips folders without an __init__.py and imports each
    package it looks into."""
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts[1:2] and parts[1] in FRONT_ENDS:
            continue
        names.append(".".join(parts))
    return names


def first_import_loading(watched: str, modules: list[str]) -> str | None:
    completed = subprocess.run(
        [sys.executable, "-c", FIRST_LOADER, watched, *modules],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert completed.returncode == 0, completed.stderr
    return completed.stdout.strip() or None


def test_the_core_is_found_on_disk() -> None:
    found = core_modules()
    assert {"specdiff", "specdiff.steps", "specdiff.engine.pairrun"} <= set(found)
    assert {"specdiff.sessions.store", "specdiff.reports.export"} <= set(found)
    assert not [name for name in found if name.split(".")[1:2] in (["tui"], ["cli"])]


def test_every_package_folder_has_an_init() -> None:
    """lint-imports does not see into a folder without __init__.py: its contracts would
    stop with "Module ... does not exist"."""
    folders = {path.parent for path in PACKAGE.rglob("*.py")}
    without = sorted(str(f.relative_to(ROOT)) for f in folders if not (f / "__init__.py").exists())
    assert without == []


def test_the_core_does_not_load_textual() -> None:
    loader = first_import_loading("textual", core_modules())
    assert loader is None, f"importing {loader} loaded textual"


def test_the_check_itself_sees_textual() -> None:
    """Guard against a check that cannot fail: a module that loads textual is named."""
    assert first_import_loading("textual", ["specdiff.steps", "specdiff.tui.app"]) == (
        "specdiff.tui.app"
    )


def test_reading_and_exporting_sessions_does_not_load_llama_cpp() -> None:
    loader = first_import_loading("llama_cpp", SESSION_READERS)
    assert loader is None, f"importing {loader} loaded llama_cpp"


def test_reading_and_exporting_sessions_does_not_load_the_engine() -> None:
    """Stronger than the llama_cpp check, which holds as long as the engine defers its
    import of llama_cpp: listing or exporting sessions loads no engine code at all."""
    loader = first_import_loading("specdiff.engine", SESSION_READERS)
    assert loader is None, f"importing {loader} loaded specdiff.engine"


def test_the_core_contract_names_every_core_package() -> None:
    """lint-imports checks only the packages its contract names: a new one must be added."""
    contracts = pyproject()["tool"]["importlinter"]["contracts"]
    (core,) = [c for c in contracts if c["name"].startswith("The headless core")]
    top_level = {".".join(name.split(".")[:2]) for name in core_modules() if name != "specdiff"}
    assert set(core["source_modules"]) == top_level


def lint_imports() -> Path:
    """The lint-imports of the interpreter running the tests: its scripts folder need not
    be on PATH (a virtual environment run by its python3 without activating it)."""
    beside = Path(sys.executable).parent / "lint-imports"
    found = beside if beside.exists() else shutil.which("lint-imports")
    assert found is not None, "lint-imports is not installed: python3 -m pip install -e '.[test]'"
    return Path(found)


def test_lint_imports_keeps_the_layers() -> None:
    completed = subprocess.run(
        [lint_imports(), "--no-cache"], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert completed.returncode == 0, completed.stdout[-4000:] + completed.stderr[-2000:]


def test_the_contracts_forbid_import_cycles_at_every_level() -> None:
    """Modules that import each other, even through a subpackage, cannot be read or
    changed one at a time: lint-imports refuses a cycle anywhere under specdiff."""
    contracts = pyproject()["tool"]["importlinter"]["contracts"]
    acyclic = [c for c in contracts if c["type"] == "acyclic_siblings"]
    assert [c["ancestors"] for c in acyclic] == [["specdiff"]]
    assert all("depth" not in c and "skip_descendants" not in c for c in acyclic)
