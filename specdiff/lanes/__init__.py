"""Lanes and pairs: what one decoding configuration is, and which two are compared.

A Lane is frozen and complete: everything that can change the greedy output of the
in-process engine is a field, so a session or report that stores the lane can be
re-run exactly. A Pair is two lanes that differ in one thing; presets are the
comparisons the field argues about. Users override any field from the CLI
(``--lane-a n_ubatch=1``) or from a TOML file.

The modules, each importing only those above it: `values` (what a key may hold),
`endpoints` (a server lane's URLs), `model` (Lane and Pair), `presets`, `overrides`
and `pairs_file`. Every public name is importable from `specdiff.lanes` itself.
"""

from __future__ import annotations

from specdiff.errors import LaneConfigError
from specdiff.lanes.endpoints import (
    ENDPOINT_FORM,
    MASKED_CREDENTIALS,
    MAX_ENDPOINTS,
    MAX_PORT,
    EndpointIdentity,
    check_endpoints,
    has_masked_credentials,
    joined_endpoints,
    split_endpoints,
    without_credentials,
)
from specdiff.lanes.model import (
    IN_PROCESS_KEYS,
    LANE_KEYS,
    OFFLOAD_DEFAULTS,
    OFFLOAD_KEYS,
    SERVER_DEFAULTS,
    SERVER_KEYS,
    Lane,
    Pair,
    differences,
    headline,
    lane_from_dict,
    unknown_key,
    unread_keys,
)
from specdiff.lanes.overrides import (
    apply_overrides,
    override_words,
    parse_overrides,
    parse_value,
)
from specdiff.lanes.pairs_file import MAX_PAIRS_FILE_BYTES, PairSet, load_pairs_file, tomllib
from specdiff.lanes.presets import SERVER_A, SERVER_B, presets, unknown_pair
from specdiff.lanes.values import (
    ACCEPT_FORMS,
    BOUNDS,
    CHOICES,
    ENV_NAME,
    KV_TYPES,
    MAX_ACCEPT_TOLERANCE,
    MAX_SERVER_FLAGS,
    QUANT_TYPES,
    REPACK_WORDS,
    Api,
    Backend,
    FlashAttn,
    LaneId,
    PrefixMode,
    Repack,
    Rescore,
    Speculation,
    SplitMode,
    accept_tolerance,
    default_threads,
)

__all__ = [
    "ACCEPT_FORMS",
    "BOUNDS",
    "CHOICES",
    "ENDPOINT_FORM",
    "ENV_NAME",
    "IN_PROCESS_KEYS",
    "KV_TYPES",
    "LANE_KEYS",
    "MASKED_CREDENTIALS",
    "MAX_ACCEPT_TOLERANCE",
    "MAX_ENDPOINTS",
    "MAX_PAIRS_FILE_BYTES",
    "MAX_PORT",
    "MAX_SERVER_FLAGS",
    "OFFLOAD_DEFAULTS",
    "OFFLOAD_KEYS",
    "QUANT_TYPES",
    "REPACK_WORDS",
    "SERVER_A",
    "SERVER_B",
    "SERVER_DEFAULTS",
    "SERVER_KEYS",
    "Api",
    "Backend",
    "EndpointIdentity",
    "FlashAttn",
    "Lane",
    "LaneConfigError",
    "LaneId",
    "Pair",
    "PairSet",
    "PrefixMode",
    "Repack",
    "Rescore",
    "Speculation",
    "SplitMode",
    "accept_tolerance",
    "apply_overrides",
    "check_endpoints",
    "default_threads",
    "differences",
    "has_masked_credentials",
    "headline",
    "joined_endpoints",
    "lane_from_dict",
    "load_pairs_file",
    "override_words",
    "parse_overrides",
    "parse_value",
    "presets",
    "split_endpoints",
    "tomllib",
    "unknown_key",
    "unknown_pair",
    "unread_keys",
    "without_credentials",
]
