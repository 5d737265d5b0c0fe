"""What each cluster's part of a plan reads (pure): its `ClusterInputs`, split out of the compiled desired
state, the observed state and the recorded state; and the hypervisors a plan cannot read, as unknowns (one
unreachable, one that left the repo with nodes still recorded there).

`gitops.plan.clusters` takes each cluster's inputs through its stages, which all read them: a restore or a
recovery (`gitops.plan.restore`, `gitops.plan.recovery`), compare (`gitops.plan.diff`), roll out
(`gitops.plan.rollout`), upkeep (`gitops.plan.upkeep`).
"""
from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from gitops.compile.desired import DesiredCluster, DesiredPod, DesiredState
from gitops.hostport import host_port
from gitops.memo import key_of
from gitops.model.resources import RepoModel
from gitops.observe.types import ObservedEtcd, ObservedPod, ObservedState, SnapshotListing
from gitops.plan.actions import Unknown, UnknownKind
from gitops.state.records import ClusterRecord, NodeRecord, State


@dataclass(slots=True)
class ClusterInputs:
    """Everything the diff (and the rollout) of one cluster reads: its desired pods and members, the
    observed pods of its nodes (and of nodes that left the repo but were labeled with it), its record, the
    hypervisors its recorded etcd members were placed on, and which of the hypervisors it involves are
    unreachable."""

    cluster: str
    wants: list[DesiredPod]  # by node
    want: DesiredCluster | None
    #: observed pods by node, each node's pods in observation order
    have: dict[str, list[ObservedPod]]
    record: ClusterRecord | None
    members_on: tuple[tuple[str, str], ...]  # (recorded etcd member, its recorded hypervisor)
    down: frozenset[str]
    #: its snapshots, listed while its spec.restore is pending (None: not listed)
    snapshots: SnapshotListing | None = None
    #: recorded etcd members that move to another hypervisor, not voting from there yet
    moving: frozenset[str] = frozenset()
    #: the hypervisors it involves that are marked lost (spec.lost): nothing is planned there
    lost: frozenset[str] = frozenset()
    #: its etcd's space and alarms (for its upkeep, decided apart from the memoized diff: not in `key`)
    etcd: ObservedEtcd | None = None
    #: members moving learner-first: (node, hypervisor, peer URL) of the old member, removed once the new
    #: one votes
    leaving: tuple[tuple[str, str, str], ...] = ()
    #: (node, client URL) of those old members, where known (`NodeRecord.leaving_ports`): they vote until
    #: removed, so a membership change meanwhile asks them there
    leaving_clients: tuple[tuple[str, str], ...] = ()

    def key(self, settings: str) -> bytes:
        """A digest of the inputs (`settings`: the diff options as text): content digests of the pods
        and members (each computed once per object), the parts of the record the diff reads."""
        record = self.record
        parts = [settings, self.cluster, self.want.content_digest if self.want is not None else None]
        if record is not None:
            parts.append("\n".join(record.etcd_members))
            parts.append("\n".join(record.etcd_learners))
            for role, authority in sorted(record.authorities.items()):
                parts += (role, authority.cert_pem)
        parts.append(repr((self.members_on, sorted(self.down), self.snapshots, sorted(self.moving), sorted(self.lost),
                           self.leaving, self.leaving_clients,
                           (record.restored, record.forcing) if record is not None else None)))
        parts += [p.content_digest for p in self.wants]
        for node in sorted(self.have):
            parts.append(f"{node}:{len(self.have[node])}")
            parts += [p.content_digest for p in self.have[node]]
        return key_of(*parts)


@dataclass(frozen=True)
class PlanInputs:
    """What the clusters' part of a plan reads: each cluster's inputs, and the hypervisors it cannot read."""

    clusters: list[ClusterInputs]
    #: the unreachable hypervisors, by name
    unreachable: tuple[Unknown, ...]
    #: the hypervisors that left the repo with nodes still recorded there, by name
    left: tuple[Unknown, ...]


def plan_inputs(model: RepoModel, desired: DesiredState, observed: ObservedState, state: State) -> PlanInputs:
    """Each cluster's inputs, and the hypervisors unreachable or gone from the repo (`state`: the recorded
    state as compiled)."""
    down = set(observed.unreachable)
    return PlanInputs(cluster_inputs(desired, observed, state, down, set(observed.lost)),
                      tuple(unreachable(name, observed, desired, state) for name in sorted(down)),
                      tuple(left_the_repo(model, state)))


def cluster_inputs(desired: DesiredState, observed: ObservedState, state: State,
                   down: set[str], lost: set[str] = frozenset()) -> list[ClusterInputs]:
    """The diff's inputs split by cluster. An observed pod goes with its node's desired cluster, or,
    when its node left the repo, with the cluster it is labeled with."""
    wants: dict[str, list[DesiredPod]] = {}
    for pod in desired.pods.values():
        wants.setdefault(pod.cluster, []).append(pod)
    have: dict[str, dict[str, list[ObservedPod]]] = {}
    pods = desired.pods
    for hv in observed.hypervisors.values():
        for seen in hv.pods:
            want = pods.get(seen.node)
            have.setdefault(want.cluster if want else seen.cluster, {}).setdefault(seen.node, []).append(seen)
    out = []
    nodes = state.nodes
    for cluster in sorted(wants.keys() | have.keys() | state.clusters.keys()):
        record = state.clusters.get(cluster)
        members_on = () if record is None else tuple(  # a moving member is still where it was, until removed
            (n, (nodes[n].moved_from or nodes[n].hypervisor) if n in nodes else "") for n in record.etcd_members)
        moving = frozenset() if record is None else frozenset(
            n for n in record.etcd_members if n in nodes and nodes[n].moved_from)
        leaving = () if record is None else tuple(
            (n, nodes[n].leaving_from, nodes[n].leaving_peer) for n in record.etcd_members
            if n in nodes and nodes[n].leaving_peer)
        leaving_clients = tuple((n, url) for n, _, _ in leaving if (url := _old_client_url(nodes[n])))
        mine = wants.get(cluster, [])
        involved = gone = frozenset()
        if down or lost:
            where = {p.hypervisor for p in mine} | {hv for _, hv in members_on}
            involved, gone = frozenset(down & where), frozenset(lost & where)
        out.append(ClusterInputs(cluster, mine, desired.clusters.get(cluster), have.get(cluster, {}), record,
                                 members_on, involved, observed.snapshots.get(cluster), moving, gone,
                                 observed.etcd.get(cluster), leaving, leaving_clients))
    return out


def _old_client_url(record: NodeRecord) -> str:
    """The client URL of a node's old member during a learner-first move: its peer URL's host, its old
    client port ("" when the record has no old ports: written by an older build)."""
    port = record.leaving_ports.get("etcd-client")
    host = urlsplit(record.leaving_peer).hostname if record.leaving_peer else None
    if not port or not host:
        return ""
    return f"https://{host_port(host, port)}"



def unreachable(name: str, observed: ObservedState, desired: DesiredState, state: State) -> Unknown:
    """An unreachable hypervisor: the nodes placed there, and those recorded there that left the repo."""
    nodes = {p.node for p in desired.pods.values() if p.hypervisor == name}
    nodes |= {node for node, record in state.nodes.items() if record.hypervisor == name}
    return Unknown(UnknownKind.HYPERVISOR, name, observed.hypervisors[name].error, tuple(sorted(nodes)))


def left_the_repo(model: RepoModel, state: State) -> list[Unknown]:
    """Hypervisors that left the repo with nodes recorded there: their pods cannot be observed nor removed."""
    gone: dict[str, list[str]] = {}
    for name, record in sorted(state.nodes.items()):
        if record.hypervisor not in model.hypervisors:
            gone.setdefault(record.hypervisor, []).append(name)
    return [Unknown(UnknownKind.HYPERVISOR, hv, "it left the repo; put the Hypervisor back to clean up its pods",
                    tuple(nodes)) for hv, nodes in sorted(gone.items())]
