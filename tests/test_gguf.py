from __future__ import annotations

import re
import shutil
import struct
import subprocess
import sys
import time
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


# A small GGUF built by hand: the reader's bounds are tested on headers whose every
# count and length is chosen, without the 250 MB model.

U32, U64, STRING, ARRAY = 4, 10, 8, 9


def packed_string(text: bytes) -> bytes:
    return struct.pack("<Q", len(text)) + text


def metadata_entry(key: str, value_type: int, payload: bytes) -> bytes:
    return packed_string(key.encode()) + struct.pack("<I", value_type) + payload


def string_array(items: list[bytes]) -> bytes:
    return struct.pack("<IQ", STRING, len(items)) + b"".join(packed_string(i) for i in items)


def tensor_entry(name: bytes, shape: tuple[int, ...], ggml_type: int = 0, offset: int = 0) -> bytes:
    dims = b"".join(struct.pack("<Q", d) for d in shape)
    return (
        packed_string(name)
        + struct.pack("<I", len(shape))
        + dims
        + struct.pack("<IQ", ggml_type, offset)
    )


def gguf_file(
    entries: list[bytes],
    tensors: list[bytes] = (),
    *,
    n_kv: int | None = None,
    n_tensors: int | None = None,
    data: bytes = b"\0" * 64,
) -> bytes:
    header = b"GGUF" + struct.pack(
        "<IQQ",
        3,
        len(tensors) if n_tensors is None else n_tensors,
        len(entries) if n_kv is None else n_kv,
    )
    body = header + b"".join(entries) + b"".join(tensors)
    return body + b"\0" * (-len(body) % 32) + data


VOCABULARY = [b"<pad>", b"a", b"b", b"\xe2\x96\x81the", b"\n"]


def good_gguf() -> bytes:
    return gguf_file(
        [
            metadata_entry("general.architecture", STRING, packed_string(b"gemma3")),
            metadata_entry("general.file_type", U32, struct.pack("<I", 15)),
            metadata_entry("tokenizer.ggml.tokens", ARRAY, string_array(VOCABULARY)),
        ],
        [tensor_entry(b"token_embd.weight", (4, 4))],
    )


def test_a_hand_built_gguf_reads(tmp_path: Path) -> None:
    path = tmp_path / "small.gguf"
    path.write_bytes(good_gguf())
    info = read_gguf(path)
    assert info.tokens == [t.decode() for t in VOCABULARY]
    assert info.quantization == "Q4_K_M" and info.tensors[0].shape == (4, 4)


def nested_arrays(depth: int) -> bytes:
    return struct.pack("<IQ", ARRAY, 1) * depth + struct.pack("<IQ", U32, 0)


HUGE = 2**63
CORRUPT_HEADERS = {
    # name: (file bytes, what the one-line error says)
    "tensor count past every bound": (gguf_file([], n_tensors=HUGE), "corrupt"),
    "key count past every bound": (gguf_file([], n_kv=HUGE), "corrupt"),
    "tensor count past the file": (gguf_file([], n_tensors=900_000), "cannot fit"),
    "key count past the file": (gguf_file([], n_kv=90_000), "cannot fit"),
    "key longer than the file": (
        gguf_file([struct.pack("<Q", 10**6) + b"key"]),
        "truncated",
    ),
    "string over the string bound": (
        gguf_file([metadata_entry("k", STRING, struct.pack("<Q", HUGE))]),
        "byte string",
    ),
    "array over the array bound": (
        gguf_file([metadata_entry("k", ARRAY, struct.pack("<IQ", U32, HUGE))]),
        "items",
    ),
    "number array past the file": (
        gguf_file([metadata_entry("k", ARRAY, struct.pack("<IQ", U64, 40_000_000))]),
        "truncated",
    ),
    "string array past the file": (
        gguf_file([metadata_entry("k", ARRAY, struct.pack("<IQ", STRING, 40_000_000))]),
        "truncated",
    ),
    "arrays nested without end": (
        gguf_file([metadata_entry("k", ARRAY, nested_arrays(100_000))]),
        "nested",
    ),
    "unknown value type": (gguf_file([metadata_entry("k", 77, b"\0" * 8)]), "value type 77"),
    "unknown array item type": (
        gguf_file([metadata_entry("k", ARRAY, struct.pack("<IQ", 77, 0))]),
        "value type 77",
    ),
    "tensor with absurd dimensions": (
        gguf_file([], [tensor_entry(b"w\x1b]0;title\x07", (1,) * 9)]),
        "9 dimensions",
    ),
    "vocabulary of numbers": (
        gguf_file([metadata_entry("tokenizer.ggml.tokens", ARRAY, struct.pack("<IQI", U32, 1, 7))]),
        "not a list of strings",
    ),
    "vocabulary with one token twice": (
        gguf_file(
            [metadata_entry("tokenizer.ggml.tokens", ARRAY, string_array([*VOCABULARY, b"a"]))]
        ),
        "token 'a' twice (ids 1 and 5)",
    ),
    "tensor past the end of the file": (
        gguf_file([], [tensor_entry(b"w", (1 << 40,))]),
        "is truncated",
    ),
}


@pytest.mark.parametrize("name", CORRUPT_HEADERS)
def test_a_corrupt_header_is_one_line_without_reading_past_the_file(
    tmp_path: Path, name: str
) -> None:
    content, message = CORRUPT_HEADERS[name]
    path = tmp_path / "corrupt.gguf"
    path.write_bytes(content)
    began = time.perf_counter()
    with pytest.raises(ModelError, match=re.escape(message)) as raised:
        read_gguf(path)
    assert time.perf_counter() - began < 2.0, "the reader walked a count it should refuse"
    text = str(raised.value)
    assert str(path) in text and "\n" not in text and "\x1b" not in text


def test_every_cut_of_a_header_is_a_truncation(tmp_path: Path) -> None:
    content = good_gguf()
    path = tmp_path / "cut.gguf"
    header_end = content.index(b"token_embd.weight") + len(b"token_embd.weight") + 4 + 16 + 12
    for length in range(header_end):
        path.write_bytes(content[:length])
        with pytest.raises(ModelError, match="truncated|not a GGUF model|cannot fit"):
            read_gguf(path)


def model_with_duplicated_token(source: Path, target: Path) -> tuple[Path, str, tuple[int, int]]:
    """A copy of `source` whose vocabulary holds one token twice: a later token of the
    same byte length is overwritten with an earlier one's text, so no offset moves."""
    info = read_gguf(source)
    encoded = [token.encode("utf-8", "surrogateescape") for token in info.tokens]
    first = next(i for i, text in enumerate(encoded) if i > 1000 and len(text) >= 6)
    second = next(
        i for i in range(first + 1, len(encoded)) if len(encoded[i]) == len(encoded[first])
    )
    with source.open("rb") as handle:
        header = handle.read(info.data_offset)
    # the tokens array is the first place after its key where this length-prefixed text lies
    position = header.find(packed_string(encoded[second]), header.find(b"tokenizer.ggml.tokens"))
    assert position > 0
    shutil.copyfile(source, target)
    with target.open("r+b") as handle:
        handle.seek(position + 8)
        handle.write(encoded[first])
    return target, info.tokens[first], (first, second)


@pytest.mark.model
def test_a_duplicated_token_in_a_real_model_is_refused_before_llama_cpp_aborts(
    tmp_path: Path, model_path: Path
) -> None:
    """llama.cpp aborts the whole process on such a vocabulary (GGML_ASSERT): specdiff
    refuses the file first, with one line naming the token and both its ids."""
    path, token, ids = model_with_duplicated_token(model_path, tmp_path / "dup.gguf")
    run = subprocess.run(
        [sys.executable, "-m", "specdiff", "run", "--model", str(path), "--max-tokens", "2"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2, run.stderr
    assert run.stderr.count("\n") == 1 and "Traceback" not in run.stderr
    assert f"{token!r} twice (ids {ids[0]} and {ids[1]})" in run.stderr


@pytest.mark.model
def test_the_bundled_vocabulary_has_no_duplicate(model_path: Path) -> None:
    info = read_gguf(model_path)  # read_gguf checks it; the set confirms it independently
    assert len(set(info.tokens)) == info.n_vocab
