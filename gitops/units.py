"""Durations and sizes as people read them in tables."""
from __future__ import annotations


def human_age(seconds: float) -> str:
    """`42s`, `5m`, `3h`, `2d`: the largest whole unit."""
    whole = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if whole >= size:
            return f"{whole // size}{unit}"
    return f"{whole}s"


def human_size(count: int) -> str:
    """`512 B`, `1.5 KiB`, `20.3 MiB`, `1.2 GiB`."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count} B"
