"""`suite --ray` and `repeat --ray` on a Ray cluster started here with 2 CPUs (once for
the module): a suite run whole here, in three shards on Ray merged, and over two actors
reports the same forks at the same tokens, an actor killed mid-unit is
survived with each unit recorded once, a stopped Ray suite is finished by --resume
without Ray, and no Ray process outlives the module. Ray missing is one line naming the
extra (fast tier: a subprocess in which `import ray` fails)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from specdiff.cli import main
from specdiff.lanes.values import default_threads
from specdiff.prompts import load as load_prompts
from specdiff.sessions.store import PARTIAL_SUFFIX, load_session
from tests.conftest import ROOT, ForkingPrompt, process_running, wait_until
from tests.same_reports import (
    assert_same_reports,
    assert_same_runs,
    compare_reports,
    report_json,
    results,
    with_lane_threads,
)

TOKENS = 8
PAIR = "spec-vs-plain"


@pytest.fixture(scope="module")
def three_prompts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("prompts") / "three.jsonl"
    lines = [json.dumps(item) for item in load_prompts("coding")[:3]]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def descendants(pid: int) -> set[int]:
    """Every process below `pid` now, read from the process table."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier}
        found |= frontier
    return found


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A local Ray with 2 CPUs in a temp folder of its own; at the end, shut down, and
    every process it started (its services, actors, their workers) gone."""
    import ray

    before = descendants(os.getpid())
    # short: Ray's socket paths live under it
    temp = Path(tmp_path_factory.mktemp("ray", numbered=True))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=str(temp))
    try:
        yield ray
    finally:
        started = descendants(os.getpid()) - before
        ray.shutdown()
        wait_until(
            lambda: not [pid for pid in started if process_running(pid)],
            "Ray's processes to end after ray.shutdown()",
        )


def suite_args(prompts: Path, report: Path, *extra: str) -> list[str]:
    return [
        "suite", str(prompts), "--pair", PAIR, "--max-tokens", str(TOKENS),
        "--report", str(report), "--quiet", *extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def in_process(three_prompts: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference: the suite in this process, each lane on one thread as an actor with
    one CPU runs it."""
    report = tmp_path_factory.mktemp("here") / "report"
    assert main([*suite_args(three_prompts, report), "--both", "threads=1"]) in (0, 1)
    return report


FORK_PAIR = "ubatch"
FORK_TOKENS = 10


def forking_suite(path: Path, fork: ForkingPrompt) -> Path:
    """Four prompts, the first one `forking_prompt` found forking under FORK_PAIR."""
    lines = [
        {"id": "fork", "prompt": fork.prompt},
        {"id": "capital", "prompt": "The capital of France is"},
        {"id": "code", "prompt": "def fibonacci(n):"},
        {"id": "story", "prompt": "Once upon a time"},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


def run_three_ways(prompts: Path, folder: Path) -> tuple[Path, list[Path], Path, Path]:
    """The suite whole in this process, in three shards on Ray merged, and whole over two
    actors: the whole folder, the shards', the merged one and the Ray one."""
    suite = ["suite", str(prompts), "--pair", FORK_PAIR, "--max-tokens", str(FORK_TOKENS)]
    suite += ["--quiet"]
    # each lane on the one thread an actor with one CPU gives it
    one_thread = ["--both", "threads=1"]
    two_actors = ["--ray", "--ray-actors", "2"]
    whole = folder / "whole"
    assert main([*suite, "--report", str(whole), *one_thread]) == 0
    shards = [folder / f"shard{n}" for n in (1, 2, 3)]
    for number, shard in enumerate(shards, start=1):
        where = ["--report", str(shard), "--shard", f"{number}/3"]
        assert main([*suite, *where, *one_thread, *two_actors]) == 0
    merged = folder / "merged"
    assert main(["suite", "merge", *map(str, shards), "--report", str(merged)]) == 0
    on_ray = folder / "ray"
    assert main([*suite, "--report", str(on_ray), *two_actors]) == 0
    return whole, shards, merged, on_ray


@pytest.mark.model
def test_a_suite_whole_in_ray_shards_merged_and_over_two_actors_reports_the_same(
    ray_cluster: Any, forking_prompt: Any, tmp_path: Path, capsys
) -> None:
    fork = forking_prompt(FORK_PAIR, FORK_TOKENS)
    prompts = forking_suite(tmp_path / "p.jsonl", fork)
    whole, shards, merged, on_ray = run_three_ways(prompts, tmp_path)
    capsys.readouterr()
    assert_same_reports(merged, whole)
    # the lanes kept this process's default threads (its cores: one under pytest-xdist,
    # which pins each worker), and each actor ran them on its one CPU
    session = load_session(next((on_ray / "sessions").rglob("*.jsonl")))
    assert session.header.pair.a.threads == default_threads()
    assert [session.header.executed[lane]["threads"] for lane in "ab"] == [1, 1]
    compare_reports(with_lane_threads(report_json(on_ray), 1), report_json(whole))
    assert_same_runs(on_ray, whole)
    forks = {row["prompt_id"]: row["fork_index"] for row in report_json(merged)["prompts"]}
    assert forks["fork"] == fork.fork_index  # as a run of its own found it
    section = report_json(merged)["shards"]
    shard_runs = [json.loads((s / "shard.json").read_text())["units"] for s in shards]
    assert sum(shard_runs) == len(forks) and [s["units"] for s in section["shards"]] == shard_runs
    [(kind, counts)] = section["forks_by_cpu"][FORK_PAIR].items()
    assert counts == {"runs": len(forks), "forked": sum(f is not None for f in forks.values())}
    assert section["fork_rate_differs"] == []
    assert "## Shards and their machines" in (merged / "report.md").read_text(encoding="utf-8")
    # a finished shard resumes on its own without Ray, reading every run back, running none
    again = tmp_path / "again"
    shutil.copytree(shards[0], again)
    assert main(["suite", "--resume", "--report", str(again), "--quiet"]) == 0
    resumed = report_json(again)
    assert resumed["resumed"] == resumed["jobs"] == resumed["finished"]
    assert len(json.loads((again / "shard.json").read_text())["machines"]) == 2


@pytest.mark.model
def test_an_actor_killed_mid_unit_is_survived_and_each_unit_is_recorded_once(
    ray_cluster: Any, three_prompts: Path, in_process: Path, tmp_path: Path, capsys
) -> None:
    report = tmp_path / "report"
    killed: list[str] = []

    def kill_an_actor_mid_unit() -> None:
        # a unit's header is written as it is sent: its actor is running it
        wait_until(
            lambda: any((report / "sessions").rglob(f"*{PARTIAL_SUFFIX}")), "a unit in flight"
        )
        names = [a["name"] for a in ray_cluster.util.list_named_actors(all_namespaces=True)]
        name = next(n for n in names if n.startswith("specdiff-pair-"))
        ray_cluster.kill(ray_cluster.get_actor(name))
        killed.append(name)

    killer = threading.Thread(target=kill_an_actor_mid_unit, daemon=True)
    killer.start()
    # not --quiet: the death is said
    loud = [arg for arg in suite_args(three_prompts, report) if arg != "--quiet"]
    code = main([*loud, "--ray"])
    killer.join(timeout=60)
    assert killed, "no actor was killed"
    assert code in (0, 1)
    assert capsys.readouterr().err.count("a Ray actor died under a unit") == 1
    rows = results(report)
    assert sorted(row["prompt_id"] for row in rows) == sorted(
        row["prompt_id"] for row in results(in_process)
    )  # each unit once
    # the unit run again on a fresh actor has the steps, logits and all, of the reference
    assert_same_runs(report, in_process)
    assert not list((report / "sessions").rglob(f"*{PARTIAL_SUFFIX}"))


@pytest.mark.model
def test_a_stopped_ray_suite_is_finished_by_resume_without_ray(
    ray_cluster: Any, three_prompts: Path, in_process: Path, tmp_path: Path
) -> None:
    report = tmp_path / "report"
    main_thread = threading.get_ident()

    def ctrl_c_while_the_first_units_run() -> None:
        # the actors take a unit each; the third waits, and a Ctrl+C leaves it waiting
        wait_until(
            lambda: any((report / "sessions").rglob(f"*{PARTIAL_SUFFIX}")), "a unit in flight"
        )
        signal.pthread_kill(main_thread, signal.SIGINT)

    threading.Thread(target=ctrl_c_while_the_first_units_run, daemon=True).start()
    assert main([*suite_args(three_prompts, report), "--ray"]) == 130
    done = json.loads((report / "report.json").read_text())["finished"]
    assert 1 <= done < 3
    assert main(["suite", "--resume", "--report", str(report), "--quiet"]) in (0, 1)
    assert results(report) == results(in_process)


def repeat_json(capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, Any]:
    arguments = ["repeat", "--prompt", "The capital of France is", "-n", "5"]
    code = main([*arguments, "--max-tokens", str(TOKENS), "--json", "--quiet", *extra])
    assert code in (0, 1)
    data: dict[str, Any] = json.loads(capsys.readouterr().out)
    for run in data["per_run"]:
        del run["tokens_per_second"]  # a time
    del data["lane"]  # the reference names its one thread
    return data


@pytest.mark.model
def test_repeat_over_actors_equals_repeat_in_process(ray_cluster: Any, capsys) -> None:
    here = repeat_json(capsys, "--lane", "threads=1")
    spread = repeat_json(capsys, "--ray", "--ray-actors", "2")
    assert spread == here
    assert spread["runs"] == 5 and not spread["cancelled"]


@pytest.mark.model
def test_more_actors_than_the_cluster_holds_are_refused(
    ray_cluster: Any, three_prompts: Path, tmp_path: Path, capsys
) -> None:
    report = tmp_path / "report"
    assert main([*suite_args(three_prompts, report), "--ray", "--ray-actors", "3"]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "--ray-actors 3 at 1 CPU each needs 3 CPUs, and the Ray cluster offers 2" in line
    assert not list((report / "sessions").rglob("*.jsonl"))


@pytest.mark.model
def test_a_pair_that_will_not_load_on_an_actor_is_skipped_as_in_process(
    ray_cluster: Any, three_prompts: Path, tmp_path: Path, capsys
) -> None:
    report = tmp_path / "report"
    loud = [arg for arg in suite_args(three_prompts, report) if arg != "--quiet"]
    missing = str(tmp_path / "missing.gguf")
    assert main([*loud, "--both", f"model={missing}", "--ray"]) == 1
    err = capsys.readouterr().err
    assert f"skipped {PAIR}: model file not found: {missing}" in err
    assert "Traceback" not in err
    # the actors that tried are gone with the pair: none is left to the next one
    names = [a["name"] for a in ray_cluster.util.list_named_actors(all_namespaces=True)]
    assert not [name for name in names if name.startswith("specdiff-")]


RAY_HIDDEN = "import sys; sys.modules['ray'] = None; from specdiff.cli import main; "


@pytest.mark.parametrize("command", ["suite", "repeat"])
def test_ray_missing_is_one_line_naming_the_extra(
    command: str, three_prompts: Path, tmp_path: Path
) -> None:
    report = tmp_path / "report"
    arguments = (
        suite_args(three_prompts, report)
        if command == "suite"
        else ["repeat", "--prompt", "hi", "-n", "2"]
    )
    done = subprocess.run(
        [sys.executable, "-c", RAY_HIDDEN + f"sys.exit(main({[*arguments, '--ray']!r}))"],
        capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "pip install -e '.[ray]'" in lines[0]
    assert not report.exists()


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--ray-actors", "2"], "--ray-actors sets how --ray runs: add --ray"),
        (["--ray-cpus", "2"], "--ray-cpus sets how --ray runs: add --ray"),
    ],
)
def test_ray_settings_without_ray_are_refused(
    extra: list[str], words: str, three_prompts: Path, tmp_path: Path, capsys
) -> None:
    report = tmp_path / "report"
    assert main([*suite_args(three_prompts, report), *extra]) == 2
    assert words in capsys.readouterr().err
    assert not report.exists()


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--batch", "4"], "--batch runs every run in one KV memory; drop --batch or --ray"),
        (["--companions", "0,1"], "--ray runs one --companions value; sweep without --ray"),
        (
            ["--endpoint", "http://127.0.0.1:9"],
            "--ray runs in-process repeats; a server repeat drops --ray",
        ),
    ],
)
def test_repeat_modes_that_need_their_runs_in_one_place_refuse_ray(
    extra: list[str], words: str, capsys
) -> None:
    assert main(["repeat", "--prompt", "hi", "-n", "2", "--ray", *extra]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert words in line


def test_a_ray_suite_with_concurrency_is_refused(
    three_prompts: Path, tmp_path: Path, capsys
) -> None:
    report = tmp_path / "report"
    server = ["--both", "backend=server", "--both", "endpoint=http://127.0.0.1:9"]
    plain = [arg if arg != PAIR else "ubatch" for arg in suite_args(three_prompts, report)]
    arguments = [*plain, *server, "--concurrency", "2", "--ray"]
    assert main(arguments) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "--ray runs units side by side on its actors (--ray-actors); drop --concurrency" in line
    assert not list(report.rglob("*.jsonl"))


def test_prompts_taken_as_the_address_are_named_in_one_line(tmp_path: Path, capsys) -> None:
    report = tmp_path / "report"
    assert main(["suite", "--ray", "coding", "--report", str(report)]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "--ray took 'coding' as the cluster's address" in line
    assert "specdiff suite coding --ray" in line
    assert not report.exists()
