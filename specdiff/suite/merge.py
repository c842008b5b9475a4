"""`specdiff suite merge`: the shards of one suite (`specdiff.suite.shards`) put together
into one report folder, whose report is the report the suite would have had run whole.

Each run is read back from its shard's session file, as a resumed suite reads its own,
and its file is copied into the merged folder under the same name, so every figure of the
report can still be traced to one file, and the folder can be resumed like any other.
Shards of another specdiff version, prompt set or configuration are refused, as are a
missing shard, a shard given twice, a run found in two shards and a shard whose runs are
not all there.

Where each shard ran is kept: the merged report lists its machines, and groups each
pair's forks by the CPU kind each run's session header names (the widest instruction set
llama.cpp used). With N shards each run ran once, on one machine: a fork rate that
differs between CPU kinds is a hint to check, over different prompts, never a proof that
a prompt forks on one kind only (`specdiff verify` on the other machine shows that).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdiff.errors import printable
from specdiff.sessions.store import PARTIAL_SUFFIX
from specdiff.sessions.verify import WIDEST_FIRST, cpu_features
from specdiff.suite import SuiteError
from specdiff.suite.folder import read_suite_file, session_path
from specdiff.suite.kld import SERVER_MISSING, kld_json, kld_path, read_scores, write_scores
from specdiff.suite.ledger import Ledger
from specdiff.suite.outcome import SuiteOutcome
from specdiff.suite.prompts import SuitePrompt
from specdiff.suite.records import Configuration, PromptRecord, read_record, unreadable_record
from specdiff.suite.settings import RESUMED_DEFAULTS, RESUMED_KEYS, SuiteSettings
from specdiff.suite.shards import Shard, SuiteUnit, read_shard_file, shard_of, suite_units

NAMED = 5
"""Units a refusal names before it counts the rest."""


@dataclass(frozen=True)
class ShardFolder:
    """One shard's report folder as merge reads it."""

    folder: Path
    shard: Shard
    suite: dict[str, Any]
    """Its suite.json."""
    record: dict[str, Any]
    """Its shard.json."""
    report: dict[str, Any] | None
    """Its report.json, None where the shard wrote none (it never ended)."""

    @property
    def complete(self) -> bool:
        return bool(self.report and self.report.get("complete"))


def read_shard(folder: Path) -> ShardFolder:
    record = read_shard_file(folder)
    report = None
    try:
        report = json.loads((folder / "report.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        pass
    except (OSError, ValueError, RecursionError) as error:
        raise SuiteError(
            f"{folder / 'report.json'}: cannot read it ({printable(str(error))})"
        ) from None
    return ShardFolder(
        folder,
        Shard(record["index"], record["count"]),
        read_suite_file(folder),
        record,
        report if isinstance(report, dict) else None,
    )


def check_same_suite(shards: Sequence[ShardFolder]) -> None:
    """Refuse shards of different suites, naming the first difference."""
    first = shards[0]
    for other in shards[1:]:
        pair = f"{first.folder} and {other.folder}"
        if first.suite.get("specdiff") != other.suite.get("specdiff"):
            raise SuiteError(
                f"the shards ran different specdiff versions: {first.folder} "
                f"{first.suite.get('specdiff')}, {other.folder} {other.suite.get('specdiff')}; "
                "run every shard with one version"
            )
        if first.shard.count != other.shard.count:
            raise SuiteError(
                f"the shards split the suite differently: {first.folder} is shard "
                f"{first.shard}, {other.folder} shard {other.shard}; run them with one N"
            )
        if first.suite.get("prompts_sha256") != other.suite.get("prompts_sha256"):
            raise SuiteError(
                f"the shards ran different prompt sets: {pair} (prompts_sha256 differs); run "
                "every shard on the same prompts"
            )
        for key in RESUMED_KEYS:
            default = RESUMED_DEFAULTS.get(key)
            ours, theirs = first.suite.get(key, default), other.suite.get(key, default)
            if ours != theirs:
                raise SuiteError(
                    f"the shards ran different configurations: {pair} differ in "
                    f"{_difference(key, ours, theirs)}; run every shard with the same options"
                )
        if first.record["suite_sha256"] != other.record["suite_sha256"]:
            raise SuiteError(f"the shards are of different suites: {pair} (suite_sha256)")


def _difference(key: str, ours: object, theirs: object) -> str:
    """The setting two shards differ in, down to a lane's key where both name the same
    pairs (a lane's default threads follow the machine's cores)."""
    shown = key.replace("_", " ")
    if key != "pairs" or not isinstance(ours, list) or not isinstance(theirs, list):
        return shown
    for one, other in zip(ours, theirs):
        for lane in ("a", "b"):
            mine, yours = _lane(one, lane), _lane(other, lane)
            changed = next((k for k in mine if mine[k] != yours.get(k)), None)
            if changed is not None:
                where = f"{printable(str(one.get('name')), 60)} lane {lane} {changed}"
                return f"pairs ({where}: {mine[changed]!r} vs {yours.get(changed)!r})"
    return shown


def _lane(pair: object, lane: str) -> dict[str, Any]:
    table = pair.get(lane) if isinstance(pair, dict) else None
    return table if isinstance(table, dict) else {}


def check_every_shard(shards: Sequence[ShardFolder]) -> None:
    """Refuse a shard given twice or one missing."""
    count = shards[0].shard.count
    seen: dict[int, Path] = {}
    for shard in shards:
        if shard.shard.index in seen:
            raise SuiteError(
                f"shard {shard.shard} is given twice ({seen[shard.shard.index]} and "
                f"{shard.folder}): each of its runs would count twice; give one of them"
            )
        seen[shard.shard.index] = shard.folder
    missing = [f"{index}/{count}" for index in range(1, count + 1) if index not in seen]
    if missing:
        raise SuiteError(
            f"shard{'s' if len(missing) > 1 else ''} {', '.join(missing)} of {count} "
            f"{'are' if len(missing) > 1 else 'is'} missing: give every shard's folder"
        )


def check_units(shards: Sequence[ShardFolder], units: Sequence[SuiteUnit]) -> None:
    """Refuse a run found in a shard it is not part of (so in two folders), and a shard
    whose finished runs are fewer than it says: one stopped before all were written, or
    whose files went since (a shard that ended may lack only the runs it skipped)."""
    count = shards[0].shard.count
    by_index = {shard.shard.index: shard for shard in shards}
    lacking: dict[int, list[str]] = {index: [] for index in by_index}
    for unit in units:
        owner = shard_of(unit.key, count)
        for shard in shards:
            if shard.shard.index != owner and _held(shard.folder, unit):
                raise SuiteError(
                    f"{unit.label} {unit.prompt.id} is in {shard.folder} (shard {shard.shard}) "
                    f"and belongs to shard {owner}/{count} ({by_index[owner].folder}): a run "
                    "duplicated; remove its session file from the wrong folder"
                )
        if not session_path(by_index[owner].folder, unit.label, unit.prompt).exists():
            lacking[owner].append(f"{unit.label} {unit.prompt.id}")
    for index, names in sorted(lacking.items()):
        shard = by_index[index]
        if names and len(names) > _skipped_runs(shard):
            more = len(names) - NAMED
            shown = ", ".join(names[:NAMED]) + (f" and {more} more" if more > 0 else "")
            raise SuiteError(
                f"shard {shard.shard} ({shard.folder}) lacks {len(names)} of its runs "
                f"({shown}): finish it with specdiff suite --resume --report {shard.folder}"
            )


def _skipped_runs(shard: ShardFolder) -> int:
    """The runs a shard that ended could not start (its report's jobs less those it
    recorded); none for a shard that did not end."""
    if not shard.complete or shard.report is None:
        return 0
    jobs, finished = shard.report.get("jobs"), shard.report.get("finished")
    return jobs - finished if isinstance(jobs, int) and isinstance(finished, int) else 0


def _held(folder: Path, unit: SuiteUnit) -> bool:
    """Whether a shard folder holds a session file of the unit, finished or cut short."""
    path = session_path(folder, unit.label, unit.prompt)
    return path.exists() or path.with_name(f"{unit.prompt.file_stem}{PARTIAL_SUFFIX}").exists()


def merge_shards(
    shards: Sequence[ShardFolder],
    settings: SuiteSettings,
    prompts: list[SuitePrompt],
    out: Path,
) -> tuple[SuiteOutcome, dict[str, Any]]:
    """Copy every run's session file into `out` and read each back in suite order: the
    outcome the whole suite would have had, and the report's `shards` section."""
    count = shards[0].shard.count
    by_index = {shard.shard.index: shard for shard in shards}
    labels = [label for label, _pair, _quant in settings.variants()]
    ledger = Ledger(labels, out, graded=settings.grade)
    executed: dict[str, Configuration] = {}
    kinds: list[tuple[str, str, bool]] = []
    quants = {label: quant for label, _pair, quant in settings.variants()}
    skipped_runs = 0
    for order, unit in enumerate(suite_units(settings, prompts)):
        source = by_index[shard_of(unit.key, count)].folder
        if not session_path(source, unit.label, unit.prompt).exists():
            skipped_runs += 1  # the shard completed without it: a run that could not start
            continue
        record, configuration = _copied_record(source, out, unit, quants[unit.label], settings)
        if configuration is not None:
            executed.setdefault(unit.label, configuration)
            forked = record.summary.fork_index is not None
            kinds.append((unit.label, cpu_kind(configuration["build"]), forked))
        ledger.add(record, order)
    outcome = SuiteOutcome(
        settings=settings,
        prompts=prompts,
        ledger=ledger,
        executed=executed,
        skipped=_skipped(shards),
        cancelled=False,
        wall_seconds=max(_number(s, "wall_seconds") for s in shards),
        resumed=int(sum(_number(s, "resumed") for s in shards)),
        started=min(str((s.report or {}).get("created", "")) for s in shards),
        skipped_runs=skipped_runs,
        executed_code=settings.executes_code(prompts),
        kld=_merged_kld(shards, settings, out, ledger),
    )
    return outcome, shards_section(shards, kinds)


def _copied_record(
    source: Path, out: Path, unit: SuiteUnit, quant: str, settings: SuiteSettings
) -> tuple[PromptRecord, Configuration | None]:
    """The unit's session file copied from its shard's folder into `out`, and its record
    read back from there (a failed run's, where it cannot be read)."""
    path = session_path(out, unit.label, unit.prompt)
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(session_path(source, unit.label, unit.prompt), path)
    relative = str(path.relative_to(out))
    prompt_id = unit.prompt.id
    read = read_record(path, relative, unit.label, quant, prompt_id, settings.near_tie)
    if isinstance(read, str):
        return unreadable_record(unit.label, quant, prompt_id, relative, read), None
    return read


def cpu_kind(build: dict[str, Any]) -> str:
    """The CPU kind a run's build names: the widest instruction set llama.cpp used."""
    features = cpu_features(str(build.get("system_info") or ""))
    widest = next((feature for feature in WIDEST_FIRST if feature in features), None)
    return widest or str(build.get("cpu") or "unknown")


def shards_section(
    shards: Sequence[ShardFolder], kinds: Sequence[tuple[str, str, bool]]
) -> dict[str, Any]:
    """The merged report's account of where the runs ran: each shard's machines, and per
    pair the runs and forks on each CPU kind, flagged where the fork rates differ."""
    forks: dict[str, dict[str, dict[str, int]]] = {}
    for label, kind, forked in kinds:
        counts = forks.setdefault(label, {}).setdefault(kind, {"runs": 0, "forked": 0})
        counts["runs"] += 1
        counts["forked"] += int(forked)
    differs = [
        label
        for label, by_kind in forks.items()
        if len(by_kind) > 1 and len({c["forked"] / c["runs"] for c in by_kind.values()}) > 1
    ]
    return {
        "count": shards[0].shard.count,
        "suite_sha256": shards[0].record["suite_sha256"],
        "shards": [
            {
                "shard": str(shard.shard),
                "folder": str(shard.folder),
                "units": shard.record["units"],
                "machines": shard.record["machines"],
            }
            for shard in sorted(shards, key=lambda s: s.shard.index)
        ],
        "forks_by_cpu": forks,
        "fork_rate_differs": differs,
    }


def _skipped(shards: Sequence[ShardFolder]) -> list[str]:
    """Every shard's skipped lines and runs, each once (every shard read the same file,
    so its bad lines are in each)."""
    lines: dict[str, None] = {}
    for shard in sorted(shards, key=lambda s: s.shard.index):
        for line in (shard.report or {}).get("skipped_prompts", []):
            lines[str(line)] = None
    return list(lines)


def _number(shard: ShardFolder, key: str) -> float:
    value = (shard.report or {}).get(key, 0)
    return float(value) if isinstance(value, (int, float)) else 0.0


def _merged_kld(
    shards: Sequence[ShardFolder], settings: SuiteSettings, out: Path, ledger: Ledger
) -> dict[str, dict[str, Any]]:
    """A teacher-forced suite's KL divergence figures from every shard's scores, written
    to the merged folder; nothing is scored again (a shard scores its own runs)."""
    if not settings.teacher_forced:
        return {}
    merged: dict[str, dict[str, Any]] = {}
    records = list(ledger.records())
    for label, pair, _quant in settings.variants():
        if {pair.a.backend, pair.b.backend} != {"local"}:
            merged[label] = {"summary": None, "prompts": [], "missing": SERVER_MISSING}
            continue
        scores = {}
        for shard in shards:
            scores.update(read_scores(kld_path(shard.folder, label)))
        path = kld_path(out, label)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_scores(path, scores)
        ids = [r["prompt_id"] for r in records if r["pair"] == label]
        merged[label] = kld_json(scores, ids, _kld_missing(shards, label))
    return merged


def _kld_missing(shards: Sequence[ShardFolder], label: str) -> str | None:
    """Why a shard's KL divergence figures of the pair are missing, the first one said."""
    for shard in shards:
        for pair in (shard.report or {}).get("pairs", []):
            kld = pair.get("summary", {}).get("kld") if pair.get("label") == label else None
            if isinstance(kld, dict) and kld.get("missing"):
                return str(kld["missing"])
    return None
