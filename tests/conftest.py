"""Shared fixtures (the real bundled model, assembled once per test run) and the guards
that keep the fast tier honest.

The suite has three markers, registered in pyproject.toml: `model` (llama-cpp-python and
the bundled model), `server` (a real server process) and `browser` (headless Chromium).
Everything unmarked is the fast tier, `pytest -m "not model and not server and not
browser"`. A test that needs the model but lacks the marker would make that tier slow or
make it fail on a machine without llama.cpp, so both ways in are checked: asking for a
model fixture, and loading llama_cpp while the test runs.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from specdiff.engine.models import bundled_model_path, make_variant
from specdiff.prompts import load as load_prompts

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

if TYPE_CHECKING:
    from textual.pilot import Pilot

__all__ = ["ROOT", "load_prompts", "pyproject", "wait_for"]

ROOT = Path(__file__).resolve().parent.parent

MODEL_FIXTURES = frozenset({"model_path", "q8_model_path"})
LLAMA = "llama_cpp"
_LLAMA_LOADED_BEFORE = pytest.StashKey[bool]()


@pytest.fixture(scope="session")
def model_path() -> Path:
    return bundled_model_path()


@pytest.fixture(scope="session")
def q8_model_path(model_path: Path) -> Path:
    return make_variant(model_path, "q8_0", threads=2)


def pyproject() -> dict[str, Any]:
    """The repo's pyproject.toml, for tests that hold other files to its settings."""
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


async def wait_for(pilot: Pilot, condition: Callable[[], object], timeout: float = 120.0) -> None:
    """Let an app under Textual's pilot run (its workers stream, its timers fire) until
    it reaches a state."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for the app")
        await pilot.pause(0.05)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    unmarked = [
        item.nodeid
        for item in items
        if MODEL_FIXTURES & set(getattr(item, "fixturenames", ()))
        and item.get_closest_marker("model") is None
    ]
    if unmarked:
        raise pytest.UsageError(
            "these tests use the bundled model but are not marked @pytest.mark.model: "
            + ", ".join(unmarked)
        )


def pytest_collection_finish(session: pytest.Session) -> None:
    # once loaded, llama_cpp stays in sys.modules and the per-test check below sees nothing
    if LLAMA in sys.modules:
        raise pytest.UsageError(
            "importing the test modules loaded llama_cpp: import it inside the model tests"
        )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, object, object]:
    item.stash[_LLAMA_LOADED_BEFORE] = LLAMA in sys.modules
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, object, object]:
    result = yield
    loaded_here = not item.stash.get(_LLAMA_LOADED_BEFORE, True) and LLAMA in sys.modules
    if loaded_here and item.get_closest_marker("model") is None:
        pytest.fail(
            f"{item.nodeid} loaded llama_cpp but is not marked @pytest.mark.model; "
            "unmarked tests form the fast tier, which runs without the model",
            pytrace=False,
        )
    return result
