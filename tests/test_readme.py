"""The README's two commands are what a newcomer types; CI must run the same test command."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEST_COMMAND = "python3 -m pip install -e '.[test]' && python3 -m ruff check . && python3 -m pytest"
RUN_COMMAND = "python3 -m pip install -e . && specdiff"


def test_readme_states_both_commands() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert RUN_COMMAND in readme
    assert TEST_COMMAND in readme


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    script = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    commands = [line for line in script.splitlines() if line and not line.startswith("#")]
    assert commands[-1] == TEST_COMMAND
