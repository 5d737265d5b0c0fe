"""Read a repo: `gitops.yaml`, then every YAML document under the configured paths.

Each document is schema-checked here; cross-document rules live in
`gitops.model.semantics`. Nothing raises for bad content: every problem
becomes a `Diagnostic` so that one run reports all of them.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from jsonschema import ValidationError

from gitops.errors import GitopsError
from gitops.model import schemas
from gitops.model.config import CONFIG_FILE, RepoConfig, coordination_problems
from gitops.model.diagnostics import Diagnostic
from gitops.model.documents import Document, FieldPath
from gitops.model.yamlload import MAX_FILE_BYTES, RawDocument, YamlError, load_yaml_documents, yaml_error_diagnostic
from gitops.safeio import FileRefused, MiB, read_bytes, within

YAML_SUFFIXES = (".yaml", ".yml")
MAX_MESSAGE = 240
#: YAML files of a repo, and their bytes altogether: past either, the rest is not read
MAX_FILES = 100_000
MAX_REPO_BYTES = 64 * MiB
#: documents of a repo (a `kind: List` counts its items)
MAX_DOCUMENTS = 100_000


@dataclass
class LoadedRepo:
    root: Path
    config: RepoConfig
    documents: list[Document] = field(default_factory=list)
    diagnostics: list[Diagnostic] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    #: the documents that passed their kind's schema
    valid: list[Document] = field(default_factory=list)
    #: gitops.yaml's document when it passed its schema (its secret fields are opened with the others')
    config_document: Document | None = None


def load_repo(root: str | os.PathLike[str]) -> LoadedRepo:
    """Load and schema-check every document of the repo at `root`."""
    root_path = Path(root)
    if not root_path.is_dir():
        raise GitopsError(f"{root}: not a directory (expected an infra repo checkout)")
    root_path = root_path.resolve()
    diagnostics: list[Diagnostic] = []
    config, paths, valid = _load_config(root_path, diagnostics)
    repo = LoadedRepo(root=root_path, config=config, diagnostics=diagnostics, config_document=valid)
    budget = _Budget()
    files = _walk_yaml(root_path, config, paths, diagnostics)
    for rel in sorted(files):
        if not budget.file(rel, diagnostics):
            break
        repo.files.append(rel)
        docs = read_documents(root_path, rel, diagnostics, budget, resolved=not files[rel])
        if budget.spent or not budget.documents(rel, docs, diagnostics):
            break
        for doc in docs:
            repo.documents.append(doc)
            errors = schema_errors(doc)
            diagnostics.extend(errors)
            if not errors:
                repo.valid.append(doc)
    return repo


class _Budget:
    """What one repo may cost: files, bytes read, documents. Past a limit: one error, and no more reading."""

    def __init__(self) -> None:
        self.files = self.bytes = self.docs = 0
        self.spent = False

    def _stop(self, rel: str, message: str, diagnostics: list[Diagnostic]) -> bool:
        diagnostics.append(Diagnostic(rel, 1, message=message))
        self.spent = True
        return False

    def file(self, rel: str, diagnostics: list[Diagnostic]) -> bool:
        self.files += 1
        if self.files > MAX_FILES:
            return self._stop(rel, f"the repo has more than {MAX_FILES} YAML files under spec.paths; "
                              "this one and the rest are not read", diagnostics)
        return True

    def read(self, rel: str, size: int, diagnostics: list[Diagnostic]) -> bool:
        self.bytes += size
        if self.bytes > MAX_REPO_BYTES:
            return self._stop(rel, f"the repo's YAML files hold more than {MAX_REPO_BYTES // MiB} MiB "
                              "altogether; this one and the rest are not read", diagnostics)
        return True

    def documents(self, rel: str, docs: list[Document], diagnostics: list[Diagnostic]) -> bool:
        self.docs += len(docs)
        if self.docs > MAX_DOCUMENTS:
            return self._stop(rel, f"the repo holds more than {MAX_DOCUMENTS} documents; this file and the "
                              "rest are not read", diagnostics)
        return True


def repo_files(root: str | os.PathLike[str]) -> tuple[RepoConfig, list[str], list[Diagnostic]]:
    """gitops.yaml's settings and the repo's YAML files (repo-relative), without reading the files."""
    root_path = Path(root)
    if not root_path.is_dir():
        raise GitopsError(f"{root}: not a directory (expected an infra repo checkout)")
    root_path = root_path.resolve()
    diagnostics: list[Diagnostic] = []
    config, paths, _ = _load_config(root_path, diagnostics)
    return config, _yaml_files(root_path, config, paths, diagnostics), diagnostics


#: where gitops.yaml's spec.paths are read from: the config document (for lines), or None; False when
#: gitops.yaml exists but cannot be read (then no path is known, and no file is read)
_Paths = Document | None | bool


def _load_config(root: Path, diagnostics: list[Diagnostic]) -> tuple[RepoConfig, _Paths, Document | None]:
    """gitops.yaml's settings (defaults when there is none), its document, and that document again when
    it passed its schema (its secret fields are opened with the others'). A gitops.yaml that is
    there but cannot be read (a directory, a FIFO, a dangling or outside link...) is an error, never
    the defaults: they would read files that spec.paths leaves out."""
    if not os.path.lexists(root / CONFIG_FILE):
        return RepoConfig(), None, None
    found = len(diagnostics)
    docs = read_documents(root, CONFIG_FILE, diagnostics)
    if not docs:
        return RepoConfig(), False if len(diagnostics) > found else None, None
    if len(docs) > 1:
        diagnostics.append(Diagnostic(CONFIG_FILE, docs[1].line, message="gitops.yaml must hold one document"))
    doc = docs[0]
    if doc.kind != "GitopsConfig":
        diagnostics.append(doc.error(("kind",), "gitops.yaml must be kind: GitopsConfig"))
        return RepoConfig(), doc, None
    errors = schema_errors(doc)
    diagnostics.extend(errors)
    if errors:
        return RepoConfig(), doc, None
    config = RepoConfig.from_spec(doc.spec)
    for name, message in coordination_problems(config.coordination):
        diagnostics.append(doc.error(("spec", "coordination", name), message))
    return config, doc, doc


def _yaml_files(root: Path, config: RepoConfig, paths: _Paths, diagnostics: list[Diagnostic]) -> list[str]:
    """Repo-relative POSIX paths of the YAML files under the configured paths, sorted."""
    return sorted(_walk_yaml(root, config, paths, diagnostics))


def _walk_yaml(root: Path, config: RepoConfig, paths: _Paths, diagnostics: list[Diagnostic]) -> dict[str, bool]:
    """{repo-relative POSIX path: whether the file itself is a symlink} of the YAML files under the
    configured paths. No directory link is followed, and each path's base is resolved, so a file that is
    no link has no link anywhere in its path (`read_documents` then reads it without resolving it)."""
    if paths is False:
        return {}
    found: dict[str, bool] = {}
    prefix = str(root).rstrip("/") + "/"
    for index, rel_dir in enumerate(config.paths):
        base = Path(os.path.realpath(root / rel_dir))
        if not base.is_relative_to(root) or not base.is_dir():
            why = "is outside the repo" if not base.is_relative_to(root) else "does not exist or is not a directory"
            where = ("spec", "paths", index)
            line = paths.line_of(where) if isinstance(paths, Document) else 1
            diagnostics.append(Diagnostic(CONFIG_FILE, line, "GitopsConfig", f"spec.paths[{index}]",
                                          f"{rel_dir!r} {why}"))
            continue
        stack = [str(base)]
        while stack:
            try:
                with os.scandir(stack.pop()) as listing:
                    entries = sorted(listing, key=_name)
            except OSError:  # (as os.walk: a directory that cannot be listed is passed over)
                continue
            subdirs = []
            for entry in entries:  # (in os.walk's order: past MAX_FILES, the same files are left out each time)
                name = entry.name
                if name.startswith("."):
                    continue
                link = entry.is_symlink()
                if not link and entry.is_dir(follow_symlinks=False):
                    subdirs.append(entry.path)
                    continue
                if not name.endswith(YAML_SUFFIXES) or (link and _to_directory(entry)):
                    continue  # (a link to a directory is neither followed nor read)
                rel = entry.path[len(prefix):]
                if rel == CONFIG_FILE or rel in found:
                    continue
                if link and not within(entry.path, root):
                    diagnostics.append(Diagnostic(rel, 1, message="symlink points outside the repo; refusing to read it"))
                    continue
                found[rel] = link
                if len(found) > MAX_FILES:
                    return found
            stack.extend(reversed(subdirs))
    return found


def _name(entry: os.DirEntry) -> str:
    return entry.name


def _to_directory(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()
    except OSError:  # a loop: read_documents names it
        return False


def read_documents(root: Path, rel: str, diagnostics: list[Diagnostic],
                   budget: _Budget | None = None, *, resolved: bool = False) -> list[Document]:
    """The documents of the repo file `rel` (read through `gitops.safeio`, inside `root`; `resolved`:
    the listing found no link in its path); every problem is a diagnostic."""
    try:
        raw = read_bytes(f"{root}/{rel}", MAX_FILE_BYTES, inside=root, name=rel, resolved=resolved)
    except FileRefused as err:
        diagnostics.append(Diagnostic(rel, 1, message=err.reason))
        return []
    if budget is not None and not budget.read(rel, len(raw), diagnostics):
        return []
    try:
        raw_docs = load_yaml_documents(raw)
    except YamlError as err:
        diagnostics.append(yaml_error_diagnostic(rel, err))
        return []
    docs: list[Document] = []
    for raw_doc in raw_docs:
        if not isinstance(raw_doc.data, dict):
            diagnostics.append(Diagnostic(rel, raw_doc.line, message="document is not a mapping "
                                          "(expected apiVersion, kind, metadata, spec)"))
            continue
        if raw_doc.data.get("kind") == "List" and isinstance(raw_doc.data.get("items"), list):
            docs.extend(_list_items(rel, raw_doc, diagnostics))
        else:
            docs.append(Document(rel, raw_doc.line, raw_doc.data, raw_doc.positions))
    return docs


def _list_items(rel: str, raw: RawDocument, diagnostics: list[Diagnostic]) -> list[Document]:
    """Expand a `kind: List` (as `kubectl get -o yaml` writes) into its items."""
    out = []
    for i, item in enumerate(raw.data["items"]):
        prefix = ("items", i)
        line = raw.positions.get(prefix, raw.line)
        if not isinstance(item, dict):
            diagnostics.append(Diagnostic(rel, line, field=f"items[{i}]", message="list item is not a mapping"))
            continue
        positions = {p[2:]: ln for p, ln in raw.positions.items() if p[:2] == prefix}
        out.append(Document(rel, line, item, positions))
    return out


def schema_errors(doc: Document) -> list[Diagnostic]:
    """Check one document against its kind's schema."""
    kind = doc.data.get("kind")
    if not isinstance(kind, str) or not kind:
        return [doc.error(("kind",), "missing 'kind' (one of: " + ", ".join(schemas.RESOURCE_KINDS) + ")")]
    if kind not in schemas.KINDS:
        return [doc.error(("kind",), f"unknown kind {kind!r} (one of: " + ", ".join(schemas.RESOURCE_KINDS) + ")")]
    out: list[Diagnostic] = []
    for err in sorted(schemas.validator(kind).iter_errors(doc.data), key=lambda e: list(map(str, e.absolute_path))):
        out.extend(_render(doc, err))
    return out


def _render(doc: Document, err: ValidationError) -> list[Diagnostic]:
    path: FieldPath = tuple(err.absolute_path)
    custom = err.schema.get(f"x-error-{err.validator}") if isinstance(err.schema, dict) else None
    if custom:
        return [doc.error(path, custom)]
    if err.validator == "additionalProperties" and isinstance(err.instance, dict):
        allowed = sorted(err.schema.get("properties", {}))
        extra = sorted(k for k in err.instance if k not in allowed)
        hint = f" (allowed: {', '.join(allowed)})" if allowed else ""
        return [doc.error(path + (key,), f"unknown field{hint}") for key in extra]
    if err.validator == "required":
        missing = err.message.split("'")[1] if "'" in err.message else err.message
        return [doc.error(path, f"missing required field {missing!r}")]
    if err.validator == "const":
        return [doc.error(path, f"must be {err.validator_value!r}, got {err.instance!r}")]
    if err.validator == "enum":
        return [doc.error(path, f"must be one of {', '.join(map(str, err.validator_value))}; got {err.instance!r}")]
    if err.validator == "pattern" and "description" in err.schema:
        return [doc.error(path, f"{err.instance!r} is invalid: {err.schema['description']}")]
    message = err.message
    if len(message) > MAX_MESSAGE:
        message = message[: MAX_MESSAGE - 3] + "..."
    return [doc.error(path, message)]


__all__ = ["LoadedRepo", "load_repo", "repo_files", "schema_errors"]
