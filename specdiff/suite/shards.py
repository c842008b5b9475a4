"""A suite split into shards: each of N machines (a Kubernetes Indexed Job's pods, a Slurm
array's tasks) runs the units of work that hash to its shard into a report folder of its
own, and `specdiff suite merge` puts the folders together into one report.

A unit of work is one prompt run under one variant of the suite (a pair, at a weight type
and a prompt length: `SuiteSettings.variants`). Its key is the sha256 of the variant's
label, the prompt's id and its text, and its shard follows from the key alone, never from
its place in the prompt file: adding a prompt adds its own units to the shards, and moves
no other unit. The shards' sizes are as even as a hash makes them, not equal.

Each shard's folder holds shard.json: which shard of how many it is, the identity of the
whole suite (a digest of its settings, its prompts and specdiff's version), so that only
shards of one suite merge, and the machines it ran on, one entry per invocation (a shard
resumed elsewhere names both).
"""

from __future__ import annotations

import hashlib
import json
import platform
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from specdiff import __version__
from specdiff.errors import printable
from specdiff.files import write_text_atomic
from specdiff.suite import SuiteError
from specdiff.suite.folder import SHARD_FILE
from specdiff.suite.prompts import SuitePrompt
from specdiff.suite.settings import RESUMED_DEFAULTS, RESUMED_KEYS, SuiteSettings

SHARDS_VARIABLE = "SPECDIFF_SHARDS"
"""How many shards `--shard auto` splits into under a Kubernetes Indexed Job, where no
variable says (set it to the Job's `completions`), unless --shards gives the number."""
MAX_SHARDS = 100_000
CPU_FLAGS = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
    "asimd",
    "sve",
)
"""The CPU flags (as /proc/cpuinfo names them) that pick llama.cpp's kernels."""


@dataclass(frozen=True)
class SuiteUnit:
    """One prompt under one variant of the suite: the unit a shard runs."""

    label: str
    """The variant's label (`SuiteSettings.variants`), e.g. spec-vs-plain@q8_0."""
    prompt: SuitePrompt
    key: str
    """`unit_key(label, prompt)`: what places the unit in its shard."""


def unit_key(label: str, prompt: SuitePrompt) -> str:
    """The unit's stable key: sha256 of its variant's label, the prompt's id and text."""
    text = json.dumps([label, prompt.id, prompt.prompt], ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def suite_units(settings: SuiteSettings, prompts: Sequence[SuitePrompt]) -> list[SuiteUnit]:
    """Every unit of the suite with its key, in the suite's order (variant, then prompt)."""
    return [
        SuiteUnit(label, prompt, unit_key(label, prompt))
        for label, _pair, _quant in settings.variants()
        for prompt in prompts
    ]


@dataclass(frozen=True)
class Shard:
    """Shard `index` of `count`, numbered from 1 (as `--shard 2/3` names it)."""

    index: int
    count: int

    def holds(self, key: str) -> bool:
        """Whether the unit with this key (`unit_key`) is this shard's."""
        return shard_of(key, self.count) == self.index

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def shard_of(key: str, count: int) -> int:
    """The shard (from 1) of `count` that the unit with this key belongs to."""
    return int(key[:16], 16) % count + 1


def prompts_by_label(
    settings: SuiteSettings, prompts: list[SuitePrompt], shard: Shard | None
) -> dict[str, list[SuitePrompt]]:
    """Per variant label, the prompts it runs: all of them without a shard (nothing is
    hashed), else those whose unit is the shard's."""
    labels = [label for label, _pair, _quant in settings.variants()]
    if shard is None:
        return {label: prompts for label in labels}
    chosen: dict[str, list[SuitePrompt]] = {label: [] for label in labels}
    for unit in suite_units(settings, prompts):
        if shard.holds(unit.key):
            chosen[unit.label].append(unit.prompt)
    return chosen


def parse_shard(value: str, shards: int | None, environ: Mapping[str, str]) -> Shard:
    """`--shard i/N`, or `auto`: the index from Kubernetes' JOB_COMPLETION_INDEX (from 0;
    N from --shards or SPECDIFF_SHARDS) or a Slurm array's SLURM_ARRAY_TASK_ID (N from
    SLURM_ARRAY_TASK_COUNT, the first task being SLURM_ARRAY_TASK_MIN)."""
    if value.strip().lower() == "auto":
        return _auto_shard(shards, environ)
    index, slash, count = value.partition("/")
    if not slash or not index.strip().isdigit() or not count.strip().isdigit():
        raise SuiteError(f"--shard {printable(value, 40)!r} is not i/N; give e.g. --shard 2/3")
    shard = _checked(int(index), int(count), f"--shard {value.strip()}")
    if shards is not None and shards != shard.count:
        raise SuiteError(f"--shard {shard} splits into {shard.count}, --shards {shards}; drop one")
    return shard


def _auto_shard(shards: int | None, environ: Mapping[str, str]) -> Shard:
    if "JOB_COMPLETION_INDEX" in environ:
        index = _whole(environ, "JOB_COMPLETION_INDEX")
        count = shards if shards is not None else _count(environ)
        return _checked(index + 1, count, f"JOB_COMPLETION_INDEX={index}")
    if "SLURM_ARRAY_TASK_ID" in environ:
        task = _whole(environ, "SLURM_ARRAY_TASK_ID")
        first = _whole(environ, "SLURM_ARRAY_TASK_MIN") if "SLURM_ARRAY_TASK_MIN" in environ else 0
        count = shards if shards is not None else _whole(environ, "SLURM_ARRAY_TASK_COUNT")
        return _checked(task - first + 1, count, f"SLURM_ARRAY_TASK_ID={task} (from {first})")
    raise SuiteError(
        "--shard auto reads JOB_COMPLETION_INDEX (Kubernetes Indexed Job) or "
        "SLURM_ARRAY_TASK_ID (Slurm array), and neither is set; give --shard i/N"
    )


def _count(environ: Mapping[str, str]) -> int:
    if SHARDS_VARIABLE not in environ:
        raise SuiteError(
            f"--shard auto under a Kubernetes Indexed Job needs the number of shards: give "
            f"--shards N or set {SHARDS_VARIABLE} to the Job's completions"
        )
    return _whole(environ, SHARDS_VARIABLE)


def _whole(environ: Mapping[str, str], name: str) -> int:
    value = environ[name].strip()
    if not value.isdigit():
        raise SuiteError(f"{name}={printable(value, 40)!r} is not a whole number")
    return int(value)


def _checked(index: int, count: int, given: str) -> Shard:
    if not 1 <= count <= MAX_SHARDS:
        raise SuiteError(f"{given}: the number of shards must be from 1 to {MAX_SHARDS}")
    if not 1 <= index <= count:
        raise SuiteError(f"{given}: there is no shard {index} of {count}; shards run 1 to {count}")
    return Shard(index, count)


def suite_identity(settings: SuiteSettings, prompts: Sequence[SuitePrompt]) -> str:
    """sha256 of what makes two shards parts of one suite: specdiff's version, the prompts
    and every setting a resumed suite must share (not the prompt file's path, which may
    differ from one machine to another)."""
    data = settings.as_json(prompts)
    shared = {key: data.get(key, RESUMED_DEFAULTS.get(key)) for key in RESUMED_KEYS}
    text = json.dumps({"specdiff": __version__, **shared}, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def this_machine(now: str) -> dict[str, Any]:
    """Where this invocation runs: host, CPU and its kernel-picking flags, the llama.cpp
    binding's version (read from its package metadata: nothing is loaded)."""
    name, flags = _cpuinfo()
    return {
        "host": socket.gethostname(),
        "cpu": name or platform.processor() or "unknown",
        "cpu_flags": [flag for flag in CPU_FLAGS if flag in flags],
        "llama_cpp_python": _version("llama-cpp-python"),
        "platform": platform.platform(),
        "started": now,
    }


def _cpuinfo() -> tuple[str, set[str]]:
    """The CPU's model name and flags from /proc/cpuinfo (empty where there is none)."""
    name, flags = "", set[str]()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and not name:
                    name = value.strip()
                elif key.strip() in ("flags", "Features") and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    return name, flags


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def resumed_shard(report_dir: Path, given: Shard | None) -> Shard | None:
    """The shard a resumed folder holds (None: a whole suite's); a --shard that names
    another one is refused."""
    stored = None
    if (report_dir / SHARD_FILE).exists():
        data = read_shard_file(report_dir)
        stored = Shard(data["index"], data["count"])
    if given is not None and given != stored:
        holds = "a whole suite" if stored is None else f"shard {stored}"
        fix = "drop --shard" if stored is None else f"resume it with --shard {stored} or none"
        raise SuiteError(f"{report_dir} holds {holds}, not shard {given}; {fix}")
    return stored


def start_shard_file(
    report_dir: Path, shard: Shard, identity: str, units: int, machine: dict[str, Any]
) -> None:
    """Write shard.json for a new shard, or add this invocation's machine to a resumed
    one's (`resumed_shard` has checked it is the same shard)."""
    path = report_dir / SHARD_FILE
    machines: list[Any] = []
    if path.exists():
        machines = list(read_shard_file(report_dir)["machines"])
    data = {
        "index": shard.index,
        "count": shard.count,
        "suite_sha256": identity,
        "specdiff": __version__,
        "units": units,
        "machines": [*machines, machine],
    }
    write_text_atomic(path, json.dumps(data, indent=1, ensure_ascii=False) + "\n")


def read_shard_file(report_dir: Path) -> dict[str, Any]:
    """A shard folder's shard.json, its index and count checked."""
    path = report_dir / SHARD_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SuiteError(f"{report_dir} is no shard's folder ({SHARD_FILE} is missing)") from None
    except (OSError, ValueError, RecursionError) as error:
        raise SuiteError(f"{path}: cannot read it ({printable(str(error), 200)})") from None
    good = isinstance(data, dict) and all(
        type(data.get(key)) is int for key in ("index", "count", "units")
    )
    if not good or not 1 <= data["index"] <= data["count"]:
        raise SuiteError(f"{path}: not a shard record (index, count, units); run the shard again")
    if not isinstance(data.get("suite_sha256"), str) or not isinstance(data.get("machines"), list):
        raise SuiteError(f"{path}: not a shard record (suite_sha256, machines); run it again")
    return dict(data)
