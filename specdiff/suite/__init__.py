"""Suites: one pair (or several) over a set of prompts, every number tied to its
configuration.

Each prompt's run is kept as a session file, so a stopped suite resumes from its files
and every figure of the report can be traced to one file. The figures are computed from
the session files themselves, whether they were written just now or by an earlier,
stopped run.
"""

from specdiff.errors import SpecdiffError

MAX_CONCURRENCY = 256
"""The most prompts a suite keeps in flight per lane (each holds a worker process)."""


class SuiteError(SpecdiffError):
    """A suite's input or report folder is wrong."""
