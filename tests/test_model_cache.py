"""The model cache's hash index is only a cache: whatever a damaged one holds, a file's
sha256 is computed again and the index rebuilt, never a traceback."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from specdiff.engine.models import models_dir, sha256_file

DAMAGED_INDEXES = {
    "not JSON": b"{not json",
    "not UTF-8": b"\xff\xfe{}",
    "nested 100,000 deep": b"[" * 100_000 + b"]" * 100_000,
    "a list": b"[1, 2]",
    "an entry of the wrong type": None,  # filled in with the file's own path below
    "a wrong hash of the right size": None,
}


@pytest.mark.parametrize("name", DAMAGED_INDEXES)
def test_a_damaged_hash_index_is_rebuilt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    monkeypatch.setenv("SPECDIFF_CACHE_DIR", str(tmp_path / "cache"))
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF not really a model")
    stat = model.stat()
    entries = {
        "an entry of the wrong type": {str(model.resolve()): ["size", stat.st_size]},
        "a wrong hash of the right size": {
            str(model.resolve()): {"size": stat.st_size, "mtime_ns": 0, "sha256": "0" * 64}
        },
    }
    content = DAMAGED_INDEXES[name]
    if content is None:
        content = json.dumps(entries[name]).encode()
    index = models_dir() / "hashes.json"
    index.write_bytes(content)
    assert sha256_file(model) == hashlib.sha256(model.read_bytes()).hexdigest()
    rebuilt = json.loads(index.read_text(encoding="utf-8"))
    assert rebuilt[str(model.resolve())]["sha256"] == hashlib.sha256(model.read_bytes()).hexdigest()
