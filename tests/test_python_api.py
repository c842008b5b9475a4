"""docs/reference/python-api.md runs as written: every Python block of the page, each in
a fresh namespace from the repository root, on the bundled model; and what the blocks
print agrees with the command line on the same input."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

from specdiff import api
from specdiff.cli import main
from specdiff.errors import SpecdiffError

ROOT = Path(__file__).parent.parent
PAGE = ROOT / "docs" / "reference" / "python-api.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```$", PAGE.read_text(encoding="utf-8"), re.M | re.S)


def test_the_page_has_an_example_of_each_function() -> None:
    text = "".join(BLOCKS)
    for name in api.__all__:
        assert f"api.{name}(" in text, name


LOADS_MODEL = ("run_pair(", "run_suite(", "certify(")


@pytest.mark.parametrize(
    "number",
    [
        pytest.param(n, marks=[pytest.mark.model] if any(c in b for c in LOADS_MODEL) else [])
        for n, b in enumerate(BLOCKS)
    ],
)
def test_each_example_runs(number: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(BLOCKS[number], f"{PAGE.name} block {number + 1}", "exec"), {})
    assert printed.getvalue().strip(), "each example shows what it found"


def test_the_import_example_says_what_the_command_says(capsys) -> None:
    a, b = "tests/data/imports/lm-eval-a", "tests/data/imports/lm-eval-b"
    main(["import", "lm-eval", str(ROOT / a), str(ROOT / b)])
    assert api.import_lm_eval(ROOT / a, ROOT / b).summary_line() == capsys.readouterr().out.strip()


def test_a_bad_budget_is_refused_before_any_model_loads() -> None:
    with pytest.raises(SpecdiffError, match="max_tokens must be at least 1, got 0"):
        api.run_pair("x", max_tokens=0)
