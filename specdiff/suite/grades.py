"""A finished run's lanes graded, each once, after the run and apart from its steps: which
runs a suite grades, that a lane cut short by its failure solved nothing, and how long
grading took, the graded programs' own time apart. The runs side by side grade from
their own threads, so the times are added under a lock.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace

from specdiff.grading.graders import NOT_RUN_LANE_FAILED, Grader, grade_text
from specdiff.results import LaneOutcome
from specdiff.sessions.format import CRASHED
from specdiff.sessions.records import Grade, RunSummary
from specdiff.suite.prompts import SuitePrompt
from specdiff.suite.settings import SuiteSettings


class RunGrader:
    """Grades a suite's runs as they end; keeps the time it took."""

    def __init__(self, settings: SuiteSettings) -> None:
        self.settings = settings
        self.grading_seconds = 0.0
        """Time spent grading, the programs' time included."""
        self.program_seconds = 0.0
        """Of that, the time the graded programs ran in the sandbox."""
        self._lock = threading.Lock()

    def graded(
        self,
        summary: RunSummary,
        lanes: tuple[LaneOutcome, LaneOutcome],
        prompt: SuitePrompt,
        stop: list[str],
    ) -> RunSummary:
        """The summary with each lane's grade, when the suite grades this prompt: with
        --grade, a grader on the prompt, and, for tests, no --no-exec."""
        grader = prompt.grader
        settings = self.settings
        if not settings.grade or grader is None or (grader.executes and settings.no_exec):
            return summary
        began = time.perf_counter()
        grades = (
            self._grade(grader, prompt, lanes[0], stop),
            self._grade(grader, prompt, lanes[1], stop),
        )
        with self._lock:
            self.grading_seconds += time.perf_counter() - began
        return replace(summary, grades=grades)

    def _grade(
        self, grader: Grader, prompt: SuitePrompt, lane: LaneOutcome, stop: list[str]
    ) -> Grade:
        if lane.error is not None or lane.stop_reason == CRASHED:
            # a lane cut short by its failure has no answer to grade: it solved nothing
            return Grade(False, NOT_RUN_LANE_FAILED, grader.kind)
        text = b"".join(step.piece for step in lane.steps).decode("utf-8", "replace")
        grade, program_seconds = grade_text(
            grader, prompt.prompt, text, stop, self.settings.grade_timeout
        )
        with self._lock:
            self.program_seconds += program_seconds
        return grade
