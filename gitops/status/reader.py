"""The status branch's layout, and the one reader for it.

Which branch (`statusBranch` in gitops.yaml, default `gitops/status`), which paths hold
what, and what was applied: the controller reads its own worktree of the branch with it,
`gitops status` and `gitops plan --against-status` read a ref of a clone with it (through
GitPython: one `git cat-file --batch` answers every file). The documents themselves are
built by `report.py` (status; `commit.py` gathers one commit's) and `state.py` (state
files), and pushed by `branch.py`.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gitops.errors import GitopsError
from gitops.model.config import CONFIG_FILE, DEFAULT_STATUS_BRANCH
from gitops.model.yamlload import MAX_FILE_BYTES, YamlError, load_yaml_documents
from gitops.observe.types import ObservedState
from gitops.safeio import FileRefused, read_bytes
from gitops.status.snapshot import CLUSTERS_DIR, HYPERVISORS, OBSERVED_DIR, load_snapshot

DEFAULT_BRANCH = DEFAULT_STATUS_BRANCH

STATUS_DIR = "status"
SOURCE = f"{STATUS_DIR}/source.yaml"
#: the plan the controller last executed, action by action, and its follow-up
APPLY = f"{STATUS_DIR}/apply.yaml"
#: the whole live snapshot in one file, as written before it was stored per cluster (read, then removed)
OBSERVED = "observed.yaml"
KUBECONFIG_DIR = "kubeconfig"
STATE_DIR = "state"
PUBLIC = f"{STATE_DIR}/public.json"
SEALED = f"{STATE_DIR}/secrets.age"
PLAINTEXT = f"{STATE_DIR}/secrets.INSECURE-PLAINTEXT.json"
#: What the controller owns on the branch: every publish makes these exactly what it writes.
MANAGED = (STATUS_DIR, OBSERVED_DIR, OBSERVED, KUBECONFIG_DIR, STATE_DIR)


def resource_path(kind: str, name: str) -> str:
    """`status/<Kind>/<name>.yaml`."""
    return f"{STATUS_DIR}/{kind}/{name}.yaml"


def kubeconfig_path(cluster: str) -> str:
    """`kubeconfig/<cluster>.yaml` (age-encrypted)."""
    return f"{KUBECONFIG_DIR}/{cluster}.yaml"


@dataclass(frozen=True)
class SourceStatus:
    """`status/source.yaml`: the last commit seen, the commit in force, and how the last one went."""

    result: str = ""  # Applied | Refused | Failed; "" when there is none yet
    last_seen_sha: str = ""
    applied_sha: str = ""  # the commit in force (the last good one); "" when none was ever applied
    errors: tuple[str, ...] = ()
    status: dict[str, Any] = field(default_factory=dict)  # the `status` mapping as written

    @classmethod
    def parse(cls, raw: bytes | str | None) -> "SourceStatus":
        """Lenient: a missing or unreadable file reads as "nothing recorded yet"."""
        try:
            doc = yaml.safe_load(raw) if raw is not None else None
        except yaml.YAMLError:
            doc = None
        status = doc.get("status") if isinstance(doc, dict) else None
        if not isinstance(status, dict):
            return cls()
        return cls(result=str(status.get("result") or ""), last_seen_sha=str(status.get("lastSeenSHA") or ""),
                   applied_sha=str(status.get("appliedSHA") or ""),
                   errors=tuple(str(e) for e in status.get("errors") or ()), status=status)


class StatusReader:
    """Reads one status tree: a worktree of the branch (`in_dir`) or a ref of a clone (`at_ref`)."""

    def __init__(self, where: str, get: Callable[[str], bytes], names: Callable[[str], list[str]], ref: str = ""):
        self.where = where
        self.ref = ref  # the git ref read, for `at_ref` readers
        self._get = get  # raises FileNotFoundError(why) when the path is not there
        self._names = names  # file names in a folder, [] when there is none

    @classmethod
    def in_dir(cls, root: Path) -> "StatusReader":
        def get(rel: str) -> bytes:
            path = root / rel
            if not path.is_file():
                raise FileNotFoundError(f"no {rel}")
            return path.read_bytes()

        def names(folder: str) -> list[str]:
            path = root / folder
            return sorted(p.name for p in path.iterdir() if p.is_file()) if path.is_dir() else []

        return cls(str(root), get, names)

    @classmethod
    def at_ref(cls, repo: Path, ref: str) -> "StatusReader":
        """The tree at `ref` of the clone `repo`, read through one `git cat-file --batch` (GitPython's)."""
        import git  # here: only readers of a ref pay GitPython's import (~0.1 s of a cold `gitops plan`)

        try:
            clone = git.Repo(repo)
        except (git.InvalidGitRepositoryError, git.NoSuchPathError):
            clone = None

        def get(rel: str) -> bytes:
            if clone is None:
                raise FileNotFoundError(f"{repo} is not a git repository")
            try:
                _sha, kind, _size, data = clone.git.get_object_data(f"{ref}:{rel}")
            except ValueError:  # "<name> missing"
                raise FileNotFoundError(f"no {rel} at {ref}") from None
            if kind != b"blob":
                raise FileNotFoundError(f"{rel} at {ref} is a {kind.decode()}, not a file")
            return data

        def names(folder: str) -> list[str]:
            if clone is None:
                return []
            try:
                return sorted(clone.git.ls_tree("--name-only", f"{ref}:{folder}").split())
            except git.GitCommandError:
                return []

        return cls(f"{ref} in {repo}", get, names, ref)

    @classmethod
    def for_clone(cls, repo: Path, ref: str | None = None) -> "StatusReader":
        """`ref`, else the clone's status branch: origin/<statusBranch>, else <statusBranch>."""
        if ref is None:
            branch = branch_of_checkout(repo)
            ref = next((c for c in (f"origin/{branch}", branch) if _resolves(repo, c)), None)
            if ref is None:
                raise GitopsError(f"no status branch {branch!r} in {repo} (fetch it, or pass --ref)")
        return cls.at_ref(repo, ref)

    # ------------------------------------------------------------------ files

    def read(self, rel: str) -> bytes | None:
        try:
            return self._get(rel)
        except FileNotFoundError:
            return None

    def require(self, rel: str) -> bytes:
        try:
            return self._get(rel)
        except FileNotFoundError as err:
            raise GitopsError(f"cannot read {rel} at {self.where}: {err}") from None

    # ------------------------------------------------------------------ what they say

    def source(self) -> SourceStatus:
        return SourceStatus.parse(self.read(SOURCE))

    def applied_sha(self) -> str:
        """The commit in force, "" when none was ever applied."""
        return self.source().applied_sha

    def observed(self) -> ObservedState:
        """The live-state snapshot of the last reconcile (required): per cluster, or the older single file."""
        if self.read(HYPERVISORS) is None and self.read(OBSERVED) is not None:
            return ObservedState.from_dict(yaml.safe_load(self.require(OBSERVED)) or {})
        if self.read(HYPERVISORS) is None:
            raise GitopsError(f"cannot read {HYPERVISORS} at {self.where}: there is no observed snapshot")
        return load_snapshot(self.read, self._names(CLUSTERS_DIR))

    def public_state(self) -> dict[str, Any]:
        """`state/public.json` without its generation counter (required); no private key is in it."""
        public = json.loads(self.require(PUBLIC))
        public.pop("generation", None)
        return public

    def documents(self, kind: str) -> dict[str, dict[str, Any]]:
        """Every `status/<Kind>/*.yaml`, by metadata.name."""
        return self.documents_in(f"{STATUS_DIR}/{kind}")

    def documents_in(self, folder: str) -> dict[str, dict[str, Any]]:
        """Every YAML document of `folder` (e.g. `backups`), by metadata.name."""
        out = {}
        for name in self._names(folder):
            doc = yaml.safe_load(self.read(f"{folder}/{name}") or b"{}")
            if doc:
                out[doc["metadata"]["name"]] = doc
        return out


def branch_of_checkout(repo: Path) -> str:
    """The status branch named by a checkout's gitops.yaml (read as is, not validated), else the default."""
    try:
        docs = load_yaml_documents(read_bytes(repo / CONFIG_FILE, MAX_FILE_BYTES, inside=repo, name=CONFIG_FILE))
    except (FileRefused, YamlError):
        return DEFAULT_BRANCH  # none, or unreadable: validate says why
    spec = docs[0].data.get("spec") if docs and isinstance(docs[0].data, dict) else None
    branch = spec.get("statusBranch") if isinstance(spec, dict) else None
    return branch if isinstance(branch, str) and branch else DEFAULT_BRANCH


def _resolves(repo: Path, ref: str) -> bool:
    """Whether `ref` names a commit in the clone `repo`."""
    import git

    try:
        git.Repo(repo).git.rev_parse("--verify", "--quiet", ref)
    except (git.GitCommandError, git.InvalidGitRepositoryError, git.NoSuchPathError):
        return False
    return True
