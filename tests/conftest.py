"""Shared fixtures (the real bundled model, assembled once per test run) and the guards
that keep the fast tier honest.

The suite has five markers, registered in pyproject.toml: `model` (llama-cpp-python and
the bundled model), `server` (a real server process), `browser` (headless Chromium),
`tui` (drives the Textual app or a real terminal; given here to every coroutine test and
every snapshot, since those are the ones that run the app) and `fuzz` (hundreds of
generated inputs per test). Everything unmarked is the fast tier,
`pytest -m "not model and not server and not browser and not tui and not fuzz"`. A test
that needs the model but lacks the marker would make that tier slow or make it fail
on a machine without llama.cpp, so both ways in are checked: asking for a model fixture,
and loading llama_cpp while the test runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import sys
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import settings

from specdiff.engine.models import bundled_model_path, make_variant
from specdiff.prompts import load as load_prompts
from tests.node_clients import PROMPTFOO

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

if TYPE_CHECKING:
    from textual.pilot import Pilot

__all__ = ["ROOT", "ForkingPrompt", "load_prompts", "pyproject", "wait_for"]

ROOT = Path(__file__).resolve().parent.parent

MODEL_FIXTURES = frozenset({"model_path", "q8_model_path", "forking_prompt"})
LLAMA = "llama_cpp"
_LLAMA_LOADED_BEFORE = pytest.StashKey[bool]()


@pytest.fixture(scope="session")
def model_path() -> Path:
    return bundled_model_path()


@pytest.fixture(scope="session")
def q8_model_path(model_path: Path) -> Path:
    return make_variant(model_path, "q8_0", threads=2)


FORK_SEARCH_SETS = ("divergence", "open")
"""Where `forking_prompt` looks, in order; the divergence set opens with the default prompt."""


@dataclass(frozen=True)
class ForkingPrompt:
    """A bundled prompt on which a pair forked, and the token where it did on this CPU."""

    prompt: str
    prompt_id: str
    fork_index: int


@pytest.fixture(scope="session")
def forking_prompt(model_path: Path) -> Callable[[str, int], ForkingPrompt]:
    """`forking_prompt(pair, max_tokens)`: the first bundled prompt on which the preset
    pair forks within `max_tokens`, both lanes generating all of them.

    Where greedy lanes fork depends on the CPU (its kernels round differently), so a test
    that needs a fork finds one here instead of assuming a prompt and an index. Searches
    are remembered for the whole test run."""
    found: dict[tuple[str, int], ForkingPrompt] = {}

    def search(pair: str, max_tokens: int) -> ForkingPrompt | None:
        # deferred: llama_cpp loads only once a model test asks for a fork
        from specdiff.engine.pairrun import PairRun
        from specdiff.lanes import presets

        with PairRun(presets()[pair]) as runner:
            for name in FORK_SEARCH_SETS:
                for entry in load_prompts(name):
                    result = runner.run(entry["prompt"], max_tokens)
                    fork = result.comparison.fork
                    full = len(result.a.steps) == len(result.b.steps) == max_tokens
                    if fork is not None and full:
                        return ForkingPrompt(entry["prompt"], entry["id"], fork.index)
        return None

    def find(pair: str, max_tokens: int) -> ForkingPrompt:
        if (pair, max_tokens) not in found:
            hit = search(pair, max_tokens)
            if hit is None:
                from specdiff.engine.runtime import cpu_name  # deferred, as above

                pytest.skip(
                    f"no prompt of the bundled sets {', '.join(FORK_SEARCH_SETS)} forks "
                    f"under {pair} within {max_tokens} tokens on this CPU ({cpu_name()})"
                )
            found[(pair, max_tokens)] = hit
        return found[(pair, max_tokens)]

    return find


@contextlib.contextmanager
def repacked(on: bool) -> Iterator[None]:
    """llama-cpp-python's `Llama`, made inside, loads its model with llama.cpp's repacked
    CPU kernels on or off. `Llama` has no such argument; it reads the model's default
    parameters, which this sets for the while. A reference must run the kernels of the
    lane it checks, and on a CPU where repacked kernels crash (AMX Xeons) the probe
    turned them off."""
    import llama_cpp.llama_cpp as low  # deferred: the fast tier never loads llama.cpp

    default = low.llama_model_default_params

    def params() -> Any:
        made = default()
        made.use_extra_bufts = on
        return made

    low.llama_model_default_params = params
    try:
        yield
    finally:
        low.llama_model_default_params = default


def pyproject() -> dict[str, Any]:
    """The repo's pyproject.toml, for tests that hold other files to its settings."""
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


async def wait_for(
    pilot: Pilot, condition: Callable[[], object], timeout: float = 120.0, what: str = ""
) -> None:
    """Let an app under Textual's pilot run (its workers stream, its timers fire) until
    it reaches a state, failing with `what` it waited for after `timeout` seconds.

    Polled every 50 ms: a pause with no delay would spin the loop and starve the worker
    threads the condition waits on."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or 'the app'}")
        await pilot.pause(0.05)


def wait_until(condition: Callable[[], object], what: str, timeout: float = 60.0) -> None:
    """Block until `condition()` holds (a process wrote a file, a server answered),
    failing with `what` it waited for after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def process_running(pid: int) -> bool:
    """Whether `pid` is a process that still runs: not gone, and neither a zombie (ended,
    its exit status waiting for its parent) nor dead."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # the command's name may hold spaces and parentheses: the state follows the last ")"
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


# Property tests: a few dozen generated inputs each in the fast tier, hundreds wherever
# the run includes the fuzz tier (the full suite, `-m fuzz`). No deadline in either: a
# deadline is a timed assert, and fails a property on a busy machine, not a broken one.
settings.register_profile("fast", max_examples=40, deadline=None)
settings.register_profile("deep", max_examples=100, deadline=None)


def pytest_configure(config: pytest.Config) -> None:
    # before the test modules are imported: each @settings reads the profile as it is made
    leaves_out_fuzz = "not fuzz" in (config.getoption("markexpr") or "")
    settings.load_profile("fast" if leaves_out_fuzz else "deep")
    pin_this_worker()


def worker_cores(cores: list[int], worker: int, workers: int) -> list[int]:
    """The cores of xdist worker `worker` of `workers`: an equal share of `cores`, or one
    core (shared round-robin) when there are more workers than cores."""
    if workers <= len(cores):
        return cores[worker::workers]
    return [cores[worker % len(cores)]]


def pin_this_worker() -> None:
    """Under pytest-xdist, each worker keeps to its own share of the cores. A lane
    decodes on every core its process may use (lanes.default_threads), so unpinned
    workers would each start a thread per core, and llama.cpp's threads, which spin
    while they wait for each other, would fight over the same cores."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not (name.startswith("gw") and name[2:].isdigit() and count.isdigit()):
        return  # one process: it keeps every core
    if not hasattr(os, "sched_setaffinity"):  # pragma: no cover - not Linux
        return
    cores = sorted(os.sched_getaffinity(0))
    workers = max(1, int(count))
    # a worker that replaces a crashed one takes a number past the count
    try:
        os.sched_setaffinity(0, worker_cores(cores, int(name[2:]) % workers, workers))
    except OSError:  # a sandbox that forbids it: the worker shares every core
        return


SNAPSHOT_FIXTURES = {"snap_compare"}


def _drives_the_app(item: pytest.Item) -> bool:
    """Pilot tests are coroutines and snapshots ask for snap_compare: both run the app,
    which takes seconds a test, so they leave the fast tier by construction rather than by
    each author remembering a marker."""
    function = getattr(item, "function", None)
    fixtures = set(getattr(item, "fixturenames", ()))
    return inspect.iscoroutinefunction(function) or bool(SNAPSHOT_FIXTURES & fixtures)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("tui") is None and _drives_the_app(item):
            item.add_marker(pytest.mark.tui)
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


@pytest.fixture
def promptfoo() -> Path:
    """The pinned promptfoo: a developer without it skips its tests with the command that
    installs it; CI, which installs it, fails instead of passing without running them."""
    if not PROMPTFOO.exists():
        message = "promptfoo is not installed: npm ci --prefix tests/clients"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return PROMPTFOO
