"""The Lane record and the Pair of two lanes.

A Lane is frozen and complete: everything that can change the greedy output of the
in-process engine is a field, checked as the record is made, so a session or report
that stores the lane can be re-run exactly. A Pair is two lanes that differ in one
thing.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from specdiff.chat import check_chat_setting
from specdiff.errors import LaneConfigError
from specdiff.lanes.endpoints import (
    check_endpoints,
    has_masked_credentials,
    joined_endpoints,
    split_endpoints,
    without_credentials,
)
from specdiff.lanes.values import (
    BOUNDS,
    CHOICES,
    ENV_NAME,
    MAX_SERVER_FLAGS,
    Api,
    Backend,
    FlashAttn,
    PrefixMode,
    Repack,
    Rescore,
    Speculation,
    SplitMode,
    accept_tolerance,
    bad_type,
    default_threads,
)


@dataclass(frozen=True)
class Lane:
    """One decoding configuration of the in-process engine."""

    label: str = ""
    backend: Backend = "local"
    model: str = "default"
    """"default" (the bundled Gemma 3 270M Q4_K_M) or a path to a .gguf file."""
    quant: str = ""
    """Requantize the model to this type first ("" = use it as it is), e.g. q8_0, f16."""
    n_ctx: int = 4096
    n_batch: int = 512
    n_ubatch: int = 512
    threads: int = field(default_factory=default_threads)
    threads_batch: int = 0
    """Threads for prompt batches; 0 = the same as threads."""
    flash_attn: FlashAttn = "off"
    type_k: str = "f16"
    type_v: str = "f16"
    repack: Repack = "auto"
    """Let llama.cpp repack weights for the CPU's wider kernels (its extra buffer types):
    on, off, or auto (on, unless a short probe decode crashes with it on this CPU)."""
    gpu_layers: int = 0
    """Layers llama.cpp offloads to the GPU: 0 = none (CPU only), -1 = all of them."""
    main_gpu: int = 0
    """The GPU (an index among the GPU devices) that holds the model when split_mode=none."""
    split_mode: SplitMode = "layer"
    """How several GPUs share the model: none (main_gpu alone), layer (whole layers per
    GPU) or row (rows of each weight split across GPUs, where the backend supports it)."""
    speculation: Speculation = "none"
    spec_ngram: int = 3
    """Prompt lookup: the longest n-gram matched against the history."""
    spec_ngram_min: int = 2
    """Prompt lookup: the shortest n-gram tried before giving up on drafting."""
    spec_drafts: int = 15
    """Tokens drafted per verification (the maximum, when adaptive)."""
    spec_adaptive: bool = True
    """Pick each verify's draft length from the recent acceptance rate (the width with
    the most expected tokens per unit of cost, or no draft after rejections)."""
    spec_align: int = 4
    """Round verify widths (drafts + 1) down to a multiple of this; 1 = no rounding."""
    spec_accept: str = "exact"
    """exact: a draft is accepted only where it is the target's argmax (lossless);
    lenient:DELTA: where its logit is within DELTA of the row's maximum (relaxed
    verification, which changes the output: a deliberate invariant breaker)."""
    draft_model: str = ""
    """Draft GGUF for speculation=draft; "" = the lane's own model."""
    prefix: PrefixMode = "fresh"
    """fresh: decode the whole prompt at once; cached: decode a prefix in an earlier call."""
    prefix_tokens: int = 0
    """cached: how many prompt tokens the earlier call decodes; 0 = half the prompt."""
    prefix_text: str = ""
    """cached: decode this text (a prefix of the prompt) in the earlier call instead."""
    top_k: int = 8
    chat: str = ""
    """Format the prompt as a conversation: "" = raw text; true (or auto) = the GGUF's
    own chat template; or a template llama.cpp builds in (gemma, chatml, llama3...)."""
    endpoint: str = ""
    """backend=server: the server's base URL, e.g. http://127.0.0.1:8080; or several,
    comma-separated (a TOML list is joined so), whose requests go to the least busy."""
    api: Api = "completions"
    """backend=server: completions (/v1/completions), chat (/v1/chat/completions) or
    llama-server (its own /completion, which also gives token ids and draft counts)."""
    api_model: str = ""
    """backend=server: the model name sent in requests ("" = the server's first model)."""
    api_key_env: str = ""
    """backend=server: the environment variable holding the API key (the key itself is
    never stored)."""
    request: str = ""
    """backend=server: extra request fields as a JSON object, e.g. {"cache_prompt": true}."""
    timeout: int = 60
    """backend=server: seconds without a byte from the server before the lane fails."""
    retries: int = 2
    """backend=server: how often a refused or failed connection is tried again."""
    rescore: Rescore = "auto"
    """backend=server: auto scores again, teacher-forced on the same server, the accepted
    drafts it reported without probabilities (so they have margins); off leaves them so."""
    server_flags: str = ""
    """backend=server: what the server was launched with that decides determinism (e.g.
    "VLLM_BATCH_INVARIANT=1 --enable-deterministic-inference"), as the user states it:
    no server reports it, and reports show it beside the result."""

    def __post_init__(self) -> None:
        repack: object = self.repack
        if isinstance(repack, bool):  # pair files and sessions written when it was a bool
            object.__setattr__(self, "repack", "on" if repack else "off")
        if isinstance(self.endpoint, (list, tuple)):  # a TOML list of endpoints
            object.__setattr__(self, "endpoint", joined_endpoints(self.endpoint))
        chat: object = self.chat
        if isinstance(chat, bool) or chat == "false":  # TOML's chat = true, as repack's
            object.__setattr__(self, "chat", "true" if chat is True else "")
        for item in fields(self):
            _check_field(item.name, getattr(self, item.name))
        self._check_local()
        check_chat_setting(self.chat)
        if self.backend == "server":
            self._check_server()
        if len(self.server_flags) > MAX_SERVER_FLAGS or not self.server_flags.isprintable():
            raise LaneConfigError(
                f"lane key 'server_flags' must be one line of at most {MAX_SERVER_FLAGS} "
                "printable characters (the server's launch flags, e.g. "
                "--enable-deterministic-inference)"
            )
        if self.api_key_env and not ENV_NAME.fullmatch(self.api_key_env):
            raise LaneConfigError(
                f"api_key_env must name an environment variable, got {self.api_key_env!r}"
            )
        if self.request:
            try:
                extra = json.loads(self.request)
            except ValueError:
                extra = None
            if not isinstance(extra, dict):
                raise LaneConfigError(
                    "request must be a JSON object of extra request fields, e.g. "
                    '{"cache_prompt": true}'
                )

    def _check_local(self) -> None:
        """Settings llama.cpp would refuse, or that contradict each other."""
        if self.n_ubatch > self.n_batch:
            raise LaneConfigError(
                f"n_ubatch ({self.n_ubatch}) must not exceed n_batch ({self.n_batch}); "
                "lower n_ubatch or raise n_batch"
            )
        if self.spec_ngram_min > self.spec_ngram:
            raise LaneConfigError(
                f"spec_ngram_min ({self.spec_ngram_min}) must not exceed spec_ngram "
                f"({self.spec_ngram})"
            )
        if self.type_v not in ("f16", "f32", "bf16") and self.flash_attn != "on":
            raise LaneConfigError(
                f"a quantized V cache (type_v={self.type_v}) needs flash_attn=on in llama.cpp"
            )
        if self.prefix_text and self.prefix_tokens:
            raise LaneConfigError("set prefix_tokens or prefix_text, not both")
        if self.accept_tolerance is not None and not self.speculative:
            raise LaneConfigError(
                f"spec_accept={self.spec_accept} relaxes draft verification: set "
                "speculation=ngram or speculation=draft too"
            )

    def _check_server(self) -> None:
        check_endpoints(self.endpoint)
        offload = [key for key in OFFLOAD_KEYS if getattr(self, key) != OFFLOAD_DEFAULTS[key]]
        if offload:
            raise LaneConfigError(
                f"{offload[0]} does not apply to a server lane: a server's offload is its own "
                "launch flag (e.g. llama-server -ngl 99 --main-gpu 0 --split-mode layer); "
                f"keep {offload[0]}={OFFLOAD_DEFAULTS[offload[0]]}"
            )
        if self.chat:
            raise LaneConfigError(
                "a server lane's chat template is the server's own (llama-server "
                "--chat-template NAME): set api=chat and keep chat empty"
            )
        if self.speculative:
            raise LaneConfigError(
                "a server lane's speculation is the server's own setting (start it so, "
                "e.g. llama-server --spec-type ngram-simple); keep speculation=none"
            )
        if self.prefix == "cached" and self.api != "llama-server":
            raise LaneConfigError(
                "prefix=cached on a server lane primes llama-server's prompt cache: "
                "set api=llama-server"
            )

    @property
    def speculative(self) -> bool:
        return self.speculation != "none"

    @property
    def accept_tolerance(self) -> float | None:
        """How far below the row's maximum an accepted draft's logit may be; None for
        exact verification."""
        return accept_tolerance(self.spec_accept)

    def describe(self) -> str:
        """A short human description, the lane's label if it has one."""
        if self.label:
            return self.label
        lenient = "" if self.accept_tolerance is None else f" · {self.spec_accept}"
        if self.speculation == "ngram":
            return f"speculative · ngram {self.spec_ngram} · {self.spec_drafts} drafts{lenient}"
        if self.speculation == "draft":
            draft = Path(self.draft_model).name if self.draft_model else "self"
            return f"speculative · draft {draft} · {self.spec_drafts} drafts{lenient}"
        if self.prefix == "cached":
            return "prefix cached"
        if self.backend == "server":
            return f"server {without_credentials(self.endpoint)}"
        return "plain"

    @property
    def endpoints(self) -> tuple[str, ...]:
        """The servers the endpoint key names, in order."""
        return split_endpoints(self.endpoint)

    def check_credentials(self, lane_id: str) -> None:
        """Refuse to contact an endpoint read back from a session or suite.json: its
        credentials were saved as ***, which would go to the server as the password."""
        masked = [url for url in self.endpoints if has_masked_credentials(url)]
        if self.backend == "server" and masked:
            raise LaneConfigError(
                f"lane {lane_id}: the endpoint {masked[0]} was saved without its "
                f"credentials; give the lane options again with them (--lane-{lane_id} "
                "endpoint=http://USER:PASSWORD@HOST:PORT)"
            )

    def shown(self, key: str) -> Any:
        """A key's value as messages print it: the endpoint without its credentials."""
        value = getattr(self, key)
        return without_credentials(value) if key == "endpoint" else value

    def as_dict(self) -> dict[str, Any]:
        """Every key, as sessions, reports and suite.json record it: the endpoint without
        the credentials a URL may carry."""
        data = dataclasses.asdict(self)
        data["endpoint"] = without_credentials(self.endpoint)
        return data


OFFLOAD_KEYS = ("gpu_layers", "main_gpu", "split_mode")
"""The keys that place an in-process lane's layers on GPUs."""
OFFLOAD_DEFAULTS = {item.name: item.default for item in fields(Lane) if item.name in OFFLOAD_KEYS}
SERVER_KEYS = (
    "endpoint", "api", "api_model", "api_key_env", "request", "timeout", "retries", "rescore",
    "server_flags",
)  # fmt: skip
"""The keys that only a server lane reads."""
IN_PROCESS_KEYS = (*OFFLOAD_KEYS, "chat", "speculation")
"""The keys a server lane refuses: its server's launch decides them. A pairs file's
[defaults] gives them to in-process lanes only."""
SERVER_DEFAULTS = {item.name: item.default for item in fields(Lane) if item.name in SERVER_KEYS}

FIELD_TYPES: dict[str, type[object]] = {}
for _field in fields(Lane):
    _default = (
        _field.default_factory()
        if _field.default_factory is not dataclasses.MISSING
        else _field.default
    )
    FIELD_TYPES[_field.name] = type(_default)
LANE_KEYS = tuple(FIELD_TYPES)


def _check_field(name: str, value: object) -> None:
    """One lane key's type, bounds and allowed values."""
    expected = FIELD_TYPES[name]
    if expected is bool:
        if not isinstance(value, bool):
            raise bad_type(name, value, "true or false")
    elif expected is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad_type(name, value, "a whole number")
        low, high = BOUNDS[name]
        if not low <= value <= high:
            raise LaneConfigError(
                f"lane key {name!r} must be between {low} and {high}, got {value}"
            )
    elif not isinstance(value, str):
        raise bad_type(name, value, "a string")
    if name in CHOICES and value not in CHOICES[name]:
        allowed = ", ".join(repr(choice) for choice in CHOICES[name])
        raise LaneConfigError(f"lane key {name!r} cannot be {value!r}; allowed: {allowed}")


def differences(a: Lane, b: Lane) -> list[str]:
    """The keys whose values differ between two lanes (the label excluded, and the
    server keys where both lanes run in-process: nothing reads them there)."""
    unread = SERVER_KEYS if a.backend != "server" and b.backend != "server" else ()
    return [
        key
        for key in LANE_KEYS
        if key != "label" and key not in unread and getattr(a, key) != getattr(b, key)
    ]


def unread_keys(lane: Lane) -> list[str]:
    """The server keys an in-process lane was given, which nothing reads there."""
    if lane.backend == "server":
        return []
    return [key for key in SERVER_KEYS if getattr(lane, key) != SERVER_DEFAULTS[key]]


def headline(lane: Lane, other: Lane) -> str:
    """What this lane is, leading with what differs from the other lane."""
    if lane.label:
        return lane.label
    changed = differences(lane, other)
    if not changed or any(
        key.startswith("spec") or key in ("speculation", "draft_model") for key in changed
    ):
        return lane.describe()
    if changed == ["prefix"] or lane.prefix == "cached" and "prefix" in changed:
        return lane.describe()
    # an unset key (quant: the model as it is) reads "none", never a name with no value
    return " · ".join(f"{key} {lane.shown(key) or 'none'}" for key in changed)


@dataclass(frozen=True)
class Pair:
    """Two lanes compared on the same prompt: lane A and lane B."""

    name: str
    a: Lane
    b: Lane
    description: str = ""

    def servers_named(self, source: str) -> str | None:
        """Why re-running this pair, read from `source` (a session file that anyone may
        have written), needs the user's word: its server lanes would send the prompt to
        the endpoints the file names, and the key from whatever variable it names. None
        when both lanes run in-process."""
        contacts = [
            f"lane {lane_id} talks to {without_credentials(lane.endpoint)}"
            + (f" with the key in ${lane.api_key_env}" if lane.api_key_env else "")
            for lane_id, lane in (("a", self.a), ("b", self.b))
            if lane.backend == "server"
        ]
        if not contacts:
            return None
        return (
            f"{source} names server lanes ({'; '.join(contacts)}); re-running them sends "
            "the prompt there: pass --allow-servers if you trust the file"
        )


def unknown_key(key: str) -> LaneConfigError:
    """The error for a key no lane has, naming the nearest keys that exist."""
    close = difflib.get_close_matches(key, LANE_KEYS, n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(close)}?" if close else f"known keys: {', '.join(LANE_KEYS)}"
    return LaneConfigError(f"unknown lane key {key!r}; {hint}")


def lane_from_dict(data: Mapping[str, Any]) -> Lane:
    """Rebuild a lane stored as a dict (sessions, reports); unknown keys are an error."""
    for key in data:
        if key not in FIELD_TYPES:
            raise unknown_key(key)
    return Lane(**dict(data))
