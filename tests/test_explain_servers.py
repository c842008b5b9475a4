"""`serve-pair explain` against real llama-servers: part 1 as a sweep of the speculative
server's draft length (the server started again for each), one entry per length with
its outcome and fork position, and part 2 left out with one line saying why."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from specdiff.autopsy import DRAFT_KEY, Autopsy, draft_verdict
from specdiff.prompts import load as load_prompts

REPETITIVE = load_prompts("repetitive")[0]["prompt"]


@pytest.mark.model
@pytest.mark.server
def test_serve_pair_explain_sweeps_the_draft_length_and_leaves_part_2_with_one_line() -> None:
    done = subprocess.run(
        [
            sys.executable, "-m", "specdiff", "serve-pair", "--threads", "1", "explain",
            "--prompt", REPETITIVE, "--max-tokens", "16", "--draft-lengths", "1,3", "--json",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    settings = data["settings"]
    assert [s["scope"] for s in settings] == ["as given", "server a", "server a"]
    assert [s["value"] for s in settings[1:]] == ["1", "3"]
    assert all(s["key"] == DRAFT_KEY and s["error"] is None for s in settings)
    for entry in settings:
        assert entry["tokens_a"] == entry["tokens_b"] == 16  # the prompt repeats: no early stop
        assert entry["identical"] == (entry["fork"] is None)
        assert entry["outcome"] == (
            "identical" if entry["fork"] is None else f"forks at {entry['fork']}"
        )
        assert entry["fork"] is None or 0 <= entry["fork"] < 16
    assert data["fork"] == settings[0]["fork"]
    # part 2 cannot run on servers: null, with the reason, in the record and on stderr
    assert data["first_difference"] is None and data["layers"] == []
    note = data["part2_note"]
    assert "in-process" in note and "eval callback" in note
    assert [line for line in done.stderr.splitlines() if "part 2" in line] == [f"specdiff: {note}"]
    verdict = draft_verdict(Autopsy.from_json(data).trials)
    assert verdict is not None and verdict in data["cause"]
