"""Probe a llama.cpp build before trusting it: does a short decode survive on this CPU?

On some CPUs (Intel Xeons with AMX) llama.cpp's repacked CPU kernels crash in the
first decode. A short probe (prompt batch, verify-width batch, single-token steps)
runs in a child process, once per combination of build, system info, model, repack
and n_ubatch; its verdict is cached as a small JSON file so later runs pay nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ProbeVerdict:
    """What the probe found for one model on this build and CPU."""

    key: str
    """The cache key: build, system info, model sha256, n_ubatch."""
    cached: bool
    """True when the verdict came from the cache and no probe ran."""
    repack_on_ok: bool | None
    """The probe survived with repack on (None: not probed)."""
    repack_off_ok: bool | None
    """The probe survived with repack off (None: not probed)."""
    signal: str
    """The signal (e.g. SIGSEGV) or exit status that ended a failed probe, else ""."""
    chosen_repack: str
    """"on" or "off": what a lane asking for `repack` runs with; "" when neither works."""
    message: str
    """One line for the user: what was found and, on failure, the fix."""


def verdict(
    model_path_or_default: str | Path = "default", repack: str = "auto", n_ubatch: int = 512
) -> ProbeVerdict:
    """The probe's verdict for a model, from the cache or by running the probe now."""
    raise NotImplementedError
