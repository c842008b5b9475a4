"""Where the Node eval clients the tests run are installed."""

from __future__ import annotations

from pathlib import Path

PROMPTFOO = Path(__file__).resolve().parent / "clients" / "node_modules" / ".bin" / "promptfoo"
"""promptfoo 0.121.20 (later releases refuse Node 20), pinned by tests/clients/package.json
and its lock file; `.ci/run` installs it with `npm ci --prefix tests/clients`."""
