"""Numbers as JSON holds them. JSON has no infinity or NaN, and specdiff meets both: a
step with one candidate has an infinite margin, a lane with no tokens no speed. Each is
written as null, by this one rule, in every record and report."""

from __future__ import annotations

import math
from typing import Any


def finite_or_null(value: float) -> float | None:
    """`value`, or None where JSON could not hold it (inf, -inf, nan)."""
    return value if math.isfinite(value) else None


def finite_everywhere(value: Any) -> Any:
    """`value` with every float JSON could not hold made None, in any nesting of dicts,
    lists and tuples (a tuple comes back as a list, as JSON writes it)."""
    if isinstance(value, float):
        return finite_or_null(value)
    if isinstance(value, dict):
        return {key: finite_everywhere(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_everywhere(item) for item in value]
    return value
