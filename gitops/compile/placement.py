"""Scheduling nodes onto hypervisors and allocating their ports (pure).

Rules:
* each role's nodes go on public or private hypervisors (`gitops.model.components.ROLES`):
  `controlplane` on private ones, `controlplane-ingress` and SIP's services on public ones;
* a pinned hypervisor is honoured;
* a recorded placement is kept while its hypervisor still exists and fits, so a new
  commit never moves a healthy node; a node recorded on a Hypervisor that left the repo is an
  error naming the way back (its pod and etcd data are there: placing it anew would start an
  empty member under the same name);
* a cordoned hypervisor (`spec.cordoned`) takes no new node; the nodes it holds stay;
* new nodes spread a cluster over hypervisors (fewest nodes of that cluster first,
  then fewest nodes overall, then name);
* ports come from the hypervisor's range, lowest free first, never shared; a
  record whose node left the repo keeps its ports until the apply stage has
  removed its pod and dropped the record.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from gitops.errors import GitopsError
from gitops.model.components import CONTROLPLANE, ROLES
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
    spread = _Spread(new)
    for node in nodes:
        record = new.nodes.get(node.name)
        if record is not None and _fits(model, node, record):
            continue
        if record is not None and record.hypervisor not in model.hypervisors:
            errors.append(_left_the_repo(node, record))
            continue
        try:
            hypervisor = _choose(model, spread, node, down)
        except Deferred as note:
            if deferred is not None:
                deferred.append(str(note))
            continue
        except PlacementError as err:
            errors.append(str(err))
            continue
        placed = NodeRecord(cluster=node.cluster, hypervisor=hypervisor.name)
        spread.move(record, placed)
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


class _Spread:
    """How many recorded nodes each hypervisor holds, overall and per cluster (kept up to date)."""

    def __init__(self, state: State):
        self.overall: Counter[str] = Counter()
        self.by_cluster: dict[str, Counter[str]] = {}
        for record in state.nodes.values():
            self._count(record, 1)

    def _count(self, record: NodeRecord, n: int) -> None:
        self.overall[record.hypervisor] += n
        self.by_cluster.setdefault(record.cluster, Counter())[record.hypervisor] += n

    def move(self, old: NodeRecord | None, new: NodeRecord) -> None:
        if old is not None:
            self._count(old, -1)
        self._count(new, 1)


def _ports_by_hypervisor(state: State) -> dict[str, Counter[int]]:
    """How many records hold each port, per hypervisor (a bad state may hold a port twice)."""
    taken: dict[str, Counter[int]] = {}
    for record in state.nodes.values():
        taken.setdefault(record.hypervisor, Counter()).update(record.ports.values())
    return taken


def _eligible(hv: Hypervisor, node: Node) -> bool:
    return hv.public == ROLES[node.role].public


def _fits(model: RepoModel, node: Node, record: NodeRecord) -> bool:
    hv = model.hypervisors.get(record.hypervisor)
    if hv is None or not _eligible(hv, node) or record.cluster != node.cluster:
        return False
    return node.hypervisor is None or node.hypervisor == record.hypervisor


def _left_the_repo(node: Node, record: NodeRecord) -> str:
    return (f"Node {node.name} is recorded on Hypervisor {record.hypervisor}, which left the repo: its pod and "
            f"data are there, and placing it anew would start it empty under the same name. Put Hypervisor "
            f"{record.hypervisor} back in the repo (spec.cordoned: true keeps new nodes off it)")


def _choose(model: RepoModel, spread: _Spread, node: Node, down: frozenset[str]) -> Hypervisor:
    kind = "public" if ROLES[node.role].public else "private"
    if node.hypervisor is not None:
        hv = model.hypervisors[node.hypervisor]
        if hv.cordoned:
            raise PlacementError(f"Node {node.name} is pinned to Hypervisor {hv.name}, which is cordoned "
                                 "(spec.cordoned): no new node is placed there")
        if hv.name in down:
            raise Deferred(f"Node {node.name} is not placed yet: its pinned Hypervisor {hv.name} is unreachable")
        return hv
    eligible = [hv for hv in model.hypervisors.values() if _eligible(hv, node) and not hv.cordoned]
    candidates = [hv for hv in eligible if hv.name not in down]
    if not eligible:
        cordoned = any(hv.cordoned for hv in model.hypervisors.values() if _eligible(hv, node))
        raise PlacementError(f"Node {node.name} (role {node.role}): no {kind} hypervisor in the repo"
                             + (" that is not cordoned" if cordoned else ""))
    if not candidates:
        raise Deferred(f"Node {node.name} is not placed yet: every {kind} hypervisor is unreachable")
    same_cluster = spread.by_cluster.get(node.cluster, Counter())
    overall = spread.overall
    return min(candidates, key=lambda hv: (same_cluster[hv.name], overall[hv.name], hv.name))


def _allocate_ports(model: RepoModel, taken: dict[str, Counter[int]], node: Node, record: NodeRecord,
                    pinned: tuple[str, int] | None = None) -> None:
    """Give `record` the ports its role needs. `taken` counts every record's ports per hypervisor
    and follows `record`'s changes; the ports `record` held during this call stay used in it."""
    hv = model.hypervisors[record.hypervisor]
    wanted = ROLES[node.role].ports
    cluster = model.clusters.get(node.cluster)
    if pinned is None and cluster is not None and cluster.api_port is not None and node.role != CONTROLPLANE:
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
