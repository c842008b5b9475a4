"""Whether a recorded session comes from another machine: the recording's CPU and
llama.cpp's system info against this machine's, by the rule `specdiff verify` uses
(`sessions.verify.likely_cause`). Another CPU runs other kernels, which round
differently, so a run here may fork elsewhere than the replay shows.

No Textual import: `build_here` runs in a worker process (the app never loads llama.cpp
itself), which imports this module to call it.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from specdiff.sessions.verify import likely_cause


def build_here(cancel: threading.Event) -> dict[str, str]:
    """This machine's build and system info, as a run here would record them (runs in
    a worker process: llama.cpp reports the CPU features it uses)."""
    # deferred: llama.cpp loads in the worker process only
    from specdiff.engine.runtime import build_info

    return build_info()


def recorded_elsewhere(recorded: Mapping[str, Any], here: Mapping[str, Any]) -> str | None:
    """One line when the session was recorded on another CPU (or llama.cpp saw it
    otherwise), else None."""
    cause = likely_cause(recorded, here)
    if cause is None:
        return None
    return f"{cause}; a run here may fork elsewhere than this replay"


def this_machine() -> dict[str, str]:
    """`build_here` in a worker process (a second or two: it loads llama.cpp, no model)."""
    # deferred: the worker module is needed only when the machine is asked about
    from specdiff.engine.worker import call_in_worker

    return call_in_worker(build_here, (), doing="reading this machine's llama.cpp build")
