"""`specdiff explain`'s first differing tensor against an independent trace of every
node of the fork step's graph: the first in the graph's own order, the KV cache
included, and a difference in the cache's history said to be one."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from specdiff.cli import main
from specdiff.lanes import Lane, presets
from tests.servers import probed_repack

pytestmark = pytest.mark.model

REFERENCE = Path(__file__).with_name("reference_taps.py")
CACHE = re.compile(r"^(cache_[kv]_l\d+)\b")


def reference_graph(model_path: Path, lane: Lane, step: int, prompt: str) -> dict[str, Any]:
    """Every node of the one-token decode that makes `step`, traced apart from specdiff."""
    completed = subprocess.run(
        [
            *(sys.executable, str(REFERENCE), "--graph", str(model_path)),
            "on" if probed_repack(model_path) else "off",  # the kernels the lane ran
            *(str(lane.threads), str(lane.n_batch), str(lane.n_ubatch), str(step), prompt),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    trace: dict[str, Any] = json.loads(completed.stdout.strip().splitlines()[-1])
    return trace


def first_differing(a: list[list[str]], b: list[list[str]]) -> str | None:
    """The first node whose bytes differ, named as specdiff names it: a cache by its
    cache, a repeated name with its occurrence."""
    assert [node[:2] for node in a] == [node[:2] for node in b]  # one graph, two lanes
    seen: dict[str, int] = {}
    for (name, _, hash_a), (_, _, hash_b) in zip(a, b, strict=True):
        occurrence = seen.get(name, 0)
        seen[name] = occurrence + 1
        if hash_a != hash_b:
            cache = CACHE.match(name)
            if cache is not None:
                return cache.group(1)  # its write, the one node of it specdiff taps
            return name if occurrence == 0 else f"{name}#{occurrence}"
    return None


def test_the_first_difference_is_the_first_in_the_whole_graph(
    forking_prompt, model_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # ubatch: both lanes decode every token after the prompt one at a time, so the
    # reference can replay them apart from specdiff; the fork's step is found here
    found = forking_prompt("ubatch", 40)
    if found.fork_index < 1:
        pytest.skip("the fork is at the prompt's own decode, which is not one token wide")
    arguments = ["explain", "--pair", "ubatch", "--prompt", found.prompt]
    arguments += ["--max-tokens", "40", "--max-runs", "1", "--no-cache", "--quiet", "--json"]
    assert main(arguments) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["fork"] == found.fork_index and data["tapping_neutral"] is True
    pair = presets()["ubatch"]
    trace_a, trace_b = (
        reference_graph(model_path, lane, found.fork_index, found.prompt)
        for lane in (pair.a, pair.b)
    )
    assert trace_a["tokens"][-1] == data["margin"]["token_a"]
    assert trace_b["tokens"][-1] == data["margin"]["token_b"]
    expected = first_differing(trace_a["nodes"], trace_b["nodes"])
    first = data["first_difference"]
    assert expected is not None and first is not None
    assert first["name"] == expected
    # one token wide in both lanes: whatever differs first came in through the cache
    assert expected.startswith("cache_") and first["kv_history"] is True
    assert first["op"] == "SET_ROWS"
