"""Scheduling nodes onto hypervisors, allocating their ports and fixing how their etcd members join (pure).

Rules:
* each role's nodes go on public or private hypervisors (`gitops.model.components.ROLES`):
  `controlplane` on private ones, `controlplane-ingress` and SIP's services on public ones;
* a pinned hypervisor is honoured;
* a recorded placement is kept while its hypervisor still exists and fits, so a new
  commit never moves a healthy node; a node recorded on a Hypervisor that left the repo is an
  error naming the way back (its pod and etcd data are there: placing it anew would start an
  empty member under the same name);
* a cordoned hypervisor (`spec.cordoned`) takes no new node; the nodes it holds stay;
* a draining or lost hypervisor (`spec.drain`, `spec.lost`) takes no new node, and its nodes are
  placed anew elsewhere; so is a node whose pin changed;
* a node that moves gets a new pod and service-account key (the old key is retired, still trusted);
  one that moves while it is an etcd member is recorded with `moved_from`; off a live hypervisor
  it moves learner-first (`leaving_from`/`leaving_peer`: its new member joins as a learner and votes,
  then the old one is removed), off a lost one its member is removed there first, then added back
  from the new place; only one member of a cluster moves at a time: the others wait (a note in
  `deferred`) until the one moving has joined again and its old member left;
* new nodes spread a cluster over hypervisors (fewest nodes of that cluster first,
  then fewest nodes overall, then name); a cluster's ingress nodes never share a hypervisor (a
  virtual IP moves between them): a new one goes where none of that cluster's ingress nodes is, or
  is not placed (an error naming the cluster; validation refuses such a repo first);
* ports come from the hypervisor's range, lowest free first, never shared; a
  record whose node left the repo keeps its ports until the apply stage has
  removed its pod and dropped the record;
* how a placed controlplane node's etcd member joins (its --initial-cluster flags) is decided once,
  after its place (`freeze_etcd_flags`).
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from gitops.compile.desired import EtcdMember
from gitops.errors import GitopsError
from gitops.hostport import host_port
from gitops.model.components import CONTROLPLANE, INGRESS, INGRESS_CHECK_PORT, ROLES
from gitops.model.resources import Hypervisor, Node, RepoModel
from gitops.state.records import NodeRecord, State


class PlacementError(GitopsError):
    """No hypervisor or no port can take a node: a plan error, not a crash."""


class Deferred(PlacementError):
    """A node cannot be placed only because hypervisors are unreachable right now."""


def place(model: RepoModel, state: State, unavailable: Iterable[str] = (),
          deferred: list[str] | None = None, fixed: dict[str, tuple[str, int]] | None = None) -> State:
    """Return a copy of `state` where every node of `model` has a hypervisor and ports.

    `unavailable` names hypervisors that could not be reached: nodes already
    there stay recorded there, new nodes are not placed on them. A node that
    only an unreachable hypervisor could take is left unplaced, with a note
    appended to `deferred`; any other impossibility raises PlacementError.
    `fixed` pins a node's port for a purpose (node -> (purpose, port)).
    """
    down = frozenset(unavailable)
    new = state.copy()
    errors: list[str] = []
    nodes = sorted(model.nodes.values(), key=lambda n: n.name)
    spread = _Spread(new, model)
    moving = _moving(new)
    for node in nodes:
        record = new.nodes.get(node.name)
        if record is not None and _fits(model, node, record):
            continue
        if record is not None and record.hypervisor not in model.hypervisors:
            errors.append(_left_the_repo(node, record))
            continue
        member = record is not None and _member(new, node, record)
        if member and node.cluster in moving:
            if deferred is not None:
                deferred.append(f"Node {node.name} waits to move off Hypervisor {record.hypervisor}: one etcd member "
                                f"of cluster {node.cluster} moves at a time ({moving[node.cluster]} first)")
            continue
        try:
            hypervisor = _choose(model, spread, node, down, _pinned_port(model, node, fixed))
        except Deferred as note:
            if deferred is not None:
                deferred.append(str(note))
            continue
        except PlacementError as err:
            errors.append(str(err))
            continue
        placed = NodeRecord(cluster=node.cluster, hypervisor=hypervisor.name,
                            moved_from=(record.moved_from or record.hypervisor) if member else "")
        if member and not record.moved_from and not model.hypervisors[record.hypervisor].lost:
            # learner-first: the old member keeps its vote until the new one votes, then leaves
            placed.leaving_from = record.hypervisor
            placed.leaving_peer = etcd_member(model.hypervisors[record.hypervisor], node, record).peer_url
            placed.leaving_ports = dict(record.ports)
        if member:
            moving[node.cluster] = node.name
        if record is not None and record.hypervisor != placed.hypervisor and node.cluster in new.clusters:
            # its new pod generates a new service-account key: the old one stays trusted, retired
            new.clusters[node.cluster].retire_service_account_key(node.name)
        spread.move(node.name, record, placed)
        new.nodes[node.name] = placed
    taken = _ports_by_hypervisor(new)
    for node in nodes:
        record = new.nodes.get(node.name)
        if record is None or record.hypervisor not in model.hypervisors:  # the latter: an error above
            continue
        try:
            _allocate_ports(model, taken, node, record, (fixed or {}).get(node.name))
        except PlacementError as err:
            errors.append(str(err))
    if errors:
        raise PlacementError("cannot place every node:\n" + "\n".join(f"  - {e}" for e in errors))
    return new


def etcd_member(hv: Hypervisor, node: Node, record: NodeRecord) -> EtcdMember:
    """Where a placed node's etcd member listens: its hypervisor's address, the ports allocated to it."""
    return EtcdMember(
        node=node.name,
        peer_url=f"https://{host_port(hv.ip_address, record.ports['etcd-peer'])}",
        client_url=f"https://{host_port(hv.ip_address, record.ports['etcd-client'])}",
    )


def freeze_etcd_flags(model: RepoModel, state: State) -> None:
    """Give every placed controlplane node of `model` its etcd --initial-cluster flags, once (in `state`, as
    `place` left it): how its member joins is decided with its place."""
    for name in sorted(model.clusters):
        placed = {node.name: (model.hypervisors[state.nodes[node.name].hypervisor], state.nodes[node.name])
                  for node in model.nodes_of(name) if node.name in state.nodes}
        _freeze_cluster_flags(state, name, model, placed)


def _freeze_cluster_flags(state: State, cluster: str, model: RepoModel,
                          placed: dict[str, tuple[Hypervisor, NodeRecord]]) -> None:
    """Give every controlplane node of `cluster` its etcd --initial-cluster flags, once.

    A cluster with no recorded members bootstraps all its controlplane nodes
    together (`new`). Later nodes join an existing cluster one at a time, in
    name order (`existing`), each listing the surviving members, the nodes
    that joined before it in this round, and itself. A member that moves to another hypervisor
    (`NodeRecord.moved_from`) joins again the same way, beside its old member when that one stays until
    the new one votes (`NodeRecord.leaving_peer`).
    """
    desired = sorted(n for n in placed if model.nodes[n].role == CONTROLPLANE)
    peer = {n: etcd_member(placed[n][0], model.nodes[n], placed[n][1]).peer_url for n in desired}
    cluster_record = state.clusters.get(cluster)  # (none yet: a new cluster, whose authorities come next)
    recorded = cluster_record.etcd_members if cluster_record is not None else []
    if not recorded:
        initial = ",".join(f"{n}={peer[n]}" for n in desired)
        for n in desired:
            record = placed[n][1]
            if not record.etcd_initial_cluster:
                record.etcd_initial_cluster, record.etcd_initial_state = initial, "new"
        return
    moving = {n for n in desired if placed[n][1].moved_from}  # joining again from a new place
    members = [n for n in recorded if n in peer and n not in moving]
    # a learner-first move joins beside its old member, which etcd still counts (listed under another name:
    # etcd matches an existing cluster's members by peer URL, and a name may appear only once)
    leaving = [f"{n}.{placed[n][1].leaving_from}={placed[n][1].leaving_peer}" for n in desired
               if n in moving and placed[n][1].leaving_peer]
    for n in desired:
        if n in recorded and n not in moving:
            continue
        members.append(n)
        record = placed[n][1]
        if not record.etcd_initial_cluster:
            record.etcd_initial_cluster = ",".join([*(f"{m}={peer[m]}" for m in sorted(members)), *leaving])
            record.etcd_initial_state = "existing"


class _Spread:
    """How many recorded nodes each hypervisor holds, overall and per cluster (kept up to date)."""

    def __init__(self, state: State, model: RepoModel):
        self.overall: Counter[str] = Counter()
        self.by_cluster: dict[str, Counter[str]] = {}
        #: per cluster, how many of its ingress nodes each hypervisor holds
        self.ingress: dict[str, Counter[str]] = {}
        self._ingress_nodes = {n.name for n in model.nodes.values() if n.role == INGRESS}
        for name, record in state.nodes.items():
            self._count(record, 1, name in self._ingress_nodes)

    def _count(self, record: NodeRecord, n: int, ingress: bool) -> None:
        self.overall[record.hypervisor] += n
        self.by_cluster.setdefault(record.cluster, Counter())[record.hypervisor] += n
        if ingress:
            self.ingress.setdefault(record.cluster, Counter())[record.hypervisor] += n

    def move(self, node: str, old: NodeRecord | None, new: NodeRecord) -> None:
        ingress = node in self._ingress_nodes
        if old is not None:
            self._count(old, -1, ingress)
        self._count(new, 1, ingress)


def _ports_by_hypervisor(state: State) -> dict[str, Counter[int]]:
    """How many records hold each port, per hypervisor (a bad state may hold a port twice); the old pod of
    a node moving learner-first still holds its ports where it was."""
    taken: dict[str, Counter[int]] = {}
    for record in state.nodes.values():
        taken.setdefault(record.hypervisor, Counter()).update(record.ports.values())
        if record.leaving_from:
            taken.setdefault(record.leaving_from, Counter()).update(record.leaving_ports.values())
    return taken


def _member(state: State, node: Node, record: NodeRecord) -> bool:
    """Whether the node's recorded placement holds a member of its cluster's etcd."""
    cluster = state.clusters.get(node.cluster)
    return (node.role == CONTROLPLANE and record.cluster == node.cluster and cluster is not None
            and node.name in cluster.etcd_members)


def _moving(state: State) -> dict[str, str]:
    """The clusters with an etcd member in motion (moved, not joined again yet, its old member not removed
    yet, or a learner): the node."""
    out = {r.cluster: n for n, r in sorted(state.nodes.items()) if r.moved_from or r.leaving_from}
    for name, cluster in sorted(state.clusters.items()):
        if cluster.etcd_learners and name not in out:
            out[name] = cluster.etcd_learners[0]
    return out


def _eligible(hv: Hypervisor, node: Node) -> bool:
    return hv.public == ROLES[node.role].public


def _fits(model: RepoModel, node: Node, record: NodeRecord) -> bool:
    hv = model.hypervisors.get(record.hypervisor)
    if hv is None or not _eligible(hv, node) or record.cluster != node.cluster or hv.leaving:
        return False
    return node.hypervisor is None or node.hypervisor == record.hypervisor


def _left_the_repo(node: Node, record: NodeRecord) -> str:
    return (f"Node {node.name} is recorded on Hypervisor {record.hypervisor}, which left the repo: its pod and "
            f"data are there, and placing it anew would start it empty under the same name. Put Hypervisor "
            f"{record.hypervisor} back in the repo: with spec.drain: true its nodes move off it (then it can "
            "leave), or, if the machine is gone for good, with spec.lost: true")


def _pinned_port(model: RepoModel, node: Node, fixed: dict[str, tuple[str, int]] | None) -> int | None:
    """The port `node` must have wherever it goes: a SIP service's, or its cluster's spec.apiServer.port for an
    ingress node."""
    if fixed and node.name in fixed:
        return fixed[node.name][1]
    cluster = model.clusters.get(node.cluster)
    if (cluster is not None and cluster.api_port is not None and node.role != CONTROLPLANE
            and not model.wants_virtual_ip(node.cluster)):  # (with a virtual IP, the port is the address's)
        return cluster.api_port
    return None


def _choose(model: RepoModel, spread: _Spread, node: Node, down: frozenset[str],
            port: int | None = None) -> Hypervisor:
    kind = "public" if ROLES[node.role].public else "private"
    if node.hypervisor is not None:
        hv = model.hypervisors[node.hypervisor]
        if hv.cordoned or hv.leaving:
            why = "lost (spec.lost)" if hv.lost else "drained (spec.drain)" if hv.drain else "cordoned (spec.cordoned)"
            raise PlacementError(f"Node {node.name} is pinned to Hypervisor {hv.name}, which is {why}: no new node "
                                 "is placed there")
        if hv.name in down:
            raise Deferred(f"Node {node.name} is not placed yet: its pinned Hypervisor {hv.name} is unreachable")
        return hv
    eligible = [hv for hv in model.hypervisors.values() if _eligible(hv, node) and not (hv.cordoned or hv.leaving)]
    candidates = [hv for hv in eligible if hv.name not in down]
    if not eligible:
        closed = any(hv.cordoned or hv.leaving for hv in model.hypervisors.values() if _eligible(hv, node))
        raise PlacementError(f"Node {node.name} (role {node.role}): no {kind} hypervisor in the repo"
                             + (" that is not cordoned, drained or lost" if closed else ""))
    if port is not None:  # a pinned port: only where the hypervisor's range holds it
        holding_port = [hv for hv in eligible if port in hv.port_range]
        if not holding_port:
            raise PlacementError(f"Node {node.name} (role {node.role}) must have port {port}, and no open {kind} "
                                 "hypervisor's spec.portRange holds it")
        eligible = holding_port
        candidates = [hv for hv in eligible if hv.name not in down]
    if node.role == INGRESS:  # never beside another ingress node of its cluster
        holding = spread.ingress.get(node.cluster, Counter())
        apart = [hv for hv in eligible if not holding[hv.name]]
        if not apart:
            raise PlacementError(f"Node {node.name} (role {node.role}): every open public hypervisor already "
                                 f"holds an ingress node of cluster {node.cluster}, and a cluster's ingress nodes "
                                 "sit on distinct public hypervisors: add a public hypervisor")
        eligible, candidates = apart, [hv for hv in apart if hv.name not in down]
    if not candidates:
        raise Deferred(f"Node {node.name} is not placed yet: every {kind} hypervisor is unreachable")
    same_cluster = spread.by_cluster.get(node.cluster, Counter())
    overall = spread.overall
    return min(candidates, key=lambda hv: (same_cluster[hv.name], overall[hv.name], hv.name))


def ports_wanted(model: RepoModel, node: Node) -> tuple[str, ...]:
    """The ports `node`'s pod binds: its role's, and an ingress node of a cluster with two or more of them
    (a virtual IP) one more for keepalived's health check of its haproxy."""
    ports = ROLES[node.role].ports
    if node.role == INGRESS and model.wants_virtual_ip(node.cluster):
        ports += (INGRESS_CHECK_PORT,)
    return ports


def _allocate_ports(model: RepoModel, taken: dict[str, Counter[int]], node: Node, record: NodeRecord,
                    pinned: tuple[str, int] | None = None) -> None:
    """Give `record` the ports its role needs. `taken` counts every record's ports per hypervisor
    and follows `record`'s changes; the ports `record` held during this call stay used in it."""
    hv = model.hypervisors[record.hypervisor]
    wanted = ports_wanted(model, node)
    cluster = model.clusters.get(node.cluster)
    if (pinned is None and cluster is not None and cluster.api_port is not None and node.role != CONTROLPLANE
            and not model.wants_virtual_ip(node.cluster)):  # (with a virtual IP, the port is the address's)
        pinned = ("apiserver", cluster.api_port)
    if (len(record.ports) == len(wanted) and all(record.ports.get(k) in hv.port_range for k in wanted)
            and (pinned is None or record.ports.get(pinned[0]) == pinned[1])):
        record.ports = dict(sorted(record.ports.items()))  # already allocated: nothing to take or give back
        return
    counts = taken.setdefault(hv.name, Counter())
    counts.subtract(record.ports.values())
    record.ports = {k: v for k, v in record.ports.items() if k in wanted and v in hv.port_range}
    counts.update(record.ports.values())
    held = set(record.ports.values())

    def used(port: int) -> bool:
        return port in held or counts[port] > 0

    def take(purpose: str, port: int) -> None:
        old = record.ports.get(purpose)
        if old is not None:
            counts[old] -= 1
        record.ports[purpose] = port
        counts[port] += 1
        held.add(port)

    if pinned is not None and record.ports.get(pinned[0]) != pinned[1]:
        purpose, fixed = pinned
        if fixed not in hv.port_range:
            raise PlacementError(f"Node {node.name}: {purpose} port {fixed} is outside "
                                 f"Hypervisor {hv.name}'s range {hv.port_range.low}-{hv.port_range.high}")
        if used(fixed):
            raise PlacementError(f"Node {node.name}: {purpose} port {fixed} on Hypervisor {hv.name} is already taken")
        take(purpose, fixed)
    free = (p for p in range(hv.port_range.low, hv.port_range.high + 1) if not used(p))
    for purpose in wanted:
        if purpose in record.ports:
            continue
        port = next(free, None)
        if port is None:
            in_use = held | {p for p, n in counts.items() if n > 0}
            raise PlacementError(
                f"Node {node.name}: Hypervisor {hv.name} has no free port left in "
                f"{hv.port_range.low}-{hv.port_range.high} for {purpose} ({len(in_use)} in use); "
                "widen spec.portRange or add a hypervisor")
        take(purpose, port)
    record.ports = dict(sorted(record.ports.items()))
