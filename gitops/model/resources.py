"""Typed views of validated repo documents.

The loader keeps raw documents (with file/line positions); once a repo has
validated, the rest of the pipeline works only with these frozen dataclasses.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

from gitops.errors import GitopsError
from gitops.model.components import COMPONENTS, INGRESS
from gitops.model.config import IngressConfig
from gitops.secrets import is_armored

if TYPE_CHECKING:
    from gitops.cri.endpoint import CRIEndpoint


@dataclass(frozen=True)
class LocalCRIEndpoint:
    """A CRI unix socket on this machine (development, labs)."""

    path: str

    @property
    def target(self) -> str:
        return f"unix://{self.path}"


@dataclass(frozen=True)
class RemoteCRIEndpoint:
    """A CRI endpoint over TCP with mutual TLS (PEM strings)."""

    uri: str
    ca_certificate: str
    client_certificate: str
    client_private_key: str

    @property
    def target(self) -> str:
        """`host:port` as gRPC wants it (a leading `tcp://` is accepted in the repo)."""
        return self.uri.removeprefix("tcp://").rstrip("/")


@dataclass(frozen=True)
class PortRange:
    low: int
    high: int

    def __contains__(self, port: object) -> bool:
        return isinstance(port, int) and self.low <= port <= self.high

    def __len__(self) -> int:
        return self.high - self.low + 1


#: annotation naming the directory on a hypervisor where gitops keeps node files
DATA_DIR_ANNOTATION = "gitops.infra/data-dir"
DEFAULT_DATA_DIR = "/var/lib/gitops"


@dataclass(frozen=True)
class Hypervisor:
    name: str
    public: bool
    ip_address: str
    port_range: PortRange
    endpoint: LocalCRIEndpoint | RemoteCRIEndpoint
    labels: dict[str, str] = field(default_factory=dict, compare=False)
    #: where node files (certificates, configs, etcd data) live on the hypervisor
    data_dir: str = DEFAULT_DATA_DIR
    #: spec.cordoned: no new node is placed here; the nodes already here stay
    cordoned: bool = False
    #: spec.drain: its nodes move elsewhere, one etcd member of a cluster at a time
    drain: bool = False
    #: spec.lost: gone for good: not observed; its nodes are placed elsewhere
    lost: bool = False
    #: spec.interface: the network interface holding ip_address (a virtual IP held here goes on it)
    interface: str = "eth0"

    @property
    def leaving(self) -> bool:
        """Its nodes move elsewhere (drained or lost), and no new node comes."""
        return self.drain or self.lost

    def cri_endpoint(self) -> CRIEndpoint:
        """How the CRI client reaches this hypervisor's runtime."""
        from gitops.cri.endpoint import CRIEndpoint  # here: loading the model needs no grpc

        ep = self.endpoint
        if isinstance(ep, LocalCRIEndpoint):
            return CRIEndpoint.unix(self.name, ep.path)
        if is_armored(ep.client_private_key):
            raise GitopsError(f"Hypervisor {self.name}: its client private key is age-encrypted and was not "
                              "decrypted (give the identity: --identity FILE or $GITOPS_IDENTITY)")
        return CRIEndpoint.tls(self.name, ep.target, ep.ca_certificate, ep.client_certificate,
                               ep.client_private_key)


DEFAULT_SERVICE_CIDR = "10.96.0.0/12"
DEFAULT_POD_CIDR = "10.244.0.0/16"
#: etcd's own --quota-backend-bytes default
DEFAULT_ETCD_QUOTA = 2 << 30
#: the kube-apiserver flags gitops sets itself (gitops.compile.components), which
#: spec.apiServer.extraArgs may not set (a test keeps the two in step)
API_SERVER_FLAGS = frozenset({
    "advertise-address", "allow-privileged", "authorization-mode", "bind-address", "client-ca-file",
    "enable-admission-plugins", "enable-bootstrap-token-auth", "etcd-cafile", "etcd-certfile", "etcd-keyfile",
    "etcd-servers", "kubelet-certificate-authority", "kubelet-client-certificate",
    "kubelet-client-key", "kubelet-preferred-address-types", "proxy-client-cert-file", "proxy-client-key-file",
    "requestheader-allowed-names", "requestheader-client-ca-file", "requestheader-extra-headers-prefix",
    "requestheader-group-headers", "requestheader-username-headers", "secure-port", "service-account-issuer",
    "service-account-key-file", "service-account-signing-key-file", "service-cluster-ip-range",
    "shutdown-delay-duration", "tls-cert-file",
    # spec.apiServer.oidc sets these
    "oidc-issuer-url", "oidc-client-id", "oidc-username-claim", "oidc-groups-claim", "oidc-username-prefix",
    "oidc-groups-prefix", "oidc-ca-file",
    "tls-private-key-file",
})
#: kube-apiserver flags removed since 1.20 (the real binary refuses them as unknown and never starts), and when
REMOVED_API_SERVER_FLAGS = {
    "insecure-port": "1.24", "port": "1.24", "address": "1.24", "insecure-bind-address": "1.24",
    "service-account-api-audiences": "1.25", "logtostderr": "1.26", "log-dir": "1.26", "log-file": "1.26",
    "alsologtostderr": "1.26", "one-output": "1.26", "skip-headers": "1.26",
}


@dataclass(frozen=True)
class ApiServerOIDC:
    """`spec.apiServer.oidc` of a Cluster: the OpenID Connect issuer its API servers trust for people."""

    issuer_url: str
    client_id: str
    username_claim: str = "email"
    groups_claim: str = "groups"
    username_prefix: str | None = None
    groups_prefix: str | None = None
    #: PEM the issuer's serving certificate is checked against ("": the system's trust)
    ca_bundle: str = ""
    #: the SIPCluster whose provider is the issuer: compile fills in `issuer_url`, `ca_bundle` and a missing
    #: `client_id` from where that provider runs (`gitops.compile.sip_services.resolve_issuers`)
    sip_cluster: str = ""

    def flags(self, ca_file: str) -> tuple[str, ...]:
        """The kube-apiserver flags it becomes (`ca_file`: where the API server reads `ca_bundle`)."""
        return (f"--oidc-issuer-url={self.issuer_url}", f"--oidc-client-id={self.client_id}",
                f"--oidc-username-claim={self.username_claim}", f"--oidc-groups-claim={self.groups_claim}",
                *((f"--oidc-username-prefix={self.username_prefix}",) if self.username_prefix is not None else ()),
                *((f"--oidc-groups-prefix={self.groups_prefix}",) if self.groups_prefix is not None else ()),
                *((f"--oidc-ca-file={ca_file}",) if self.ca_bundle else ()))


@dataclass(frozen=True)
class ClusterBackup:
    """`spec.backup` of a Cluster: where and how often its etcd snapshots go, and how many stay."""

    target: str
    interval_minutes: int = 60
    keep: int = 24


@dataclass(frozen=True)
class ClusterRestore:
    """`spec.restore` of a Cluster: restore its etcd from this snapshot of `spec.backup.target`, once."""

    #: a snapshot id (or a prefix of 8+ hex characters), or LATEST
    snapshot: str


#: `spec.restore.snapshot: latest`: the newest snapshot when the plan is made
LATEST = "latest"


@dataclass(frozen=True)
class ClusterRecovery:
    """`spec.recovery` of a Cluster: rebuild etcd from this surviving member once its quorum is lost."""

    force_new_cluster_from: str


@dataclass(frozen=True)
class Cluster:
    name: str
    kubernetes_version: str  # always with a leading "v"
    etcd_version: str
    image_overrides: dict[str, str] = field(default_factory=dict, hash=False)
    endpoint_hosts: tuple[str, ...] = ()
    api_port: int | None = None
    #: spec.apiServer.virtualIP: the pinned virtual IP (two or more ingress nodes; else from the pool)
    virtual_ip: str | None = None
    service_cidr: str = DEFAULT_SERVICE_CIDR
    pod_cidr: str = DEFAULT_POD_CIDR
    node_cidr: str | None = None
    vpn_cidr: str | None = None
    validity_days: int = 365
    renew_before_days: int = 30
    #: spec.apiServer.extraArgs, sorted: further kube-apiserver flags (name without dashes, value)
    api_server_args: tuple[tuple[str, str], ...] = ()
    #: spec.apiServer.oidc: the issuer people log in through (None: client certificates and tokens only)
    oidc: ApiServerOIDC | None = None
    #: spec.certificates.caGeneration: raised to rotate the cluster's CAs (see gitops.compile.authorities)
    ca_generation: int = 1
    #: where caGeneration is written ("file:line"), for errors about it
    ca_generation_at: str = field(default="", compare=False)
    #: where kubernetesVersion and etcdVersion are written ("file:line"; the nearest field there is), for
    #: errors about a version change
    version_at: str = field(default="", compare=False)
    etcd_version_at: str = field(default="", compare=False)
    #: metadata.labels: which rollout wave it is in (gitops.model.waves); nothing it runs depends on them
    labels: dict[str, str] = field(default_factory=dict, compare=False, repr=False, hash=False)
    #: spec.backup: etcd snapshots (None: none taken)
    backup: ClusterBackup | None = None
    #: spec.restore: restore etcd from a snapshot (None: no restore asked)
    restore: ClusterRestore | None = None
    #: spec.recovery: rebuild etcd from a survivor when a majority of its members is lost
    recovery: ClusterRecovery | None = None
    #: spec.etcd.quotaBackendBytes (None: etcd's default, DEFAULT_ETCD_QUOTA)
    etcd_quota: int | None = None

    def image(self, component: str) -> str:
        """Image of `component` (a `COMPONENTS` name): the override, else the upstream default."""
        return COMPONENTS[component].image(self.image_overrides, self.kubernetes_version, self.etcd_version)


NodeRole = str  # a `ROLES` name: "controlplane" | "controlplane-ingress" (and SIP's services)


@dataclass(frozen=True)
class Node:
    name: str
    cluster: str
    role: NodeRole
    hypervisor: str | None = None


@dataclass(frozen=True)
class LabelRequirement:
    key: str
    operator: str  # In | NotIn | Exists | DoesNotExist
    values: tuple[str, ...] = ()

    def matches(self, labels: dict[str, str]) -> bool:
        present = self.key in labels
        if self.operator == "Exists":
            return present
        if self.operator == "DoesNotExist":
            return not present
        if self.operator == "In":
            return present and labels[self.key] in self.values
        return not present or labels[self.key] not in self.values  # NotIn


@dataclass(frozen=True)
class LabelSelector:
    """Kubernetes label selector semantics: every term must match."""

    match_labels: tuple[tuple[str, str], ...] = ()
    match_expressions: tuple[LabelRequirement, ...] = ()

    def matches(self, labels: dict[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.match_labels) and all(
            req.matches(labels) for req in self.match_expressions
        )


@dataclass(frozen=True)
class SIPRole:
    active: int
    standby: int
    selector: LabelSelector
    spread: str  # PerRack | PerHost


@dataclass(frozen=True)
class LoadBalancerService:
    port: int
    target_port: int = 6443
    node_port_range: tuple[int, int] | None = None


@dataclass(frozen=True)
class JumpHostService:
    authorized_keys: tuple[str, ...]
    port: int | None = None


@dataclass(frozen=True)
class AuthUser:
    """A person of a SIPCluster's OIDC provider (`services.auth.users`): a hash, never a password."""

    username: str
    email: str
    password_hash: str
    groups: tuple[str, ...] = ()


@dataclass(frozen=True)
class AuthClient:
    """A client of a SIPCluster's OIDC provider; `secret` decrypted in memory ("": a public client)."""

    client_id: str
    name: str = ""
    redirect_uris: tuple[str, ...] = ()
    secret: str = field(default="", repr=False)
    grant_types: tuple[str, ...] = ("authorization_code", "refresh_token")


@dataclass(frozen=True)
class AuthService:
    oidc_issuer_url: str | None = None
    client_id: str | None = None
    token_ttl: int = 600
    users: tuple[AuthUser, ...] = ()
    clients: tuple[AuthClient, ...] = ()


@dataclass(frozen=True)
class SIPCluster:
    name: str
    roles: dict[str, SIPRole] = field(hash=False)
    load_balancer: LoadBalancerService | None = None
    jump_host: JumpHostService | None = None
    auth: AuthService | None = None


@dataclass(frozen=True)
class BareMetalHost:
    name: str
    namespace: str
    labels: dict[str, str] = field(hash=False)
    online: bool = False
    bmc_address: str | None = None
    network_data: str | None = None
    provisioning_state: str | None = None
    operational_status: str | None = None
    powered_on: bool | None = None


@dataclass(frozen=True)
class RepoModel:
    """Every validated resource of a repo, by name (sorted for determinism)."""

    hypervisors: dict[str, Hypervisor]
    clusters: dict[str, Cluster]
    nodes: dict[str, Node]
    sip_clusters: dict[str, SIPCluster]
    baremetal_hosts: dict[str, BareMetalHost]  # keyed "namespace/name"
    #: raw v1 Secret documents (networkData for BareMetalHosts), keyed "namespace/name"
    secrets: dict[str, dict] = field(default_factory=dict, hash=False)
    #: gitops.yaml's spec.ingress: the virtual IP pool and port
    ingress: IngressConfig = field(default_factory=IngressConfig)

    def nodes_of(self, cluster: str) -> list[Node]:
        """The nodes of `cluster`, in `nodes` order."""
        return list(self._nodes_by_cluster.get(cluster, ()))

    def wants_virtual_ip(self, cluster: str) -> bool:
        """Whether `cluster` is reached at a virtual IP: it has two or more ingress nodes (`gitops.compile.vip`)."""
        return sum(1 for n in self._nodes_by_cluster.get(cluster, ()) if n.role == INGRESS) >= 2

    @cached_property
    def _nodes_by_cluster(self) -> dict[str, tuple[Node, ...]]:
        """Nodes grouped by cluster, built once (the model is never mutated; `replace` makes a new one)."""
        grouped: dict[str, list[Node]] = {}
        for node in self.nodes.values():
            grouped.setdefault(node.cluster, []).append(node)
        return {name: tuple(nodes) for name, nodes in grouped.items()}
