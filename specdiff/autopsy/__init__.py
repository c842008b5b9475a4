"""A fork's autopsy: which setting, which layer and which operation made two lanes part.

These are the records `specdiff explain` produces and every front end reads: the
settings sweep (one SettingTrial per run), the tensors compared at the fork step (one
TensorDifference each, in graph order), the difference's growth layer by layer, and
one plain-words sentence naming the cause. They hold numbers and names only, never
arrays or engine objects, so the command line, the exports and the TUI can show an
autopsy without loading llama.cpp, and a JSON file of one reads back the same
(`Autopsy.from_json` checks every field, since such a file may come from anyone).

The modules, each importing only those above it: `records` (the parts), `words` (names
and ops as a reader knows them), `codec` (the parts as JSON), `findings` (the Autopsy
record) and `files` (an autopsy saved beside its session); `progress` is the stage an
autopsy being made reports, with its estimate of the time left. The engine side that fills
them in is `specdiff.engine.autopsy`.
"""

from __future__ import annotations

from specdiff.autopsy.files import (
    MAX_SAVED_BYTES,
    SAVED_SUFFIX,
    load_saved,
    missing_model,
    save_beside,
    saved_beside,
)
from specdiff.autopsy.findings import Autopsy
from specdiff.autopsy.progress import AutopsyStage
from specdiff.autopsy.records import (
    DRAFT_KEY,
    LAST_BITS,
    MAX_NAME,
    MAX_TENSORS,
    MAX_TRIALS,
    SCHEMA,
    AutopsyError,
    AutopsyInterrupted,
    ForkMargin,
    LayerGrowth,
    SettingTrial,
    TensorDifference,
)
from specdiff.autopsy.words import DATA_MOVES, draft_verdict, op_words, tensor_words

__all__ = [
    "DATA_MOVES",
    "DRAFT_KEY",
    "LAST_BITS",
    "MAX_NAME",
    "MAX_SAVED_BYTES",
    "MAX_TENSORS",
    "MAX_TRIALS",
    "SAVED_SUFFIX",
    "SCHEMA",
    "Autopsy",
    "AutopsyError",
    "AutopsyInterrupted",
    "AutopsyStage",
    "ForkMargin",
    "LayerGrowth",
    "SettingTrial",
    "TensorDifference",
    "draft_verdict",
    "load_saved",
    "missing_model",
    "op_words",
    "save_beside",
    "saved_beside",
    "tensor_words",
]
