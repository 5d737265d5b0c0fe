"""`gitops.yaml`: repo-wide settings, with sensible defaults when absent."""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any

CONFIG_FILE = "gitops.yaml"
#: `statusBranch` when gitops.yaml does not set it (read by `gitops.status.reader`).
DEFAULT_STATUS_BRANCH = "gitops/status"


@dataclass(frozen=True)
class PrunePolicy:
    enabled: bool = True
    max_deletes: int = 10


@dataclass(frozen=True)
class BareMetalSource:
    """Where BareMetalHosts come from: the repo (`file`) or a management cluster (`kubernetes`)."""

    provider: str = "file"
    kubeconfig: str | None = None  # path on the controller's machine
    namespace: str | None = None  # None: all namespaces


@dataclass(frozen=True)
class Coordination:
    """`spec.coordination`: several controllers through Kubernetes Leases; mode "" keeps the git lock."""

    mode: str = ""  # "" | "leader" | "shards"
    kubeconfig: str | None = None  # path on the controller's machine
    namespace: str = "default"
    shards: int = 1
    lease_duration: int = 15
    renew_deadline: int = 10
    retry_period: int = 2


@dataclass(frozen=True)
class SecretsPolicy:
    """`spec.secrets`: who secret fields are encrypted to, and whether plaintext keys are tolerated."""

    recipients: tuple[str, ...] = ()
    allow_plaintext: bool = False


@dataclass(frozen=True)
class BackupTarget:
    """One of `spec.backup.targets`: a restic repository etcd snapshots go to (gitops.backup)."""

    name: str
    repository: str
    #: the repository password: decrypted in memory when the repo was loaded with an identity
    password: str = field(repr=False)
    #: sftp only: the ssh command restic runs instead of its own (`-o sftp.command=...`)
    ssh_command: tuple[str, ...] = ()


@dataclass(frozen=True)
class NotificationTarget:
    """One of `spec.notifications.targets`: where each commit's outcome is POSTed (gitops.notify)."""

    name: str
    kind: str  # webhook | slack
    #: decrypted in memory when the repo was loaded with an identity (a secret field)
    url: str = field(repr=False)
    events: tuple[str, ...] = ("Applied", "Failed", "Refused", "Incomplete", "UntrustedStatus", "Halted")


@dataclass(frozen=True)
class Wave:
    """One of `spec.rollout.waves`: the clusters a commit reaches together, and how long it then watches them."""

    name: str
    #: a Kubernetes label selector over Cluster labels, as written (None: every cluster no earlier wave took)
    selector: dict | None = field(default=None, hash=False)
    soak_seconds: int = 300
    #: clusters of the wave rolled together (their actions interleaved phase by phase; 1: one after another)
    max_concurrent: int = 1


@dataclass(frozen=True)
class Rollout:
    """`spec.rollout`: how a commit reaches the fleet (`gitops.plan.waves`). No waves: every cluster at once."""

    waves: tuple[Wave, ...] = ()
    #: spec.rollout.slo.minSuccessRatio: the share of probe requests through each cluster's ingress that must
    #: succeed from a wave's start to the end of its soak
    min_success_ratio: float = 0.999


#: the port of a virtual IP's API endpoint unless gitops.yaml or the Cluster (spec.apiServer.port) says otherwise
DEFAULT_VIRTUAL_IP_PORT = 6443


@dataclass(frozen=True)
class IngressConfig:
    """`spec.ingress`: the virtual IPs of clusters with two or more ingress nodes (gitops.compile.vip)."""

    #: addresses as written: CIDRs ("10.0.5.0/28") or ranges ("10.0.5.10-10.0.5.20")
    virtual_ips: tuple[str, ...] = ()
    #: the API port on a virtual IP (each virtual IP is one cluster's alone, so every cluster may use it)
    port: int = DEFAULT_VIRTUAL_IP_PORT

    def ranges(self) -> list[tuple[ipaddress.IPv4Address | ipaddress.IPv6Address,
                                   ipaddress.IPv4Address | ipaddress.IPv6Address]]:
        """The pool as (first, last) addresses, in the order written (ValueError naming a bad entry)."""
        return [pool_range(entry) for entry in self.virtual_ips]


def pool_range(entry: str) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address,
                                    ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """One pool entry, a CIDR or "FIRST-LAST", as its first and last usable address (a CIDR's network and
    broadcast addresses are left out from /30 and wider). ValueError says what is wrong."""
    if "/" in entry:
        net = ipaddress.ip_network(entry.strip(), strict=False)
        hosts_only = net.num_addresses > 2 and net.version == 4
        first = net.network_address + (1 if hosts_only else 0)
        last = net.broadcast_address - (1 if hosts_only else 0)
        return first, last
    low, sep, high = entry.partition("-")
    if not sep:
        return (ipaddress.ip_address(entry.strip()),) * 2
    first, last = ipaddress.ip_address(low.strip()), ipaddress.ip_address(high.strip())
    if first.version != last.version or first > last:
        raise ValueError(f"{entry!r}: FIRST-LAST with FIRST <= LAST, of one address family")
    return first, last


@dataclass(frozen=True)
class RepoConfig:
    paths: tuple[str, ...] = (".",)
    status_branch: str = DEFAULT_STATUS_BRANCH
    #: spec.status.signers: allowed-signers lines of the keys status commits must be signed with
    status_signers: tuple[str, ...] = ()
    kubeconfig_recipients: tuple[str, ...] = ()
    prune: PrunePolicy = field(default_factory=PrunePolicy)
    renew_before_days: int = 30
    bare_metal: BareMetalSource = field(default_factory=BareMetalSource)
    #: etcd steps and API server replacements wait at most this long for health (spec.rollout.healthTimeoutSeconds)
    health_timeout: int = 60
    #: the controller reads the node files of a pod whose containers did not change at most this often
    #: (spec.drift.nodeFilesIntervalSeconds; 0: on every poll)
    node_files_interval: int = 300
    #: the controller lists the objects it keeps in each cluster's API at most this often between applies
    #: (spec.drift.clusterObjectsIntervalSeconds; 0: on every poll)
    cluster_objects_interval: int = 300
    secrets: SecretsPolicy = field(default_factory=SecretsPolicy)
    coordination: Coordination = field(default_factory=Coordination)
    #: spec.backup.targets by name
    backup_targets: dict[str, BackupTarget] = field(default_factory=dict, hash=False)
    #: spec.notifications.targets
    notifications: tuple[NotificationTarget, ...] = ()
    ingress: IngressConfig = field(default_factory=IngressConfig)
    rollout: Rollout = field(default_factory=Rollout)

    @property
    def allow_plaintext(self) -> bool:
        return self.secrets.allow_plaintext

    @classmethod
    def from_spec(cls, spec: dict) -> "RepoConfig":
        """Build from a schema-valid `spec` (missing fields take defaults)."""
        prune = spec.get("prune", {})
        defaults = cls()
        return cls(
            paths=tuple(spec.get("paths", defaults.paths)),
            status_branch=spec.get("statusBranch", defaults.status_branch),
            status_signers=tuple(spec.get("status", {}).get("signers", ())),
            kubeconfig_recipients=tuple(spec.get("kubeconfigRecipients", ())),
            prune=PrunePolicy(
                enabled=prune.get("enabled", PrunePolicy.enabled),
                max_deletes=prune.get("maxDeletes", PrunePolicy.max_deletes),
            ),
            renew_before_days=spec.get("certificates", {}).get("renewBeforeDays", defaults.renew_before_days),
            health_timeout=spec.get("rollout", {}).get("healthTimeoutSeconds", defaults.health_timeout),
            node_files_interval=spec.get("drift", {}).get("nodeFilesIntervalSeconds", defaults.node_files_interval),
            cluster_objects_interval=spec.get("drift", {}).get("clusterObjectsIntervalSeconds",
                                                               defaults.cluster_objects_interval),
            bare_metal=BareMetalSource(
                provider=spec.get("bareMetal", {}).get("provider", "file"),
                kubeconfig=spec.get("bareMetal", {}).get("kubeconfig"),
                namespace=spec.get("bareMetal", {}).get("namespace"),
            ),
            coordination=_coordination(spec.get("coordination")),
            rollout=_rollout(spec.get("rollout", {})),
            ingress=IngressConfig(tuple(spec.get("ingress", {}).get("virtualIPs", ())),
                                  spec.get("ingress", {}).get("port", DEFAULT_VIRTUAL_IP_PORT)),
            secrets=SecretsPolicy(
                recipients=tuple(spec.get("secrets", {}).get("recipients", ())),
                allow_plaintext=spec.get("secrets", {}).get("allowPlaintext", False),
            ),
            **secret_settings(spec),
        )


def secret_settings(spec: dict) -> dict[str, Any]:
    """The settings that hold secret fields, as RepoConfig fields: built again once the fields of the
    in-memory `spec` are decrypted (`gitops.model.validate`)."""
    return {"backup_targets": backup_targets(spec), "notifications": notification_targets(spec)}


def notification_targets(spec: dict) -> tuple[NotificationTarget, ...]:
    """`spec.notifications.targets` (their URLs as decrypted, when they were)."""
    return tuple(NotificationTarget(t["name"], t.get("type", "webhook"), t["url"].strip(),
                                    tuple(t.get("events", NotificationTarget.events)))
                 for t in spec.get("notifications", {}).get("targets", ()))


def backup_targets(spec: dict) -> dict[str, BackupTarget]:
    """`spec.backup.targets` by name (the last of a repeated name: validation reports the repeat). A
    password's trailing newline (a YAML `|` block's) is not part of it, as with restic's --password-file."""
    return {t["name"]: BackupTarget(t["name"], t["repository"], t["password"].removesuffix("\n"),
                                    tuple(t.get("sshCommand", ())))
            for t in spec.get("backup", {}).get("targets", ())}


def _rollout(raw: dict) -> Rollout:
    waves = tuple(Wave(w["name"], w.get("selector"), w.get("soakSeconds", Wave.soak_seconds),
                       w.get("maxConcurrent", Wave.max_concurrent)) for w in raw.get("waves", ()))
    return Rollout(waves, float(raw.get("slo", {}).get("minSuccessRatio", Rollout.min_success_ratio)))


def _coordination(raw: dict | None) -> Coordination:
    if raw is None:
        return Coordination()
    d = Coordination()
    return Coordination(mode=raw["mode"], kubeconfig=raw.get("kubeconfig"), namespace=raw.get("namespace", d.namespace),
                        shards=raw.get("shards", d.shards),
                        lease_duration=raw.get("leaseDurationSeconds", d.lease_duration),
                        renew_deadline=raw.get("renewDeadlineSeconds", d.renew_deadline),
                        retry_period=raw.get("retryPeriodSeconds", d.retry_period))


def coordination_problems(c: Coordination) -> list[tuple[str, str]]:
    """(field, message) for client-go's timing rules, which a schema cannot say."""
    out = []
    if c.mode and not c.lease_duration > c.renew_deadline:
        out.append(("renewDeadlineSeconds", f"{c.renew_deadline} must be less than leaseDurationSeconds "
                                            f"({c.lease_duration})"))
    if c.mode and not c.renew_deadline > 1.2 * c.retry_period:
        out.append(("retryPeriodSeconds", f"1.2 x {c.retry_period} must be less than renewDeadlineSeconds "
                                          f"({c.renew_deadline})"))
    return out
