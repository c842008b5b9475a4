"""Lanes and pairs: what one decoding configuration is, and which two are compared.

A Lane is frozen and complete: everything that can change the greedy output of the
in-process engine is a field, so a session or report that stores the lane can be
re-run exactly. A Pair is two lanes that differ in one thing; presets are the
comparisons the field argues about. Users override any field from the CLI
(``--lane-a n_ubatch=1``) or from a TOML file.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal, get_args
from urllib.parse import urlsplit

from specdiff.chat import check_chat_setting
from specdiff.errors import LaneConfigError, did_you_mean
from specdiff.files import read_limited

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

LaneId = Literal["a", "b"]
"""A lane of a pair: "a" (the configuration under test) or "b" (the one it is compared with)."""
# the lane keys that take one of a few words: the type says which, CHOICES checks them
Backend = Literal["local", "server"]
Api = Literal["completions", "chat", "llama-server"]
FlashAttn = Literal["off", "on", "auto"]
Speculation = Literal["none", "ngram", "draft"]
PrefixMode = Literal["fresh", "cached"]
Repack = Literal["auto", "on", "off"]
SplitMode = Literal["none", "layer", "row"]
Rescore = Literal["auto", "off"]
KV_TYPES = ("f16", "f32", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")
QUANT_TYPES = ("", "f16", "bf16", "q8_0", "q6_k", "q5_k_m", "q4_k_m", "q4_0")
CHOICES: dict[str, tuple[str, ...]] = {
    "backend": get_args(Backend),
    "api": get_args(Api),
    "flash_attn": get_args(FlashAttn),
    "type_k": KV_TYPES,
    "type_v": KV_TYPES,
    "speculation": get_args(Speculation),
    "prefix": get_args(PrefixMode),
    "quant": QUANT_TYPES,
    "repack": get_args(Repack),
    "split_mode": get_args(SplitMode),
    "rescore": get_args(Rescore),
}
REPACK_WORDS = {
    **dict.fromkeys(("true", "1", "yes", "on"), "on"),
    **dict.fromkeys(("false", "0", "no", "off"), "off"),
    "auto": "auto",
}
"""What `repack=` may say: on/off in any of the ways a boolean is written, or auto."""
# inclusive bounds of integer fields
BOUNDS: dict[str, tuple[int, int]] = {
    "n_ctx": (16, 1 << 20),
    "n_batch": (1, 1 << 16),
    "n_ubatch": (1, 1 << 16),
    "threads": (1, 1024),
    "threads_batch": (0, 1024),
    "gpu_layers": (-1, 1 << 16),
    "main_gpu": (0, 255),
    "spec_ngram": (1, 32),
    "spec_ngram_min": (1, 32),
    "spec_drafts": (1, 64),
    "spec_align": (1, 64),
    "prefix_tokens": (0, 1 << 20),
    "top_k": (2, 1024),
    "timeout": (1, 3600),
    "retries": (0, 10),
}
MAX_SERVER_FLAGS = 400
"""server_flags is a launch line quoted beside a result, not a file."""
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def default_threads() -> int:
    """All cores this process may run on: what llama.cpp's own tools default to."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


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
    spec_drafts: int = 7
    """Tokens drafted per verification (the maximum, when adaptive)."""
    spec_adaptive: bool = True
    """Grow the draft length while drafts are accepted, shrink it when they are not."""
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


MASKED_CREDENTIALS = "***"
"""What a saved endpoint holds in place of its user name and password."""
_URL_PARTS = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)([^/?#]*)(.*)", re.DOTALL)
"""A URL as scheme, authority (user info @ host) and the rest."""
_NEXT_URL = re.compile(r",(?=\s*[A-Za-z][A-Za-z0-9+.-]*://)")
"""A comma that separates two endpoints: one followed by the next URL's scheme. A comma
anywhere else (a password's) stays inside its URL, so it is masked with it."""


def without_credentials(url: str) -> str:
    """`url` with any user name and password replaced by ***: a URL's credentials are as
    secret as an API key, and lanes are printed and saved. A comma-separated list of
    endpoints has each one's masked."""
    return ",".join(_one_without_credentials(part) for part in _NEXT_URL.split(url))


def _one_without_credentials(url: str) -> str:
    parts = _URL_PARTS.match(url)
    if parts is None or "@" not in parts[2]:
        return url
    return f"{parts[1]}{MASKED_CREDENTIALS}@{parts[2].rpartition('@')[2]}{parts[3]}"


ENDPOINT_FORM = "endpoint=http://HOST:PORT (the server's base URL; several: comma-separated)"


def joined_endpoints(urls: Iterable[object]) -> str:
    """A TOML list of endpoints as the one string a lane keeps."""
    listed = list(urls)
    if not listed:
        raise LaneConfigError(
            "lane key 'endpoint' is an empty list; name at least one server, e.g. "
            'endpoint = ["http://127.0.0.1:8080"]'
        )
    endpoints: list[str] = []
    for url in listed:
        if not isinstance(url, str):
            raise _bad_type("endpoint", url, "a URL in quotes")
        endpoints.append(url)
    return ",".join(endpoints)


def split_endpoints(endpoint: str) -> tuple[str, ...]:
    """The URLs a lane's endpoint key names, in order."""
    return tuple(url.strip() for url in _NEXT_URL.split(endpoint) if url.strip())


EndpointIdentity = tuple[str, str, int, str]


def _endpoint_identity(url: str) -> EndpointIdentity | None:
    """What makes two endpoint URLs the same server: scheme, host (any case), port
    (the scheme's default when none), path (without a trailing slash); None for what
    is no http(s) URL with a host."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:  # a port that is no number, a broken [IPv6] address
        return None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname:
        return None
    default = 443 if scheme == "https" else 80
    return (scheme, parts.hostname.lower(), port or default, parts.path.rstrip("/"))


MAX_ENDPOINTS = 256
"""A lane's pool of servers: each is asked who it is before the run, and each is named
on the lane's line of every report."""


def check_endpoints(endpoint: str) -> None:
    """A server lane's endpoint key: one URL or several, comma-separated, each
    http(s)://HOST[:PORT][/PATH], none named twice."""
    if not endpoint.strip():
        raise LaneConfigError(f"a server lane needs {ENDPOINT_FORM}")
    urls = [entry.strip() for entry in _NEXT_URL.split(endpoint)]
    if len(urls) > MAX_ENDPOINTS:
        raise LaneConfigError(
            f"lane key 'endpoint' names {len(urls):,} servers; a lane pools at most "
            f"{MAX_ENDPOINTS}, so list fewer"
        )
    seen: dict[EndpointIdentity, str] = {}
    for url in urls:
        shown = without_credentials(url)
        identity = _endpoint_identity(url)
        if identity is None or _UNSENDABLE.search(url):
            raise LaneConfigError(_not_a_url(url))
        if identity in seen:
            raise LaneConfigError(
                f"lane key 'endpoint' names {shown!r:.120} twice (as {seen[identity]!r:.120}); "
                "list each server once"
            )
        seen[identity] = shown


_UNSENDABLE = re.compile(r"[\x00-\x1f\x7f]")
"""What no request line may carry and no URL parser percent-encodes: control characters."""
_ANY_USER_INFO = re.compile(r"(://).*@", re.DOTALL)
"""Everything up to a URL's last @: a password holding / ? or # ends the authority early
for a URL parser, so the strict mask would show it."""


_PORT = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://[^/?#@]*:(\d+)(?:[/?#]|$)")
"""The port of a URL with no user info (the caller masks and explains those first)."""
MAX_PORT = 65535


def _not_a_url(url: str) -> str:
    """Why `url` cannot be an endpoint, with anything that may be a password masked."""
    shown = _ANY_USER_INFO.sub(rf"\1{MASKED_CREDENTIALS}@", url, count=1)
    if url.endswith(","):
        return f"lane key 'endpoint' has an empty entry: {shown!r:.120} ends in a comma; drop it"
    if _UNSENDABLE.search(url):
        return (
            f"lane key 'endpoint': {shown!r:.120} holds a control character; "
            "percent-encode it (an escape is %1B)"
        )
    if "@" in url:
        return (
            f"lane key 'endpoint': {shown!r:.120} is not a URL; percent-encode / ? # in a "
            "user name or password (%2F %3F %23)"
        )
    port = _PORT.search(url)
    if port is not None and int(port.group(1)) > MAX_PORT:
        return (
            f"lane key 'endpoint': {shown!r:.120} names port {int(port.group(1))}; "
            f"a port is 1 to {MAX_PORT}"
        )
    return f"lane key 'endpoint': {shown!r:.120} is not a URL; a server lane needs {ENDPOINT_FORM}"


def has_masked_credentials(url: str) -> bool:
    """Whether `url` is an endpoint as saved: its credentials replaced by ***."""
    parts = _URL_PARTS.match(url)
    return parts is not None and parts[2].rpartition("@")[0] == MASKED_CREDENTIALS


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

_FIELD_TYPES: dict[str, type] = {}
for _field in fields(Lane):
    _default = (
        _field.default_factory()
        if _field.default_factory is not dataclasses.MISSING
        else _field.default
    )
    _FIELD_TYPES[_field.name] = type(_default)
LANE_KEYS = tuple(_FIELD_TYPES)


def _bad_type(key: str, value: object, wanted: str) -> LaneConfigError:
    shown = repr(value)
    if len(shown) > 80:  # an array or table from a file can be any size
        shown = shown[:77] + "..."
    return LaneConfigError(f"lane key {key!r} must be {wanted}, got {shown}")


def _check_field(name: str, value: object) -> None:
    """One lane key's type, bounds and allowed values."""
    expected = _FIELD_TYPES[name]
    if expected is bool:
        if not isinstance(value, bool):
            raise _bad_type(name, value, "true or false")
    elif expected is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _bad_type(name, value, "a whole number")
        low, high = BOUNDS[name]
        if not low <= value <= high:
            raise LaneConfigError(
                f"lane key {name!r} must be between {low} and {high}, got {value}"
            )
    elif not isinstance(value, str):
        raise _bad_type(name, value, "a string")
    if name in CHOICES and value not in CHOICES[name]:
        allowed = ", ".join(repr(choice) for choice in CHOICES[name])
        raise LaneConfigError(f"lane key {name!r} cannot be {value!r}; allowed: {allowed}")


MAX_ACCEPT_TOLERANCE = 100.0
"""Far beyond any logit gap that matters: every draft in the top few is accepted."""
ACCEPT_FORMS = (
    "exact or lenient:DELTA (DELTA a number of logits above 0 and at most 100, e.g. lenient:1.0)"
)


def accept_tolerance(spec_accept: str) -> float | None:
    """The DELTA of ``lenient:DELTA``, None for ``exact``; raises LaneConfigError naming
    the accepted forms for anything else."""
    if spec_accept == "exact":
        return None
    word, _, number = spec_accept.partition(":")
    try:
        tolerance = float(number) if word == "lenient" else math.nan
    except ValueError:
        tolerance = math.nan
    # NaN fails both comparisons, so "nan", "inf" and non-numbers are refused here
    if not 0 < tolerance <= MAX_ACCEPT_TOLERANCE:
        raise LaneConfigError(
            f"lane key 'spec_accept' must be {ACCEPT_FORMS}, got {spec_accept!r:.80}"
        )
    return tolerance


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


def _lane(**overrides: Any) -> Lane:
    return Lane(**overrides)


SERVER_A = "http://127.0.0.1:8080"
SERVER_B = "http://127.0.0.1:8081"


def presets() -> dict[str, Pair]:
    """The built-in pairs. Built on call so that each takes the current default threads."""
    return {
        "spec-vs-plain": Pair(
            "spec-vs-plain",
            _lane(speculation="ngram"),
            _lane(),
            "prompt-lookup n-gram speculation vs plain greedy decoding",
        ),
        "draft-vs-plain": Pair(
            "draft-vs-plain",
            _lane(speculation="draft"),
            _lane(),
            "draft-model speculation (default draft: the model itself) vs plain",
        ),
        "lenient-vs-plain": Pair(
            "lenient-vs-plain",
            _lane(speculation="ngram", spec_accept="lenient:1.0"),
            _lane(),
            "n-gram speculation accepting drafts within 1 logit of the best (lossy) vs plain",
        ),
        "cache-vs-fresh": Pair(
            "cache-vs-fresh",
            _lane(prefix="cached"),
            _lane(),
            "a prompt prefix decoded in an earlier call (a cache hit) vs the whole prompt at once",
        ),
        "ubatch": Pair(
            "ubatch",
            _lane(),
            _lane(n_batch=2, n_ubatch=2),
            "prompt decoded in batches of 512 vs batches of 2",
        ),
        "quant": Pair(
            "quant",
            _lane(),
            _lane(quant="q8_0"),
            "the model as it is (Q4_K_M by default) vs requantized to Q8_0",
        ),
        "threads": Pair(
            "threads",
            _lane(threads=1, threads_batch=1),
            _lane(threads=2, threads_batch=2),
            "1 thread vs 2 threads",
        ),
        "gpu-vs-cpu": Pair(
            "gpu-vs-cpu",
            _lane(gpu_layers=-1),
            _lane(),
            "every layer offloaded to the GPU vs none (CPU only); needs a llama-cpp-python "
            "built with CUDA, Metal or Vulkan",
        ),
        **_server_presets(),
    }


def _server_presets() -> dict[str, Pair]:
    """The built-in pairs whose lanes are servers."""
    return {
        "servers": Pair(
            "servers",
            _lane(backend="server", endpoint=SERVER_A),
            _lane(backend="server", endpoint=SERVER_B),
            "two OpenAI-compatible servers (set them: --lane-a endpoint=URL --lane-b endpoint=URL)",
        ),
        "server-cache-vs-fresh": Pair(
            "server-cache-vs-fresh",
            _lane(backend="server", api="llama-server", endpoint=SERVER_A, prefix="cached"),
            _lane(backend="server", api="llama-server", endpoint=SERVER_A),
            "one llama-server: cache_prompt after a priming request with half the prompt vs "
            "no prompt cache",
        ),
    }


def parse_value(key: str, text: str) -> Any:
    """Turn the text of a ``key=value`` override into the field's type."""
    if key not in _FIELD_TYPES:
        raise unknown_key(key)
    expected = _FIELD_TYPES[key]
    if key == "repack":
        word = REPACK_WORDS.get(text.strip().lower())
        if word is None:
            raise _bad_type(key, text, "auto, on or off (true/false also work)")
        return word
    if expected is bool:
        lowered = text.strip().lower()
        if lowered in ("true", "1", "yes", "on"):
            return True
        if lowered in ("false", "0", "no", "off"):
            return False
        raise _bad_type(key, text, "true or false")
    if expected is int:
        # int() also reads 1_000 and other scripts' digits; a lane value is ASCII digits
        if not _WHOLE_NUMBER.fullmatch(text.strip()):
            raise _bad_type(key, text, "a whole number")
        return int(text.strip())
    return text


_WHOLE_NUMBER = re.compile(r"[+-]?[0-9]+", re.ASCII)


def unknown_key(key: str) -> LaneConfigError:
    """The error for a key no lane has, naming the nearest keys that exist."""
    close = difflib.get_close_matches(key, LANE_KEYS, n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(close)}?" if close else f"known keys: {', '.join(LANE_KEYS)}"
    return LaneConfigError(f"unknown lane key {key!r}; {hint}")


_NEXT_SETTING = re.compile(r"\s+(?=[A-Za-z_][A-Za-z0-9_]*=)")


def override_words(text: str) -> list[str]:
    """`key=value` settings typed on one line: a new one starts only where a word reads
    `key=`, so a value keeps its spaces, quotes and backslashes (a label, a JSON
    request, a Windows path) as typed."""
    return [word for word in _NEXT_SETTING.split(text.strip()) if word]


def parse_overrides(items: Iterable[str]) -> dict[str, Any]:
    """Parse CLI overrides like ``n_ubatch=1`` into typed values."""
    parsed: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise LaneConfigError(f"lane override {item!r} is not key=value, e.g. n_ubatch=2")
        parsed[key] = parse_value(key, text)
    return parsed


def apply_overrides(lane: Lane, overrides: Mapping[str, Any]) -> Lane:
    for key in overrides:
        if key not in _FIELD_TYPES:
            raise unknown_key(key)
    return replace(lane, **overrides)


def unknown_pair(name: str, known: Iterable[str]) -> LaneConfigError:
    names = sorted(known)
    return LaneConfigError(
        f"unknown pair {name!r}; {did_you_mean(name, names)}known pairs: {', '.join(names)}"
    )


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
        return tomllib.loads(raw.decode("utf-8"))
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
        if key not in _FIELD_TYPES:
            raise LaneConfigError(f"{path}: {where}: " + str(unknown_key(key)))


def lane_from_dict(data: Mapping[str, Any]) -> Lane:
    """Rebuild a lane stored as a dict (sessions, reports); unknown keys are an error."""
    for key in data:
        if key not in _FIELD_TYPES:
            raise unknown_key(key)
    return Lane(**dict(data))
