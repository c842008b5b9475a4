"""specdiff from Python (a notebook, a script): the functions the command line's commands
call, behind typed signatures with the command line's defaults.

Each function is a thin seam over what a command runs, not a second implementation:
`run_pair` is `specdiff run` (a PairWorker, the run in a worker process), `run_suite` is
`specdiff suite` (SuiteRun into a report folder, then the same four report files),
`certify` is `specdiff certify` (the battery, in a worker process), `load_session` is the
session reader, and `import_lm_eval` / `import_promptfoo` are `specdiff import`. Errors
are the ones the commands turn into one line and exit 2: `SpecdiffError` subclasses.

Engine modules load inside the functions, so `import specdiff.api` stays cheap.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specdiff.compare import DEFAULT_NEAR_TIE
from specdiff.errors import PromptError
from specdiff.lanes import Lane, Pair

if TYPE_CHECKING:
    from specdiff.imports.compare import ImportComparison
    from specdiff.results import PairResult
    from specdiff.sessions.store import Session
    from specdiff.suite.outcome import SuiteReport

__all__ = [
    "certify",
    "import_lm_eval",
    "import_promptfoo",
    "load_session",
    "pair",
    "run_pair",
    "run_suite",
]

DEFAULT_PAIR = "spec-vs-plain"
"""The pair `specdiff run` compares when none is named."""


def pair(
    name: str | Pair = DEFAULT_PAIR,
    *,
    both: Mapping[str, Any] | None = None,
    lane_a: Mapping[str, Any] | None = None,
    lane_b: Mapping[str, Any] | None = None,
) -> Pair:
    """A preset pair by name (`specdiff run --pair`), with lane settings changed in both
    lanes (`--both`) and in each (`--lane-a`, `--lane-b`): `pair("ubatch",
    both={"repack": False})`. Values are typed as the lane keys are (ints, bools...)."""
    # deferred: presets read their TOML only when a pair is asked for
    from dataclasses import replace

    from specdiff.lanes.overrides import apply_overrides
    from specdiff.lanes.presets import presets, unknown_pair

    if isinstance(name, Pair):
        chosen = name
    else:
        known = presets()
        if name not in known:
            raise unknown_pair(name, known)
        chosen = known[name]
    lanes = [
        apply_overrides(apply_overrides(lane, dict(both or {})), dict(own or {}))
        for lane, own in ((chosen.a, lane_a), (chosen.b, lane_b))
    ]
    return replace(chosen, a=lanes[0], b=lanes[1])


def run_pair(
    prompt: str,
    pair: str | Pair = DEFAULT_PAIR,
    max_tokens: int = 64,
    *,
    stop: Sequence[str] = (),
    near_tie: float = DEFAULT_NEAR_TIE,
    teacher_forced: bool = False,
) -> PairResult:
    """Both lanes of `pair` on `prompt`, greedy, as `specdiff run` runs them: the
    result holds each lane's steps (`result.a.steps`), and `result.comparison.fork`
    the first differing token with both lanes' margins there (None when identical)."""
    # deferred: the engine loads only when a run is asked for
    from specdiff.engine.worker import PairWorker

    _check_limits(max_tokens, near_tie)
    chosen = _pair(pair)
    with PairWorker(chosen) as runner:
        return runner.run(prompt, max_tokens, list(stop), near_tie, None, teacher_forced)


def load_session(path: str | Path) -> Session:
    """A saved session (`specdiff run --save`, a suite's sessions/): its header (prompt,
    lanes, build), both lanes' steps and `summary()`."""
    # deferred: the session reader loads only when a session is asked for
    from specdiff.sessions.store import load_session as load

    return load(path)


def run_suite(
    prompts: Sequence[str] | Mapping[str, str] | str | Path,
    pairs: Sequence[str | Pair] = (DEFAULT_PAIR,),
    report: str | Path = "suite-report",
    max_tokens: int = 64,
    *,
    near_tie: float = DEFAULT_NEAR_TIE,
    force: bool = False,
) -> SuiteReport:
    """Every pair on every prompt, as `specdiff suite` runs them, into the folder
    `report` (report.json, .md, .html, results.csv and the sessions); returns what
    report.json holds (its `prompts`: one record per run). `prompts`: texts (ids p1,
    p2, ...), a mapping of id to text, or what `specdiff suite` takes (a JSONL file, a
    folder of .txt, a bundled set's name)."""
    # deferred: the suite runner and the engine load only when a suite is asked for
    from specdiff.reports.suite import write_reports
    from specdiff.suite.folder import prepare_report_dir, write_settings
    from specdiff.suite.outcome import outcome_json
    from specdiff.suite.runner import SuiteRun
    from specdiff.suite.settings import SuiteSettings, check_concurrency

    _check_limits(max_tokens, near_tie)
    source, chosen = _suite_prompts(prompts)
    settings = SuiteSettings(
        source=source,
        pairs=tuple(_pair(p) for p in pairs),
        max_tokens=max_tokens,
        near_tie=near_tie,
    )
    check_concurrency(settings)
    folder = Path(report).expanduser()
    prepare_report_dir(folder, settings, chosen, resume=False, force=force)
    write_settings(folder, settings, chosen)
    outcome = SuiteRun(settings, chosen, folder).run()
    data = outcome_json(outcome)
    try:
        write_reports(folder, data)
        # the records are read from the ledger as they are iterated: read them while it
        # is open, so the caller's copy outlives it
        data["prompts"] = list(data["prompts"])
    finally:
        outcome.ledger.close()
    return data


def certify(
    lane: str | Lane | None = None,
    *,
    other: str | Lane | None = None,
    properties: Sequence[str] = (),
    max_tokens: int = 48,
    runs: int = 4,
) -> dict[str, Any]:
    """The certify battery (`specdiff certify`) on a server (its URL) or a lane (the
    in-process engine when None), compared with `other` where given; returns the
    certificate's JSON, each property's verdict under `properties`."""
    # deferred: the battery and the engine load only when a certificate is asked for
    from specdiff.certify.battery import certify as battery
    from specdiff.certify.records import check_properties
    from specdiff.certify.sides import Settings
    from specdiff.engine.worker import call_in_worker

    settings = Settings(
        runs=runs,
        max_tokens=max_tokens,
        properties=check_properties(list(properties)) if properties else (),
    )
    settings.check()
    arguments = (_lane(lane), settings, None if other is None else _lane(other), False)
    data: dict[str, Any] = call_in_worker(battery, arguments, {}, doing="running certify")
    return data


def import_lm_eval(run_a: str | Path, run_b: str | Path) -> ImportComparison:
    """Two lm-evaluation-harness --log_samples runs paired item by item
    (`specdiff import lm-eval`); `.summary_line()` and `.to_json()` describe them."""
    from specdiff.imports.compare import compare_runs
    from specdiff.imports.lm_eval import read_lm_eval

    return compare_runs(read_lm_eval(Path(run_a)), read_lm_eval(Path(run_b)))


def import_promptfoo(run_a: str | Path, run_b: str | Path) -> ImportComparison:
    """Two promptfoo `eval -o` results paired item by item (`specdiff import promptfoo`)."""
    from specdiff.imports.compare import compare_runs
    from specdiff.imports.promptfoo import pair_providers, read_promptfoo

    a = read_promptfoo(Path(run_a))
    return compare_runs(a, pair_providers(a, read_promptfoo(Path(run_b))))


def _check_limits(max_tokens: int, near_tie: float) -> None:
    """The limits every decoding command checks, in the words of a call."""
    if max_tokens < 1:
        raise PromptError(f"max_tokens must be at least 1, got {max_tokens}")
    if near_tie < 0:
        raise PromptError(f"near_tie must not be negative, got {near_tie}")


def _pair(given: str | Pair) -> Pair:
    return given if isinstance(given, Pair) else pair(given)


def _lane(given: str | Lane | None) -> Lane:
    if given is None:
        return Lane()
    if isinstance(given, Lane):
        return given
    return Lane(backend="server", endpoint=given)


def _suite_prompts(
    prompts: Sequence[str] | Mapping[str, str] | str | Path,
) -> tuple[str, list[Any]]:
    """The suite's source (as suite.json names it) and its prompts."""
    from specdiff.suite.prompts import SuitePrompt, load_suite_prompts

    if isinstance(prompts, (str, Path)):
        loaded, _ = load_suite_prompts(str(prompts))
        return str(prompts), loaded
    if isinstance(prompts, Mapping):
        items = list(prompts.items())
    else:
        items = [(f"p{n}", text) for n, text in enumerate(prompts, 1)]
    return "python", [SuitePrompt(id=key, prompt=text, where="python") for key, text in items]
