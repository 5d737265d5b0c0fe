"""Validation = schema + semantics over a whole repo; the model only when all is well."""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from gitops.errors import GitopsError
from gitops.model.build import build_model
from gitops.model.diagnostics import Diagnostic
from gitops.model.repo import LoadedRepo, load_repo
from gitops.model.resources import RepoModel
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
