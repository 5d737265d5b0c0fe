"""The desired state: what should run on each hypervisor, as plain dataclasses.

A node becomes one pod sandbox (host network) holding a `files` agent
container and the node's components. Certificates and configuration reach
the components as files in a host directory the agent writes (see
`gitops.agent` for why and how); nothing secret is ever put in a container's
arguments, environment, labels or annotations.
"""
from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import asdict, dataclass, replace
from typing import Any

from gitops.cri.types import ContainerSpec, SandboxSpec
from gitops.hostport import host_port
from gitops.memo import ContentDigested
from gitops.model.components import STOP_START
from gitops.model.resources import ClusterBackup, ClusterRecovery, ClusterRestore
# the node files' types (their home is below compile and plan), also as the compiler's modules import them
from gitops.nodefiles import AFTER_APPLY, CertificateSpec, FileSpec, KeySpec, ServiceAccountBundle  # noqa: F401
from gitops.pods import COMPONENT, SPEC_ANNOTATION, SPEC_HASH, file_digest


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=_default)


def _default(value: Any) -> Any:
    if isinstance(value, (tuple, frozenset, set)):
        return sorted(value) if isinstance(value, (set, frozenset)) else list(value)
    raise TypeError(f"not serialisable: {type(value).__name__}")


def digest(value: Any) -> str:
    """Short, stable content hash (12 hex digits) of a JSON-able value."""
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()[:12]


@dataclass(frozen=True, slots=True)
class DesiredContainer:
    spec: ContainerSpec
    #: the spec's identity: changes whenever anything the container runs with changes
    #: (AFTER_APPLY while a file it reads is known after apply)
    spec_hash: str
    #: how a running one is replaced, and the command that reloads it in place (its component's, from
    #: `gitops.model.components.COMPONENTS`)
    rollout: str = STOP_START
    reload: tuple[str, ...] = ()

    @property
    def known(self) -> bool:
        return self.spec_hash != AFTER_APPLY

    @property
    def summary(self) -> dict[str, Any]:
        """What the spec hash covers, as the observed annotation reads back (JSON types: lists, not
        tuples); decoded when a diff needs it, not kept: compiled pods stay cached between plans."""
        return json.loads(self.spec.annotations[SPEC_ANNOTATION])


def hash_inputs(container: dict[str, Any], files: dict[str, str], certificates: dict[str, Any]) -> dict[str, Any]:
    """What a container's spec hash covers: its spec, the digests of the files it reads, its certificates."""
    return {"container": container, "files": files, "certificates": certificates}


def identify(spec: ContainerSpec, pod_labels: dict[str, str], inputs: dict[str, Any]) -> ContainerSpec:
    """`spec` with its identity labels and spec annotation; the hash is AFTER_APPLY while an input is."""
    pending = AFTER_APPLY in inputs["files"].values()
    spec_hash = AFTER_APPLY if pending else sys.intern(digest(inputs))  # shared with the observed container's
    return replace(spec, labels={**pod_labels, COMPONENT: spec.name, SPEC_HASH: spec_hash},
                   annotations={SPEC_ANNOTATION: sys.intern(canonical_json(inputs))})  # shared with observations


def resolve_container(spec: ContainerSpec, contents: dict[str, str]) -> ContainerSpec:
    """A container whose hash was known after apply, as compile makes it once the files' final `contents`
    are known. Apply never calls it: its fill-in, `gitops.plan.payloads.CreateContainer.resolved`, must give
    the same spec."""
    if spec.labels.get(SPEC_HASH) != AFTER_APPLY:
        return spec
    inputs = json.loads(spec.annotations[SPEC_ANNOTATION])
    for name, value in inputs["files"].items():
        if value == AFTER_APPLY:
            inputs["files"][name] = file_digest(contents[name])
    pod_labels = {k: v for k, v in spec.labels.items() if k not in (COMPONENT, SPEC_HASH)}
    return identify(spec, pod_labels, inputs)


@dataclass(frozen=True, slots=True)
class DesiredPod(ContentDigested):
    node: str
    cluster: str
    role: str
    hypervisor: str
    sandbox: SandboxSpec
    #: host directory mounted as /etc/gitops in every container of the pod
    files_dir: str
    files: tuple[FileSpec, ...]
    certificates: tuple[CertificateSpec, ...]
    keys: tuple[KeySpec, ...]
    #: the `files` agent first, then components in start order
    containers: tuple[DesiredContainer, ...]
    #: certificate lifetime and renewal window (the Cluster's spec.certificates)
    validity_days: int = 365
    renew_before_days: int = 30
    #: a controlplane node's own API server (https://ip:port), "" for other roles
    api_url: str = ""
    #: (certificate, PEM written after it): server certificates re-issued during a CA rotation carry
    #: the new CA cross-signed by the old one
    chains: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class ClusterTrust:
    """What a cluster's pods trust and present, as its record says (taken once per cluster): each authority's
    trust bundle, and the chain that follows a server certificate it signs ("" none), by role; the nodes
    with a recorded service-account key, and the bundle of the keys its API servers verify tokens with."""

    bundles: dict[str, str]
    chains: dict[str, str]
    keyed: frozenset[str]
    service_account_keys: str


@dataclass(frozen=True, slots=True)
class EtcdMember:
    node: str
    peer_url: str
    client_url: str


@dataclass(frozen=True, slots=True)
class KubeObject:
    """An object gitops keeps in a cluster's own API (worker bootstrap: RBAC, cluster-info).

    `body` is its canonical JSON, labeled managed-by=gitops and annotated with `spec_hash`
    (a digest of everything else), so observation compares one annotation.
    """

    #: the collection's API path, e.g. /apis/rbac.authorization.k8s.io/v1/clusterrolebindings
    collection: str
    kind: str
    name: str
    body: str
    spec_hash: str

    @property
    def key(self) -> str:
        """What observation reports it under: collection/name."""
        return f"{self.collection}/{self.name}"

    def manifest(self) -> dict[str, Any]:
        return json.loads(self.body)


@dataclass(frozen=True, slots=True)
class DesiredCluster(ContentDigested):
    name: str
    #: controlplane nodes that should be etcd members, sorted
    etcd_members: tuple[EtcdMember, ...]
    #: https://ingress-ip:port for kubeconfigs, or None without an ingress node
    api_endpoint: str | None
    #: objects gitops keeps in the cluster's API, sorted by key (none without an endpoint)
    objects: tuple[KubeObject, ...] = ()
    #: spec.backup: a plan that changes its etcd membership, a member or its version backs etcd up first
    backup: ClusterBackup | None = None
    #: spec.restore: its etcd restored from a snapshot, once per value
    restore: ClusterRestore | None = None
    #: spec.recovery: etcd rebuilt from a surviving member once its quorum is lost for good
    recovery: ClusterRecovery | None = None
    #: spec.etcd.quotaBackendBytes (None: etcd's default)
    etcd_quota: int | None = None


@dataclass(frozen=True, slots=True)
class DesiredState:
    pods: dict[str, DesiredPod]  # by node name
    clusters: dict[str, DesiredCluster]


def container_summary(spec: ContainerSpec) -> dict[str, Any]:
    data = asdict(spec)
    data.pop("labels", None)
    data.pop("annotations", None)
    if data.get("user") is None:  # (a field added later: the hashes of containers without it stay as they were)
        data.pop("user", None)
    return data


@dataclass(frozen=True)
class VirtualIP:
    """A cluster's virtual IP (gitops.compile.vip) as its pods and clients use it."""

    address: str
    port: int
    #: its VRRP router id (1-255, no other cluster's)
    vrrp_id: int

    @property
    def url(self) -> str:
        return f"https://{host_port(self.address, self.port)}"
