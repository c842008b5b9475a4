"""A server lane's endpoint key: one URL or several, checked, split, and printed without
the credentials a URL may carry (they are as secret as an API key, and lanes are
printed and saved).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import urlsplit

from specdiff.errors import LaneConfigError
from specdiff.lanes.values import bad_type

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
            raise bad_type("endpoint", url, "a URL in quotes")
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
