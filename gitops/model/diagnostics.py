"""Diagnostics: every problem found in a repo, pinned to file, line and field."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True, order=True)
class Diagnostic:
    """One error in the repo.

    Rendered as `path/to/file.yaml:LINE: Kind/name: field.path: message`; the
    subject and field parts are left out when they do not apply (e.g. a file
    that is not YAML at all).
    """

    file: str
    line: int
    subject: str = ""
    field: str = ""
    message: str = ""

    def __str__(self) -> str:
        parts = [f"{self.file}:{self.line}"]
        if self.subject:
            parts.append(self.subject)
        if self.field:
            parts.append(self.field)
        parts.append(self.message)
        return ": ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def format_path(path: tuple[str | int, ...]) -> str:
    """`("spec", "portRange", "low")` -> `spec.portRange.low`; list items as `[i]`."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out
