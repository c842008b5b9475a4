"""The session file format: its schema version and the names it gives the lanes.

A session is a header line (SessionHeader), one line per TokenStep, and a footer line
(RunSummary), each a JSON object. The records are in sessions/header.py and
sessions/records.py, the checks every field passes on its way in in sessions/checks.py,
and a step's line in sessions/codec.py. Every reader goes through a `from_json` (or
`step_from`), which checks every field's type and range, so a hostile or damaged file is
one ValueError naming the field, never a crash further on.
"""

from __future__ import annotations

from typing import get_args

from specdiff.lanes import LaneId

SCHEMA_VERSION = 1
"""Fields added since schema 1 are optional, so a reader of any version loads them."""

LANE_IDS: tuple[LaneId, ...] = get_args(LaneId)
CRASHED = "crashed"
"""A lane's stop reason when the process running the lanes died under it (a native
crash in llama.cpp); the other stop reasons are eos, length, stop and cancelled."""
