"""The kernel probe: repack auto/on/off, what each verdict makes a run do, and its cache.

This CPU's kernels do not crash, so the crash paths are driven by SPECDIFF_PROBE_FAULT
(read only in the probe's child). Each model test gets a cache directory of its own
(the bundled model linked in), so verdicts never leak between tests or into the user's
cache; whether a run probed is read from its "checking llama.cpp's kernels" line and
from the verdict files, never from timing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from specdiff.engine.llama.probe import Outcome, ProbeVerdict, judge
from specdiff.errors import LaneConfigError
from specdiff.lanes import Lane, lane_from_dict, load_pairs_file, parse_value
from tests.conftest import ROOT

FALLBACK_NOTE = "repack off (auto: repacked kernels crashed on this CPU, SIGSEGV)"
PROBING = "checking llama.cpp's kernels"
UNCACHED = "cannot keep the kernel probe's verdict"
COMBO = {
    "llama_cpp_python": "0.3.36",
    "llama_cpp_build": "0.5.0-dev",
    "system_info": "CPU : AVX2 = 1 | AVX512 = 1 | AMX_INT8 = 1 |",
    "cpu": "Intel Xeon",
    "n_ubatch": 512,
}


# --- repack's three values -------------------------------------------------------------


def test_repack_defaults_to_auto_and_reads_booleans_as_on_and_off() -> None:
    assert Lane().repack == "auto"
    assert (Lane(repack=True).repack, Lane(repack=False).repack) == ("on", "off")
    words = {"true": "on", "yes": "on", "1": "on", "false": "off", "off": "off", "AUTO": "auto"}
    for text, value in words.items():
        assert parse_value("repack", text) == value
    with pytest.raises(LaneConfigError, match="'repack' cannot be 'sometimes'"):
        Lane(repack="sometimes")


def test_sessions_and_pair_files_written_with_boolean_repack_still_load(tmp_path: Path) -> None:
    header = json.loads(
        (ROOT / "tests/data/ubatch-roman-empire.jsonl").read_text(encoding="utf-8").splitlines()[0]
    )
    assert header["lanes"]["a"]["repack"] is True
    assert lane_from_dict(header["lanes"]["a"]).repack == "on"
    pairs = tmp_path / "pairs.toml"
    pairs.write_text("[pairs.raw]\nfrom = 'ubatch'\nb = { repack = false }\n", encoding="utf-8")
    raw = load_pairs_file(pairs)["raw"]
    assert (raw.a.repack, raw.b.repack) == ("auto", "off")


# --- what a verdict means ------------------------------------------------------------


def judged(mode: str, on: bool | None, off: bool | None) -> ProbeVerdict:
    outcomes = {}
    for name, ok in (("on", on), ("off", off)):
        if ok is not None:
            outcomes[name] = Outcome(ok, "" if ok else "SIGSEGV", cached=True)
    return judge(mode, "k", outcomes, Path("model.gguf"), COMBO)


def test_auto_falls_back_to_repack_off_and_says_why() -> None:
    found = judged("auto", on=False, off=True)
    assert (found.chosen_repack, found.note, found.signal) == ("off", FALLBACK_NOTE, "SIGSEGV")
    assert found.message.startswith(FALLBACK_NOTE) and "numerics differ" in found.message
    assert (found.repack_on_ok, found.repack_off_ok, found.cached) == (False, True, True)
    assert judged("auto", on=True, off=None).chosen_repack == "on"


def test_repack_on_that_crashes_is_refused_with_the_fix() -> None:
    found = judged("on", on=False, off=True)
    assert found.chosen_repack == ""
    assert "SIGSEGV" in found.message and "--both repack=false" in found.message


def test_both_crashing_names_the_build_and_how_to_rebuild() -> None:
    found = judged("auto", on=False, off=False)
    assert found.chosen_repack == ""
    assert "llama.cpp 0.5.0-dev (llama-cpp-python 0.3.36)" in found.message
    assert "-DGGML_NATIVE=OFF -DGGML_AVX512=ON" in found.message
    assert "-DGGML_AMX_INT8=OFF" in found.message and "llama-cpp-python==0.3.36" in found.message


def test_repack_off_is_probed_alone() -> None:
    found = judged("off", on=None, off=True)
    assert (found.chosen_repack, found.note, found.repack_on_ok) == ("off", "repack off", None)


# --- real runs, crashes injected -------------------------------------------------------


def cache_with_model(tmp_path: Path, model_path: Path) -> Path:
    """A cache directory of its own that shares the bundled model (and its hash index)."""
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "models").symlink_to(model_path.parent, target_is_directory=True)
    return cache


def specdiff_run(cache: Path, *args: str, fault: str = "") -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "SPECDIFF_CACHE_DIR": str(cache)}
    env.pop("SPECDIFF_PROBE", None)
    env.pop("SPECDIFF_PROBE_FAULT", None)
    if fault:
        env["SPECDIFF_PROBE_FAULT"] = fault
    command = ["run", "--prompt", "The capital of France is", "--max-tokens", "2", *args]
    return subprocess.run(
        [sys.executable, "-m", "specdiff", *command],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        check=False,
    )


def verdict_files(cache: Path) -> dict[str, int]:
    """Each cached verdict and when it was written."""
    return {item.name: item.stat().st_mtime_ns for item in (cache / "probes").glob("*.json")}


def error_lines(completed: subprocess.CompletedProcess) -> list[str]:
    assert completed.returncode == 2, completed.stderr
    assert "Traceback" not in completed.stderr
    return [line for line in completed.stderr.splitlines() if line.startswith("specdiff: error:")]


@pytest.fixture(scope="module")
def fallback_runs(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> dict[str, Any]:
    """Two runs with repacked kernels that crash in the probe: the first probes and
    saves a session, the second finds the verdict cached."""
    tmp_path = tmp_path_factory.mktemp("fallback")
    cache = cache_with_model(tmp_path, model_path)
    sessions = tmp_path / "sessions"
    first = specdiff_run(
        cache, "--json", "--save", "--sessions-dir", str(sessions), fault="segv:on"
    )
    files = verdict_files(cache)
    second = specdiff_run(cache, "--json", fault="segv:on")
    return {
        "first": first,
        "second": second,
        "files": files,
        "files_after": verdict_files(cache),
        "sessions": sorted(sessions.glob("*.jsonl")),
    }


@pytest.mark.model
def test_auto_fallback_is_announced_and_recorded(fallback_runs: dict[str, Any]) -> None:
    first = fallback_runs["first"]
    assert first.returncode in (0, 1), first.stderr
    announced = [line for line in first.stderr.splitlines() if line.startswith(FALLBACK_NOTE)]
    assert len(announced) == 1, first.stderr
    data = json.loads(first.stdout)
    for side in ("a", "b"):
        executed = data["lanes"][side]["executed"]
        assert (executed["repack"], executed["repack_choice"]) == (False, FALLBACK_NOTE)
    # deferred: the session reader is only needed here
    from specdiff.sessions.store import load_session

    (saved,) = fallback_runs["sessions"]
    header = load_session(saved).header
    assert header.pair.a.repack == "auto"  # the lane as asked; executed says what ran
    assert header.executed["a"]["repack_choice"] == FALLBACK_NOTE
    assert header.executed["b"]["repack"] is False


@pytest.mark.model
def test_a_cached_verdict_starts_no_probe(fallback_runs: dict[str, Any]) -> None:
    first, second = fallback_runs["first"], fallback_runs["second"]
    assert PROBING in first.stderr
    written = fallback_runs["files"]
    assert len(written) == 2 and all(name.endswith(("-on.json", "-off.json")) for name in written)
    assert second.returncode in (0, 1), second.stderr
    assert PROBING not in second.stderr  # the probe's child was never started
    assert fallback_runs["files_after"] == fallback_runs["files"]  # nor a verdict rewritten
    assert FALLBACK_NOTE in second.stderr
    data = json.loads(second.stdout)
    assert data["lanes"]["a"]["executed"]["repack_choice"] == FALLBACK_NOTE


@pytest.mark.model
def test_explicit_repack_on_that_crashes_exits_2_with_the_fix(
    tmp_path: Path, model_path: Path
) -> None:
    cache = cache_with_model(tmp_path, model_path)
    completed = specdiff_run(cache, "--both", "repack=on", fault="segv:on")
    (line,) = error_lines(completed)
    assert "SIGSEGV" in line and "repack=off (--both repack=false)" in line


@pytest.mark.model
def test_both_crashing_exits_2_naming_the_build(tmp_path: Path, model_path: Path) -> None:
    cache = cache_with_model(tmp_path, model_path)
    completed = specdiff_run(cache, fault="ill")
    (line,) = error_lines(completed)
    assert "SIGILL" in line and "with repack on and off" in line
    assert "llama-cpp-python " in line and "CMAKE_ARGS=" in line and "GGML_NATIVE=OFF" in line


@pytest.mark.model
def test_unwritable_cache_still_probes_and_says_so_once(tmp_path: Path, model_path: Path) -> None:
    cache = cache_with_model(tmp_path, model_path)
    (cache / "probes").write_text("not a folder", encoding="utf-8")
    # the ubatch pair's lanes are two combinations: two probes of repack on, and where
    # this CPU crashes with it (AMX), two more of repack off; the failed writes are said
    # once
    completed = specdiff_run(cache, "--pair", "ubatch", "--json")
    assert completed.returncode in (0, 1), completed.stderr
    assert completed.stderr.count(f"{PROBING} on this CPU") == completed.stderr.count(PROBING)
    assert completed.stderr.count("with repack on (once") == 2, completed.stderr
    assert completed.stderr.count(UNCACHED) == 1, completed.stderr
    lanes = json.loads(completed.stdout)["lanes"]
    choices = {lanes[side]["executed"]["repack_choice"] for side in ("a", "b")}
    fell_back = completed.stderr.count("with repack off (once")
    assert (fell_back, choices) in ((0, {"repack on (auto)"}), (2, {FALLBACK_NOTE}))


@pytest.mark.model
def test_verdict_probes_once_then_reads_the_cache(
    tmp_path: Path, model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from specdiff.engine.llama.probe import verdict  # deferred: it loads llama.cpp

    monkeypatch.setenv("SPECDIFF_CACHE_DIR", str(cache_with_model(tmp_path, model_path)))
    monkeypatch.delenv("SPECDIFF_PROBE_FAULT", raising=False)
    first = verdict("default", n_ubatch=8)
    # repack on where this CPU runs it, off where it crashes (AMX): read, not assumed
    chosen = "on" if first.repack_on_ok else "off"
    assert (first.cached, first.chosen_repack) == (False, chosen)
    assert first.repack_on_ok in (True, False)
    again = verdict(model_path, repack="auto", n_ubatch=8)
    assert again.cached and again.key == first.key and again.chosen_repack == chosen
    assert verdict(model_path, n_ubatch=16).key != first.key


def system_info() -> str:
    code = "from specdiff.engine.runtime import build_info; print(build_info()['system_info'])"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    return done.stdout


@pytest.mark.model
def test_default_run_on_an_amx_cpu_falls_back_to_repack_off(
    tmp_path: Path, model_path: Path
) -> None:
    """Where llama.cpp's AMX kernels are built in and the CPU has them, the default run
    must succeed, the fallback said and recorded, with no fault injected."""
    if "AMX_INT8 = 1" not in system_info():
        pytest.skip("this CPU (or this llama.cpp build) has no AMX_INT8 in its system info")
    cache = cache_with_model(tmp_path, model_path)
    completed = specdiff_run(cache, "--json")
    assert completed.returncode in (0, 1), completed.stderr
    prefix = "repack off (auto: repacked kernels crashed on this CPU, SIG"
    assert prefix in completed.stderr
    executed = json.loads(completed.stdout)["lanes"]["a"]["executed"]
    assert executed["repack_choice"].startswith(prefix) and executed["repack"] is False


@pytest.mark.model
def test_a_pair_opened_as_a_library_is_probed_before_it_decodes(
    tmp_path: Path, model_path: Path
) -> None:
    """PairRun straight from Python, with no front end's probe before it: the lanes'
    own opening probes them, so repacked kernels that crash fall back, not kill it."""
    cache = cache_with_model(tmp_path, model_path)
    code = (
        "from specdiff.engine.pairrun import PairRun\n"
        "from specdiff.lanes import presets\n"
        "with PairRun(presets()['ubatch']) as run:\n"
        "    result = run.run('The capital of France is', 2)\n"
        "print(result.a.executed['repack_choice'])\n"
        "print(result.b.executed['repack_choice'])\n"
    )
    env = {**os.environ, "SPECDIFF_CACHE_DIR": str(cache), "SPECDIFF_PROBE_FAULT": "segv:on"}
    env.pop("SPECDIFF_PROBE", None)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == [FALLBACK_NOTE, FALLBACK_NOTE]
    assert len(verdict_files(cache)) == 4  # both lanes' combinations, on and off
