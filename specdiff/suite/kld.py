"""KL divergence over the whole vocabulary for a teacher-forced suite, as `specdiff score`
measures it: every finished run's prompt and lane a's tokens forced through both lanes
again (`specdiff.engine.llama.score_steps`, in a worker process), so each step gives
KL(a||b), same top-1 and the rest of `specdiff.scoring.PositionScore`.

Each pair (variant) keeps its runs' position scores in its sessions folder (KLD_FILE), so
a resumed suite scores only the runs it has not; the report summarises them per prompt
and per pair with `specdiff.scoring.summarise`. Server lanes give the top candidates'
log-probabilities only, never a whole row: their figures are missing, and say why.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from specdiff.errors import SpecdiffError, printable
from specdiff.files import write_text_atomic
from specdiff.lanes import Pair
from specdiff.scoring import PositionScore, summarise
from specdiff.sessions.checks import check_float, check_int, check_list, check_object
from specdiff.sessions.records import RunSummary
from specdiff.sessions.store import load_session, safe_name
from specdiff.suite import SuiteError
from specdiff.suite.folder import SESSIONS_FOLDER
from specdiff.suite.settings import SuiteSettings

KLD_FILE = "kld.json"
SERVER_MISSING = (
    "not measured: a server lane gives only its top candidates' log-probabilities, and KL "
    "over the whole vocabulary needs every logit of both lanes (in-process lanes only)"
)
_INTEGER_FIELDS = ("position", "token", "top_a", "top_b")
_LARGEST_ID = 1 << 31

Scores = dict[str, list[PositionScore]]


def kld_path(report_dir: Path, label: str) -> Path:
    return report_dir / SESSIONS_FOLDER / safe_name(label) / KLD_FILE


def score_teacher_forced(
    settings: SuiteSettings,
    report_dir: Path,
    records: Iterable[dict[str, Any]],
    cancel: threading.Event,
    on_message: Callable[[str], None],
    score_new: bool = True,
) -> dict[str, dict[str, Any]]:
    """Per variant label, its KLD figures (`kld_json`), scoring the finished runs not yet
    scored unless not `score_new` (a stopped suite); empty unless teacher-forced."""
    if not settings.teacher_forced:
        return {}
    out: dict[str, dict[str, Any]] = {}
    for label, pair, _quant in settings.variants():
        if {pair.a.backend, pair.b.backend} != {"local"}:
            out[label] = {"summary": None, "prompts": [], "missing": SERVER_MISSING}
            continue
        mine = [RunRef.of(r) for r in records if r["pair"] == label]
        path = kld_path(report_dir, label)
        scores = read_scores(path)
        wanted = [r for r in mine if r.finished and r.prompt_id not in scores]
        missing = None
        if wanted and score_new and not cancel.is_set():
            on_message(f"{label}: KL divergence of {len(wanted)} teacher-forced runs")
            try:
                scores.update(_score(pair, report_dir, wanted, cancel))
            except SpecdiffError as error:
                missing = f"not measured: {printable(str(error), 300)}"
            path.parent.mkdir(parents=True, exist_ok=True)
            write_scores(path, scores)
        out[label] = kld_json(scores, [r.prompt_id for r in mine], missing)
    return out


@dataclass(frozen=True)
class RunRef:
    """What scoring needs of a run's record: its prompt, its session file, and whether it
    ran to its end (neither failed nor crashed)."""

    prompt_id: str
    session: str
    finished: bool

    @classmethod
    def of(cls, record: dict[str, Any]) -> RunRef:
        """From a record's JSON (`PromptRecord.to_json`), which holds the run's summary."""
        run = RunSummary.from_json(record)
        return cls(record["prompt_id"], record["session"], not run.failed and not run.crashed)


def _score(
    pair: Pair, report_dir: Path, records: Sequence[RunRef], cancel: threading.Event
) -> Scores:
    """The runs' position scores, scored in one worker process (llama.cpp runs there)."""
    # deferred: the engine loads only where a suite scores its runs
    from specdiff.engine.llama.score_steps import score_runs
    from specdiff.engine.worker import call_in_worker

    runs, ids = [], []
    for record in records:
        session = load_session(report_dir / record.session)
        tokens = [step.token_id for step in session.steps["a"]]
        if tokens:
            runs.append((list(session.header.prompt_token_ids), tokens))
            ids.append(record.prompt_id)
    if not runs:
        return {}
    scored = call_in_worker(
        score_runs,
        (pair, runs),
        cancel=cancel,
        doing="scoring the teacher-forced runs over the whole vocabulary",
        repack_off="--both repack=false",
    )
    return dict(zip(ids, scored))


def kld_json(scores: Scores, prompt_ids: Sequence[str], missing: str | None) -> dict[str, Any]:
    """The pair's summary over every scored step of its runs, each prompt's own, and why
    figures are missing (None when none is)."""
    pooled = [score for prompt_id in prompt_ids for score in scores.get(prompt_id, [])]
    return {
        "summary": summarise(pooled).as_dict() if pooled else None,
        "prompts": [
            {"prompt_id": prompt_id, **summarise(scores[prompt_id]).as_dict()}
            for prompt_id in prompt_ids
            if scores.get(prompt_id)
        ],
        "missing": missing,
    }


def write_scores(path: Path, scores: Scores) -> None:
    data = {"prompts": {key: [asdict(score) for score in value] for key, value in scores.items()}}
    write_text_atomic(path, json.dumps(data, separators=(",", ":")) + "\n")


def read_scores(path: Path) -> Scores:
    """A variant's stored position scores; none before its first scored run. SuiteError
    names the file and the first field that cannot be read."""
    if not path.exists():
        return {}
    try:
        data = check_object(json.loads(path.read_text(encoding="utf-8")), "the file")
        prompts = check_object(data.get("prompts"), "prompts")
        return {
            str(key): [
                _position(item, f"prompts.{key}[{number}]")
                for number, item in enumerate(check_list(value, f"prompts.{key}"))
            ]
            for key, value in prompts.items()
        }
    except (OSError, ValueError, RecursionError) as error:
        raise SuiteError(
            f"{path}: {printable(str(error), 200)}; delete the file, and --resume scores "
            "the runs again"
        ) from None


def _position(value: object, what: str) -> PositionScore:
    item = check_object(value, what)
    values: dict[str, Any] = {}
    for field in fields(PositionScore):
        where = f"{what}.{field.name}"
        if field.name in _INTEGER_FIELDS:
            values[field.name] = check_int(item.get(field.name), where, 0, _LARGEST_ID)
        else:
            values[field.name] = check_float(item.get(field.name), where)
    return PositionScore(**values)
