"""Bundled prompt sets (JSONL: one {"id", "prompt"} object a line) and the default prompt.

- ``divergence``: everyday completions, the set the divergence measurements run on;
- ``repetitive``: rewrite / extract / repeat tasks, where n-gram drafts hit;
- ``open``: open-ended completions, where they mostly do not;
- ``coding``: Python function / class stubs with docstrings, ending where the body starts;
- ``questions``: short factual and explanatory questions, ending where the answer starts.

The bundled model is a base (not instruction-tuned) model, so every prompt is text to
continue: a question ends with "Answer:" for the model to go on from.
"""

from __future__ import annotations

import json
from importlib import resources

# Forks under ubatch on the bundled model on the CPUs tried so far (where depends on the
# CPU's kernels); tests that need a fork search the bundled sets instead of assuming it.
DEFAULT_PROMPT = "The history of the Roman Empire"

SETS = ("divergence", "repetitive", "open", "coding", "questions")


def load(name: str) -> list[dict[str, str]]:
    """The prompts of a bundled set, in file order."""
    if name not in SETS:
        raise ValueError(f"unknown prompt set {name!r}; bundled: {', '.join(SETS)}")
    text = resources.files(__name__).joinpath(f"{name}.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]
