"""What a suite's run leaves: its settings, prompts and the ledger of every run's record,
and the one JSON-able object every report is rendered from. Apart from the runner, so
that the figures (stats.py) and the ledger that holds them never import the runner.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TypedDict

from specdiff import __version__
from specdiff.suite.ledger import Ledger
from specdiff.suite.prompts import SuitePrompt
from specdiff.suite.records import Configuration
from specdiff.suite.settings import SuiteSettings
from specdiff.suite.stats import PairFigures


@dataclass
class SuiteOutcome:
    settings: SuiteSettings
    prompts: list[SuitePrompt]
    ledger: Ledger
    """Every run's record, read back in suite order, and each pair's figures."""
    executed: dict[str, Configuration]
    """Per variant label: the header's lanes, executed settings and build."""
    skipped: list[str]
    cancelled: bool
    wall_seconds: float
    resumed: int
    started: str
    skipped_runs: int = 0
    unloaded: list[str] = field(default_factory=list)
    """`label: why` for each pair (variant) whose models would not load."""
    executed_code: bool = False
    """Model-written programs were run (graded with tests)."""
    grading_seconds: float = 0.0
    """Time spent grading the runs of this invocation, its programs' time included."""
    program_seconds: float = 0.0
    """Of that, the time the graded programs ran in the sandbox."""
    kld: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per variant label, teacher-forced: KL divergence over the whole vocabulary."""
    jobs: int | None = None
    """The runs this outcome set out to do: a shard's share; None for every one."""

    @property
    def finished_runs(self) -> int:
        """Runs that came to an end: neither failed (unreadable included) nor crashed."""
        return self.ledger.finished

    def nothing_ran(self) -> str | None:
        """Why no run of the suite came to an end, when none did and it was not stopped:
        a pair that would not load, else the first failed or crashed run's error."""
        if self.cancelled or self.finished_runs:
            return None
        if self.unloaded:
            return self.unloaded[0]
        if self.ledger.first_error is not None:
            return self.ledger.first_error
        if self.skipped:
            return self.skipped[0]
        return "the prompt set is empty" if not self.prompts else None


class PairReport(TypedDict):
    """One pair (variant) as every report shows it."""

    label: str
    quant: str
    summary: dict[str, Any]
    """The pair's figures (`PairFigures.summary`), with the load and the KL divergence."""
    configuration: Configuration | None
    prompt_length: int | None


class _MergedReport(TypedDict, total=False):
    shards: dict[str, Any]
    """A report merged from shards (suite.merge): the shards, their machines, and each
    pair's forks by CPU kind."""


class SuiteReport(_MergedReport):
    """The one JSON-able object every report file is rendered from (report.json is it)."""

    specdiff: str
    created: str
    complete: bool
    jobs: int
    finished: int
    resumed: int
    wall_seconds: float
    settings: dict[str, Any]
    """`SuiteSettings.as_json`: what the suite ran."""
    skipped_prompts: list[str]
    prompt_texts: dict[str, str]
    pairs: list[PairReport]
    prompts: Iterable[dict[str, Any]]
    """Every run's record, in suite order; last, and read as it is iterated."""


PROMPT_TEXT_KEPT = 200
"""Characters of each prompt report.json keeps: enough to recognise it by."""


def outcome_json(outcome: SuiteOutcome) -> SuiteReport:
    """Everything the reports show, as one JSON-able object; its `prompts` are read from
    the ledger as they are iterated (a `RecordView`), never held together."""
    settings = outcome.settings
    ledger = outcome.ledger
    pairs: list[PairReport] = []
    for label, _pair, quant in settings.variants():
        figures = ledger.figures.get(label) or PairFigures()
        pairs.append(
            {
                "label": label,
                "quant": quant,
                "summary": {
                    **figures.summary(settings.max_tokens, settings.near_tie),
                    # the load every figure was measured under, beside each of them
                    "concurrency": settings.concurrency,
                    "kld": outcome.kld.get(label),
                },
                "configuration": outcome.executed.get(label),
                "prompt_length": settings.prompt_length(label),
            }
        )
    jobs = outcome.jobs
    if jobs is None:
        jobs = len(settings.variants()) * len(outcome.prompts)
    return {
        "specdiff": __version__,
        "created": outcome.started,
        "complete": not outcome.cancelled and ledger.count + outcome.skipped_runs == jobs,
        "jobs": jobs,
        "finished": ledger.count,
        "resumed": outcome.resumed,
        "wall_seconds": outcome.wall_seconds,
        "settings": settings.as_json(outcome.prompts),
        "skipped_prompts": outcome.skipped,
        # the start of each prompt, so a report names prompts by their words, not ids
        "prompt_texts": {prompt.id: prompt.prompt[:PROMPT_TEXT_KEPT] for prompt in outcome.prompts},
        "pairs": pairs,
        "prompts": ledger.records(),
    }
