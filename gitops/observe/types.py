"""What observation reports (pure data, no I/O): the managed pods, containers and node files on
every hypervisor, and what gitops keeps inside each cluster's API. The readers are
`gitops.observe.hypervisors` and `gitops.observe.clusters`; planning reads only these types.
"""
from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from gitops.backup.snapshot import Snapshot
from gitops.cri.types import ContainerState
from gitops.memo import ContentDigested
from gitops.model.resources import BareMetalHost
from gitops.pods import NodeFiles


@dataclass(frozen=True)
class ClusterTarget:
    """How to reach a cluster's API as its admin."""

    cluster: str
    #: the cluster's running API servers, tried in order until one answers
    servers: tuple[str, ...]
    ca_pem: str = field(repr=False)
    cert_pem: str = field(repr=False)
    key_pem: str = field(repr=False)


@dataclass(frozen=True)
class ObservedCSR:
    """A certificate request no one has answered yet (no certificate issued, not denied)."""

    name: str
    uid: str
    signer: str
    username: str
    groups: tuple[str, ...]
    usages: tuple[str, ...]
    request: str  # PEM
    approved: bool


@dataclass(frozen=True)
class ObservedWorker:
    name: str
    ready: bool
    kubelet_version: str = ""
    address: str = ""


@dataclass(frozen=True)
class SnapshotListing:
    """A cluster's snapshots in its backup target, listed for a restore its spec asks for: oldest first,
    or why they could not be listed."""

    target: str
    snapshots: tuple[Snapshot, ...] = ()
    error: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "snapshots": [s.to_json() for s in self.snapshots], "error": self.error}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "SnapshotListing":
        return cls(data["target"], tuple(Snapshot.from_json(s) for s in data.get("snapshots", ())),
                   data.get("error", ""))


@dataclass(frozen=True)
class EtcdMemberSpace:
    """One etcd member's database: its file size and the space in use (etcd 3.4+), whether it leads."""

    node: str
    client_url: str
    db_size: int = 0
    db_in_use: int = 0
    leader: bool = False
    #: why it did not answer ("" when it did)
    error: str = ""


@dataclass(frozen=True)
class ObservedEtcd:
    """A cluster's etcd as its upkeep sees it: each running member's space, and the alarms (node, alarm)."""

    members: tuple[EtcdMemberSpace, ...] = ()
    alarms: tuple[tuple[str, str], ...] = ()
    #: the cluster's spec.etcd.quotaBackendBytes when it was read (None: etcd's default)
    quota: int | None = None


@dataclass(frozen=True)
class ObservedCluster:
    name: str
    reachable: bool
    error: str = ""
    #: gitops's objects found (collection/name) and their spec-hash annotation
    objects: dict[str, str] = field(default_factory=dict)
    #: the cluster's Nodes (all of them are workers: control planes run as pods, not kubelets)
    workers: tuple[ObservedWorker, ...] = ()
    pending_csrs: tuple[ObservedCSR, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "reachable": self.reachable, "error": self.error,
                "objects": dict(sorted(self.objects.items())),
                "workers": [vars(w) for w in self.workers],
                "pending_csrs": [{**vars(c), "groups": list(c.groups), "usages": list(c.usages)}
                                 for c in self.pending_csrs]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ObservedCluster":
        objects = {sys.intern(k): sys.intern(v) for k, v in data.get("objects", {}).items()}  # alike in every cluster
        return cls(data["name"], data["reachable"], data.get("error", ""), objects,
                   tuple(ObservedWorker(**w) for w in data.get("workers", ())),
                   tuple(ObservedCSR(**{**c, "groups": tuple(c["groups"]), "usages": tuple(c["usages"])})
                         for c in data.get("pending_csrs", ())))


@dataclass(frozen=True, slots=True)
class ObservedContainer:
    id: str
    component: str
    state: str  # created | running | exited | unknown
    spec_hash: str
    created_at: int
    #: the inputs the container was created from: its spec annotation as compact JSON text (a dict given
    #: is stored so), decoded by `inputs` only when a diff shows what changed
    spec: str | None = None
    #: the digests of the certificates it read when it started (its certificates annotation, JSON text);
    #: None for a container started without one
    certificates: str | None = None

    def __post_init__(self) -> None:
        if self.spec is not None and not isinstance(self.spec, str):
            object.__setattr__(self, "spec", json.dumps(self.spec, sort_keys=True, separators=(",", ":")))
        if self.spec is not None:
            object.__setattr__(self, "spec", sys.intern(self.spec))  # shared with the compiled annotation

    @property
    def inputs(self) -> dict[str, Any] | None:
        """The spec annotation, decoded (None when absent or unreadable)."""
        try:
            return json.loads(self.spec) if self.spec is not None else None
        except ValueError:
            return None

    @property
    def read_certificates(self) -> dict[str, str] | None:
        """Certificate name -> digest of its file when the container started (None: not recorded)."""
        try:
            value = json.loads(self.certificates) if self.certificates is not None else None
        except ValueError:
            return None
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            return None
        return value


class _PodSlots(ContentDigested):
    """`_once`: the pod's content digest; `_by_component`: its newest running container of each component."""

    __slots__ = ("_by_component",)


@dataclass(frozen=True, slots=True)
class ObservedPod(_PodSlots):
    sandbox_id: str
    node: str
    cluster: str
    role: str
    hypervisor: str
    ready: bool
    spec_hash: str
    created_at: int
    containers: tuple[ObservedContainer, ...] = ()
    #: None when the files agent is not running (nothing could be read)
    files: NodeFiles | None = None

    def running(self, component: str) -> ObservedContainer | None:
        """The newest running container of `component`."""
        return self._kept("_by_component", self._running_by_component).get(component)

    def _running_by_component(self) -> dict[str, ObservedContainer]:
        out: dict[str, ObservedContainer] = {}
        for c in sorted(self.containers, key=lambda c: -c.created_at):
            if c.state == ContainerState.RUNNING.value:
                out.setdefault(c.component, c)
        return out


@dataclass(frozen=True, slots=True)
class ObservedHypervisor:
    name: str
    reachable: bool
    error: str = ""
    pods: tuple[ObservedPod, ...] = ()
    #: marked lost in the repo (spec.lost): not asked, nothing planned on it, not an unknown
    lost: bool = False


def _hypervisor(hv: ObservedHypervisor) -> dict[str, Any]:
    data = asdict(hv)
    if not hv.lost:
        del data["lost"]  # (as written before hypervisors could be marked lost)
    return data


@dataclass(frozen=True)
class ObservedState:
    hypervisors: dict[str, ObservedHypervisor]
    #: BareMetalHosts listed from a kubernetes provider (None when not observed)
    hosts: tuple[BareMetalHost, ...] | None = None
    #: each cluster's own API, for clusters with a running API server (see gitops.observe.clusters)
    clusters: dict[str, ObservedCluster] = field(default_factory=dict)
    #: the snapshots of each cluster whose spec.restore is not done yet (listed only then)
    snapshots: dict[str, SnapshotListing] = field(default_factory=dict)
    #: each cluster's etcd space and alarms (clusters whose etcd runs; see gitops.observe.etcd); live only,
    #: not in `to_dict` (the sizes change with every write)
    etcd: dict[str, ObservedEtcd] = field(default_factory=dict)

    def pods(self) -> list[ObservedPod]:
        return [p for hv in self.hypervisors.values() for p in hv.pods]

    @property
    def unreachable(self) -> list[str]:
        """Hypervisors that could not be observed (not the ones marked lost: those are not asked)."""
        return sorted(n for n, hv in self.hypervisors.items() if not hv.reachable and not hv.lost)

    @property
    def lost(self) -> list[str]:
        return sorted(n for n, hv in self.hypervisors.items() if hv.lost)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"hypervisors": {n: _hypervisor(hv) for n, hv in sorted(self.hypervisors.items())}}
        if self.hosts is not None:
            data["bareMetalHosts"] = [asdict(h) for h in self.hosts]
        if self.clusters:
            data["clusters"] = {n: c.to_dict() for n, c in sorted(self.clusters.items())}
        if self.snapshots:
            data["snapshots"] = {n: s.to_dict() for n, s in sorted(self.snapshots.items())}
        return data  # (not `etcd`: database sizes change with every write, the snapshot would change every poll)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ObservedState":
        hvs = {}
        for name, raw in data.get("hypervisors", {}).items():
            pods = []
            for p in raw.get("pods", []):
                files = p.get("files")
                pods.append(ObservedPod(
                    **{k: v for k, v in p.items() if k not in ("containers", "files")},
                    containers=tuple(ObservedContainer(**c) for c in p.get("containers", [])),
                    files=NodeFiles(files["digests"], files["certificates"], tuple(files["keys"]),
                                    files["public_keys"]) if files is not None else None,
                ))
            hvs[name] = ObservedHypervisor(raw["name"], raw["reachable"], raw.get("error", ""), tuple(pods),
                                           bool(raw.get("lost", False)))
        hosts = data.get("bareMetalHosts")
        clusters = {n: ObservedCluster.from_dict(c) for n, c in data.get("clusters", {}).items()}
        snapshots = {n: SnapshotListing.from_dict(s) for n, s in data.get("snapshots", {}).items()}
        return cls(hvs, tuple(BareMetalHost(**h) for h in hosts) if hosts is not None else None, clusters, snapshots)


#: node files read earlier that still hold for a pod as listed now (None: read them now)
FilesReuse = Callable[[ObservedPod], "NodeFiles | None"]
