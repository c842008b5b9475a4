"""Probe a llama.cpp build before trusting it: does a short decode survive on this CPU?

On some CPUs (Intel Xeons with AMX) llama.cpp's repacked CPU kernels crash in the
first decode (SIGSEGV in-process, SIGILL in llama-server), while the same build with
repack off works. So before the first real run of a combination (llama.cpp build,
system info, model sha256, repack, n_ubatch) a short probe runs in a child process:
a prompt decoded in a batch wider than 1, a verify-width batch (a speculative step)
and a few single-token steps. A crash ends the child, not the caller. The verdict is
kept as a small JSON file in specdiff's cache directory, so later runs pay only for
reading it.

A lane's ``repack`` decides what a verdict means: ``auto`` falls back to repack off
(said in one line, and recorded, because the numerics differ), ``on`` refuses to run
with the fix named, and when both crash the build itself is named with a rebuild
command. ``SPECDIFF_PROBE_FAULT=KIND[:on|off|both]`` (KIND: segv, abort, ill), read
only in the probe's child, makes it die by that signal, so every path is testable on
any CPU; ``SPECDIFF_PROBE=off`` skips the probe (auto then means llama.cpp's default, on,
and the executed record says it was not probed).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specdiff.engine.faults import Fault
from specdiff.engine.models import base_model_path, cache_dir, resolve_model, sha256_file
from specdiff.errors import LaneConfigError, SpecdiffError, lane_failure, printable
from specdiff.files import write_text_atomic
from specdiff.lanes import REPACK_WORDS, Lane, LaneId, Pair, default_threads

if TYPE_CHECKING:
    from specdiff.engine.llama.context import RepackChoice

Progress = Callable[[str], None]


@dataclass(frozen=True)
class ProbeVerdict:
    """What the probe found for one model on this build and CPU."""

    key: str
    """The cache key of the combination: build, system info, model sha256, n_ubatch."""
    cached: bool
    """True when every outcome came from the cache and no probe ran."""
    repack_on_ok: bool | None
    """The probe survived with repack on (None: not probed, or it could not run)."""
    repack_off_ok: bool | None
    """The probe survived with repack off (None: not probed, or it could not run)."""
    signal: str
    """The signal (e.g. SIGSEGV) that ended the first failed probe, else ""."""
    chosen_repack: str
    """"on" or "off": what a lane asking for `repack` runs with; "" when it must not run."""
    message: str
    """One line for the user: what was found and, on failure, the fix."""
    note: str = ""
    """What a lane's executed record says about repack, e.g.
    "repack off (auto: repacked kernels crashed on this CPU, SIGSEGV)"."""


def _quiet(_: str) -> None:
    return None


def verdict(
    model_path_or_default: str | Path = "default",
    repack: str = "auto",
    n_ubatch: int = 512,
    *,
    threads: int | None = None,
    progress: Progress = _quiet,
) -> ProbeVerdict:
    """The probe's verdict for a model ("default": the bundled one), from the cache or
    by running the probe now. `repack` is "auto", "on" or "off" (or a bool)."""
    mode = REPACK_WORDS.get(str(repack).strip().lower())
    if mode is None:
        raise LaneConfigError(f"repack must be auto, on or off, got {repack!r}")
    path = base_model_path(str(model_path_or_default), progress)
    return Prober(progress).verdict(path, mode, n_ubatch, threads or default_threads())


class ProbeFailed(SpecdiffError):
    """llama.cpp's kernels crash on this CPU in the configuration a lane asks for."""


PROBE_FAULT_ENV = "SPECDIFF_PROBE_FAULT"
PROBE_ENV = "SPECDIFF_PROBE"
PROBE_MAIN = (
    # as the worker's: the current folder first on sys.path could shadow installed packages
    "import sys; sys.path.pop(0); from specdiff.engine.llama.probe import probe_main; probe_main()"
)
PROBE_SECONDS = 300.0
"""A probe that runs longer is stuck, not crashed: the run goes ahead unprobed."""
PROBE_TEXT = "The quick brown fox jumps over the lazy dog, and the dog does not mind at all. "
PROMPT_WIDTH = 32
"""Prompt tokens decoded at once: wide enough for every batched kernel (gemm for >= 4 rows)."""
VERIFY_WIDTH = 8
"""Rows of the speculative-step batch, all with logits."""
SINGLE_STEPS = 3
PROBE_CTX = 128
NOT_PROBED = 3
"""The child's exit status when it could not run the probe (a Python error, a bad file)."""
CRASH_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGILL, signal.SIGABRT, signal.SIGBUS})
REBUILD = (
    'CMAKE_ARGS="-DGGML_NATIVE=OFF{avx512} -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF '
    '-DGGML_AMX_BF16=OFF" pip install --force-reinstall --no-cache-dir llama-cpp-python=={version}'
)


@dataclass(frozen=True)
class Outcome:
    """One probe with repack on or off: ok True (it survived), False (a crash) or None
    (it could not run, so it says nothing about the kernels)."""

    ok: bool | None
    signal: str = ""
    detail: str = ""
    cached: bool = False


# --- the cache key -------------------------------------------------------------------


def combination(path: Path, n_ubatch: int) -> dict[str, Any]:
    """What a verdict holds for: the build (versions and the libraries' files), the CPU
    and its system info, the model's sha256 (from the hash index) and n_ubatch."""
    # deferred: llama.cpp loads only where a probe is asked for
    from specdiff.engine.runtime import build_info, llama

    build = build_info()
    return {
        **{key: build[key] for key in ("llama_cpp_python", "llama_cpp_build", "system_info")},
        "cpu": build["cpu"],
        "libraries": _library_stamp(llama()),
        "model_sha256": sha256_file(path),
        "n_ubatch": n_ubatch,
    }


def _library_stamp(lib: Any) -> list[str]:
    """Name, size and mtime of llama.cpp's shared libraries: a rebuild with other flags
    keeps the version numbers but not the files."""
    loaded = getattr(getattr(lib, "_lib", None), "_name", None)
    if not loaded:
        return []
    folder = Path(loaded).parent
    stamps = []
    try:
        for item in sorted(folder.iterdir()):
            if any(ext in item.name for ext in (".so", ".dylib", ".dll")):
                stat = item.stat()
                stamps.append(f"{item.name}:{stat.st_size}:{stat.st_mtime_ns}")
    except OSError:
        return [str(loaded)]
    return stamps


def combination_key(combo: dict[str, Any]) -> str:
    text = json.dumps(combo, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:24]


def probes_dir() -> Path:
    return cache_dir() / "probes"


# --- the parent's side ---------------------------------------------------------------


class Prober:
    """Verdicts for one command: each combination probed at most once, cached on disk,
    and an unwritable cache said once."""

    def __init__(self, progress: Progress = _quiet) -> None:
        self.progress = progress
        self._uncached_said = False
        self._verdicts: dict[tuple[Path, str, int], ProbeVerdict] = {}

    def verdict(self, path: Path, mode: str, n_ubatch: int, threads: int) -> ProbeVerdict:
        memo = (path.resolve(), mode, n_ubatch)
        if memo not in self._verdicts:
            combo = combination(path, n_ubatch)
            key = combination_key(combo)
            outcomes: dict[str, Outcome] = {}
            # a lane's own setting first; the other only to say what would work instead
            first = "off" if mode == "off" else "on"
            outcomes[first] = self._outcome(path, combo, key, first, threads)
            if outcomes[first].ok is False:
                second = "on" if first == "off" else "off"
                outcomes[second] = self._outcome(path, combo, key, second, threads)
            self._verdicts[memo] = judge(mode, key, outcomes, path, combo)
        return self._verdicts[memo]

    def _outcome(
        self, path: Path, combo: dict[str, Any], key: str, repack: str, threads: int
    ) -> Outcome:
        file = probes_dir() / f"{key}-repack-{repack}.json"
        known = _recall(file, combo)
        if known is not None:
            return known
        self.progress(
            f"checking llama.cpp's kernels on this CPU: a short decode of {path.name} with "
            f"repack {repack} (once per build, model and n_ubatch)"
        )
        started = time.monotonic()
        found = run_probe(path, repack == "on", int(combo["n_ubatch"]), threads)
        if found.ok is not None:
            record = {
                "combination": combo,
                "repack": repack,
                "ok": found.ok,
                "signal": found.signal,
                "seconds": round(time.monotonic() - started, 3),
            }
            self._remember(file, record)
        return found

    def _remember(self, file: Path, record: dict[str, Any]) -> None:
        try:
            file.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(file, json.dumps(record, indent=1, sort_keys=True) + "\n")
        except OSError as error:
            if not self._uncached_said:
                self._uncached_said = True
                self.progress(
                    f"cannot keep the kernel probe's verdict in {file.parent} "
                    f"({error.strerror or error}), so the probe runs again next time; make "
                    "that folder writable or set SPECDIFF_CACHE_DIR"
                )


def _recall(file: Path, combo: dict[str, Any]) -> Outcome | None:
    try:
        record = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("combination") != combo:
        return None  # damaged, or another combination with the same short key
    ok, name = record.get("ok"), record.get("signal", "")
    if not isinstance(ok, bool) or not isinstance(name, str):
        return None
    return Outcome(ok, name, cached=True)


def run_probe(path: Path, repack: bool, n_ubatch: int, threads: int) -> Outcome:
    """The probe in a child process: how it ended."""
    command = [
        sys.executable,
        "-c",
        PROBE_MAIN,
        str(path),
        "on" if repack else "off",
        str(n_ubatch),
        str(threads),
    ]
    try:
        done = subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=PROBE_SECONDS,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return Outcome(None, detail=f"it did not finish within {PROBE_SECONDS:.0f} s")
    code = done.returncode
    if code == 0:
        return Outcome(True)
    if code < 0 and -code in CRASH_SIGNALS:
        return Outcome(False, signal.Signals(-code).name)
    lines = done.stderr.decode("utf-8", "replace").strip().splitlines()
    return Outcome(None, detail=printable(lines[-1]) if lines else f"exit status {code}")


def judge(
    mode: str, key: str, outcomes: dict[str, Outcome], path: Path, combo: dict[str, Any]
) -> ProbeVerdict:
    """What a lane asking for repack `mode` runs with, and the line that says why."""
    first = "off" if mode == "off" else "on"
    second = "on" if first == "off" else "off"
    failed = outcomes[first]
    on, off = outcomes.get("on"), outcomes.get("off")

    def made(chosen: str, message: str, note: str = "") -> ProbeVerdict:
        return ProbeVerdict(
            key=key,
            cached=all(outcome.cached for outcome in outcomes.values()),
            repack_on_ok=on.ok if on is not None else None,
            repack_off_ok=off.ok if off is not None else None,
            signal=failed.signal,
            chosen_repack=chosen,
            message=message,
            note=note or (f"repack {chosen} (auto)" if mode == "auto" else f"repack {chosen}"),
        )

    where = f"in a short probe decode of {path.name}"
    if failed.ok is not False:
        passed = "passed" if failed.ok else f"could not run ({failed.detail})"
        return made(first, f"llama.cpp's kernels with repack {first}: the probe {passed}")
    if outcomes[second].ok is False:
        return made("", _both_crash(failed.signal, where, combo))
    if mode == "auto":
        note = f"repack off (auto: repacked kernels crashed on this CPU, {failed.signal})"
        return made(
            "off",
            f"{note}: llama.cpp's repacked CPU kernels crashed {where}, so the lanes run "
            "without them, and their numerics differ from repack on",
            note,
        )
    if mode == "on":
        return made(
            "",
            f"llama.cpp's repacked CPU kernels crash on this CPU ({failed.signal} {where}, "
            "which passes with repack off): set repack=off (--both repack=false) or repack=auto",
        )
    return made(
        "",
        f"llama.cpp crashes on this CPU with repack off ({failed.signal} {where}, which "
        "passes with repack on): set repack=on or repack=auto (--both repack=auto)",
    )


def _both_crash(name: str, where: str, combo: dict[str, Any]) -> str:
    version = combo["llama_cpp_python"]
    avx512 = " -DGGML_AVX512=ON" if "AVX512 = 1" in combo["system_info"] else ""
    return (
        f"llama.cpp {combo['llama_cpp_build']} (llama-cpp-python {version}) crashes on this "
        f"CPU ({combo['cpu']}) with repack on and off ({name} {where}); rebuild "
        "llama-cpp-python without the native kernels at fault: "
        + REBUILD.format(avx512=avx512, version=version)
    )


def trust_kernels(pair: Pair, progress: Progress) -> None:
    """Probe both lanes of a pair before they load: see trust_lanes."""
    trust_lanes((("a", pair.a), ("b", pair.b)), progress)


def trust_lanes(lanes: Iterable[tuple[LaneId, Lane]], progress: Progress) -> None:
    """Probe each local lane's combination (cached after the first time) and record what
    its model runs with; a fallback is said once for all the lanes, a lane that must not
    run raises ProbeFailed, and any failure names the lane it belongs to (a missing model
    is that lane's). SPECDIFF_PROBE=off skips it. Call it in the process that then opens
    the lanes, before it does."""
    if os.environ.get(PROBE_ENV) == "off":
        return
    # deferred: the choice lives beside the model loader, which loads llama.cpp
    from specdiff.engine.llama.context import RepackChoice, decide_repack

    prober = Prober(progress)
    said: set[str] = set()
    for lane_id, lane in lanes:
        if lane.backend != "local":
            continue  # a server lane's model only tokenizes; its server decodes
        with lane_failure(lane_id):
            path = resolve_model(lane.model, lane.quant, lane.threads, progress)
            found = prober.verdict(path, lane.repack, lane.n_ubatch, lane.threads)
            if not found.chosen_repack:
                raise ProbeFailed(found.message)
        if found.signal and found.message not in said:
            said.add(found.message)
            progress(found.message)
        decide_repack(path, lane, RepackChoice(found.chosen_repack == "on", found.note))


def trusted_repack(lane_id: LaneId, lane: Lane, path: Path, progress: Progress) -> RepackChoice:
    """The repack choice a local lane's model at `path` loads with, probing its
    combination first when no probe has decided it in this process. Every way into the
    decode loop comes through here, so a library caller or a test that opens a lane
    without the front end's probe meets a kernel that crashes on this CPU in the
    probe's child process, not in its own."""
    # deferred: the choice lives beside the model loader, which loads llama.cpp
    from specdiff.engine.llama.context import repack_choice, repack_decided

    if not repack_decided(lane, path):
        trust_lanes(((lane_id, lane),), progress)
    return repack_choice(lane, path)


# --- the probe's child ---------------------------------------------------------------


def probe_main() -> None:
    """The child's main: MODEL on|off N_UBATCH THREADS; exit 0 when the decode survived."""
    path, repack = Path(sys.argv[1]), sys.argv[2] == "on"
    try:
        probe_decode(path, repack, int(sys.argv[3]), int(sys.argv[4]))
    except Exception as error:  # not the kernels: the parent says the probe could not run
        sys.stderr.write(f"{type(error).__name__}: {error}\n")
        sys.exit(NOT_PROBED)


def probe_decode(path: Path, repack: bool, n_ubatch: int, threads: int) -> None:
    """The decode shapes a run uses: a wide prompt batch, a verify batch with logits on
    every row, then single-token steps."""
    import numpy as np

    from specdiff.engine.llama.context import Context, LoadedModel

    lane = Lane(
        n_ctx=PROBE_CTX,
        n_batch=max(n_ubatch, PROMPT_WIDTH),
        n_ubatch=n_ubatch,
        threads=threads,
        repack="on" if repack else "off",
    )
    model = LoadedModel(path, repack)
    _injected_fault(repack)
    context = Context(model, lane, threading.Event())
    text = PROBE_TEXT
    while len(prompt := model.tokenize(text)) < PROMPT_WIDTH:
        text += PROBE_TEXT
    prompt = prompt[:PROMPT_WIDTH]
    context.decode(prompt, 0, all_logits=False)
    verify = [int(np.argmax(context.row(-1))), *prompt[1:VERIFY_WIDTH]]
    context.decode(verify, len(prompt), all_logits=True)
    position = len(prompt) + len(verify)
    for _ in range(SINGLE_STEPS):
        context.decode([int(np.argmax(context.row(-1)))], position, all_logits=False)
        position += 1
    context.close()
    model.close()


def _injected_fault(repack: bool) -> None:
    """SPECDIFF_PROBE_FAULT=KIND[:on|off|both]: die by that signal where the first decode
    would run, with repack on, off, or either (the default)."""
    kind, _, when = os.environ.get(PROBE_FAULT_ENV, "").partition(":")
    if not kind:
        return
    if kind not in Fault.KINDS or when not in ("", "both", "on" if repack else "off"):
        return
    signal.signal(Fault.KINDS[kind], signal.SIG_DFL)
    os.kill(os.getpid(), Fault.KINDS[kind])
