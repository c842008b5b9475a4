"""specdiff proxy: both lanes of a pair behind one OpenAI-compatible endpoint.

Every request a client sends (an eval harness, an app) runs on both lanes; the client
gets one lane's answer in the shape it asked for, and the pair is saved, as it ends,
as a session of a suite folder that `specdiff suite`'s reports read like any other.

The package is headless: `requests` reads what a client sent, `answers` writes what it
gets back, `folder` keeps the suite folder, `service` runs the pairs, and `server` is
the HTTP front. The command line (specdiff.cli.proxy) only wires them together.
"""

from __future__ import annotations

from specdiff.errors import SpecdiffError


class ProxyError(SpecdiffError):
    """The proxy cannot start as asked (an address, a folder)."""
