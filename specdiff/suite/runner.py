"""Suites: one pair (or several) over a set of prompts, every number tied to its
configuration.

Each prompt's run is kept as a session file (the sessions' format), so a stopped suite
resumes from its files and every figure of the report can be traced to one file. The
figures are computed from the session files themselves, whether they were written just
now or by an earlier, stopped run.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from specdiff import __version__
from specdiff.compare import DEFAULT_NEAR_TIE, compare
from specdiff.errors import SpecdiffError
from specdiff.lanes import QUANT_TYPES, Pair, lane_from_dict
from specdiff.sessions.store import (
    PARTIAL_SUFFIX,
    SUFFIX,
    Session,
    SessionWriter,
    footer_record,
    header_record,
    load_session,
    safe_name,
)
from specdiff.steps import TokenStep

SUITE_FILE = "suite.json"
SESSIONS_FOLDER = "sessions"
REPORT_FILES = ("report.json", "report.md", "report.html", "results.csv")
CHECKPOINTS = (25, 50, 100, 200, 400, 800, 1600, 3200, 6400)
"""Generation lengths at which the report gives the fraction of prompts forked."""
MARGIN_BUCKETS = (0.0, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, math.inf)
"""Teacher-forced flips are counted by the reference lane's margin in these buckets."""
DELTA_BINS = (0.0, 1e-4, 1e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0, math.inf)
"""Bins of |Δlogit| of the chosen token (teacher-forced), roughly logarithmic."""
BASE_QUANT = "base"
"""In --quants: the model as it is, not requantized."""


class SuiteError(SpecdiffError):
    """A suite's input or report folder is wrong."""


class PromptSkipped(Exception):
    """One prompt cannot run (too long for the context, ...); the others can."""


# -- prompts -------------------------------------------------------------------------
@dataclass(frozen=True)
class SuitePrompt:
    id: str
    prompt: str
    max_tokens: int | None = None
    where: str = ""
    """File and line (or file) it came from, for messages."""

    @property
    def file_stem(self) -> str:
        return safe_name(self.id)


def load_suite_prompts(source: str, skip_bad: bool = False) -> tuple[list[SuitePrompt], list[str]]:
    """Prompts from a JSONL file ({"id", "prompt", "max_tokens"?} a line), a folder of
    .txt files (id = file name), or a bundled set's name. Returns the prompts and the
    problems skipped (only with `skip_bad`; otherwise the first problem is raised)."""
    from specdiff import prompts as bundled

    path = Path(source).expanduser()
    problems: list[str] = []

    def bad(message: str) -> None:
        if not skip_bad:
            raise SuiteError(f"{message} (fix it, or pass --skip-bad to run the rest)")
        problems.append(message)

    entries: list[SuitePrompt] = []
    if path.is_dir():
        files = sorted(path.glob("*.txt"))
        for file in files:
            try:
                text = file.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                bad(f"{file}: not UTF-8 text")
                continue
            except OSError as error:
                bad(f"{file}: cannot read it ({error.strerror})")
                continue
            # an editor's final newline is not part of the prompt
            text = text[:-1] if text.endswith("\n") else text
            if not text.strip():
                bad(f"{file}: the prompt is empty")
                continue
            entries.append(SuitePrompt(file.stem, text, None, str(file)))
        where = f"{path} (no .txt files)" if not files else str(path)
    elif path.is_file():
        where = str(path)
        try:
            raw_lines = path.read_bytes().split(b"\n")
        except OSError as error:
            raise SuiteError(f"cannot read {path}: {error.strerror}") from None
        for number, raw in enumerate(raw_lines, 1):
            if not raw.strip():
                continue
            entry = _prompt_line(path, number, raw, bad)
            if entry is not None:
                entries.append(entry)
    elif source in bundled.SETS:
        where = f"the bundled set {source!r}"
        for number, item in enumerate(bundled.load(source), 1):
            entries.append(
                SuitePrompt(str(item["id"]), str(item["prompt"]), None, f"{source}:{number}")
            )
    else:
        raise SuiteError(
            f"no prompt file, folder or bundled set named {source!r} "
            f"(bundled sets: {', '.join(bundled.SETS)})"
        )
    unique: list[SuitePrompt] = []
    seen: dict[str, SuitePrompt] = {}
    for entry in entries:
        first = seen.get(entry.file_stem.lower())
        if first is not None:
            same = "duplicate id" if first.id == entry.id else "an id that names the same file as"
            bad(f"{entry.where}: {same} {entry.id!r} (first at {first.where})")
            continue
        seen[entry.file_stem.lower()] = entry
        unique.append(entry)
    if not unique:
        raise SuiteError(f"{where} holds no prompts; give at least one")
    return unique, problems


def _prompt_line(
    path: Path, number: int, raw: bytes, bad: Callable[[str], None]
) -> SuitePrompt | None:
    where = f"{path}:{number}"
    try:
        record = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        bad(f"{where}: not UTF-8 text")
        return None
    except ValueError as error:
        bad(f"{where}: not valid JSON ({error.args[0].split(':')[0]})")
        return None
    if not isinstance(record, dict):
        bad(f'{where}: expected an object like {{"id": "...", "prompt": "..."}}')
        return None
    prompt_id, prompt = record.get("id"), record.get("prompt")
    if isinstance(prompt_id, int) and not isinstance(prompt_id, bool):
        prompt_id = str(prompt_id)
    if not isinstance(prompt_id, str) or not prompt_id.strip():
        bad(f'{where}: missing "id" (a non-empty string)')
        return None
    if not isinstance(prompt, str) or not prompt.strip():
        bad(f'{where}: missing "prompt" (a non-empty string)')
        return None
    max_tokens = record.get("max_tokens")
    if max_tokens is not None and (
        isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1
    ):
        bad(f'{where}: "max_tokens" must be a whole number of at least 1, got {max_tokens!r}')
        return None
    return SuitePrompt(prompt_id, prompt, max_tokens, where)


# -- settings ------------------------------------------------------------------------
@dataclass(frozen=True)
class SuiteSettings:
    source: str
    pairs: tuple[Pair, ...]
    max_tokens: int
    near_tie: float = DEFAULT_NEAR_TIE
    teacher_forced: bool = False
    quants: tuple[str, ...] = ()
    """Run every pair once per weight type (BASE_QUANT = the model as it is)."""
    stop: tuple[str, ...] = ()

    def variants(self) -> list[tuple[str, Pair, str]]:
        """(label, pair as run, quant) for every pair and weight type, in run order."""
        if not self.quants:
            return [(pair.name, pair, "") for pair in self.pairs]
        out = []
        for pair in self.pairs:
            for quant in self.quants:
                value = "" if quant == BASE_QUANT else quant
                variant = replace(
                    pair, a=replace(pair.a, quant=value), b=replace(pair.b, quant=value)
                )
                out.append((f"{pair.name}@{quant}", variant, quant))
        return out

    def as_json(self, prompts: Sequence[SuitePrompt]) -> dict[str, Any]:
        return {
            "specdiff": __version__,
            "source": self.source,
            "prompts_sha256": prompts_digest(prompts),
            "prompt_ids": [p.id for p in prompts],
            "pairs": [
                {
                    "name": p.name,
                    "description": p.description,
                    "a": p.a.as_dict(),
                    "b": p.b.as_dict(),
                }
                for p in self.pairs
            ],
            "max_tokens": self.max_tokens,
            "near_tie": self.near_tie,
            "teacher_forced": self.teacher_forced,
            "quants": list(self.quants),
            "stop": list(self.stop),
        }


def check_quants(quants: Iterable[str]) -> tuple[str, ...]:
    known = (BASE_QUANT, *[q for q in QUANT_TYPES if q])
    out = []
    for quant in quants:
        quant = quant.strip().lower()
        if quant not in known:
            raise SuiteError(
                f"unknown weight type {quant!r} in --quants; known: {', '.join(known)}"
            )
        if quant not in out:
            out.append(quant)
    return tuple(out)


def prompts_digest(prompts: Sequence[SuitePrompt]) -> str:
    text = json.dumps([[p.id, p.prompt, p.max_tokens] for p in prompts], ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def settings_from_json(data: dict[str, Any]) -> SuiteSettings:
    pairs = tuple(
        Pair(
            str(p["name"]),
            lane_from_dict(p["a"]),
            lane_from_dict(p["b"]),
            str(p.get("description", "")),
        )
        for p in data["pairs"]
    )
    return SuiteSettings(
        source=str(data["source"]),
        pairs=pairs,
        max_tokens=int(data["max_tokens"]),
        near_tie=float(data["near_tie"]),
        teacher_forced=bool(data["teacher_forced"]),
        quants=tuple(data.get("quants", ())),
        stop=tuple(data.get("stop", ())),
    )


# -- per-prompt records --------------------------------------------------------------
@dataclass
class TeacherStats:
    """Lane B fed lane A's tokens: where B's own argmax differs (a flip)."""

    steps: int = 0
    flips: list[int] = field(default_factory=list)
    deltas: list[float] = field(default_factory=list)
    """|logit of A's token in B - in A| per step."""
    bucket_steps: list[int] = field(default_factory=lambda: [0] * (len(MARGIN_BUCKETS) - 1))
    bucket_flips: list[int] = field(default_factory=lambda: [0] * (len(MARGIN_BUCKETS) - 1))


def teacher_stats(a: Sequence[TokenStep], b: Sequence[TokenStep]) -> TeacherStats:
    stats = TeacherStats()
    for index in range(min(len(a), len(b))):
        reference, forced = a[index], b[index]
        chosen = reference.token_id
        stats.steps += 1
        flipped = forced.top[0].token_id != chosen
        if flipped:
            stats.flips.append(index)
        own = reference.logit_of(chosen)
        other = forced.logit_of(chosen)
        if own is not None and other is not None:
            stats.deltas.append(abs(other - own))
        bucket = _bucket(reference.margin, MARGIN_BUCKETS)
        stats.bucket_steps[bucket] += 1
        stats.bucket_flips[bucket] += int(flipped)
    return stats


def _bucket(value: float, edges: Sequence[float]) -> int:
    for number in range(len(edges) - 1):
        if value < edges[number + 1]:
            return number
    return len(edges) - 2


@dataclass
class PromptRecord:
    """What the report needs of one prompt under one pair, read from its session."""

    pair: str
    quant: str
    prompt_id: str
    session: str
    """The session file, relative to the report folder."""
    generated: tuple[int, int]
    identical: bool
    fork_index: int | None
    fork_margins: tuple[float, float] | None
    near_ties: tuple[int, int]
    tokens_per_second: tuple[float, float]
    generation_seconds: float
    drafted: tuple[int, int]
    accepted: tuple[int, int]
    output_sha256: tuple[str, str]
    stop_reasons: tuple[str, str]
    errors: tuple[str | None, str | None]
    teacher: TeacherStats | None = None

    @property
    def failed(self) -> bool:
        return any(self.errors)


def record_from_session(
    session: Session, label: str, quant: str, prompt_id: str, relative: str, near_tie: float
) -> PromptRecord:
    a, b = session.steps["a"], session.steps["b"]
    footer = session.footer or {}
    comparison = compare(a, b, near_tie)
    fork = comparison.fork
    identical = comparison.identical
    fork_index = None if fork is None else fork.index
    fork_margins = None if fork is None else (fork.a.margin, fork.b.margin)
    teacher = None
    if session.header.get("teacher_forced"):
        # B's token ids are A's by construction: B "forks" where its own pick first differs
        teacher = teacher_stats(a, b)
        identical = not teacher.flips and len(a) == len(b)
        fork_index = teacher.flips[0] if teacher.flips else None
        if fork_index is not None:
            fork_margins = (a[fork_index].margin, b[fork_index].margin)

    def pair_of(key: str, default: Any) -> tuple[Any, Any]:
        value = footer.get(key)
        return (value[0], value[1]) if isinstance(value, list) and len(value) == 2 else default

    return PromptRecord(
        pair=label,
        quant=quant,
        prompt_id=prompt_id,
        session=relative,
        generated=(len(a), len(b)),
        identical=identical,
        fork_index=fork_index,
        fork_margins=fork_margins,
        near_ties=(
            sum(1 for s in a if s.margin < near_tie),
            sum(1 for s in b if s.margin < near_tie),
        ),
        tokens_per_second=pair_of("tokens_per_second", (0.0, 0.0)),
        generation_seconds=float(footer.get("generation_seconds", 0.0)),
        drafted=pair_of("drafted", (0, 0)),
        accepted=pair_of("accepted", (0, 0)),
        output_sha256=(
            hashlib.sha256(b"".join(s.piece for s in a)).hexdigest(),
            hashlib.sha256(b"".join(s.piece for s in b)).hexdigest(),
        ),
        stop_reasons=pair_of("stop_reasons", ("", "")),
        errors=pair_of("errors", (None, None)),
        teacher=teacher,
    )


# -- running -------------------------------------------------------------------------
@dataclass
class Progress:
    """Where a running suite is, for a progress bar."""

    label: str
    prompt_id: str
    job: int
    """Jobs (prompt x pair) finished before the current one."""
    jobs: int
    tokens: int
    """Tokens produced so far in the current job (both lanes)."""
    job_tokens: int
    """Most tokens the current job can produce (both lanes)."""
    elapsed: float
    done_seconds: float
    """Wall time of the jobs run (not resumed) so far."""
    run_jobs: int
    """How many jobs were run (not resumed) so far."""

    @property
    def fraction(self) -> float:
        within = self.tokens / self.job_tokens if self.job_tokens else 0.0
        return min(1.0, (self.job + within) / self.jobs) if self.jobs else 1.0

    @property
    def eta_seconds(self) -> float | None:
        if not self.run_jobs:
            return None
        per_job = self.done_seconds / self.run_jobs
        within = self.tokens / self.job_tokens if self.job_tokens else 0.0
        return max(0.0, per_job * (self.jobs - self.job - within))


@dataclass
class SuiteOutcome:
    settings: SuiteSettings
    prompts: list[SuitePrompt]
    records: list[PromptRecord]
    executed: dict[str, dict[str, Any]]
    """Per variant label: the header's lanes, executed settings and build."""
    skipped: list[str]
    cancelled: bool
    wall_seconds: float
    resumed: int
    started: str
    skipped_runs: int = 0


class SuiteRun:
    """Runs a suite into a report folder; `run()` returns what finished."""

    def __init__(
        self,
        settings: SuiteSettings,
        prompts: list[SuitePrompt],
        report_dir: Path,
        skipped: Sequence[str] = (),
        on_progress: Callable[[Progress], None] | None = None,
        on_message: Callable[[str], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> None:
        self.settings = settings
        self.prompts = prompts
        self.report_dir = report_dir
        self.skipped = list(skipped)
        self.on_progress = on_progress or (lambda _: None)
        self.on_message = on_message or (lambda _: None)
        self.cancel = cancel or threading.Event()
        self.skipped_runs = 0
        """Runs that could not start (a prompt too long, a pair that would not load)."""

    def session_path(self, label: str, prompt: SuitePrompt) -> Path:
        return self.report_dir / SESSIONS_FOLDER / safe_name(label) / f"{prompt.file_stem}{SUFFIX}"

    def run(self) -> SuiteOutcome:
        from specdiff.engine.pairrun import PairRun

        began = time.perf_counter()
        started = datetime.now(timezone.utc).isoformat(timespec="seconds")
        variants = self.settings.variants()
        jobs = len(variants) * len(self.prompts)
        records: list[PromptRecord] = []
        executed: dict[str, dict[str, Any]] = {}
        job = resumed = run_jobs = 0
        done_seconds = 0.0
        cancelled = False
        for label, pair, quant in variants:
            pending = []
            for prompt in self.prompts:
                path = self.session_path(label, prompt)
                if path.exists():
                    records.append(self._record(path, label, quant, prompt, executed))
                    resumed += 1
                    job += 1
                else:
                    pending.append(prompt)
            if not pending:
                continue
            if self.cancel.is_set():
                cancelled = True
                break
            self.on_message(f"{label}: {pair.description or pair.name}")
            try:
                runner_for_pair = PairRun(pair, self.on_message, self.cancel)
            except SpecdiffError as error:
                # this pair cannot run (model, server, variant): the others still can
                for prompt in pending:
                    self.skipped.append(f"{label}: {prompt.id}: {error}")
                self.skipped_runs += len(pending)
                self.on_message(f"skipped {label}: {error}")
                job += len(pending)
                continue
            with runner_for_pair as runner:
                for prompt in pending:
                    job_began = time.perf_counter()
                    try:
                        path, stopped = self._run_one(
                            runner, label, pair, prompt, job, jobs, began, done_seconds, run_jobs
                        )
                    except PromptSkipped as skipped:
                        self.skipped.append(f"{label}: {skipped}")
                        self.skipped_runs += 1
                        self.on_message(f"skipped {label}: {skipped}")
                        job += 1
                        continue
                    if stopped:
                        cancelled = True
                        break
                    done_seconds += time.perf_counter() - job_began
                    run_jobs += 1
                    job += 1
                    records.append(self._record(path, label, quant, prompt, executed))
            if cancelled:
                break
        return SuiteOutcome(
            settings=self.settings,
            prompts=self.prompts,
            records=records,
            executed=executed,
            skipped=self.skipped,
            cancelled=cancelled,
            wall_seconds=time.perf_counter() - began,
            resumed=resumed,
            started=started,
            skipped_runs=self.skipped_runs,
        )

    def _record(
        self,
        path: Path,
        label: str,
        quant: str,
        prompt: SuitePrompt,
        executed: dict[str, dict[str, Any]],
    ) -> PromptRecord:
        session = load_session(path)
        if label not in executed:
            header = session.header
            executed[label] = {
                "lanes": header["lanes"],
                "executed": header.get("executed", {}),
                "build": header.get("build", {}),
            }
        relative = str(path.relative_to(self.report_dir))
        return record_from_session(
            session, label, quant, prompt.id, relative, self.settings.near_tie
        )

    def _run_one(
        self,
        runner: Any,
        label: str,
        pair: Pair,
        prompt: SuitePrompt,
        job: int,
        jobs: int,
        began: float,
        done_seconds: float,
        run_jobs: int,
    ) -> tuple[Path, bool]:
        """Run one prompt into its session file; True when the suite was stopped."""
        from specdiff.engine.pairrun import PairResult

        path = self.session_path(label, prompt)
        folder = path.parent
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{prompt.file_stem}{PARTIAL_SUFFIX}").unlink(missing_ok=True)
        max_tokens = prompt.max_tokens or self.settings.max_tokens
        try:
            tokens = runner.tokenize(prompt.prompt)
            runner.check(tokens, max_tokens)
        except SpecdiffError as error:
            raise PromptSkipped(f"{prompt.where}: {error}") from None
        writer = SessionWriter(folder, pair.name, prompt.prompt, name=prompt.file_stem)
        writer.write(
            header_record(
                pair,
                prompt.prompt,
                tokens,
                max_tokens,
                list(self.settings.stop),
                runner.executed(),
                runner.build,
                datetime.now(timezone.utc).isoformat(timespec="seconds"),
                self.settings.teacher_forced,
            )
        )
        produced = 0
        last_report = 0.0

        def on_step(step: TokenStep) -> None:
            nonlocal produced, last_report
            writer.step(step)
            produced += 1
            now = time.perf_counter()
            if now - last_report >= 0.1:
                last_report = now
                self.on_progress(
                    Progress(
                        label,
                        prompt.id,
                        job,
                        jobs,
                        produced,
                        2 * max_tokens,
                        now - began,
                        done_seconds,
                        run_jobs,
                    )
                )

        result: PairResult = runner.run(
            prompt.prompt,
            max_tokens,
            list(self.settings.stop),
            self.settings.near_tie,
            on_step,
            teacher_forced=self.settings.teacher_forced,
        )
        if result.cancelled:
            writer.handle.close()  # the partial file stays; --resume runs the prompt again
            return path, True
        footer = footer_record(result)
        footer["generation_seconds"] = result.a.seconds + result.b.seconds
        final = writer.finish(footer)
        if final != path:
            raise SuiteError(f"{path} appeared while the suite was writing it; start again")
        return path, False


# -- the report folder ---------------------------------------------------------------
def prepare_report_dir(
    report_dir: Path,
    settings: SuiteSettings | None,
    prompts: Sequence[SuitePrompt] | None,
    resume: bool,
    force: bool,
) -> SuiteSettings:
    """Check the report folder for a new or resumed suite; returns the settings to run.

    New: the folder must not exist (or --force clears specdiff's files from it).
    Resume: the folder's suite.json must exist and agree with what the command gives.
    """
    suite_file = report_dir / SUITE_FILE
    if resume:
        if force:
            raise SuiteError("--resume continues a suite and --force replaces it; pick one")
        try:
            recorded = json.loads(suite_file.read_text(encoding="utf-8"))
            recorded_settings = settings_from_json(recorded)
        except FileNotFoundError:
            raise SuiteError(
                f"{report_dir} holds no stopped suite ({SUITE_FILE} is missing); "
                "drop --resume to start one"
            ) from None
        except (OSError, ValueError, KeyError, TypeError, SpecdiffError) as error:
            raise SuiteError(f"{suite_file}: cannot read it ({error})") from None
        if settings is not None and prompts is not None:
            given = settings.as_json(prompts)
            for key in (
                "prompts_sha256",
                "pairs",
                "max_tokens",
                "teacher_forced",
                "quants",
                "stop",
                "near_tie",
            ):
                if given[key] != recorded.get(key):
                    raise SuiteError(
                        f"the {key.replace('_', ' ')} given differ from the stopped suite's in "
                        f"{report_dir}; resume with the same options, or use a new --report dir"
                    )
        return recorded_settings
    assert settings is not None
    if report_dir.exists():
        if not force:
            raise SuiteError(
                f"the report folder {report_dir} already exists; pass --force to replace "
                "its report, --resume to continue a stopped suite, or name a new folder"
            )
        if not report_dir.is_dir():
            raise SuiteError(f"{report_dir} is a file; name a folder for --report")
        for name in (SUITE_FILE, *REPORT_FILES):
            (report_dir / name).unlink(missing_ok=True)
        shutil.rmtree(report_dir / SESSIONS_FOLDER, ignore_errors=True)
    try:
        report_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise SuiteError(f"cannot create {report_dir}: {error.strerror}") from None
    return settings


def write_settings(
    report_dir: Path, settings: SuiteSettings, prompts: Sequence[SuitePrompt]
) -> None:
    text = json.dumps(settings.as_json(prompts), indent=1, ensure_ascii=False)
    (report_dir / SUITE_FILE).write_text(text + "\n", encoding="utf-8")


# -- summaries -----------------------------------------------------------------------
def median(values: Sequence[float]) -> float | None:
    clean = [v for v in values if math.isfinite(v)]
    return statistics.median(clean) if clean else None


def quantile(values: Sequence[float], q: float) -> float | None:
    clean = sorted(v for v in values if math.isfinite(v))
    if not clean:
        return None
    position = min(len(clean) - 1, max(0, math.ceil(q * len(clean)) - 1))
    return clean[position]


def fork_bins(max_tokens: int) -> list[tuple[int, int]]:
    """Ten equal bins of first-divergence index over [0, max_tokens)."""
    width = max(1, math.ceil(max_tokens / 10))
    return [(start, min(start + width, max_tokens)) for start in range(0, max_tokens, width)]


def summarize(records: Sequence[PromptRecord], max_tokens: int, near_tie: float) -> dict[str, Any]:
    """The report's figures for one pair (variant) from its prompt records."""
    n = len(records)
    ok = [r for r in records if not r.failed]
    forks = [r.fork_index for r in ok if r.fork_index is not None]
    longest = max([max_tokens, *(max(r.generated) for r in records)])
    bins = fork_bins(longest)
    histogram = [sum(1 for f in forks if lo <= f < hi) for lo, hi in bins]
    checkpoints = [c for c in CHECKPOINTS if c < longest] + [longest]
    by_length = [
        {"tokens": c, "forked": sum(1 for f in forks if f < c), "of": len(ok)} for c in checkpoints
    ]
    forked_at = [0] * (longest + 1)
    for index in forks:
        forked_at[index + 1] += 1
    by_token = []
    running = 0
    for count in forked_at:
        running += count
        by_token.append(running)
    margins = [min(r.fork_margins) for r in ok if r.fork_margins is not None]
    steps = [sum(r.generated[i] for r in ok) for i in (0, 1)]
    ties = [sum(r.near_ties[i] for r in ok) for i in (0, 1)]
    speeds = [
        median([r.tokens_per_second[i] for r in ok if r.tokens_per_second[i] > 0]) for i in (0, 1)
    ]
    ratios = [
        r.tokens_per_second[0] / r.tokens_per_second[1]
        for r in ok
        if r.tokens_per_second[0] > 0 and r.tokens_per_second[1] > 0
    ]
    drafted = [sum(r.drafted[i] for r in ok) for i in (0, 1)]
    accepted = [sum(r.accepted[i] for r in ok) for i in (0, 1)]
    summary: dict[str, Any] = {
        "prompts": n,
        "failed": n - len(ok),
        "identical": sum(1 for r in ok if r.identical),
        "forked": len(forks),
        "lengths_differ": sum(1 for r in ok if not r.identical and r.fork_index is None),
        "fork_indices": forks,
        "fork_histogram": [
            {"from": lo, "to": hi, "count": c} for (lo, hi), c in zip(bins, histogram)
        ],
        "forked_by_length": by_length,
        "forked_by_token": by_token,
        "fork_margin_median": median(margins),
        "fork_margins": margins,
        "near_tie_threshold": near_tie,
        "near_ties_per_1000": [1000 * ties[i] / steps[i] if steps[i] else None for i in (0, 1)],
        "tokens_per_second_median": speeds,
        "speedup": speeds[0] / speeds[1] if speeds[0] and speeds[1] else None,
        "speedup_median_of_ratios": median(ratios),
        "acceptance": [accepted[i] / drafted[i] if drafted[i] else None for i in (0, 1)],
        "drafted": drafted,
        "accepted": accepted,
        "generation_seconds": sum(r.generation_seconds for r in records),
    }
    teachers = [r.teacher for r in ok if r.teacher is not None]
    if teachers:
        summary["teacher_forced"] = teacher_summary(teachers)
    return summary


def teacher_summary(stats: Sequence[TeacherStats]) -> dict[str, Any]:
    steps = sum(s.steps for s in stats)
    flips = sum(len(s.flips) for s in stats)
    deltas = [d for s in stats for d in s.deltas]
    bucket_steps = [sum(s.bucket_steps[i] for s in stats) for i in range(len(MARGIN_BUCKETS) - 1)]
    bucket_flips = [sum(s.bucket_flips[i] for s in stats) for i in range(len(MARGIN_BUCKETS) - 1)]
    delta_counts = [0] * (len(DELTA_BINS) - 1)
    for delta in deltas:
        delta_counts[_bucket(delta, DELTA_BINS)] += 1
    return {
        "steps": steps,
        "flips": flips,
        "flip_rate": flips / steps if steps else None,
        "same_top1": 1 - flips / steps if steps else None,
        "prompts_with_a_flip": sum(1 for s in stats if s.flips),
        "delta_logit": {
            "mean": statistics.fmean(deltas) if deltas else None,
            "median": median(deltas),
            "p90": quantile(deltas, 0.9),
            "p99": quantile(deltas, 0.99),
            "max": max(deltas) if deltas else None,
            "histogram": [
                {"from": DELTA_BINS[i], "to": DELTA_BINS[i + 1], "count": delta_counts[i]}
                for i in range(len(delta_counts))
            ],
        },
        "by_margin": [
            {
                "from": MARGIN_BUCKETS[i],
                "to": MARGIN_BUCKETS[i + 1],
                "steps": bucket_steps[i],
                "flips": bucket_flips[i],
            }
            for i in range(len(bucket_steps))
        ],
    }


def outcome_json(outcome: SuiteOutcome) -> dict[str, Any]:
    """Everything the reports show, as one JSON-able object."""
    settings = outcome.settings
    by_label: dict[str, list[PromptRecord]] = {}
    for record in outcome.records:
        by_label.setdefault(record.pair, []).append(record)
    pairs = []
    for label, _pair, quant in settings.variants():
        records = by_label.get(label, [])
        pairs.append(
            {
                "label": label,
                "quant": quant,
                "summary": summarize(records, settings.max_tokens, settings.near_tie),
                "configuration": outcome.executed.get(label),
            }
        )
    jobs = len(settings.variants()) * len(outcome.prompts)
    return {
        "specdiff": __version__,
        "created": outcome.started,
        "complete": not outcome.cancelled
        and len(outcome.records) + outcome.skipped_runs == jobs,
        "jobs": jobs,
        "finished": len(outcome.records),
        "resumed": outcome.resumed,
        "wall_seconds": outcome.wall_seconds,
        "settings": settings.as_json(outcome.prompts),
        "skipped_prompts": outcome.skipped,
        "pairs": pairs,
        "prompts": [_record_json(r) for r in outcome.records],
    }


def _record_json(record: PromptRecord) -> dict[str, Any]:
    data = asdict(record)
    if record.teacher is not None:
        data["teacher"] = {
            "steps": record.teacher.steps,
            "flips": record.teacher.flips,
            "max_delta_logit": max(record.teacher.deltas, default=None),
        }
    return data
