"""The plan of a branch's files against a status commit, as `gitops plan CLONE --against-status REF` makes it."""
from __future__ import annotations

from pathlib import Path

from gitops.model.validate import InvalidRepo, validate_repo
from gitops.plan.actions import Plan
from gitops.status.against import plan_against_status


def branch_plan(files: Path, mirror: Path, status_ref: str) -> Plan:
    """`files` (a branch's checkout) planned against the snapshot and public state at `status_ref` (a ref or a
    commit) of `mirror`. Secret fields stay sealed: no hypervisor is contacted. An invalid repo is an error
    listing why."""
    result = validate_repo(files, None, sealed_ok=True)
    if result.model is None:
        raise InvalidRepo(result.diagnostics)
    return plan_against_status(result.model, result.repo.config, mirror, status_ref).plan
