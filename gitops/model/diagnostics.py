"""Diagnostics: every problem found in a repo, pinned to file, line and field."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from gitops.printable import printable, shorten

#: errors printed in full; past them, how many more there are
MAX_SHOWN = 50
#: characters kept of a message (a value echoed in it) and of the file, subject and field parts
MAX_MESSAGE = 400
MAX_PART = 200


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

    def __post_init__(self) -> None:
        for name, limit in (("file", MAX_PART), ("subject", MAX_PART), ("field", MAX_PART), ("message", MAX_MESSAGE)):
            value = getattr(self, name)
            if len(value) > limit:
                object.__setattr__(self, name, shorten(value, limit))

    def __str__(self) -> str:
        """One line: control characters in any part (a file or key name...) are escaped as `repr` does."""
        parts = [f"{self.file}:{self.line}"]
        if self.subject:
            parts.append(self.subject)
        if self.field:
            parts.append(self.field)
        parts.append(self.message)
        return printable(": ".join(parts))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def capped(diagnostics: Sequence[Diagnostic], what: str = "error") -> list[str]:
    """The first `MAX_SHOWN` as lines, then one line saying how many more there are."""
    lines = [str(d) for d in diagnostics[:MAX_SHOWN]]
    if len(diagnostics) > MAX_SHOWN:
        lines.append(f"... and {len(diagnostics) - MAX_SHOWN} more {what}(s) not shown")
    return lines


def format_path(path: tuple[str | int, ...]) -> str:
    """`("spec", "portRange", "low")` -> `spec.portRange.low`; list items as `[i]`."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out
