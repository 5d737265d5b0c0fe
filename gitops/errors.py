"""Errors shown to users: one clear line, never a traceback."""
from __future__ import annotations


class GitopsError(Exception):
    """An actionable failure; the CLI prints `str(err)` and exits 1."""
