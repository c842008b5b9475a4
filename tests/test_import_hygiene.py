"""The headless core must never import Textual: it runs in suites, CI jobs and other
programs that have no screen."""

from __future__ import annotations

import subprocess
import sys

import pytest

CORE_MODULES = [
    "specdiff",
    "specdiff.steps",
    "specdiff.lanes",
    "specdiff.compare",
    "specdiff.engine.pairrun",
    "specdiff.reports.text",
    "specdiff.sessions.store",
    "specdiff.reports.export",
    "specdiff.reports.svg",
    "specdiff.prompts",
    "specdiff.cli",
    "specdiff.engine.gguf",
    "specdiff.engine.models",
    "specdiff.engine.runtime",
    "specdiff.engine.topk",
    "specdiff.engine.llama.drafts",
    "specdiff.engine.llama.lane",
]


@pytest.mark.parametrize("module", CORE_MODULES)
def test_core_module_does_not_load_textual(module: str) -> None:
    code = (
        "import importlib, sys\n"
        f"importlib.import_module({module!r})\n"
        "loaded = sorted(m for m in sys.modules if m == 'textual' or m.startswith('textual.'))\n"
        "print(','.join(loaded))\n"
        "sys.exit(1 if loaded else 0)\n"
    )
    completed = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert completed.returncode == 0, f"{module} loaded textual: {completed.stdout.strip()}"


def test_the_check_itself_sees_textual() -> None:
    """Guard against a check that cannot fail: importing textual is detected."""
    code = "import sys, textual\nsys.exit(0 if 'textual' in sys.modules else 1)\n"
    completed = subprocess.run([sys.executable, "-c", code], timeout=120)
    assert completed.returncode == 0
