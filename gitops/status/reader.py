"""The status branch's layout, and the one reader for it.

Which branch (`statusBranch` in gitops.yaml, default `gitops/status`), which paths hold
what, and what was applied: the controller reads its own worktree of the branch with it,
`gitops status` and `gitops plan --against-status` read a ref of a clone with it. The
documents themselves are written by `report.py` (status) and `state.py` (state files),
and pushed by `branch.py`.
"""
from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gitops.errors import GitopsError
from gitops.model.config import CONFIG_FILE, DEFAULT_STATUS_BRANCH
from gitops.model.yamlload import MAX_FILE_BYTES, YamlError, load_yaml_documents
from gitops.observe import ObservedState
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

    def __init__(self, where: str, get: Callable[[str], bytes], names: Callable[[str], list[str]], ref: str = "",
                 repo: Path | None = None):
        self.where = where
        self.ref = ref  # the git ref read, for `at_ref` readers
        self._get = get  # raises FileNotFoundError(why) when the path is not there
        self._names = names  # file names in a folder, [] when there is none
        self._repo = repo  # the clone, for `at_ref` readers (many files are read through one git process)

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
        def get(rel: str) -> bytes:
            proc = _git(repo, "show", f"{ref}:{rel}")
            if proc.returncode != 0:
                raise FileNotFoundError(proc.stderr.decode(errors="replace").strip() or "git show failed")
            return proc.stdout

        def names(folder: str) -> list[str]:
            proc = _git(repo, "ls-tree", "--name-only", f"{ref}:{folder}")
            return sorted(proc.stdout.decode().split()) if proc.returncode == 0 else []

        return cls(f"{ref} in {repo}", get, names, ref, repo)

    @classmethod
    def for_clone(cls, repo: Path, ref: str | None = None) -> "StatusReader":
        """`ref`, else the clone's status branch: origin/<statusBranch>, else <statusBranch>."""
        if ref is None:
            branch = branch_of_checkout(repo)
            ref = next((c for c in (f"origin/{branch}", branch)
                        if _git(repo, "rev-parse", "--verify", "--quiet", c).returncode == 0), None)
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
        with self.many() as read:
            return load_snapshot(read, self._names(CLUSTERS_DIR))

    @contextmanager
    def many(self) -> Iterator[Callable[[str], bytes | None]]:
        """A `read` for many files: at a ref, one `git cat-file --batch` answers them all."""
        if self._repo is None:
            yield self.read
            return
        proc = subprocess.Popen(["git", "cat-file", "--batch"], cwd=self._repo, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert proc.stdin is not None and proc.stdout is not None
        stdin, stdout = proc.stdin, proc.stdout

        def read(rel: str) -> bytes | None:
            stdin.write(f"{self.ref}:{rel}\n".encode())
            stdin.flush()
            header = stdout.readline().split()
            if len(header) != 3:  # "<name> missing"
                return None
            data = stdout.read(int(header[2]))
            stdout.read(1)
            return data if header[1] == b"blob" else None

        try:
            yield read
        finally:
            stdin.close()
            stdout.close()
            proc.wait(timeout=60)

    def public_state(self) -> dict[str, Any]:
        """`state/public.json` without its generation counter (required); no private key is in it."""
        public = json.loads(self.require(PUBLIC))
        public.pop("generation", None)
        return public

    def documents(self, kind: str) -> dict[str, dict[str, Any]]:
        """Every `status/<Kind>/*.yaml`, by metadata.name."""
        out = {}
        for name in self._names(f"{STATUS_DIR}/{kind}"):
            doc = yaml.safe_load(self.read(f"{STATUS_DIR}/{kind}/{name}") or b"{}")
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


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, timeout=60)
