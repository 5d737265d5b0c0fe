"""A resource document as read from the repo, with the position of every field."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gitops.model.diagnostics import Diagnostic, format_path

FieldPath = tuple[str | int, ...]


@dataclass
class Document:
    """One Kubernetes-style document (`apiVersion`, `kind`, `metadata`, `spec`).

    `positions` maps field paths (relative to this document) to 1-based lines
    in `file`, so any later check can point at the exact line.
    """

    file: str
    line: int
    data: dict[str, Any]
    positions: dict[FieldPath, int] = field(default_factory=dict, repr=False)

    @property
    def kind(self) -> str:
        kind = self.data.get("kind")
        return kind if isinstance(kind, str) else ""

    @property
    def name(self) -> str:
        meta = self.data.get("metadata")
        name = meta.get("name") if isinstance(meta, dict) else None
        return name if isinstance(name, str) else ""

    @property
    def subject(self) -> str:
        if self.kind == "GitopsConfig" and not self.name:  # gitops.yaml's one document has no name
            return self.kind
        return f"{self.kind or '?'}/{self.name or '?'}"

    @property
    def spec(self) -> dict[str, Any]:
        spec = self.data.get("spec")
        return spec if isinstance(spec, dict) else {}

    def get(self, path: FieldPath, default: Any = None) -> Any:
        node: Any = self.data
        for part in path:
            try:
                node = node[part]
            except (KeyError, IndexError, TypeError):
                return default
        return node

    def line_of(self, path: FieldPath) -> int:
        """Line of `path`, or of its nearest ancestor that exists."""
        for end in range(len(path), -1, -1):
            line = self.positions.get(tuple(path[:end]))
            if line is not None:
                return line
        return self.line

    def error(self, path: FieldPath, message: str) -> Diagnostic:
        return Diagnostic(self.file, self.line_of(path), self.subject, format_path(path), message)
