"""The one rule for numbers JSON cannot hold: inf, -inf and NaN become null, in any
nesting, and every other value passes unchanged."""

from __future__ import annotations

import json
import math

from specdiff.json_numbers import finite_everywhere, finite_or_null


def test_a_finite_number_passes_and_the_others_become_null() -> None:
    assert finite_or_null(0.06) == 0.06
    assert finite_or_null(-0.0) == 0.0
    for value in (math.inf, -math.inf, math.nan):
        assert finite_or_null(value) is None


def test_every_nesting_is_made_writable_as_strict_json() -> None:
    record = {
        "margin": math.inf,
        "steps": [(0.5, -math.inf), {"speed": math.nan, "tokens": 3, "text": "nan"}],
        "fork": None,
    }
    cleaned = finite_everywhere(record)
    assert cleaned == {
        "margin": None,
        "steps": [[0.5, None], {"speed": None, "tokens": 3, "text": "nan"}],
        "fork": None,
    }
    json.dumps(cleaned, allow_nan=False)  # raises on any inf or nan left behind
