"""The desired state: what should run on each hypervisor, as plain dataclasses.

A node becomes one pod sandbox (host network) holding a `files` agent
container and the node's components. Certificates and configuration reach
the components as files in a host directory the agent writes (see
`gitops.compile.files` for why and how); nothing secret is ever put in a
container's arguments, environment, labels or annotations.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from gitops.cri.types import ContainerSpec, SandboxSpec

LABEL = "gitops.infra"
MANAGED = f"{LABEL}/managed-by"
CLUSTER = f"{LABEL}/cluster"
NODE = f"{LABEL}/node"
ROLE = f"{LABEL}/role"
COMPONENT = f"{LABEL}/component"
SPEC_HASH = f"{LABEL}/spec-hash"
#: annotation holding the container's spec (JSON, no secrets) so a diff can name changed fields
SPEC_ANNOTATION = f"{LABEL}/spec"
MANAGER = "gitops"


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=_default)


def _default(value: Any) -> Any:
    if isinstance(value, (tuple, frozenset, set)):
        return sorted(value) if isinstance(value, (set, frozenset)) else list(value)
    raise TypeError(f"not serialisable: {type(value).__name__}")


def digest(value: Any) -> str:
    """Short, stable content hash (12 hex digits) of a JSON-able value."""
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class CertificateSpec:
    """A leaf certificate whose key is generated on the hypervisor (file `<name>.key`)."""

    name: str
    signer: str  # authority role: "cluster" | "etcd" | "front-proxy"
    common_name: str
    organizations: tuple[str, ...] = ()
    dns_names: tuple[str, ...] = ()
    ip_addresses: tuple[str, ...] = ()
    server: bool = False
    client: bool = False


@dataclass(frozen=True)
class FileSpec:
    """A public file (CA bundle, config, kubeconfig without keys) the agent writes."""

    name: str
    content: str

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.content.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class KeySpec:
    """A private key generated on the hypervisor whose public half the controller needs."""

    name: str
    purpose: str  # "service-account"


@dataclass(frozen=True)
class DesiredContainer:
    spec: ContainerSpec
    #: the spec's identity: changes whenever anything the container runs with changes
    spec_hash: str
    #: the part of the spec shown in diffs (everything but labels/annotations)
    summary: dict[str, Any] = field(hash=False, compare=False)


@dataclass(frozen=True)
class DesiredPod:
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

    @property
    def key(self) -> str:
        return self.node


@dataclass(frozen=True)
class EtcdMember:
    node: str
    peer_url: str
    client_url: str


@dataclass(frozen=True)
class DesiredCluster:
    name: str
    #: controlplane nodes that should be etcd members, sorted
    etcd_members: tuple[EtcdMember, ...]
    #: https://ingress-ip:port for kubeconfigs, or None without an ingress node
    api_endpoint: str | None


@dataclass(frozen=True)
class DesiredState:
    pods: dict[str, DesiredPod]  # by node name
    clusters: dict[str, DesiredCluster]

    def on(self, hypervisor: str) -> list[DesiredPod]:
        return [p for p in self.pods.values() if p.hypervisor == hypervisor]


def container_summary(spec: ContainerSpec) -> dict[str, Any]:
    data = asdict(spec)
    data.pop("labels", None)
    data.pop("annotations", None)
    return data
