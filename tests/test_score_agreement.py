"""specdiff score agrees with llama.cpp's own llama-perplexity --kl-divergence on the
same text, models and context: mean KLD within 10% and same top-1 within one point.

Both tools run as real processes (benchmarks/score_agreement.py drives them); the
figures are printed, so a run of the suite shows them (pytest -s)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

SCRIPT = ROOT / "benchmarks" / "score_agreement.py"


@pytest.mark.model
def test_score_agrees_with_llama_perplexity(q8_model_path):
    """Q4_K_M against its Q8_0 variant (F16 is the figure in docs/how-to/score.md; Q8_0 is
    quicker to make and to run), three 128-token chunks of code."""
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--base", "q8_0", "--n-ctx", "128", "--tokens", "260"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)
    ours, theirs = figures["specdiff"], figures["llama_perplexity"]
    print(
        f"\nspecdiff score:   mean KLD {ours['mean_kld']:.6f}, same top-1 "
        f"{ours['same_top_percent']:.3f} % over {ours['positions']} positions"
        f"\nllama-perplexity: mean KLD {theirs['mean_kld']:.6f}, same top p "
        f"{theirs['same_top_percent']:.3f} %"
    )
    assert ours["positions"] >= 2 * 63, "at least two chunks scored"
    assert abs(figures["kld_gap_percent"]) < 10
    assert abs(figures["same_top_gap_points"]) < 1
