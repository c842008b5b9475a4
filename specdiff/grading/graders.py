"""Graders: what a prompt-set line may carry to say whether a lane's text is right, and
grading a lane's text with it.

A line carries at most one grader:

- ``tests`` with ``entry_point``: HumanEval-style. The program is the prompt, the lane's
  completion, the tests, then ``check(entry_point)``, then a line that prints a nonce
  drawn for this run; it passes when it exits 0 and the nonce is the last line it
  printed, so a completion that exits early (``sys.exit(0)``, ``os._exit(0)``,
  ``unittest.main()``) fails (one written to read its own source could still find the
  nonce: this catches early exits, not a program bent on passing). It runs in the
  sandbox (specdiff.grading.sandbox), and only when the suite was asked to grade.
- ``answer`` (text) or ``answers`` (a list of texts): the lane's first non-empty line
  passes when it holds one of them as whole words. Both sides are compared as words:
  case, punctuation and spacing are ignored, so "The capital is Canberra." holds
  "canberra", and "8,848 m" holds "8 848". The first line, because a base model goes on
  after its answer with more text of its own.
- ``answer_regex``: a Python regular expression searched for in the whole completion
  (``re.MULTILINE``).

Every grader sees the completion cut at the first of the run's stop strings (a lane's
last step may reach past one).
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from specdiff.grading import DEFAULT_TIMEOUT
from specdiff.sessions.records import Grade

GRADER_FIELDS = ("tests", "entry_point", "answer", "answers", "answer_regex")
"""The fields of a prompt-set line that make its grader."""
MAX_ANSWERS = 64
NOT_RUN_LANE_FAILED = "not graded: lane failed"
EXITED_EARLY = "failed: exited before its tests finished"
_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")


@dataclass(frozen=True)
class Grader:
    kind: str
    """"tests", "answer" or "regex" (Grade.grader)."""
    tests: str = ""
    entry_point: str = ""
    answers: tuple[str, ...] = ()
    pattern: str = ""

    @property
    def executes(self) -> bool:
        """Grading runs model-written code."""
        return self.kind == "tests"

    def as_json(self) -> dict[str, Any]:
        """The line's grader fields, as a prompt set writes them."""
        if self.kind == "tests":
            return {"tests": self.tests, "entry_point": self.entry_point}
        if self.kind == "answer":
            return {"answers": list(self.answers)}
        return {"answer_regex": self.pattern}


def grader_from(record: Mapping[str, Any]) -> Grader | None:
    """The grader a prompt-set line carries, or None; ValueError names what is wrong."""
    present = [key for key in GRADER_FIELDS if key in record]
    if not present:
        return None
    kinds = {"tests" if key == "entry_point" else key for key in present}
    if len(kinds - {"answer", "answers"}) + bool(kinds & {"answer", "answers"}) > 1:
        raise ValueError(
            f"a line carries one grader (tests, answer or answers, answer_regex), "
            f"not {' and '.join(present)}"
        )
    if "tests" in kinds:
        return _tests_grader(record)
    if "answer_regex" in kinds:
        pattern = _text(record, "answer_regex")
        try:
            re.compile(pattern)
        except re.error as error:
            raise ValueError(f'"answer_regex" is not a regular expression ({error})') from None
        return Grader("regex", pattern=pattern)
    return Grader("answer", answers=_answers(record))


def _text(record: Mapping[str, Any], key: str) -> str:
    value = record[key]
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f'"{key}" must be a non-empty string, got {type(value).__name__}')
    return value


def _tests_grader(record: Mapping[str, Any]) -> Grader:
    if "tests" not in record:
        raise ValueError('"entry_point" needs "tests" beside it')
    tests = _text(record, "tests")
    if "entry_point" not in record:
        raise ValueError('"tests" needs "entry_point": the name of the function they check')
    entry_point = _text(record, "entry_point")
    if not _IDENTIFIER.fullmatch(entry_point):
        raise ValueError(f'"entry_point" must be a Python name, got {entry_point[:40]!r}')
    return Grader("tests", tests=tests, entry_point=entry_point)


def _answers(record: Mapping[str, Any]) -> tuple[str, ...]:
    if "answer" in record and "answers" in record:
        raise ValueError('give "answer" or "answers", not both')
    if "answer" in record:
        values: Any = [_text(record, "answer")]
    else:
        values = record["answers"]
        if not isinstance(values, list) or not 0 < len(values) <= MAX_ANSWERS:
            raise ValueError(f'"answers" must be a list of 1 to {MAX_ANSWERS} strings')
    answers = tuple(normalise(value) for value in values if isinstance(value, str))
    if len(answers) != len(values) or not all(answers):
        raise ValueError('"answers" must hold strings with letters or digits in them')
    return answers


def normalise(text: str) -> str:
    """Words only: case folded, every run of punctuation and spacing one space."""
    words = "".join(ch if ch.isalnum() else " " for ch in text.casefold())
    return " ".join(words.split())


def completion(text: str, stop: Sequence[str]) -> str:
    """`text` up to the first stop string in it."""
    cut = min((i for s in stop if s and (i := text.find(s)) >= 0), default=len(text))
    return text[:cut]


def program(prompt: str, text: str, grader: Grader, nonce: str) -> str:
    """The program a tests grader runs, laid out as HumanEval's own harness does, and
    printing `nonce` once its tests passed."""
    return (
        f"{prompt}{text}\n{grader.tests}\n\ncheck({grader.entry_point})\n"
        f"print({nonce!r}, flush=True)\n"
    )


def finished(output: str, nonce: str) -> bool:
    """The program's last printed line is `nonce`: it ran to its end."""
    lines = output.rstrip().splitlines()
    return bool(lines) and lines[-1] == nonce


def grade_text(
    grader: Grader,
    prompt: str,
    text: str,
    stop: Sequence[str] = (),
    timeout: float = DEFAULT_TIMEOUT,
) -> tuple[Grade, float]:
    """Grade one lane's generated text; returns the grade and the seconds its program
    ran (a tests grader's, in the sandbox; 0 for the others)."""
    text = completion(text, stop)
    if grader.kind == "tests":
        # deferred: the sandbox (POSIX rlimits, namespaces) loads only to run a program
        from specdiff.grading.sandbox import run_program

        nonce = secrets.token_hex(16)
        run = run_program(program(prompt, text, grader, nonce), timeout)
        if run.passed and not finished(run.output, nonce):
            return Grade(False, EXITED_EARLY, "tests"), run.seconds
        return Grade(run.passed, run.reason, "tests"), run.seconds
    if grader.kind == "regex":
        found = re.search(grader.pattern, text, re.MULTILINE) is not None
    else:
        first_line = next((line for line in text.splitlines() if line.strip()), "")
        words = f" {normalise(first_line)} "
        found = any(f" {answer} " in words for answer in grader.answers)
    return Grade(found, "matched" if found else "no match", grader.kind), 0.0
