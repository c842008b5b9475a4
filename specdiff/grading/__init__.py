"""Grading what a lane wrote: a prompt's tests executed in a sandbox, an exact answer,
or a pattern (graders), and the sandbox that runs model-written programs (sandbox)."""

DEFAULT_TIMEOUT = 10.0
"""Seconds a graded program may run (``--grade-timeout``)."""
MAX_TIMEOUT = 3600.0
"""The longest ``--grade-timeout``: a graded program runs an hour at most."""
