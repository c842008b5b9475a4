"""certify in-process on the bundled model: the acceptance run (every property printed
with its verdict and evidence), and the batch and speculation verdicts with the evidence
they rest on; whether a fork appears is read from the run, never assumed."""

from __future__ import annotations

import json
from typing import Any

import pytest

from specdiff.cli import main

pytestmark = pytest.mark.model


ONE_THREAD = ["--both", "threads=1", "--both", "threads_batch=1"]
"""llama.cpp's threads spin while they wait for each other: on cores other processes share
(a test run's), one thread decodes several times faster than two."""


def certify(capsys: Any, *arguments: str) -> tuple[int, dict[str, Any]]:
    code = main(["certify", "--json", "--quiet", *ONE_THREAD, *arguments])
    captured = capsys.readouterr()
    assert code in (0, 1), captured.err
    return code, json.loads(captured.out)


def test_every_property_is_printed_with_its_verdict_and_evidence(capsys) -> None:
    code, data = certify(
        capsys, "-n", "2", "--batch-size", "2", "--fillers", "2", "--max-tokens", "40"
    )
    names = [found["name"] for found in data["properties"]]
    assert names == [
        "run-to-run",
        "batch-invariance",
        "needle",
        "prefix-cache",
        "decode-vs-prefill",
        "speculation",
    ]
    for found in data["properties"]:
        # in-process every condition can be made and shown: nothing is left untested
        assert found["verdict"] in ("holds", "broken"), (found["name"], found["why"])
        assert found["proof"]["shown"] or found["verdict"] == "broken"
        assert found["compared"] > 0 and found["why"]
    assert entry(data, "batch-invariance")["proof"]["facts"]["rows_per_decode_call"] >= 2
    assert entry(data, "prefix-cache")["proof"]["facts"]["prefix_tokens"] > 0
    # whether a batch of rows runs other kernels than one row depends on the CPU: the
    # verdict expected is read from the certificate's own evidence, never assumed
    batch = entry(data, "batch-invariance")
    gap = batch["largest_difference"]
    differs = batch["identical"] < batch["compared"] or gap is None or gap > 0.0
    assert batch["verdict"] == ("broken" if differs else "holds"), batch["why"]
    speculation = entry(data, "speculation")
    forked = speculation["identical"] < speculation["compared"]
    assert speculation["verdict"] == ("broken" if forked else "holds")
    broken = any(found["verdict"] == "broken" for found in data["properties"])
    assert code == (1 if broken else 0)
    assert data["cost"]["overhead"] is not None and data["cost"]["tokens"] > 0


def entry(data: dict[str, Any], name: str) -> dict[str, Any]:
    return next(found for found in data["properties"] if found["name"] == name)


def test_ctrl_c_stops_the_battery_with_exit_130() -> None:
    import signal
    import subprocess
    import sys
    import time

    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "specdiff", "certify", "--property", "run-to-run"),
            *("-n", "50", "--max-tokens", "200", *ONE_THREAD),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stderr is not None
    # the interrupt comes once the battery has started, however long the start took
    started = process.stderr.readline()
    assert started.startswith("certify: run-to-run on the in-process engine"), started
    time.sleep(1)  # a moment into the battery, as it is the point: stopped mid-run
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    assert "specdiff: interrupted" in stderr
    assert "Traceback" not in stderr and "worker failed" not in stderr
