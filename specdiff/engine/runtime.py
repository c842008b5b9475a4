"""Process-wide llama.cpp state: backend initialisation, logging, build and system info,
and the devices llama.cpp can offload to.

llama.cpp logs to stderr from C. specdiff keeps the last error lines instead, so a
failed load is reported as one line with llama.cpp's own reason; set
SPECDIFF_LLAMA_LOG=1 to see everything llama.cpp prints.
"""

from __future__ import annotations

import collections
import ctypes
import os
import platform
import re
import sys
import threading
from collections.abc import Iterable
from types import ModuleType
from typing import Any, TypedDict

from specdiff.errors import LaneConfigError
from specdiff.lanes import Lane, LaneId


class _State(TypedDict, total=False):
    """What this process holds of llama.cpp once it is loaded."""

    module: ModuleType
    callback: object
    """The log callback: a ctypes callback must outlive its registration."""
    offloaded: tuple[int, int]
    devices: list[dict[str, Any]]


_LOCK = threading.Lock()
_STATE: _State = {}
_ERRORS: collections.deque[str] = collections.deque(maxlen=20)
_LEVEL_ERROR = 3
_LEVEL_CONT = 5
_OFFLOADED = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")
"""llama.cpp's line saying how many of a model's layers went to GPUs (offload builds only)."""
DEVICE_TYPES = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel"}
"""enum ggml_backend_dev_type, in ggml-backend.h."""
GPU_BUILD = (
    'CMAKE_ARGS="-DGGML_CUDA=on" pip install --force-reinstall --no-cache-dir '
    "llama-cpp-python (Metal: -DGGML_METAL=on, Vulkan: -DGGML_VULKAN=on)"
)
"""How to get a llama-cpp-python that can offload layers to a GPU."""


def llama() -> ModuleType:
    """The low-level llama_cpp module, with the backend initialised and logging captured."""
    with _LOCK:
        module = _STATE.get("module")
        if module is not None:
            return module
        import llama_cpp.llama_cpp as lib

        verbose = os.environ.get("SPECDIFF_LLAMA_LOG") == "1"
        last_level = [0]

        @lib.llama_log_callback
        def on_log(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
            effective = last_level[0] if level == _LEVEL_CONT else level
            last_level[0] = effective
            line = text.decode("utf-8", "replace") if text else ""
            if effective == _LEVEL_ERROR and line.strip():
                _ERRORS.append(line.strip())
            offloaded = _OFFLOADED.search(line)
            if offloaded:
                _STATE["offloaded"] = (int(offloaded[1]), int(offloaded[2]))
            if verbose:
                sys.stderr.write(line)

        lib.llama_log_set(on_log, ctypes.c_void_p(0))
        lib.llama_backend_init()
        _STATE["callback"] = on_log  # a ctypes callback must outlive its registration
        _STATE["module"] = lib
        return lib


def last_error() -> str:
    """llama.cpp's most recent error line, or an empty string."""
    return _ERRORS[-1] if _ERRORS else ""


def clear_errors() -> None:
    _ERRORS.clear()


def build_info() -> dict[str, str]:
    """What executed: llama-cpp-python's version, llama.cpp's build and system info, the CPU."""
    lib = llama()
    import llama_cpp

    version = getattr(lib, "llama_version", None)
    return {
        "llama_cpp_python": str(getattr(llama_cpp, "__version__", "unknown")),
        "llama_cpp_build": version().decode() if version is not None else "unknown",
        "system_info": lib.llama_print_system_info().decode("utf-8", "replace").strip(),
        "cpu": cpu_name(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def take_offloaded() -> tuple[int, int] | None:
    """(layers offloaded, layers in all) from llama.cpp's last model load, once: None
    where it said nothing (a build without GPU offload says nothing)."""
    return _STATE.pop("offloaded", None)


def supports_gpu_offload() -> bool:
    """Whether this llama.cpp has a GPU (or RPC) device to offload layers to."""
    return bool(llama().llama_supports_gpu_offload())


def refuse_unsupported_offload(lanes: Iterable[tuple[LaneId, Lane]]) -> None:
    """Stop before any model loads when an in-process lane asks for GPU layers that this
    llama-cpp-python cannot place (llama.cpp would quietly keep them on the CPU, and the
    comparison would not be the one asked for)."""
    for lane_id, lane in lanes:
        if lane.backend == "local":
            check_offload(lane.gpu_layers, f"lane {lane_id}")


def check_offload(gpu_layers: int, who: str) -> None:
    """Refuse GPU layers (`who` asks for them) where no GPU can take them."""
    if gpu_layers != 0 and not supports_gpu_offload():
        raise LaneConfigError(
            f"{who} asks for gpu_layers={gpu_layers}, but this llama-cpp-python was built "
            f"without GPU offload; reinstall it with {GPU_BUILD}, or set gpu_layers=0"
        )


def backend_devices() -> list[dict[str, Any]]:
    """The devices llama.cpp registered (the CPU, and each GPU an offload build found),
    read once per process so that both lanes of a pair record the same list: name,
    description, type and memory (free when first read, and total) in bytes. Empty where
    llama-cpp-python's ggml libraries cannot be opened."""
    with _LOCK:
        devices = _STATE.get("devices")
    if devices is None:
        try:
            devices = _read_devices()
        except (OSError, AttributeError, ImportError):  # a build laid out otherwise
            devices = []
        with _LOCK:
            _STATE["devices"] = devices
    return [dict(device) for device in devices]


def _read_devices() -> list[dict[str, Any]]:
    # llama-cpp-python binds none of ggml's device API: the registry lives in libggml,
    # the device calls in libggml-base, both beside libllama
    from llama_cpp._ctypes_extensions import load_shared_library

    lib = llama()
    registry = load_shared_library("ggml", lib._base_path)
    base = load_shared_library("ggml-base", lib._base_path)
    registry.ggml_backend_dev_count.restype = ctypes.c_size_t
    registry.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    registry.ggml_backend_dev_get.restype = ctypes.c_void_p
    for name in ("name", "description"):
        call = getattr(base, f"ggml_backend_dev_{name}")
        call.argtypes, call.restype = [ctypes.c_void_p], ctypes.c_char_p
    base.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
    base.ggml_backend_dev_type.restype = ctypes.c_int
    size = ctypes.POINTER(ctypes.c_size_t)
    base.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, size, size]
    base.ggml_backend_dev_memory.restype = None
    devices = []
    for index in range(registry.ggml_backend_dev_count()):
        device = registry.ggml_backend_dev_get(index)
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        base.ggml_backend_dev_memory(device, ctypes.byref(free), ctypes.byref(total))
        kind = int(base.ggml_backend_dev_type(device))
        devices.append(
            {
                "name": (base.ggml_backend_dev_name(device) or b"").decode("utf-8", "replace"),
                "description": (base.ggml_backend_dev_description(device) or b"").decode(
                    "utf-8", "replace"
                ),
                "type": DEVICE_TYPES.get(kind, f"type {kind}"),
                "memory_free": int(free.value),
                "memory_total": int(total.value),
            }
        )
    return devices
