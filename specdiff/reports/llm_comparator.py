"""A suite folder (or one session) as LLM Comparator's JSON (PAIR-code/llm-comparator):
`metadata` {`source_path`, `custom_fields_schema`}, `models` [{name}, {name}] and one
`examples[]` entry per run, each with `input_text`, `tags`, `output_text_a`,
`output_text_b`, `score`, `individual_rater_scores` and `custom_fields`.

LLM Comparator shows two models' answers to the same prompts side by side; here the
two models are a pair's two lanes. specdiff does not judge which answer is better:
`score` (positive where a is preferred) is the graded suite's verdict where exactly
one lane solved the prompt, else 0, and there are no rater scores. What specdiff knows
goes in `custom_fields`: the pair, where the lanes forked, each lane's token and
margin there, the fork's class, and each lane's length and speed.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specdiff.errors import SpecdiffError
from specdiff.lanes.model import Pair, differences
from specdiff.sessions.store import SUFFIX, Session, load_session

SESSIONS_FOLDER = "sessions"
"""Where a suite folder keeps its runs: sessions/<pair>/<prompt id>.jsonl."""
CUSTOM_FIELDS = (
    ("pair", "category"),
    ("prompt_id", "string"),
    ("outcome", "category"),
    ("fork_index", "number"),
    ("fork_token", "per_model_text"),
    ("fork_margin", "per_model_number"),
    ("fork_class", "category"),
    ("generated_tokens", "per_model_number"),
    ("tokens_per_second", "per_model_number"),
)
"""Each custom field and its LLM Comparator type (client/lib/types.ts FieldType): a
per_model_* field holds [lane a's value, lane b's value]."""


class ComparatorExportError(SpecdiffError):
    """A path that is neither a suite folder nor a session file."""


def session_files(path: Path) -> list[Path]:
    """The runs to export: every session of a suite folder, in pair then file order,
    or the one session file given."""
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise ComparatorExportError(
            f"{path} does not exist: give a suite's --report folder or a session file"
        )
    found = sorted((path / SESSIONS_FOLDER).glob(f"*/*{SUFFIX}"))
    if not found:
        raise ComparatorExportError(
            f"{path} holds no {SESSIONS_FOLDER}/<pair>/*{SUFFIX}, so it is not a suite "
            "folder: give the folder `specdiff suite --report` wrote, or a session file"
        )
    return found


def llm_comparator(path: Path) -> dict[str, Any]:
    """The suite folder or session at `path` as one LLM Comparator file."""
    sessions = [load_session(file) for file in session_files(path)]
    pairs = {session.pair.name: session.pair for session in sessions}
    names = model_names(next(iter(pairs.values()))) if len(pairs) == 1 else ("lane a", "lane b")
    return {
        "metadata": {
            "source_path": str(path),
            "custom_fields_schema": [{"name": n, "type": t} for n, t in CUSTOM_FIELDS],
        },
        "models": [{"name": name} for name in names],
        "examples": [example(session) for session in sessions],
    }


def model_names(pair: Pair) -> tuple[str, str]:
    """Each lane named by the settings in which it differs from the other."""
    keys = differences(pair.a, pair.b)
    named = []
    for lane_id, lane in (("a", pair.a), ("b", pair.b)):
        settings = ", ".join(f"{key}={getattr(lane, key)}" for key in keys)
        named.append(f"{lane_id}: {settings or lane.describe()}")
    return named[0], named[1]


def _text(session: Session, lane: str) -> str:
    return b"".join(step.piece for step in session.steps[lane]).decode("utf-8", "replace")


def _score(session: Session) -> float:
    grades = session.summary().grades
    if grades is None or grades[0] is None or grades[1] is None:
        return 0.0
    return float(grades[0].passed) - float(grades[1].passed)


def example(session: Session) -> dict[str, Any]:
    summary = session.summary()
    fork = summary.fork_index
    tokens: Sequence[str | None] = [None, None]
    if fork is not None:
        tokens = [
            session.steps[lane][fork].piece.decode("utf-8", "replace")
            if fork < len(session.steps[lane])
            else None
            for lane in ("a", "b")
        ]
    outcome = (
        "identical" if summary.identical else "forked" if fork is not None else "lengths differ"
    )
    return {
        "input_text": session.prompt,
        "tags": [session.pair.name],
        "output_text_a": _text(session, "a"),
        "output_text_b": _text(session, "b"),
        "score": _score(session),
        "individual_rater_scores": [],
        "custom_fields": {
            "pair": session.pair.name,
            "prompt_id": session.path.name.removesuffix(SUFFIX),
            "outcome": outcome,
            "fork_index": fork,
            "fork_token": list(tokens),
            "fork_margin": list(summary.fork_margins) if summary.fork_margins else [None, None],
            "fork_class": summary.fork_class,
            "generated_tokens": list(summary.generated),
            "tokens_per_second": list(summary.tokens_per_second),
        },
    }
