"""The documentation cannot drift from the code where the code can say what is true: the
README stays a front page, the architecture page names every module, the CLI reference
holds every command's `--help`, and every link the README gives leads to a file."""

from __future__ import annotations

import importlib.util
import re
from types import ModuleType

import pytest

from specdiff.cli import build_parser, main
from tests.conftest import ROOT

DOCS = ROOT / "docs"
README_MOST_LINES = 200


def docs_hooks() -> ModuleType:
    """docs/hooks.py, the MkDocs hook that writes the CLI reference, imported by path (it
    is no package of the repo)."""
    spec = importlib.util.spec_from_file_location("specdiff_docs_hooks", DOCS / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


HOOKS = docs_hooks()
COMMANDS = [words for words, _ in HOOKS.command_parsers(build_parser())]


@pytest.fixture(scope="module")
def reference() -> str:
    return HOOKS.reference_markdown()


def test_the_readme_is_a_front_page() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MOST_LINES


def test_every_link_of_the_readme_leads_to_a_file() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme)
    local = [target for target in targets if "://" not in target]
    assert local, "the README links into the documentation"
    # the CLI reference is written while the site builds, so it is no file in the repo
    generated = {f"docs/{HOOKS.REFERENCE_PAGE}"}
    missing = [t for t in local if t not in generated and not (ROOT / t).exists()]
    assert missing == []


def test_the_architecture_page_names_every_module() -> None:
    page = (DOCS / "architecture.md").read_text(encoding="utf-8")
    package = ROOT / "specdiff"
    modules = sorted(path.relative_to(package).as_posix() for path in package.rglob("*.py"))
    assert len(modules) > 50
    missing = [module for module in modules if f"`{module}`" not in page]
    assert missing == []


def test_the_reference_covers_every_command() -> None:
    top_level = {words[1] for words in COMMANDS if len(words) == 2}
    listed = set(build_parser()._subparsers._group_actions[0].choices)  # type: ignore[union-attr]
    assert top_level == listed
    assert {"run", "live", "replay", "suite", "serve-pair"} <= top_level
    # subcommands are walked too
    assert ("specdiff", "sessions", "open") in COMMANDS


def real_help(words: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> str:
    """What `specdiff ... --help` prints in a terminal of the reference's width."""
    with pytest.raises(SystemExit) as done:
        main([*words[1:], "--help"])
    assert done.value.code == 0
    return capsys.readouterr().out


def reference_section(reference: str, words: tuple[str, ...]) -> str:
    """The fenced help text under the heading that names `words`."""
    heading = re.compile(rf"^#+ {re.escape(' '.join(words))}\n\n```text\n", re.MULTILINE)
    found = heading.search(reference)
    assert found is not None, f"no section for {' '.join(words)}"
    return reference[found.end() : reference.index("```\n", found.end())]


@pytest.mark.parametrize("words", COMMANDS, ids=" ".join)
def test_the_reference_is_each_commands_help(
    words: tuple[str, ...],
    reference: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", str(HOOKS.HELP_COLUMNS))
    shown = real_help(words, capsys)
    section = reference_section(reference, words)
    options = set(re.findall(r"(?<![\w-])--?[A-Za-z][\w-]*", shown))
    assert "-h" in options and "--help" in options
    assert {option for option in options if option not in section} == set()
    assert section == shown
