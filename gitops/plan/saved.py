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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gitops.errors import GitopsError
from gitops.model.config import CONFIG_FILE
from gitops.model.yamlload import MAX_FILE_BYTES
from gitops.observe.types import ObservedState
from gitops.plan.actions import Plan
from gitops.printable import printable, shorten
from gitops.safeio import FileRefused, MiB, read_bytes, read_text, write_atomic
from gitops.secrets import decrypt, encrypt, load_identities
from gitops.state.records import State
from gitops.state.sealing import merge, split

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
    #: an age recipient (the controller's): the planned state's private keys are sealed to it in the file
    recipient: str = ""

    def to_json(self) -> str:
        planned: dict[str, Any] = {"plannedState": self.planned_state.to_dict()}
        if self.recipient:
            public, keys = split(self.planned_state)
            sealed = encrypt((json.dumps(keys, sort_keys=True) + "\n").encode(), [self.recipient])
            planned = {"plannedState": public, "plannedSecrets": sealed}
        return json.dumps({
            "format": FORMAT, "version": VERSION,
            "digests": {"repo": self.repo, "state": self.state, "observed": self.observed},
            "plan": self.plan.to_dict(), **planned,
        }, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, source: str, identity: str | None = None) -> "SavedPlan":
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as err:
            raise GitopsError(f"{source}: not a saved plan (not JSON: {err})") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise GitopsError(f"{source}: not a saved plan (no \"format\": \"{FORMAT}\")")
        if data.get("version") != VERSION:
            raise GitopsError(f"{source}: saved plan version {data.get('version')!r}; this gitops reads "
                              f"version {VERSION}: make the plan again")
        planned = data.get("plannedState")
        if "plannedSecrets" in data:
            planned = _unseal(planned, data["plannedSecrets"], source, identity)
        try:
            digests = data["digests"]
            return cls(Plan.from_dict(data["plan"]), digests["repo"], digests["state"], digests["observed"],
                       State.parse(planned))
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise GitopsError(f"{source}: corrupt saved plan ({type(err).__name__}: {shorten(str(err), 300)})") from None

    def write(self, path: Path) -> None:
        """Write atomically, private (the planned state may hold new clusters' CA keys)."""
        write_atomic(path.resolve(), self.to_json())

    @classmethod
    def read(cls, path: Path, identity: str | None = None) -> "SavedPlan":
        """The saved plan in `path`; `identity` (age) opens its sealed keys."""
        try:
            text = read_text(path, MAX_PLAN_BYTES)
        except FileRefused as err:
            raise GitopsError(f"cannot read the saved plan: {err}") from None
        return cls.from_json(text, printable(str(path)), identity)

    def check(self, repo: str, state: str, observed: str) -> None:
        """Refuse unless the plan was made against exactly these."""
        moved = [what for what, mine, now in (("the repo", self.repo, repo), ("the recorded state", self.state, state),
                                              ("the live state", self.observed, observed)) if mine != now]
        if moved:
            raise StalePlan(f"the saved plan is stale: {' and '.join(moved)} changed since it was made; nothing "
                            "was applied. Run `gitops plan --out` again and review the new plan.")

    def verify(self, recorded: State, fresh: State, again: tuple[Plan, State]) -> None:
        """Refuse (StalePlan) unless this plan is exactly what its inputs make.

        `fresh`: the planned state made now from the `recorded` state; `again`: the plan and state made from this
        file's planned state. Every action and payload must be `again`'s, and the planned state
        `again`'s and `fresh`'s but for what the plan generates (new clusters' or a new rotation's
        authorities and keys, which no two plans make alike): so an edited payload, an added action or a
        replaced key is refused, and a generated key can only be one the recorded state does not hold.
        """
        found = []
        actions, planned = self.plan.to_dict(), self.planned_state.to_dict()
        if actions != (made := again[0].to_dict()):
            found.append(_first_difference("actions", actions, made))
        if planned != again[1].to_dict():
            found.append("the planned state is not what planning from it decides")
        known = set(_pems(recorded.to_dict()))
        mine, theirs = _generated(planned, known), _generated(fresh.to_dict(), known)
        if mine != theirs:
            found.append(_first_difference("planned state", mine, theirs))
        if found:
            raise StalePlan("the saved plan is not what its inputs make (edited after `gitops plan --out`?): "
                            + "; ".join(found) + ". Nothing was applied. Run `gitops plan --out` again and "
                            "review the new plan.")


def _unseal(public: Any, sealed: Any, source: str, identity: str | None) -> Any:
    """The planned state whose private keys are age-sealed in the file, opened with `identity`."""
    if not isinstance(public, dict) or not isinstance(sealed, str):
        raise GitopsError(f"{source}: corrupt saved plan (plannedState / plannedSecrets)")
    if identity is None:
        raise GitopsError(f"{source}: the plan's keys are sealed to an age identity: pass --identity (or "
                          "$GITOPS_IDENTITY), the one `gitops plan --out` sealed them to")
    try:
        keys = json.loads(decrypt(sealed, load_identities(identity)))
        return merge(public, keys).to_dict()
    except (GitopsError, ValueError, TypeError, AttributeError) as err:
        raise GitopsError(f"{source}: cannot open the plan's sealed keys: {shorten(str(err), 300)}") from None


_GENERATED = "(generated by the plan)"


def _pems(value: Any) -> list[str]:
    """Every PEM string in a JSON value."""
    if isinstance(value, dict):
        return [p for v in value.values() for p in _pems(v)]
    if isinstance(value, list):
        return [p for v in value for p in _pems(v)]
    return [value] if isinstance(value, str) and "-----BEGIN " in value else []


def _generated(value: Any, known: set[str]) -> Any:
    """`value` with every PEM that is not in `known` (material the plan generated) replaced by a marker."""
    if isinstance(value, dict):
        return {k: _generated(v, known) for k, v in value.items()}
    if isinstance(value, list):
        return [_generated(v, known) for v in value]
    if isinstance(value, str) and "-----BEGIN " in value and value not in known:
        return _GENERATED
    return value


def _first_difference(what: str, mine: Any, theirs: Any, path: str = "") -> str:
    """Where two JSON values first differ, for the refusal message."""
    if isinstance(mine, dict) and isinstance(theirs, dict):
        for key in sorted(set(mine) | set(theirs)):
            if mine.get(key) != theirs.get(key):
                return _first_difference(what, mine.get(key), theirs.get(key), f"{path}.{key}" if path else key)
    elif isinstance(mine, list) and isinstance(theirs, list):
        if len(mine) != len(theirs):
            return f"{what} differ at {path or 'the top'}: {len(mine)} entries in the file, {len(theirs)} planned now"
        for i, (a, b) in enumerate(zip(mine, theirs)):
            if a != b:
                return _first_difference(what, a, b, f"{path}[{i}]")
    return f"{what} differ at {printable(path) or 'the top'}"
