"""`specdiff suite --shard I/N` and `specdiff suite merge`: the partition of a suite's runs
into shards (stable under added and reordered prompts, each run in one shard), the shard
values refused and the merges refused. That three shards merged report what the suite
run whole does (and what it does on Ray) is tests/test_ray.py's, which runs the shards
on its Ray cluster."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdiff.cli import main
from specdiff.cli.suite_merge import merge_arguments
from specdiff.cli.suite_shards import record_shard
from specdiff.lanes import presets
from specdiff.suite import SuiteError
from specdiff.suite.folder import write_settings
from specdiff.suite.prompts import SuitePrompt, load_suite_prompts
from specdiff.suite.settings import SuiteSettings
from specdiff.suite.shards import Shard, parse_shard, suite_units

PAIR = "ubatch"

texts = st.text(min_size=1, max_size=30)
prompt_sets = st.lists(st.tuples(st.text(min_size=1, max_size=8), texts), max_size=12).map(
    lambda items: [SuitePrompt(id, text) for id, text in dict(items).items()]
)


def suite_of(quants: tuple[str, ...] = ()) -> SuiteSettings:
    pairs = presets()
    return SuiteSettings("p.jsonl", (pairs[PAIR], pairs["spec-vs-plain"]), 8, quants=quants)


def shards_of(settings: SuiteSettings, prompts: list[SuitePrompt], count: int) -> dict:
    """Each unit (label, prompt id) and the one shard of `count` that holds it."""
    placed: dict[tuple[str, str], list[int]] = {}
    for unit in suite_units(settings, prompts):
        for index in range(1, count + 1):
            if Shard(index, count).holds(unit.key):
                placed.setdefault((unit.label, unit.prompt.id), []).append(index)
    return placed


@settings(max_examples=60, deadline=None)
@given(prompts=prompt_sets, count=st.integers(1, 9), quants=st.sampled_from([(), ("base",)]))
def test_every_unit_is_in_exactly_one_shard(prompts, count, quants) -> None:
    suite = suite_of(quants)
    placed = shards_of(suite, prompts, count)
    assert len(placed) == 2 * len(prompts)
    assert all(len(indices) == 1 for indices in placed.values())


@settings(max_examples=60, deadline=None)
@given(prompts=prompt_sets, new=texts, count=st.integers(1, 9), data=st.data())
def test_adding_a_prompt_moves_only_its_own_units(prompts, new, count, data) -> None:
    suite = suite_of()
    before = shards_of(suite, prompts, count)
    added = SuitePrompt("\0new", new)
    place = data.draw(st.integers(0, len(prompts)))
    after = shards_of(suite, [*prompts[:place], added, *prompts[place:]], count)
    assert {key: value for key, value in after.items() if key[1] != added.id} == before
    assert len(after) == len(before) + 2


@settings(max_examples=30, deadline=None)
@given(prompts=prompt_sets, count=st.integers(1, 9), seed=st.randoms())
def test_the_order_of_the_prompts_moves_nothing(prompts, count, seed) -> None:
    shuffled = list(prompts)
    seed.shuffle(shuffled)
    assert shards_of(suite_of(), shuffled, count) == shards_of(suite_of(), prompts, count)


def test_shards_are_about_even() -> None:
    prompts = [SuitePrompt(f"p{n}", f"prompt number {n}") for n in range(600)]
    sizes = [0, 0, 0]
    for indices in shards_of(suite_of(), prompts, 3).values():
        sizes[indices[0] - 1] += 1
    # 1,200 units, 400 expected per shard: 6 standard deviations either side
    spread = 6 * math.sqrt(1200 * (1 / 3) * (2 / 3))
    assert all(abs(size - 400) < spread for size in sizes), sizes


@pytest.mark.parametrize(
    "value, environ, shards, expected",
    [
        ("2/3", {}, None, Shard(2, 3)),
        (" 3/3 ", {}, 3, Shard(3, 3)),
        ("auto", {"JOB_COMPLETION_INDEX": "0"}, 3, Shard(1, 3)),
        ("auto", {"JOB_COMPLETION_INDEX": "2", "SPECDIFF_SHARDS": "3"}, None, Shard(3, 3)),
        ("auto", {"SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_TASK_COUNT": "3"}, None, Shard(1, 3)),
        (
            "auto",
            {
                "SLURM_ARRAY_TASK_ID": "6",
                "SLURM_ARRAY_TASK_MIN": "5",
                "SLURM_ARRAY_TASK_COUNT": "3",
            },
            None,
            Shard(2, 3),
        ),
    ],
)
def test_shard_values(value, environ, shards, expected) -> None:
    assert parse_shard(value, shards, environ) == expected


@pytest.mark.parametrize(
    "value, environ, shards, message",
    [
        ("0/3", {}, None, "there is no shard 0 of 3"),
        ("4/3", {}, None, "there is no shard 4 of 3"),
        ("1/0", {}, None, "the number of shards must be from 1"),
        ("x/y", {}, None, "is not i/N"),
        ("2", {}, None, "is not i/N"),
        ("-1/3", {}, None, "is not i/N"),
        ("2/3", {}, 4, "drop one"),
        ("auto", {}, None, "neither is set"),
        ("auto", {"JOB_COMPLETION_INDEX": "1"}, None, "give --shards N or set SPECDIFF_SHARDS"),
        ("auto", {"JOB_COMPLETION_INDEX": "3"}, 3, "there is no shard 4 of 3"),
        ("auto", {"JOB_COMPLETION_INDEX": "one"}, 3, "is not a whole number"),
        ("auto", {"SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_MIN": "3"}, 3, "no shard 0 of 3"),
    ],
)
def test_bad_shard_values(value, environ, shards, message) -> None:
    with pytest.raises(SuiteError, match=re.escape(message)):
        parse_shard(value, shards, environ)


def one_line_error(capsys, code: int) -> str:
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("specdiff: error:"), err
    return err


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--shard", "0/3"], "--shard 0/3: there is no shard 0 of 3; shards run 1 to 3"),
        (["--shard", "4/3"], "--shard 4/3: there is no shard 4 of 3"),
        (["--shard", "x/y"], "--shard 'x/y' is not i/N"),
        (["--shard", "auto"], "neither is set; give --shard i/N"),
        (["--shards", "3"], "--shards N goes with --shard auto"),
    ],
)
def test_bad_shards_on_the_command_line(tmp_path, capsys, monkeypatch, arguments, message) -> None:
    for name in ("JOB_COMPLETION_INDEX", "SLURM_ARRAY_TASK_ID", "SPECDIFF_SHARDS"):
        monkeypatch.delenv(name, raising=False)
    code = main(["suite", "coding", "--report", str(tmp_path / "r"), *arguments])
    assert message in one_line_error(capsys, code)
    assert not (tmp_path / "r").exists()


def test_suite_merge_is_read_as_the_merge_command_and_prompts_stay_prompts() -> None:
    assert merge_arguments(["suite", "merge", "a", "b"]) == ["suite-merge", "a", "b"]
    assert merge_arguments(["suite", "./merge"]) == ["suite", "./merge"]
    assert merge_arguments(["suite", "coding", "merge"]) == ["suite", "coding", "merge"]


def write_prompts(path: Path, count: int) -> Path:
    lines = [json.dumps({"id": f"p{n}", "prompt": f"Prompt number {n}:"}) for n in range(count)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def make_shard(folder: Path, shard: Shard, prompts_file: Path, max_tokens: int = 8) -> Path:
    """A shard's folder as `suite --shard` starts it (suite.json, shard.json), before
    any run: what merge checks first."""
    prompts, _ = load_suite_prompts(str(prompts_file))
    suite = SuiteSettings(str(prompts_file), (presets()[PAIR],), max_tokens)
    folder.mkdir()
    write_settings(folder, suite, prompts)
    record_shard(folder, shard, suite, prompts)
    return folder


def merge(capsys, *folders: Path, out: Path) -> str:
    code = main(["suite", "merge", *map(str, folders), "--report", str(out)])
    err = one_line_error(capsys, code)
    assert not out.exists()
    return err


def test_merge_refuses_shards_of_different_suites(tmp_path: Path, capsys) -> None:
    prompts = write_prompts(tmp_path / "p.jsonl", 6)
    one = make_shard(tmp_path / "s1", Shard(1, 2), prompts)
    other_tokens = make_shard(tmp_path / "t2", Shard(2, 2), prompts, max_tokens=9)
    err = merge(capsys, one, other_tokens, out=tmp_path / "out")
    assert "the shards ran different configurations" in err and "max tokens" in err
    threads = make_shard(tmp_path / "w2", Shard(2, 2), prompts)
    stored = json.loads((threads / "suite.json").read_text(encoding="utf-8"))
    stored["pairs"][0]["b"]["threads"] += 1  # as on a machine with another core count
    (threads / "suite.json").write_text(json.dumps(stored), encoding="utf-8")
    err = merge(capsys, one, threads, out=tmp_path / "out")
    assert f"differ in pairs ({PAIR} lane b threads:" in err
    other_prompts = make_shard(tmp_path / "u2", Shard(2, 2), write_prompts(tmp_path / "q", 7))
    err = merge(capsys, one, other_prompts, out=tmp_path / "out")
    assert "the shards ran different prompt sets" in err
    other_count = make_shard(tmp_path / "v2", Shard(2, 3), prompts)
    assert "split the suite differently" in merge(capsys, one, other_count, out=tmp_path / "out")
    two = make_shard(tmp_path / "s2", Shard(2, 2), prompts)
    suite_file = two / "suite.json"
    stored = json.loads(suite_file.read_text(encoding="utf-8"))
    suite_file.write_text(json.dumps({**stored, "specdiff": "0.0.1"}), encoding="utf-8")
    err = merge(capsys, one, two, out=tmp_path / "out")
    assert "the shards ran different specdiff versions" in err and "0.0.1" in err


def test_merge_names_a_missing_shard_a_shard_given_twice_and_a_duplicated_run(
    tmp_path: Path, capsys
) -> None:
    prompts = write_prompts(tmp_path / "p.jsonl", 6)
    folders = [make_shard(tmp_path / f"s{n}", Shard(n, 3), prompts) for n in (1, 2, 3)]
    err = merge(capsys, folders[0], folders[2], out=tmp_path / "out")
    assert "shard 2/3 of 3 is missing" in err
    err = merge(capsys, folders[0], *folders, out=tmp_path / "out")
    assert "shard 1/3 is given twice" in err
    suite, units = SuiteSettings("", (presets()[PAIR],), 8), None
    units = suite_units(suite, load_suite_prompts(str(prompts))[0])
    stray = next(u for u in units if Shard(2, 3).holds(u.key))
    session = folders[0] / "sessions" / PAIR / f"{stray.prompt.file_stem}.jsonl"
    session.parent.mkdir(parents=True)
    session.write_text("{}\n", encoding="utf-8")
    err = merge(capsys, *folders, out=tmp_path / "out")
    assert f"{PAIR} {stray.prompt.id} is in {folders[0]} (shard 1/3)" in err
    assert "belongs to shard 2/3" in err


def test_merge_names_the_runs_a_stopped_shard_lacks(tmp_path: Path, capsys) -> None:
    prompts = write_prompts(tmp_path / "p.jsonl", 6)
    folders = [make_shard(tmp_path / f"s{n}", Shard(n, 2), prompts) for n in (1, 2)]
    err = merge(capsys, *folders, out=tmp_path / "out")
    assert re.search(r"shard 1/2 \(.*s1\) lacks \d+ of its runs \(ubatch p\d", err), err
    assert f"specdiff suite --resume --report {folders[0]}" in err
    # a shard that ended may lack only the runs it could not start, as its report says
    for folder in folders:
        units = json.loads((folder / "shard.json").read_text())["units"]
        ended = {"complete": True, "jobs": units, "finished": units, "skipped_prompts": []}
        (folder / "report.json").write_text(json.dumps(ended), encoding="utf-8")
    err = merge(capsys, *folders, out=tmp_path / "out")
    assert re.search(r"shard 1/2 \(.*s1\) lacks \d+ of its runs", err), err
    for folder in folders:
        report = json.loads((folder / "report.json").read_text())
        skipped = [f"{PAIR}: p{n}: too long" for n in range(report["jobs"])]
        report.update(finished=0, skipped_prompts=skipped)
        (folder / "report.json").write_text(json.dumps(report), encoding="utf-8")
    assert main(["suite", "merge", *map(str, folders), "--report", str(tmp_path / "out")]) == 0
    merged = json.loads((tmp_path / "out" / "report.json").read_text())
    assert (merged["jobs"], merged["finished"], merged["complete"]) == (6, 0, True)
    assert len(merged["skipped_prompts"]) == len(set(merged["skipped_prompts"]))


def test_a_shard_resumes_as_itself(tmp_path: Path, capsys) -> None:
    prompts = write_prompts(tmp_path / "p.jsonl", 3)
    folder = make_shard(tmp_path / "s1", Shard(1, 2), prompts)
    code = main(["suite", "--resume", "--report", str(folder), "--shard", "2/2"])
    assert "holds shard 1/2, not shard 2/2; resume it with --shard 1/2" in one_line_error(
        capsys, code
    )
    whole = tmp_path / "whole"
    whole.mkdir()
    (whole / "suite.json").write_text((folder / "suite.json").read_text(), encoding="utf-8")
    code = main(["suite", "--resume", "--report", str(whole), "--shard", "1/2"])
    assert "holds a whole suite, not shard 1/2; drop --shard" in one_line_error(capsys, code)
