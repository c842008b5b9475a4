"""Keeping the secrets in specdiff's environment (the API keys server lanes read) from
other processes of the same user, such as a graded program that runs as that user."""

from __future__ import annotations

import ctypes
import os

_PR_SET_DUMPABLE = 4


def hide_environment() -> str | None:
    """PR_SET_DUMPABLE 0 for this process: its /proc/<pid>/environ and memory become
    root's, so a process of the same user cannot read the keys in its environment.
    Children that exec are dumpable again, so each process that holds keys calls this
    itself. None when done (or not Linux, where no /proc/<pid>/environ exists), else
    why it failed."""
    prctl = getattr(ctypes.CDLL(None, use_errno=True), "prctl", None)
    if prctl is None:
        return None
    if prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        return os.strerror(ctypes.get_errno())
    return None
