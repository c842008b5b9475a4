"""specdiff's work on a Ray cluster: connecting to one (or starting one on this machine),
and the actors that run a suite's units or a repeat's runs there.

Ray is an optional dependency (the `ray` extra): nothing here imports it at module level,
so the rest of specdiff loads without it, and a command asking for it without it says
so in one line (`import_ray`)."""

from __future__ import annotations

from types import ModuleType

from specdiff.errors import SpecdiffError

RAY_EXTRA = "ray"
"""The optional dependency set (pyproject) that installs Ray."""


class RayMissing(SpecdiffError):
    """--ray was asked for, and Ray is not installed."""


def import_ray() -> ModuleType:
    """The ray module; RayMissing, naming the extra to install, when it is absent."""
    try:
        import ray
    except ImportError as error:
        raise RayMissing(
            f"--ray needs Ray ({error.name or 'ray'} is not installed); install it with "
            f"pip install -e '.[{RAY_EXTRA}]' in specdiff's folder, or pip install ray"
        ) from None
    return ray
