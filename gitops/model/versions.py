"""The Kubernetes versions gitops compiles control planes for.

Flags differ between versions (1.20-1.23 still serve insecure ports unless told
not to; 1.24 removed those flags), so a version outside the supported range is a
validation error rather than a guess.
"""
from __future__ import annotations

#: oldest and newest supported minor versions of Kubernetes 1.x
MIN_MINOR = 20
MAX_MINOR = 31


def parse(version: str) -> tuple[int, int, int]:
    """"v1.20.2" or "1.20.2" -> (1, 20, 2); ValueError otherwise."""
    parts = version.strip().removeprefix("v").split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"not a Kubernetes version (want MAJOR.MINOR.PATCH): {version!r}")
    major, minor, patch = (int(p) for p in parts)
    return major, minor, patch


def minor(version: str) -> int:
    """The minor version of a supported 1.x version."""
    return parse(version)[1]


def supported_range() -> str:
    return f"1.{MIN_MINOR}.0 to 1.{MAX_MINOR}.x"


def problem(version: str) -> str | None:
    """Why `version` is not supported, or None if it is."""
    try:
        major, minor_, _ = parse(version)
    except ValueError as err:
        return str(err)
    if major != 1 or not MIN_MINOR <= minor_ <= MAX_MINOR:
        return f"Kubernetes {version.removeprefix('v')} is not supported: gitops supports {supported_range()}"
    return None
