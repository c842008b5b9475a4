"""The suite folder a proxy fills as its clients' requests end: the same files a suite
writes (suite.json, a session per prompt under sessions/PAIR/, the report files), so that
`specdiff suite`'s reports, replay, verify and export read it like any other.

A suite's prompts are known before it starts; a proxy's arrive one by one. Each
request's prompt is kept, as a suite's JSONL line ({id, prompt | messages, max_tokens,
stop}), in the folder's prompts.jsonl the moment its pair ends, and suite.json names
that file as its source and is written again: at any moment the folder is a whole suite
of the pairs that ended, one `specdiff suite --resume --report DIR` can report on, and
whose prompts `specdiff suite DIR/prompts.jsonl` runs again.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

from specdiff.chat import Conversation
from specdiff.files import write_text_atomic
from specdiff.results import PairResult
from specdiff.sessions.store import SessionWriter
from specdiff.suite.folder import SESSIONS_FOLDER, prepare_report_dir, session_path, write_settings
from specdiff.suite.ledger import Ledger
from specdiff.suite.outcome import SuiteOutcome
from specdiff.suite.prompts import SuitePrompt
from specdiff.suite.records import (
    Configuration,
    PromptRecord,
    lane_serving,
    read_record,
    unreadable_record,
)
from specdiff.suite.settings import SuiteSettings

PROMPTS_FILE = "prompts.jsonl"


@dataclass(frozen=True)
class Recorded:
    """One pair saved: its record and how many the folder holds now."""

    record: PromptRecord
    count: int
    forked: int


def prompt_line(prompt: SuitePrompt) -> str:
    """The prompt as a line of a suite's JSONL prompt file."""
    line: dict[str, object] = {"id": prompt.id}
    if isinstance(prompt.prompt, Conversation):
        line["messages"] = prompt.prompt.to_json()
    else:
        line["prompt"] = prompt.prompt
    if prompt.max_tokens is not None:
        line["max_tokens"] = prompt.max_tokens
    if prompt.stop:
        line["stop"] = list(prompt.stop)
    return json.dumps(line, ensure_ascii=False)


class ProxySuite:
    """One suite folder, filled a pair at a time from any thread."""

    def __init__(self, report_dir: Path, settings: SuiteSettings) -> None:
        self.report_dir = report_dir
        prepare_report_dir(report_dir, settings, [], resume=False, force=False)
        self.prompts_file = report_dir.resolve() / PROMPTS_FILE
        self.settings = replace(settings, source=str(self.prompts_file))
        self.label = self.settings.pairs[0].name
        self.prompts: list[SuitePrompt] = []
        self.ledger = Ledger([self.label], report_dir, graded=False)
        self.executed: dict[str, Configuration] = {}
        self.started = datetime.now(timezone.utc).isoformat(timespec="seconds")
        self.began = time.perf_counter()
        self.forked = 0
        self._lock = threading.Lock()
        self.prompts_file.write_text("", encoding="utf-8")
        write_settings(report_dir, self.settings, [])

    def record(self, prompt: SuitePrompt, result: PairResult, concurrency: int) -> Recorded:
        """Save the pair's session, add its record and prompt; a session that cannot be
        read back is recorded as a failed run, never dropped."""
        path = self.write_session(prompt, result, concurrency)
        relative = str(path.relative_to(self.report_dir))
        read = read_record(path, relative, self.label, "", prompt.id, self.settings.near_tie)
        with self._lock:
            if isinstance(read, str):
                record = unreadable_record(self.label, "", prompt.id, relative, read)
            else:
                record, configuration = read
                self.executed.setdefault(self.label, configuration)
            self.ledger.add(record, len(self.prompts))
            self.prompts.append(prompt)
            self.forked += record.summary.fork_index is not None
            with self.prompts_file.open("a", encoding="utf-8") as handle:
                handle.write(prompt_line(prompt) + "\n")
            write_settings(self.report_dir, self.settings, self.prompts)
            return Recorded(record, len(self.prompts), self.forked)

    def write_session(self, prompt: SuitePrompt, result: PairResult, concurrency: int) -> Path:
        """The run as a suite writes it: the header with the load it ran under, both
        lanes' steps in turn, and the summary with how each server lane was served."""
        path = session_path(self.report_dir, self.label, prompt)
        header = result.header()
        header = replace(
            header,
            executed={lane: {**table, "concurrency": concurrency}
                      for lane, table in header.executed.items()},
        )  # fmt: skip
        summary = result.summary()
        serving = (lane_serving(result.a), lane_serving(result.b))
        if serving != (None, None):
            summary = replace(summary, serving=serving)
        writer = SessionWriter(path.parent, self.label, prompt.prompt, name=prompt.file_stem)
        writer.header(header)
        a, b = result.a.steps, result.b.steps
        for index in range(max(len(a), len(b))):
            for steps in (a, b):
                if index < len(steps):
                    writer.step(steps[index])
        return writer.finish(summary)

    def close(self, cancelled: bool) -> list[Path]:
        """Write the report files; their paths (none when no pair was saved)."""
        # deferred: the report renderers load only when the proxy stops
        from specdiff.reports.suite import write_reports
        from specdiff.suite.outcome import outcome_json

        try:
            if not self.prompts:
                return []
            outcome = SuiteOutcome(
                settings=self.settings,
                prompts=self.prompts,
                ledger=self.ledger,
                executed=self.executed,
                skipped=[],
                cancelled=cancelled,
                wall_seconds=time.perf_counter() - self.began,
                resumed=0,
                started=self.started,
            )
            return write_reports(self.report_dir, outcome_json(outcome))
        finally:
            self.ledger.close()

    @property
    def sessions(self) -> Path:
        return self.report_dir / SESSIONS_FOLDER


def write_prompts(path: Path, prompts: list[SuitePrompt]) -> None:
    """All the prompts as one JSONL file (for a suite run of the same prompts)."""
    write_text_atomic(path, "".join(prompt_line(p) + "\n" for p in prompts))
