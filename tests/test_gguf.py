from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from specdiff.engine.gguf import read_gguf
from specdiff.errors import ModelError


@pytest.mark.model
def test_reads_the_bundled_model(model_path: Path) -> None:
    info = read_gguf(model_path)
    assert info.architecture == "gemma3"
    assert info.quantization == "Q4_K_M"
    assert info.n_vocab == 262_144
    assert info.expected_size == info.file_size or info.expected_size < info.file_size
    assert len(info.tensors) > 100


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="model file not found"):
        read_gguf(tmp_path / "absent.gguf")


def test_not_gguf(tmp_path: Path) -> None:
    path = tmp_path / "notes.gguf"
    path.write_text("just some text, not a model\n", encoding="utf-8")
    with pytest.raises(ModelError, match="is not a GGUF model"):
        read_gguf(path)


@pytest.mark.model
def test_truncated_in_the_header(tmp_path: Path, model_path: Path) -> None:
    path = tmp_path / "cut.gguf"
    with model_path.open("rb") as source:
        path.write_bytes(source.read(100_000))
    with pytest.raises(ModelError, match="truncated"):
        read_gguf(path)


@pytest.mark.model
def test_truncated_in_the_tensor_data(tmp_path: Path, model_path: Path) -> None:
    path = tmp_path / "cut.gguf"
    shutil.copyfile(model_path, path)
    with path.open("r+b") as handle:
        handle.truncate(model_path.stat().st_size - 4096)
    with pytest.raises(ModelError, match="is truncated: .* its tensors need"):
        read_gguf(path)


@pytest.mark.model
def test_vocabulary_digest_sees_one_changed_token(tmp_path: Path, model_path: Path) -> None:
    from tests.fixtures import model_with_changed_token

    changed = model_with_changed_token(model_path, tmp_path / "other-vocab.gguf")
    original, other = read_gguf(model_path), read_gguf(changed)
    assert original.n_vocab == other.n_vocab
    assert original.vocab_digest != other.vocab_digest
    differing = [i for i, (x, y) in enumerate(zip(original.tokens, other.tokens)) if x != y]
    assert len(differing) == 1
