"""The status branch's layout, and the one reader for it.

Which branch (`statusBranch` in gitops.yaml, default `gitops/status`), which paths hold
what, and what was applied: the controller reads its own worktree of the branch with it,
`gitops status` and `gitops plan --against-status` read a ref of a clone with it (through
`gitops.gitrepo`: one `git cat-file --batch` answers every file). The documents themselves are
built by `report.py` (status; `commit.py` gathers one commit's) and `state.py` (state
files), and pushed by `branch.py`.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from gitops.errors import GitopsError
from gitops.gitrepo import GitError, Repo, as_repo
from gitops.model.config import CONFIG_FILE, DEFAULT_STATUS_BRANCH
from gitops.model.yamlload import MAX_FILE_BYTES, YamlError, load_yaml_documents
from gitops.observe.types import ObservedState
from gitops.plan.converged import Converged, blob_id
from gitops.safeio import FileRefused, files_under, read_bytes, read_under
from gitops.status.snapshot import CLUSTERS_DIR, HYPERVISORS, OBSERVED_DIR, load_snapshot

if TYPE_CHECKING:
    from gitops.status.trust import Verifier

DEFAULT_BRANCH = DEFAULT_STATUS_BRANCH

STATUS_DIR = "status"
SOURCE = f"{STATUS_DIR}/source.yaml"
#: the plan the controller last executed, action by action, and its follow-up
APPLY = f"{STATUS_DIR}/apply.yaml"
#: the last rollout through spec.rollout.waves: each wave, its figures, a halt and its reason
ROLLOUT = f"{STATUS_DIR}/rollout.yaml"
#: the whole live snapshot in one file, as written before it was stored per cluster (read, then removed)
OBSERVED = "observed.yaml"
KUBECONFIG_DIR = "kubeconfig"
STATE_DIR = "state"
PUBLIC = f"{STATE_DIR}/public.json"
SEALED = f"{STATE_DIR}/secrets.age"
PLAINTEXT = f"{STATE_DIR}/secrets.INSECURE-PLAINTEXT.json"
#: cluster snapshot files read in one request
SNAPSHOT_CHUNK = 256
#: per cluster, what its last empty plan was made from (`gitops.plan.converged`): what a cold plan may skip
CONVERGED_DIR = f"{OBSERVED_DIR}/converged"
#: What the controller owns on the branch: every publish makes these exactly what it writes.
MANAGED = (STATUS_DIR, OBSERVED_DIR, OBSERVED, KUBECONFIG_DIR, STATE_DIR)
#: the largest status-branch file read (the public state of a large fleet is the largest)
MAX_STATUS_FILE = 512 << 20
#: git tree-entry modes of the files a status tree may hold (a link, a submodule or a tree is refused)
_FILE_MODES = ("100644", "100755")


def resource_path(kind: str, name: str) -> str:
    """`status/<Kind>/<name>.yaml`."""
    return f"{STATUS_DIR}/{kind}/{name}.yaml"


def converged_path(cluster: str) -> str:
    """`observed/converged/<cluster>.json`."""
    return f"{CONVERGED_DIR}/{cluster}.json"


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
                 blobs: Callable[[str], dict[str, str]] | None = None,
                 many: Callable[[list[str]], dict[str, bytes]] | None = None):
        self.where = where
        self.ref = ref  # the git ref read, for `at_ref` readers
        self._get = get  # raises FileNotFoundError(why) when the path is not there
        self._names = names  # file names in a folder, [] when there is none
        #: file name -> git blob id, for the files of a folder
        self._blobs = blobs or (lambda folder: {n: blob_id(self._get(f"{folder}/{n}")) for n in self._names(folder)})
        #: path -> content of those of `paths` that are there
        self._many = many or (lambda paths: {p: data for p in paths if (data := self.read(p)) is not None})
        #: files read ahead (`prefetch`), None where there is none
        self._kept: dict[str, bytes | None] = {}

    @classmethod
    def in_dir(cls, root: Path) -> "StatusReader":
        """A worktree of the branch, read through safe I/O: a link or a non-regular entry anywhere in a path
        read is `FileRefused` (naming it), never followed."""
        def get(rel: str) -> bytes:
            data = read_under(root, rel, MAX_STATUS_FILE)
            if data is None:
                raise FileNotFoundError(f"no {rel}")
            return data

        def names(folder: str) -> list[str]:
            return files_under(root, folder)

        return cls(str(root), get, names)

    @classmethod
    def at_ref(cls, repo: Repo | Path, ref: str, verifier: "Verifier | None" = None) -> "StatusReader":
        """The tree at `ref` of the clone `repo`, read through `gitops.gitrepo`: `git cat-file --batch` given
        every path of a read at once, `git ls-tree` for a folder (one process per read: safe from any thread,
        and the UI serves with several).
        A ref that names a commit is resolved once: every read of the reader sees the same commit, however
        the ref moves meanwhile (a fetch by another request of the UI). `verifier`: that commit must be
        signed by a pinned status signer (`TrustError` otherwise). Only regular files are read: a link (or
        a submodule) where a file or a folder is read is `FileRefused`, naming it."""
        where, git = repo, as_repo(repo)
        label, ref = ref, git.commit_of(ref) or ref
        if verifier is not None:
            verifier.require(git, ref, f"status commit of {label}")

        def get(rel: str) -> bytes:
            folder, _, name = rel.rpartition("/")
            found_id = blobs(folder).get(name)
            if found_id is None:
                raise FileNotFoundError(f"no {rel} at {ref}")
            try:
                found = batch_read(git, ref, [rel], {rel: found_id})
            except GitopsError as err:
                raise FileNotFoundError(str(err)) from None
            if rel not in found:
                raise FileNotFoundError(f"no {rel} at {ref}")
            return found[rel]

        listed: dict[str, list[tuple[str, str, str]]] = {}

        def listing(folder: str) -> list[tuple[str, str, str]]:
            """(kind, object id, name) of each entry of `folder` ([] when there is none), listed once."""
            if folder not in listed:
                listed[folder] = _listing(folder)
            return listed[folder]

        def _listing(folder: str) -> list[tuple[str, str, str]]:
            done = git.attempt("ls-tree", "-z", f"{ref}:{folder}" if folder else ref)
            if not done.ok:
                if folder and (git.header(f"{ref}:{folder}") or ("tree",))[0] != "tree":
                    raise FileRefused(folder, "is not a folder in the status tree (a link or a file); refusing it")
                return []
            out = []
            for entry in done.out.decode(errors="surrogateescape").split("\0"):
                meta, _, name = entry.partition("\t")
                fields = meta.split()
                if len(fields) == 3 and name:
                    if fields[1] == "blob" and fields[0] not in _FILE_MODES or fields[1] == "commit":
                        raise FileRefused(f"{folder}/{name}" if folder else name,
                                          "is a link (or a submodule) in the status tree; refusing it")
                    out.append((fields[1], fields[2], name))
            return out

        def names(folder: str) -> list[str]:
            return sorted(name for kind, _, name in listing(folder) if kind == "blob")

        by_name: dict[str, dict[str, str]] = {}

        def blobs(folder: str) -> dict[str, str]:
            if folder not in by_name:
                by_name[folder] = {name: sha for kind, sha, name in listing(folder) if kind == "blob"}
            return by_name[folder]

        def many(paths: list[str]) -> dict[str, bytes]:
            # every file is asked for by its object id from its folder's listing (one per folder): git then
            # looks up no path, and only regular files are read
            ids = {}
            for path in paths:
                folder, _, name = path.rpartition("/")
                found = blobs(folder).get(name)
                if found is not None:
                    ids[path] = found
            wanted = [p for p in paths if p in ids]
            return batch_read(git, ref, wanted, ids)  # (git failing is an error, not files missing)

        return cls(f"{label} in {where}", get, names, label, blobs, many)

    @classmethod
    def for_clone(cls, repo: Repo | Path, ref: str | None = None, verifier: "Verifier | None" = None) -> "StatusReader":
        """`ref`, else the clone's status branch: origin/<statusBranch>, else <statusBranch>."""
        if ref is None:
            branch = branch_of_checkout(repo)
            ref = next((c for c in (f"origin/{branch}", branch) if as_repo(repo).commit_of(c)), None)
            if ref is None:
                raise GitopsError(f"no status branch {branch!r} in {repo} (fetch it, or pass --ref)")
        return cls.at_ref(repo, ref, verifier)

    # ------------------------------------------------------------------ files

    def prefetch(self, paths: list[str]) -> None:
        """Read `paths` in one request now and keep them: for a reader that needs several."""
        found = self._many(paths)
        self._kept.update({p: found.get(p) for p in paths})

    def _read(self, rel: str) -> bytes:
        if rel in self._kept:
            data = self._kept[rel]
            if data is None:
                raise FileNotFoundError(f"no {rel}")
            return data
        return self._get(rel)

    def read(self, rel: str) -> bytes | None:
        try:
            return self._read(rel)
        except FileNotFoundError:
            return None

    def require(self, rel: str) -> bytes:
        try:
            return self._read(rel)
        except FileNotFoundError as err:
            raise GitopsError(f"cannot read {rel} at {self.where}: {err}") from None

    # ------------------------------------------------------------------ what they say

    def source(self) -> SourceStatus:
        return SourceStatus.parse(self.read(SOURCE))

    def rollout(self) -> dict[str, Any] | None:
        """status/rollout.yaml's status: the last rollout through spec.rollout.waves (None before any)."""
        raw = self.read(ROLLOUT)
        try:
            doc = yaml.safe_load(raw) if raw else None
        except yaml.YAMLError:
            return None
        return doc.get("status") if isinstance(doc, dict) and isinstance(doc.get("status"), dict) else None

    def applied_sha(self) -> str:
        """The commit in force, "" when none was ever applied."""
        return self.source().applied_sha

    def observed(self) -> ObservedState:
        """The live-state snapshot of the last reconcile (required): per cluster, or the older single file."""
        if self.read(HYPERVISORS) is None and self.read(OBSERVED) is not None:
            return ObservedState.from_dict(yaml.safe_load(self.require(OBSERVED)) or {})
        if self.read(HYPERVISORS) is None:
            raise GitopsError(f"cannot read {HYPERVISORS} at {self.where}: there is no observed snapshot")
        return self._snapshot(self._names(CLUSTERS_DIR))

    def observed_of(self, clusters: Iterable[str] | None) -> ObservedState:
        """The snapshot with the files of `clusters` only (None: all), and everything not filed by cluster."""
        if clusters is None:
            return self.observed()
        wanted = {f"{c}.json" for c in clusters}
        return self._snapshot([n for n in self._names(CLUSTERS_DIR) if n in wanted])

    def _snapshot(self, names: list[str]) -> ObservedState:
        """The snapshot with the cluster files `names`, read `SNAPSHOT_CHUNK` at a time: a read of many
        files is one request, and no more than a chunk of the snapshot's text is held at once."""
        def chunks():
            names_json = [n for n in sorted(names) if n.endswith(".json")]
            for i in range(0, len(names_json), SNAPSHOT_CHUNK):
                found = self._many([f"{CLUSTERS_DIR}/{n}" for n in names_json[i:i + SNAPSHOT_CHUNK]])
                yield from found.values()
        return load_snapshot(self.read, contents=chunks())

    def observed_blobs(self) -> dict[str, str]:
        """The git blob id of each cluster's observed file, by cluster."""
        return {n.removesuffix(".json"): sha for n, sha in self._blobs(CLUSTERS_DIR).items() if n.endswith(".json")}

    def reachability(self) -> dict[str, bool]:
        """Whether each hypervisor answered, as the snapshot says (no cluster file is read)."""
        top = json.loads(self.require(HYPERVISORS))
        return {name: bool(hv.get("reachable")) for name, hv in (top.get("hypervisors") or {}).items()}

    def converged(self) -> dict[str, Converged]:
        """Every cluster's `Converged` record (those unreadable or of another format left out)."""
        names = [n for n in self._names(CONVERGED_DIR) if n.endswith(".json")]
        found = self._many([f"{CONVERGED_DIR}/{n}" for n in names])
        out = {}
        for rel, raw in found.items():
            record = Converged.parse(raw)
            if record is not None:
                out[rel.rsplit("/", 1)[-1].removesuffix(".json")] = record
        return out

    def public_state(self) -> dict[str, Any]:
        """`state/public.json` without its generation counter (required); no private key is in it."""
        public = json.loads(self.require(PUBLIC))
        self._kept.pop(PUBLIC, None)  # (the largest file: not kept beside what it reads as)
        public.pop("generation", None)
        return public

    def documents(self, kind: str) -> dict[str, dict[str, Any]]:
        """Every `status/<Kind>/*.yaml`, by metadata.name."""
        return self.documents_in(f"{STATUS_DIR}/{kind}")

    def documents_in(self, folder: str) -> dict[str, dict[str, Any]]:
        """Every YAML document of `folder` (e.g. `backups`), by metadata.name."""
        out = {}
        found = self._many([f"{folder}/{name}" for name in self._names(folder)])
        for rel in sorted(found):
            doc = yaml.safe_load(found[rel] or b"{}")
            if doc:
                out[doc["metadata"]["name"]] = doc
        return out


def _spec_of_checkout(repo: Path) -> dict[str, Any]:
    """The spec of a checkout's gitops.yaml, read as is, not validated ({} when none or unreadable)."""
    try:
        docs = load_yaml_documents(read_bytes(repo / CONFIG_FILE, MAX_FILE_BYTES, inside=repo, name=CONFIG_FILE))
    except (FileRefused, YamlError):
        return {}  # none, or unreadable: validate says why
    spec = docs[0].data.get("spec") if docs and isinstance(docs[0].data, dict) else None
    return spec if isinstance(spec, dict) else {}


def branch_of_checkout(repo: Path) -> str:
    """The status branch named by a checkout's gitops.yaml (read as is, not validated), else the default."""
    branch = _spec_of_checkout(repo).get("statusBranch")
    return branch if isinstance(branch, str) and branch else DEFAULT_BRANCH


def signers_of_checkout(repo: Path) -> tuple[str, ...]:
    """spec.status.signers of a checkout's gitops.yaml (read as is: a line that is no signer is refused
    when it is used)."""
    status = _spec_of_checkout(repo).get("status")
    signers = status.get("signers") if isinstance(status, dict) else None
    return tuple(str(s) for s in signers) if isinstance(signers, list) else ()


def batch_read(repo: Repo | Path, ref: str, paths: list[str], ids: dict[str, str] | None = None) -> dict[str, bytes]:
    """The contents of those of `paths` at `ref` that are files, read at once (`Repo.read_objects`). `ids`: the
    object id of some of them, asked for instead of their path."""
    ids = ids or {}
    if any("\n" in p for p in paths):
        raise GitopsError("a status-branch path holds a newline")
    try:
        found = as_repo(repo).read_objects([ids.get(p) or f"{ref}:{p}" for p in paths])
    except GitError as err:
        raise GitopsError(f"cannot read {ref} in {as_repo(repo).path}: {err.detail}") from None
    return {path: obj[1] for path, obj in zip(paths, found) if obj is not None and obj[0] == "blob"}
