"""One job per module, function and class: a file past 600 lines, a function past 50 or a
class past 30 methods is doing several, and cannot be read or changed one job at a time.

The limits are counted with Python's own parser, so a decorator, a docstring or a blank
line inside a function counts as the reader sees it. A few functions are declarative
tables (an argparse builder lists options; a preset list lists presets): splitting one
would scatter what is read as one list, so each is named below with why."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from tests.conftest import ROOT, pyproject

PACKAGE = ROOT / "specdiff"
MODULE_LINES = 600
FUNCTION_LINES = 50
CLASS_METHODS = 30

ARGPARSE_BUILDER = (
    "an argparse builder: one option after another, each a call of a few lines, read "
    "top to bottom as the command's --help lists them"
)
# "path:function" -> why it may be longer than FUNCTION_LINES
DECLARATIVE_TABLES: dict[str, str] = {
    "specdiff/cli/explain.py:add_parser": ARGPARSE_BUILDER,
    "specdiff/cli/repeat.py:add_parser": ARGPARSE_BUILDER,
    "specdiff/cli/serve_pair.py:add_parser": ARGPARSE_BUILDER,
}


def sources() -> Iterator[tuple[str, ast.Module, int]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        yield path.relative_to(ROOT).as_posix(), ast.parse(text), len(text.splitlines())


def functions() -> Iterator[tuple[str, int]]:
    """Every function and method, nested ones too, as ("path:name", lines)."""
    for path, tree, _ in sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                yield f"{path}:{node.name}", node.end_lineno - first + 1


def test_no_module_is_over_600_lines() -> None:
    long = {path: lines for path, _, lines in sources() if lines > MODULE_LINES}
    assert long == {}


def test_no_function_is_over_50_lines_but_the_declarative_tables() -> None:
    long = {
        name: lines
        for name, lines in functions()
        if lines > FUNCTION_LINES and name not in DECLARATIVE_TABLES
    }
    assert long == {}


def test_every_named_table_is_still_there_and_still_long() -> None:
    """A table that was split or removed leaves the list, so the list cannot excuse a new
    long function that happens to take the name."""
    lengths = dict(functions())
    stale = {
        name: lengths.get(name)
        for name in DECLARATIVE_TABLES
        if lengths.get(name, 0) <= FUNCTION_LINES
    }
    assert stale == {}


def test_no_class_has_over_30_methods() -> None:
    crowded = {}
    for path, tree, _ in sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                methods = [
                    item
                    for item in node.body
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
                ]
                if len(methods) > CLASS_METHODS:
                    crowded[f"{path}:{node.name}"] = len(methods)
    assert crowded == {}


def test_the_counter_sees_long_functions_and_crowded_classes() -> None:
    """The checks above pass on any tree they fail to read: show that they read one."""
    body = "\n".join(f"    x{i} = {i}" for i in range(FUNCTION_LINES))
    tree = ast.parse(f"@decorator\ndef long():\n{body}\n")
    node = tree.body[0]
    assert isinstance(node, ast.FunctionDef) and node.end_lineno is not None
    assert node.end_lineno - node.decorator_list[0].lineno + 1 == FUNCTION_LINES + 2
    assert sum(1 for _ in functions()) > 1000


def test_type_checking_imports_count_for_the_layers() -> None:
    """An import under `if TYPE_CHECKING:` is a dependency a reader must follow all the
    same: a helper that names the screen it drives there is the screen's mixin in
    disguise, so the acyclic contract must see it."""
    assert pyproject()["tool"]["importlinter"]["exclude_type_checking_imports"] is False
