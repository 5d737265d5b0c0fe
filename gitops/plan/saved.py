"""Saved plans: `gitops plan --out FILE`, applied exactly by `gitops apply FILE` or refused as stale.

A saved plan is one JSON document: the ordered actions with their payloads, the
digests of what it was made against (the repo's content, the recorded state,
the observed live state) and the recorded state it will save before its first
action (placements, ports, and the authorities of new clusters, which are
generated at plan time: the file is private, mode 0600, like the state dir).
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gitops.errors import GitopsError
from gitops.model.config import CONFIG_FILE
from gitops.model.yamlload import MAX_FILE_BYTES
from gitops.observe import ObservedState
from gitops.plan.actions import Plan
from gitops.printable import printable, shorten
from gitops.safeio import FileRefused, MiB, read_bytes, read_text
from gitops.state.records import State

FORMAT = "gitops.infra/saved-plan"
VERSION = 1
#: a saved plan holds the planned state and every payload: a fleet's first apply stays well under it
MAX_PLAN_BYTES = 512 * MiB


class StalePlan(GitopsError):
    """The repo, the recorded state or the live state moved since the plan was made."""


def _digest(value: Any) -> str:
    return "sha256:" + hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def repo_digest(root: Path, files: list[str]) -> str:
    """Digest of the repo's content as gitops reads it: gitops.yaml and every YAML file under spec.paths."""
    h = hashlib.sha256()
    for rel in [CONFIG_FILE, *sorted(files)]:
        path = root / rel
        data = read_bytes(path, MAX_FILE_BYTES, inside=root, name=rel) if os.path.lexists(path) else b""
        h.update(f"{rel}\0{len(data)}\0".encode() + data)
    return "sha256:" + h.hexdigest()


def state_digest(state: State) -> str:
    return _digest(state.to_dict())


def observed_digest(observed: ObservedState) -> str:
    return _digest(observed.to_dict())


@dataclass(frozen=True)
class SavedPlan:
    plan: Plan
    repo: str
    state: str
    observed: str
    #: the recorded state with the plan's decisions, saved before the first action
    planned_state: State

    def to_json(self) -> str:
        return json.dumps({
            "format": FORMAT, "version": VERSION,
            "digests": {"repo": self.repo, "state": self.state, "observed": self.observed},
            "plan": self.plan.to_dict(), "plannedState": self.planned_state.to_dict(),
        }, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, source: str) -> "SavedPlan":
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as err:
            raise GitopsError(f"{source}: not a saved plan (not JSON: {err})") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise GitopsError(f"{source}: not a saved plan (no \"format\": \"{FORMAT}\")")
        if data.get("version") != VERSION:
            raise GitopsError(f"{source}: saved plan version {data.get('version')!r}; this gitops reads "
                              f"version {VERSION}: make the plan again")
        try:
            digests = data["digests"]
            return cls(Plan.from_dict(data["plan"]), digests["repo"], digests["state"], digests["observed"],
                       State.parse(data["plannedState"]))
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise GitopsError(f"{source}: corrupt saved plan ({type(err).__name__}: {shorten(str(err), 300)})") from None

    def write(self, path: Path) -> None:
        """Write atomically, private (the planned state may hold new clusters' CA keys)."""
        path = path.resolve()
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(self.to_json())
            os.chmod(tmp, 0o600)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    @classmethod
    def read(cls, path: Path) -> "SavedPlan":
        try:
            text = read_text(path, MAX_PLAN_BYTES)
        except FileRefused as err:
            raise GitopsError(f"cannot read the saved plan: {err}") from None
        return cls.from_json(text, printable(str(path)))

    def check(self, repo: str, state: str, observed: str) -> None:
        """Refuse unless the plan was made against exactly these."""
        moved = [what for what, mine, now in (("the repo", self.repo, repo), ("the recorded state", self.state, state),
                                              ("the live state", self.observed, observed)) if mine != now]
        if moved:
            raise StalePlan(f"the saved plan is stale: {' and '.join(moved)} changed since it was made; nothing "
                            "was applied. Run `gitops plan --out` again and review the new plan.")
