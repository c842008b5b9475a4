"""User pairs from a TOML file (``--pairs``): [defaults] for every lane, [pairs.NAME]
tables that start from a known pair; every problem one line naming the file, the table
and the fix.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from specdiff.errors import LaneConfigError
from specdiff.files import read_limited
from specdiff.lanes.model import FIELD_TYPES, IN_PROCESS_KEYS, SERVER_KEYS, Lane, Pair, unknown_key
from specdiff.lanes.presets import presets, unknown_pair

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

MAX_PAIRS_FILE_BYTES = 1 << 20
"""A pairs file with a thousand pairs is a few hundred KB; past this it is not one."""


class PairSet(dict[str, Pair]):
    """Pairs by name, and `refused`: the presets a pairs file's [defaults] cannot apply to
    (an in-process key on a server preset), each with its reason, which is an error only
    where that pair is chosen."""

    def __init__(self, pairs: Mapping[str, Pair], refused: Mapping[str, str] | None = None) -> None:
        super().__init__(pairs)
        self.refused = dict(refused or {})


def load_pairs_file(path: str | Path, base: Mapping[str, Pair] | None = None) -> PairSet:
    """Read user pairs from TOML.

    ```toml
    [defaults]               # applied to both lanes of every pair in this file
    model = "/models/gemma-3-1b-q4_k_m.gguf"

    [pairs.tiny-ubatch]
    description = "ubatch 512 vs 1"
    from = "ubatch"          # optional: start from a known pair
    a = { n_ubatch = 512 }
    b = { n_batch = 1, n_ubatch = 1 }
    ```

    Every problem is one LaneConfigError naming the file, the table and the fix.
    """
    path = Path(path).expanduser()
    data = _read_pairs_toml(path)
    known = dict(base if base is not None else presets())
    unexpected = set(data) - {"defaults", "pairs"}
    if unexpected:
        raise LaneConfigError(
            f"{path}: unknown table {sorted(unexpected)[0]!r}; use [defaults] and [pairs.NAME]"
        )
    defaults = data.get("defaults", {})
    if not isinstance(defaults, dict):
        raise LaneConfigError(f"{path}: [defaults] must be a table of lane keys")
    _check_keys(path, "defaults", defaults)
    pairs = data.get("pairs", {})
    if not isinstance(pairs, dict):
        raise LaneConfigError(f"{path}: [pairs] must hold tables like [pairs.my-pair]")
    result: dict[str, Pair] = {}
    for name, spec in pairs.items():
        result[name] = _pair_from_table(path, name, spec, defaults, {**known, **result})
    refused: dict[str, str] = {}
    if defaults:
        for name, pair in known.items():
            if name not in result:
                where = f"[defaults] on pair {name!r}, lane "
                try:
                    result[name] = _pair_with(path, where, pair, defaults, {})
                except LaneConfigError as error:
                    refused[name] = str(error)
    return PairSet(result, refused)


def _read_pairs_toml(path: Path) -> dict[str, Any]:
    """The pairs file parsed: a regular UTF-8 TOML file of bounded size."""
    fix = "give --pairs a TOML file of [pairs.NAME] tables"
    try:
        raw = read_limited(path, MAX_PAIRS_FILE_BYTES)
    except FileNotFoundError:
        raise LaneConfigError(f"pairs file not found: {path}") from None
    except OSError as error:
        reason = error.strerror or str(error)
        raise LaneConfigError(f"cannot read the pairs file {path}: {reason}") from None
    except ValueError as error:
        raise LaneConfigError(f"the pairs file {path} {error}; {fix}") from None
    try:
        parsed: dict[str, Any] = tomllib.loads(raw.decode("utf-8"))
        return parsed
    except UnicodeDecodeError:
        raise LaneConfigError(f"{path}: not UTF-8 text; {fix}") from None
    except tomllib.TOMLDecodeError as error:
        raise LaneConfigError(f"{path}: not valid TOML ({error})") from None
    except RecursionError:
        raise LaneConfigError(f"{path}: arrays or tables nested too deep; {fix}") from None


def _pair_from_table(
    path: Path, name: str, spec: object, defaults: Mapping[str, Any], known: Mapping[str, Pair]
) -> Pair:
    """One [pairs.NAME] table: its lanes start from `from` (a known pair, or one defined
    earlier in the file) and take the file's defaults, then the table's own keys."""
    where = f"{path}: pairs.{name}"
    if not isinstance(spec, dict):
        raise LaneConfigError(f"{where} must be a table of description, from, a and b")
    extra = set(spec) - {"description", "from", "a", "b"}
    if extra:
        raise LaneConfigError(
            f"{where} has unknown key {sorted(extra)[0]!r}; allowed: description, from, a, b"
        )
    for key in ("description", "from"):
        if not isinstance(spec.get(key, ""), str):
            raise LaneConfigError(
                f"{where}.{key} must be text in quotes, got {_toml_kind(spec[key])}"
            )
    origin = spec.get("from")
    if origin is None:
        start = Pair(name, Lane(), Lane())
    elif origin in known:
        start = known[origin]
    else:
        raise LaneConfigError(f"{where}: " + str(unknown_pair(origin, known)))
    sides = {}
    for side in ("a", "b"):
        table = spec.get(side, {})
        if not isinstance(table, dict):
            raise LaneConfigError(
                f"{where}.{side} must be a table of lane keys, e.g. {side} = {{ n_ubatch = 2 }}"
            )
        _check_keys(path, f"pairs.{name}.{side}", table)
        sides[side] = table
    pair = Pair(name, start.a, start.b, spec.get("description", ""))
    return _pair_with(path, f"pairs.{name}.", pair, defaults, sides)


def _pair_with(
    path: Path,
    where: str,
    pair: Pair,
    defaults: Mapping[str, Any],
    sides: Mapping[str, Mapping[str, Any]],
) -> Pair:
    """`pair` with the file's defaults on both lanes and each side's own keys on top;
    a value of the wrong type or range names the file and `where` + the side."""
    lanes = []
    for side in ("a", "b"):
        lane, own = getattr(pair, side), sides.get(side, {})
        backend = own.get("backend", defaults.get("backend", lane.backend))
        # a default reaches the lanes it applies to: a server key the server lanes, an
        # in-process key the in-process ones (a lane's own table is taken as written)
        skipped = IN_PROCESS_KEYS if backend == "server" else SERVER_KEYS
        shared = {key: value for key, value in defaults.items() if key not in skipped}
        try:
            lanes.append(replace(lane, **{**shared, **own}))
        except LaneConfigError as error:
            raise LaneConfigError(f"{path}: {where}{side}: {error}") from None
    return Pair(pair.name, lanes[0], lanes[1], pair.description)


def _toml_kind(value: object) -> str:
    """What a TOML value is, in the file's own words."""
    if isinstance(value, bool):
        return "true/false"
    kinds = ((dict, "a table"), (list, "an array"), (int, "a number"), (float, "a number"))
    return next((name for kind, name in kinds if isinstance(value, kind)), "a date or time")


def _check_keys(path: Path, where: str, table: Mapping[str, Any]) -> None:
    for key in table:
        if key not in FIELD_TYPES:
            raise LaneConfigError(f"{path}: {where}: " + str(unknown_key(key)))
