"""Validation = schema + semantics over a whole repo; the model only when all is well."""
from __future__ import annotations

import os
from pathlib import Path
from dataclasses import dataclass, field

from gitops.errors import GitopsError
from gitops.model.build import build_model
from gitops.model.diagnostics import Diagnostic
from gitops.model.repo import LoadedRepo, load_repo, read_documents, schema_errors
from gitops.model.resources import Hypervisor, RepoModel
from gitops.model.semantics import check_all


@dataclass
class Validation:
    repo: LoadedRepo
    diagnostics: list[Diagnostic] = field(default_factory=list)
    model: RepoModel | None = None

    @property
    def ok(self) -> bool:
        return not self.diagnostics


def validate_repo(root: str | os.PathLike[str]) -> Validation:
    """Load, schema-check and semantically check the repo at `root`.

    All problems are collected (sorted by file and line); `model` is set only
    when there are none, so a bad commit is refused as a whole.
    """
    repo = load_repo(root)
    diagnostics = list(repo.diagnostics) + check_all(repo.valid, repo.documents)
    diagnostics = sorted(set(diagnostics))
    model = build_model(repo.documents) if not diagnostics else None
    return Validation(repo=repo, diagnostics=diagnostics, model=model)


class InvalidRepo(GitopsError):
    """The repo does not validate; carries every diagnostic."""

    def __init__(self, diagnostics: list[Diagnostic]):
        self.diagnostics = diagnostics
        lines = "\n".join(str(d) for d in diagnostics)
        super().__init__(f"repo is invalid ({len(diagnostics)} error(s)):\n{lines}")


def load_model(root: str | os.PathLike[str]) -> RepoModel:
    """The validated model of the repo at `root`, or `InvalidRepo`."""
    result = validate_repo(root)
    if result.model is None:
        raise InvalidRepo(result.diagnostics)
    return result.model


def load_hypervisors(path: str | os.PathLike[str]) -> dict[str, Hypervisor]:
    """The validated Hypervisors of a repo directory, or of one YAML file of Hypervisor documents
    (such as `gitops lab hypervisors` prints). Raises `InvalidRepo` with every error."""
    target = Path(path)
    if target.is_dir():
        return load_model(target).hypervisors
    if not target.is_file():
        raise GitopsError(f"{path}: no such file or directory")
    diagnostics: list[Diagnostic] = []
    docs = [d for d in read_documents(target.parent.resolve(), target.name, diagnostics)]
    for doc in docs:
        if doc.kind != "Hypervisor":
            diagnostics.append(doc.error(("kind",), "only Hypervisor documents are expected in this file"))
        else:
            diagnostics.extend(schema_errors(doc))
    if not diagnostics:
        diagnostics = check_all(docs, docs)
    if diagnostics:
        raise InvalidRepo(sorted(set(diagnostics)))
    return build_model(docs).hypervisors
