"""What each kind of action carries for apply: everything it needs, decided at plan time.

`Action.reason` and `Action.details` are for people; apply reads only these
payloads. Values that exist only once earlier actions of the same plan ran are
named, not guessed: a sandbox or agent id left empty is the one the plan's own
`create-pod` action makes, a file with a `ServiceAccountBundle` is filled from
the keys its `generate-keys` actions return. Every payload round-trips through
JSON (`to_dict` / `payload_from_dict`) for saved plans.

Known after apply, the fill-in: what apply computes is only what depends on
such values, from data the payload names, with nothing of `gitops.compile`:
a bundle's content (the keys recorded by then, `gitops.apply.executor`), and a
container's spec hash and read certificates (`CreateContainer.resolved`, the
files agent's digest of its spec annotation once the digests it names are in).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Union

from gitops.cri.types import ContainerSpec, Mount, SandboxSpec
from gitops.nodefiles import AFTER_APPLY, CertificateSpec, FileSpec, KeySpec, ServiceAccountBundle
from gitops.pods import CERTIFICATES_ANNOTATION, COMPONENT, SPEC_ANNOTATION, SPEC_HASH, file_digest


@dataclass(frozen=True)
class PodRef:
    """The pod an action works in. Empty ids: the pod is created by an earlier action of the plan."""

    sandbox_id: str = ""
    #: the running files agent container
    agent_id: str = ""


@dataclass(frozen=True)
class CreatePod:
    sandbox: SandboxSpec
    agent: ContainerSpec
    #: every image of the pod, pulled before the sandbox starts
    images: tuple[str, ...]
    #: a control plane's first pods bootstrap etcd together: the members to record
    bootstrap_members: tuple[str, ...] = ()


@dataclass(frozen=True)
class GenerateKeys:
    pod: PodRef
    keys: tuple[KeySpec, ...]


@dataclass(frozen=True)
class IssueCertificate:
    """Sign the node's certificate request for `spec` with the cluster's `spec.signer` authority."""

    spec: CertificateSpec
    days: int
    #: written after the certificate (a CA rotation's cross-signed CA), "" for none
    chain: str = ""


@dataclass(frozen=True)
class WriteFiles:
    pod: PodRef
    cluster: str
    certificates: tuple[IssueCertificate, ...] = ()
    files: tuple[FileSpec, ...] = ()


@dataclass(frozen=True)
class EtcdMemberChange:
    """Add (`peer_url` set: as a learner), promote or remove `member`, asking the members at `client_urls`
    (a removal with `peer_url`: the old member of a learner-first move, known by its peer URL; the node's
    new member, under the same name, stays).

    Before the change every member at `client_urls` must be healthy with a leader; a promotion
    waits until the learner has caught up, then until it is healthy; all within `timeout` seconds.
    """

    member: str
    client_urls: tuple[str, ...]
    peer_url: str = ""
    timeout: int = 60
    #: the member's own client URL (promotion: where to check it is healthy afterwards)
    client_url: str = ""


@dataclass(frozen=True)
class EtcdHealth:
    """An etcd container change on a running cluster: the other members (`peers`) must be healthy
    before it (and a member that leads hands leadership to another first), and the member at
    `client_url` healthy after it, within `timeout` seconds."""

    client_url: str
    peers: tuple[str, ...]
    timeout: int = 60
    #: where leadership goes if this member leads: the first voting member among these client URLs
    #: (members rolled earlier in the plan first, then untouched ones, then the one rolled last), so a
    #: roll moves leadership as few times as it can
    prefer: tuple[str, ...] = ()


@dataclass(frozen=True)
class ApiReady:
    """A running API server replaced: apply waits until `url` (its own /readyz, verified against the
    cluster CA) answers ok, within `timeout` seconds, then `ingress` seconds more (the ingress's health
    check counts it back in), before the next action replaces another."""

    url: str
    timeout: int = 60
    ingress: int = 0


@dataclass(frozen=True)
class ServingFirst:
    """Before a running API server (`url`, its /readyz) stops: one of its cluster's other API servers
    (`peers`, their /readyz) has answered ok for `steady` seconds (the ingress's check counts it in
    meanwhile; one a killed run just started may not be behind it yet), within `timeout` seconds. When
    neither it nor any peer answers ok, there is no service to keep and it stops at once."""

    url: str
    peers: tuple[str, ...]
    timeout: int = 60
    steady: int = 0


@dataclass(frozen=True)
class CreateContainer:
    """Create and start `container` in the pod (after removing `replaces`, for a recreate).

    A container whose spec hash reads files known after apply names them in
    `files`: apply fills in the hash from what those files end up holding (`resolved`).
    """

    pod: PodRef
    sandbox: SandboxSpec
    container: ContainerSpec
    files: tuple[FileSpec, ...] = ()
    #: etcd on a running cluster: one member at a time, health checked before and after
    etcd: EtcdHealth | None = None
    #: a running API server: ready again before the next one goes (and a new one in a running cluster:
    #: ready before anything routes to it)
    ready: ApiReady | None = None
    #: the cluster's first running API server the plan stops: another one serving first
    serving: ServingFirst | None = None
    #: seconds the new container runs beside the one it replaces before that one is stopped (0: stop it
    #: first). The ingress's haproxy binds its port with SO_REUSEPORT, so the port never closes, and the
    #: old one soft-stops (its image's stop signal, SIGUSR1): connections in flight finish.
    overlap: int = 0
    #: the certificates it reads, each with the digest of its file (AFTER_APPLY for one issued by this
    #: plan): recorded on the container when it starts, so a later plan sees one written since
    certificates: tuple[tuple[str, str], ...] = ()

    @property
    def certificates_after_apply(self) -> tuple[str, ...]:
        """The certificates whose digests the plan could not know (issued by it, or not readable then)."""
        return tuple(name for name, digest in self.certificates if digest == AFTER_APPLY)

    def resolved(self, contents: dict[str, str], certificates: dict[str, str]) -> ContainerSpec:
        """The container as it starts, its values known after apply filled in: the digests of the files
        its spec hash covers (`contents`: what `files` hold by then, by name) and of the certificates it
        reads (`certificates`: the digests of `certificates_after_apply`, by name)."""
        spec = self.container
        if spec.labels.get(SPEC_HASH) == AFTER_APPLY:
            inputs = json.loads(spec.annotations[SPEC_ANNOTATION])
            inputs["files"].update({n: file_digest(contents[n]) for n, d in inputs["files"].items()
                                    if d == AFTER_APPLY})
            text = json.dumps(inputs, sort_keys=True, separators=(",", ":"))  # as compile wrote it
            labels = {k: v for k, v in spec.labels.items() if k not in (COMPONENT, SPEC_HASH)}
            spec = replace(spec, labels={**labels, COMPONENT: spec.name, SPEC_HASH: file_digest(text)},
                           annotations={**spec.annotations, SPEC_ANNOTATION: text})
        if self.certificates:
            read = json.dumps({**dict(self.certificates), **certificates}, sort_keys=True, separators=(",", ":"))
            spec = replace(spec, annotations={**spec.annotations, CERTIFICATES_ANNOTATION: read})
        return spec


@dataclass(frozen=True)
class Remove:
    """Stop and remove a container or a pod sandbox by id."""

    target_id: str
    #: wipe the node's files and etcd data first, through this running agent (the node leaves the hypervisor)
    wipe_agent_id: str = ""
    #: the node left the repo: free its records (ports, keys, etcd membership) once its pod is gone
    forget: bool = False
    #: running containers stopped one by one first, each gracefully (its stop signal, then SIGKILL after
    #: 10 s), the last started first: an API server leaves the ingress before it goes (stopping the
    #: sandbox kills them at once)
    stop_first: tuple[str, ...] = ()
    #: an API server stopped because its etcd member changes next: these members (`client_url` and
    #: `peers`) healthy first, so an unhealthy cluster stops the run before anything stops
    etcd: EtcdHealth | None = None
    #: the cluster's first running API server the plan stops: another one serving first
    serving: ServingFirst | None = None


@dataclass(frozen=True)
class Reload:
    """Run `command` in running container `target_id` (it reads its files again), then write `record`
    into the node's file `record_file` through the pod's files agent: the container runs the new spec."""

    pod: PodRef
    target_id: str
    command: tuple[str, ...]
    record_file: str
    record: str


@dataclass(frozen=True)
class LabelHost:
    host: str  # namespace/name
    set: tuple[tuple[str, str], ...] = ()
    remove: tuple[str, ...] = ()


@dataclass(frozen=True)
class PutObject:
    """Create or replace one object (canonical JSON `body`) in `collection` of the cluster's API at
    `server`, as the cluster's admin. `wait_ready`: the plan also creates that API; wait up to so many
    seconds for its /readyz first."""

    cluster: str
    server: str
    collection: str
    body: str
    wait_ready: int = 0


@dataclass(frozen=True)
class Condition:
    """A status condition apply adds to an object (a certificate request's approval)."""

    type: str
    status: str
    reason: str
    message: str


#: how gitops approves a certificate request it signs
APPROVED = Condition("Approved", "True", "GitopsApproved", "the request matches its node (gitops)")


@dataclass(frozen=True)
class SignRequest:
    """Answer the certificate request `name` (uid `uid`, PEM `request`) with a certificate signed by the
    cluster CA for exactly this subject, names and usage; approve it first when `approve` (adding the
    condition `approval`, unless a condition of its type is there already)."""

    cluster: str
    server: str
    name: str
    uid: str
    request: str
    common_name: str
    organizations: tuple[str, ...] = ()
    dns_names: tuple[str, ...] = ()
    ip_addresses: tuple[str, ...] = ()
    server_auth: bool = False
    client_auth: bool = False
    days: int = 365
    approve: bool = False
    approval: Condition = APPROVED


@dataclass(frozen=True)
class RotationStep:
    """Record that `cluster`'s CA rotation to `generation` has run its phase `phase` (every action of it
    earlier in the plan): the recorded state moves to the next phase, or ends the rotation after the last."""

    cluster: str
    generation: int
    phase: str


@dataclass(frozen=True)
class BackupEtcd:
    """Snapshot the cluster's etcd into backup target `target` (by name: apply reads its repository and
    password from the repo settings, never from the plan), from the healthiest current member of
    `members` (node, client URL), then keep the newest `keep`."""

    target: str
    keep: int
    members: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class RestoreMember:
    """One etcd member a restore rewrites: its pod (running, with its files agent), its peer URL, and
    the container `etcdutl snapshot restore` runs in (the cluster's etcd image, the node directory
    mounted as the agent sees it)."""

    node: str
    hypervisor: str
    pod: PodRef
    sandbox: SandboxSpec
    peer_url: str
    restorer: ContainerSpec


@dataclass(frozen=True)
class RestoreEtcd:
    """Restore the cluster's etcd from snapshot `snapshot` of backup target `target` (by name, as
    `BackupEtcd`): copy the snapshot to every member, stop and remove `stop` ((hypervisor, container id),
    API servers first), restore each member's data directory with `token` and `initial_cluster`
    (the old one kept beside it), then record `record` as the cluster's restored spec.restore value.
    The containers start again in the plan's next actions."""

    target: str
    snapshot: str
    token: str
    initial_cluster: str
    members: tuple[RestoreMember, ...]
    stop: tuple[tuple[str, str], ...]
    record: str


@dataclass(frozen=True)
class EtcdAlarm:
    """Clear every `alarm` (NOSPACE) of the cluster's etcd, asking the members at `client_urls`."""

    client_urls: tuple[str, ...]
    alarm: str


@dataclass(frozen=True)
class RecoverEtcd:
    """Rebuild the cluster's etcd from the member `create` starts (spec.recovery): remove its etcd
    containers `stop`, start it once with --force-new-cluster until healthy at `client_url`, then as
    `create` says until healthy again (within `timeout` seconds each), and record `record` as done with
    that member the only one."""

    create: CreateContainer
    stop: tuple[str, ...]
    client_url: str
    timeout: int
    record: str


@dataclass(frozen=True)
class WaveCluster:
    """A cluster a rollout wave watches, as its admin (credentials from the recorded state)."""

    cluster: str
    #: its API through its ingress (or virtual IP): where the probe's reads and writes go
    server: str
    #: each control-plane node's own API server (`/readyz`) and the etcd members' client URLs
    api_servers: tuple[str, ...]
    etcd_members: tuple[str, ...]
    #: its API answered when the plan was made: probed from the wave's start (else from its soak's)
    serving: bool = True


@dataclass(frozen=True)
class WaveGate:
    """A rollout wave of commit `commit`: `start-wave` begins watching its clusters, `soak-wave` watches them
    `soak_seconds` more, then halts the rollout unless each kept the SLO (`gitops.apply.waves`)."""

    wave: str
    commit: str
    clusters: tuple[WaveCluster, ...]
    soak_seconds: int
    min_success_ratio: float
    #: health waits and probe requests time out after this many seconds (spec.rollout.healthTimeoutSeconds)
    timeout: int = 60


Payload = Union[CreatePod, GenerateKeys, WriteFiles, EtcdMemberChange, CreateContainer, Remove, Reload, LabelHost,
                PutObject, SignRequest, RotationStep, BackupEtcd, RestoreEtcd, RecoverEtcd, EtcdAlarm, WaveGate]
TYPES: dict[str, type] = {t.__name__: t for t in (CreatePod, GenerateKeys, WriteFiles, EtcdMemberChange,
                                                   CreateContainer, Remove, Reload, LabelHost, PutObject, SignRequest,
                                                   RotationStep, BackupEtcd, RestoreEtcd, RecoverEtcd, EtcdAlarm,
                                                   EtcdHealth, WaveGate)}


def payload_to_dict(payload: Payload) -> dict[str, Any]:
    return {"type": type(payload).__name__, **_plain(asdict(payload))}


def payload_from_dict(data: dict[str, Any]) -> Payload:
    data = dict(data)
    kind = TYPES[data.pop("type")]
    return _build(kind, data)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in sorted(value.items())}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


#: nested dataclass fields, by (class, field name)
_NESTED: dict[tuple[type, str], Any] = {
    (CreatePod, "sandbox"): SandboxSpec, (CreatePod, "agent"): ContainerSpec,
    (GenerateKeys, "pod"): PodRef, (GenerateKeys, "keys"): (KeySpec,),
    (IssueCertificate, "spec"): CertificateSpec,
    (WriteFiles, "pod"): PodRef, (WriteFiles, "certificates"): (IssueCertificate,), (WriteFiles, "files"): (FileSpec,),
    (FileSpec, "bundle"): ServiceAccountBundle,
    (CreateContainer, "pod"): PodRef, (CreateContainer, "sandbox"): SandboxSpec,
    (CreateContainer, "container"): ContainerSpec, (CreateContainer, "files"): (FileSpec,),
    (CreateContainer, "etcd"): EtcdHealth, (CreateContainer, "ready"): ApiReady, (Remove, "etcd"): EtcdHealth,
    (CreateContainer, "serving"): ServingFirst, (Remove, "serving"): ServingFirst,
    (Reload, "pod"): PodRef,
    (SignRequest, "approval"): Condition,
    (ContainerSpec, "mounts"): (Mount,),
    (RecoverEtcd, "create"): CreateContainer,
    (RestoreEtcd, "members"): (RestoreMember,), (RestoreMember, "pod"): PodRef,
    (RestoreMember, "sandbox"): SandboxSpec, (RestoreMember, "restorer"): ContainerSpec,
    (WaveGate, "clusters"): (WaveCluster,),
}


def _build(cls: type, data: dict[str, Any]) -> Any:
    out: dict[str, Any] = {}
    for f in fields(cls):
        if f.name not in data:
            continue
        value = data[f.name]
        nested = _NESTED.get((cls, f.name))
        if value is None:
            out[f.name] = None
        elif isinstance(nested, tuple):
            out[f.name] = tuple(_build(nested[0], v) for v in value)
        elif nested is not None:
            out[f.name] = _build(nested, value)
        elif isinstance(value, list):
            out[f.name] = tuple(tuple(v) if isinstance(v, list) else v for v in value)
        else:
            out[f.name] = value
    return cls(**out)
