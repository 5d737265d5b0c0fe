"""Safe, bounded YAML loading that remembers where every field came from.

PyYAML's safe composer (LibYAML's C parser when available) builds a node
tree; we construct plain Python values from it ourselves so that we can:

* record the line of every mapping key and sequence item (for error messages),
* reject duplicate keys (PyYAML silently keeps the last one),
* bound alias expansion (nodes and bytes, counted as expanded) and nesting, so a
  "billion laughs" document, or many aliases of one large string, is refused instead of
  expanded: every later pass over the documents is then bounded too.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from gitops.model.diagnostics import Diagnostic

try:  # LibYAML is much faster; fall back to pure Python when not built in.
    _Base: type = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - depends on the PyYAML build
    _Base = yaml.SafeLoader


class _Loader(_Base):  # type: ignore[misc, valid-type]
    """Safe loader that resolves scalars the way Kubernetes tooling does.

    YAML 1.1's base-60 numbers turn an unquoted MAC address such as
    `52:54:00:12:34:56` (as `kubectl get bmh -o yaml` prints it) into an
    integer; Go's YAML libraries never did that, so neither do we.
    """


_INT = re.compile(r"""^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$""", re.X)
_FLOAT = re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?|\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$""", re.X)
_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")]
    for first, resolvers in _Base.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver("tag:yaml.org,2002:int", _INT, list("-+0123456789"))
_Loader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789."))

MAX_FILE_BYTES = 8 * 1024 * 1024
#: nodes of a file counted as expanded: an alias counts its whole target again
MAX_NODES_PER_FILE = 1_000_000
#: bytes of scalars and keys of a file, counted as expanded (source text is at most MAX_FILE_BYTES)
MAX_EXPANDED_BYTES = 16 * 1024 * 1024
MAX_DEPTH = 64
#: documents of one file, empty ones included (`---` lines)
MAX_DOCUMENTS_PER_FILE = 10_000

Path_ = tuple[str | int, ...]

_MAP = "tag:yaml.org,2002:map"
_SEQ = "tag:yaml.org,2002:seq"
_MERGE = "tag:yaml.org,2002:merge"
_STR = "tag:yaml.org,2002:str"
_TIMESTAMP = "tag:yaml.org,2002:timestamp"
_SCALAR_TAGS = frozenset(f"tag:yaml.org,2002:{t}" for t in ("str", "int", "float", "bool", "null"))


class YamlError(Exception):
    """A problem in one YAML file, at a 1-based line."""

    def __init__(self, line: int, message: str, path: Path_ = ()):
        super().__init__(message)
        self.line = line
        self.message = message
        self.path = path


@dataclass(frozen=True)
class Span:
    """Where a mapping's scalar value is written: character offsets into the text, for in-place edits."""

    start: int
    end: int  # a block scalar's span ends after its last line break (and any blank lines after it)
    key_column: int  # 0-based column of its key
    style: str  # '' plain, '|' or '>' block, '"' or "'" quoted
    flow: bool  # inside a flow mapping ({...}), where block scalars are not allowed


@dataclass
class RawDocument:
    """One YAML document: its data plus the line of each field path (and, on request, value spans)."""

    line: int
    data: Any
    positions: dict[Path_, int] = field(default_factory=dict)
    spans: dict[Path_, Span] = field(default_factory=dict)


class _Builder:
    """Turns a composed node tree into Python values, with positions and limits."""

    def __init__(self, spans: bool = False) -> None:
        self._scalars = yaml.constructor.SafeConstructor()
        self.visited = 0
        self.expanded_bytes = 0
        self._spans: dict[Path_, Span] | None = {} if spans else None

    def build(self, node: yaml.Node) -> RawDocument:
        positions: dict[Path_, int] = {}
        if self._spans is not None:
            self._spans = {}
        data = self._value(node, (), positions, 0)
        return RawDocument(line=node.start_mark.line + 1, data=data, positions=positions, spans=self._spans or {})

    def _value(self, node: yaml.Node, path: Path_, pos: dict[Path_, int], depth: int) -> Any:
        self.visited += 1
        line = node.start_mark.line + 1
        if self.visited > MAX_NODES_PER_FILE:
            raise YamlError(line, f"document expands to more than {MAX_NODES_PER_FILE} nodes "
                            "(alias bomb?); refusing to load it")
        if depth > MAX_DEPTH:
            raise YamlError(line, f"nesting deeper than {MAX_DEPTH} levels (recursive alias?)", path[:4])
        pos.setdefault(path, line)
        if node.tag not in _SCALAR_TAGS and node.tag not in (_MAP, _SEQ, _TIMESTAMP):
            raise YamlError(line, f"unsupported YAML tag {node.tag!r} (plain YAML only)", path)
        if isinstance(node, yaml.MappingNode):
            return self._mapping(node, path, pos, depth)
        if isinstance(node, yaml.SequenceNode):
            return [self._value(item, path + (i,), pos, depth + 1) for i, item in enumerate(node.value)]
        self._count_bytes(node, line)
        if node.tag == _TIMESTAMP or node.tag == _STR:  # dates kept as written (schemas speak strings)
            return node.value
        try:
            return self._scalars.construct_object(node, deep=True)
        except yaml.YAMLError as err:
            raise YamlError(line, f"bad scalar: {err}", path) from None

    def _count_bytes(self, node: yaml.ScalarNode, line: int) -> None:
        self.expanded_bytes += len(node.value)
        if self.expanded_bytes > MAX_EXPANDED_BYTES:
            raise YamlError(line, f"document expands to more than {MAX_EXPANDED_BYTES // (1024 * 1024)} MiB of "
                            "text (many aliases of a large value?); refusing to load it")

    def _mapping(self, node: yaml.MappingNode, path: Path_, pos: dict[Path_, int], depth: int) -> dict:
        out: dict[str, Any] = {}
        merged: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key_line = key_node.start_mark.line + 1
            if key_node.tag == _MERGE:
                sources = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
                for src in sources:
                    if not isinstance(src, yaml.MappingNode):
                        raise YamlError(key_line, "merge key '<<' needs a mapping or a list of mappings", path)
                    for k, v in self._mapping(src, path, pos, depth + 1).items():
                        merged.setdefault(k, v)
                continue
            if not isinstance(key_node, yaml.ScalarNode):
                raise YamlError(key_line, "mapping keys must be plain scalars", path)
            # Keys are field names: keep them as written (`80:` is "80", `on:` is "on").
            key = str(key_node.value)
            self.visited += 1
            self._count_bytes(key_node, key_line)
            if key in out:
                raise YamlError(key_line, f"duplicate key {key!r} (first at line {pos[path + (key,)]})",
                                path + (key,))
            pos[path + (key,)] = key_line
            if self._spans is not None and isinstance(value_node, yaml.ScalarNode):
                self._spans[path + (key,)] = Span(value_node.start_mark.index, value_node.end_mark.index,
                                                  key_node.start_mark.column, value_node.style or "",
                                                  bool(node.flow_style))
            out[key] = self._value(value_node, path + (key,), pos, depth + 1)
        for k, v in merged.items():
            out.setdefault(k, v)
        return out


def load_yaml_documents(text: str | bytes, *, spans: bool = False) -> list[RawDocument]:
    """Parse every document of a YAML stream (empty documents are dropped).

    With `spans`, each document also records where its mapping values' scalars are written
    (character offsets into the decoded text), so a field can be rewritten in place.
    Raises `YamlError` with the line of the first problem.
    """
    if len(text) > MAX_FILE_BYTES:
        raise YamlError(1, f"file is larger than {MAX_FILE_BYTES // (1024 * 1024)} MiB; refusing to load it")
    if isinstance(text, bytes):
        if b"\x00" in text:
            raise YamlError(1, "binary file (contains NUL bytes), not YAML")
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as err:
            raise YamlError(text[: err.start].count(b"\n") + 1, "not UTF-8 text, not YAML") from None
    builder = _Builder(spans)
    docs: list[RawDocument] = []
    try:
        for count, node in enumerate(yaml.compose_all(text, Loader=_Loader), 1):
            if count > MAX_DOCUMENTS_PER_FILE:
                line = node.start_mark.line + 1 if node is not None else 1
                raise YamlError(line, f"more than {MAX_DOCUMENTS_PER_FILE} documents in one file; "
                                "refusing to load it (split it)")
            if node is None:
                continue
            if isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null":
                continue
            docs.append(builder.build(node))
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        line = mark.line + 1 if mark is not None else 1
        problem = err.problem or "invalid YAML"
        if err.context:
            problem = f"{problem} ({err.context})"
        raise YamlError(line, f"invalid YAML: {problem}") from None
    except yaml.YAMLError as err:
        raise YamlError(1, f"invalid YAML: {err}") from None
    return docs


def yaml_error_diagnostic(file: str, err: YamlError) -> Diagnostic:
    from gitops.model.diagnostics import format_path

    return Diagnostic(file=file, line=err.line, field=format_path(err.path), message=err.message)
