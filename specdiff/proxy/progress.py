"""What a proxy has saved so far, as one record a pair: the counts over all of its suite
folders (completions, chat/, sampled/) and the session just saved. The live line and
the TUI both read it; neither counts for itself."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

from specdiff.proxy.folder import Recorded


@dataclass(frozen=True)
class ProxyProgress:
    """One pair saved, and where the proxy stands after it."""

    session: Path
    """The pair's session file."""
    prompt_id: str
    fork_index: int | None
    failed: bool
    """A lane failed (the session holds its error)."""
    requests: int
    """Pairs saved so far, in all the proxy's folders, this one included."""
    forked: int
    """Of them, those whose lanes forked."""


class ProxyTally:
    """Counts the pairs saved, from any of the service's threads."""

    def __init__(self) -> None:
        self.requests = 0
        self.forked = 0
        self._lock = threading.Lock()

    def add(self, recorded: Recorded, folder: str) -> ProxyProgress:
        """The progress after `recorded`, saved into the suite folder `folder`."""
        record = recorded.record
        summary = record.summary
        failed = bool(summary.errors[0] or summary.errors[1])
        with self._lock:
            self.requests += 1
            self.forked += summary.fork_index is not None and not failed
            return ProxyProgress(
                session=Path(folder) / record.session,
                prompt_id=record.prompt_id,
                fork_index=summary.fork_index,
                failed=failed,
                requests=self.requests,
                forked=self.forked,
            )
