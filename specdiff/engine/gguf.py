"""A small GGUF header reader.

specdiff reads the header itself, before llama.cpp sees a file, for three reasons:
llama.cpp answers a wrong or truncated file with a NULL model and a log line, not
with a reason a user can act on; `specdiff models` should list quantization and
vocabulary without loading weights; and the draft-model check compares the two
vocabularies token by token.

Format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md
"""

from __future__ import annotations

import functools
import hashlib
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from specdiff.errors import ModelError

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# Header sanity bounds: a corrupt count must not make the reader allocate gigabytes,
# recurse without end, or walk a count far past the end of the file.
MAX_TENSORS = 1_000_000
MAX_KV = 100_000
MAX_ARRAY = 50_000_000
MAX_STRING = 64 * 1024 * 1024
MAX_ARRAY_DEPTH = 4
"""Arrays of arrays nest at most this deep (real files nest none)."""
MAX_DIMS = 8
# the fewest bytes one metadata entry (key length, value type, smallest value) and one
# tensor entry (name length, dims, type, offset) can take
_SMALLEST_KV = 8 + 4 + 1
_SMALLEST_TENSOR = 8 + 4 + 4 + 8
VOCABULARY_KEY = "tokenizer.ggml.tokens"

# value type id -> struct format of one scalar
_SCALAR_FORMATS = {
    0: "<B",  # uint8
    1: "<b",  # int8
    2: "<H",  # uint16
    3: "<h",  # int16
    4: "<I",  # uint32
    5: "<i",  # int32
    6: "<f",  # float32
    7: "<?",  # bool
    10: "<Q",  # uint64
    11: "<q",  # int64
    12: "<d",  # float64
}
_STRING = 8
_ARRAY = 9

# ggml type id -> (name, elements per block, bytes per block)
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66),
    17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18),
    21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82),
    23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1),
    25: ("I16", 1, 2),
    26: ("I32", 1, 4),
    27: ("I64", 1, 8),
    28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2),
    34: ("TQ1_0", 256, 54),
    35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17),
}

# llama.cpp's `general.file_type` (enum llama_ftype) -> the name users know
FILE_TYPES = {
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    7: "Q8_0",
    8: "Q5_0",
    9: "Q5_1",
    10: "Q2_K",
    11: "Q3_K_S",
    12: "Q3_K_M",
    13: "Q3_K_L",
    14: "Q4_K_S",
    15: "Q4_K_M",
    16: "Q5_K_S",
    17: "Q5_K_M",
    18: "Q6_K",
    19: "IQ2_XXS",
    20: "IQ2_XS",
    21: "Q2_K_S",
    22: "IQ3_XS",
    23: "IQ3_XXS",
    24: "IQ1_S",
    25: "IQ4_NL",
    26: "IQ3_S",
    27: "IQ3_M",
    28: "IQ2_S",
    29: "IQ2_M",
    30: "IQ4_XS",
    31: "IQ1_M",
    32: "BF16",
    36: "TQ1_0",
    37: "TQ2_0",
    38: "MXFP4_MOE",
}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int

    @property
    def nbytes(self) -> int | None:
        traits = GGML_TYPES.get(self.ggml_type)
        if traits is None:
            return None
        _, block, size = traits
        elements = 1
        for dim in self.shape:
            elements *= dim
        return elements // block * size


@dataclass(frozen=True)
class GGUFInfo:
    """What the header of a GGUF file says, and whether the file is long enough."""

    path: Path
    version: int
    metadata: dict[str, Any]
    tensors: tuple[TensorInfo, ...]
    data_offset: int
    file_size: int

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", "unknown"))

    @property
    def name(self) -> str:
        return str(self.metadata.get("general.name", self.path.stem))

    @property
    def quantization(self) -> str:
        file_type = self.metadata.get("general.file_type")
        if isinstance(file_type, int) and file_type in FILE_TYPES:
            return FILE_TYPES[file_type]
        return "unknown"

    @property
    def tokens(self) -> list[str]:
        tokens = self.metadata.get("tokenizer.ggml.tokens")
        return list(tokens) if isinstance(tokens, list) else []

    @property
    def n_vocab(self) -> int:
        tokens = self.metadata.get("tokenizer.ggml.tokens")
        return len(tokens) if isinstance(tokens, list) else 0

    @functools.cached_property
    def vocab_digest(self) -> str:
        """sha256 over the token texts: equal digests mean the same vocabulary. Kept once
        made: every lane and every runner of a suite's slots that shares the file asks
        for it, and 262k tokens take a third of a second to hash."""
        digest = hashlib.sha256()
        for token in self.tokens:
            encoded = token.encode("utf-8", "surrogatepass")
            digest.update(len(encoded).to_bytes(4, "little"))
            digest.update(encoded)
        return digest.hexdigest()

    @property
    def expected_size(self) -> int | None:
        """Bytes the file must have to hold every tensor; None if a tensor type is unknown."""
        end = self.data_offset
        for tensor in self.tensors:
            nbytes = tensor.nbytes
            if nbytes is None:
                return None
            end = max(end, self.data_offset + tensor.offset + nbytes)
        return end


class _Reader:
    """Reads one header, never past the end of the file: every count is checked against
    the bytes left before anything is read or allocated for it."""

    def __init__(self, handle: BinaryIO, path: Path, size: int) -> None:
        self.handle = handle
        self.path = path
        self.size = size
        self.position = handle.tell()
        """Kept here, not asked of the handle: tell() per string would double the time
        a 262,144-token vocabulary takes to read."""

    def remaining(self) -> int:
        return self.size - self.position

    def truncated(self) -> ModelError:
        return ModelError(
            f"{self.path}: the GGUF header ends early (truncated file); "
            "download or assemble the model again"
        )

    def corrupt(self, what: str) -> ModelError:
        return ModelError(
            f"{self.path}: corrupt GGUF header ({what}); download or assemble the model again"
        )

    def exact(self, count: int) -> bytes:
        if count > self.remaining():
            raise self.truncated()
        data = self.handle.read(count)
        if len(data) != count:
            raise self.truncated()
        self.position += count
        return data

    def scalar(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.exact(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        length = self.scalar("<Q")
        if length > MAX_STRING:
            raise self.corrupt(f"a {length}-byte string")
        return self.exact(length).decode("utf-8", "surrogateescape")

    def value(self, value_type: int, depth: int = 0) -> Any:
        if value_type in _SCALAR_FORMATS:
            return self.scalar(_SCALAR_FORMATS[value_type])
        if value_type == _STRING:
            return self.string()
        if value_type == _ARRAY:
            return self.array(depth)
        raise self.corrupt(f"unknown value type {value_type}")

    def array(self, depth: int) -> list[Any]:
        if depth >= MAX_ARRAY_DEPTH:
            raise self.corrupt(f"arrays nested more than {MAX_ARRAY_DEPTH} deep")
        item_type = self.scalar("<I")
        count = self.scalar("<Q")
        if count > MAX_ARRAY:
            raise self.corrupt(f"an array of {count} items")
        if item_type in _SCALAR_FORMATS:
            fmt = _SCALAR_FORMATS[item_type]
            raw = self.exact(struct.calcsize(fmt) * count)
            return list(struct.unpack(f"<{count}{fmt[1]}", raw))
        if item_type not in (_STRING, _ARRAY):
            raise self.corrupt(f"unknown value type {item_type} in an array")
        # a string or an array takes at least 8 bytes: a count past the file is caught
        # here, before a loop that would run until the file ran out
        if 8 * count > self.remaining():
            raise self.truncated()
        if item_type == _STRING:
            return [self.string() for _ in range(count)]
        return [self.array(depth + 1) for _ in range(count)]

    def tensor(self) -> TensorInfo:
        name = self.string()
        n_dims = self.scalar("<I")
        if n_dims > MAX_DIMS:
            raise self.corrupt(f"tensor {name!r} has {n_dims} dimensions")
        shape = tuple(self.scalar("<Q") for _ in range(n_dims))
        return TensorInfo(name, shape, self.scalar("<I"), self.scalar("<Q"))


def check_vocabulary(path: Path, metadata: dict[str, Any]) -> None:
    """Refuse a vocabulary that is not a list of strings, or holds one token twice:
    llama.cpp asserts that every token is unique and aborts the whole process on a
    duplicate, so it is caught here, before llama.cpp sees the file."""
    tokens = metadata.get(VOCABULARY_KEY)
    if tokens is None:
        return
    if not isinstance(tokens, list) or not all(isinstance(token, str) for token in tokens):
        raise ModelError(
            f"{path}: corrupt GGUF header ({VOCABULARY_KEY} is not a list of strings); "
            "download or assemble the model again"
        )
    first_ids: dict[str, int] = {}
    for token_id, token in enumerate(tokens):
        first = first_ids.setdefault(token, token_id)
        if first != token_id:
            raise ModelError(
                f"{path}: its vocabulary holds the token {token!r} twice (ids {first} and "
                f"{token_id}), which makes llama.cpp abort; use an intact model file"
            )


def read_gguf(path: str | Path) -> GGUFInfo:
    """Parse a GGUF header; raise ModelError naming the file if it is missing, not GGUF,
    corrupt (counts past the end of the file, a duplicated vocabulary token) or shorter
    than its tensors need."""
    path = Path(path).expanduser()
    if not path.exists():
        raise ModelError(f"model file not found: {path}; pass an existing .gguf path")
    if not path.is_file():
        raise ModelError(f"model path is not a file: {path}; pass a .gguf file")
    file_size = path.stat().st_size
    with path.open("rb") as handle:
        reader = _Reader(handle, path, file_size)
        version, metadata, tensors = _read_header(reader)
        header_end = reader.position
    check_vocabulary(path, metadata)
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0:
        alignment = DEFAULT_ALIGNMENT
    data_offset = (header_end + alignment - 1) // alignment * alignment
    info = GGUFInfo(path, version, metadata, tuple(tensors), data_offset, file_size)
    expected = info.expected_size
    if file_size < (expected if expected is not None else data_offset):
        raise ModelError(
            f"{path} is truncated: {file_size} bytes on disk, its tensors need "
            f"{expected if expected is not None else data_offset}; download or assemble it again"
        )
    return info


def _read_header(reader: _Reader) -> tuple[int, dict[str, Any], list[TensorInfo]]:
    """The version, metadata and tensor entries, each count checked before its loop."""
    path = reader.path
    magic = reader.handle.read(4)
    reader.position += len(magic)
    if magic != GGUF_MAGIC:
        raise ModelError(
            f"{path} is not a GGUF model (it starts with {magic!r}, not b'GGUF'); pass a .gguf file"
        )
    version = reader.scalar("<I")
    if version not in (2, 3):
        raise ModelError(f"{path}: GGUF version {version} is not supported (2 or 3 are)")
    n_tensors = reader.scalar("<Q")
    n_kv = reader.scalar("<Q")
    if n_tensors > MAX_TENSORS or n_kv > MAX_KV:
        raise reader.corrupt(f"{n_tensors} tensors, {n_kv} keys")
    if n_tensors * _SMALLEST_TENSOR + n_kv * _SMALLEST_KV > reader.remaining():
        raise reader.corrupt(
            f"{n_tensors} tensors and {n_kv} keys cannot fit in a {reader.size}-byte file"
        )
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = reader.string()
        metadata[key] = reader.value(reader.scalar("<I"))
    return version, metadata, [reader.tensor() for _ in range(n_tensors)]
