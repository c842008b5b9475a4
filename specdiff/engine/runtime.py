"""Process-wide llama.cpp state: backend initialisation, logging, build and system info.

llama.cpp logs to stderr from C. specdiff keeps the last error lines instead, so a
failed load is reported as one line with llama.cpp's own reason; set
SPECDIFF_LLAMA_LOG=1 to see everything llama.cpp prints.
"""

from __future__ import annotations

import collections
import ctypes
import os
import platform
import sys
import threading
from types import ModuleType
from typing import Any

_LOCK = threading.Lock()
_STATE: dict[str, Any] = {}
_ERRORS: collections.deque[str] = collections.deque(maxlen=20)
_LEVEL_ERROR = 3
_LEVEL_CONT = 5


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
