"""What one replica may touch: the clusters of the shard Leases it holds, and who owns the rest.

Every action names a cluster; it belongs to the shard of that name (`shard_of`), so
even a cluster that left the repo is cleaned up by exactly one replica. What is not
one cluster's (actions and status with no cluster, SIPClusters, whose host selection
spans the shared BareMetalHost inventory, hypervisor status, the commit's source
status) is *global*: owned by the holder of shard 0, or by the leader in leader mode.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gitops.coordination.shards import LEADER, shard_lease, shard_of
from gitops.errors import GitopsError
from gitops.state.records import State


class PlacementRaced(GitopsError):
    """Another replica published a node on the same hypervisor port first; plan again from its records."""


@dataclass(frozen=True)
class Scope:
    mode: str  # "leader" | "shards"
    shards: int
    #: the work Leases held fresh when the reconcile began
    held: frozenset[str]
    #: names that are global although they look like clusters (SIPClusters and their service pods)
    global_names: frozenset[str] = frozenset()

    @property
    def global_lease(self) -> str:
        return LEADER if self.mode == "leader" else shard_lease(0, self.shards)

    def lease_of(self, cluster: str) -> str:
        """The Lease an action or file of `cluster` ("" for none) is fenced by."""
        if self.mode == "leader" or not cluster or cluster in self.global_names:
            return self.global_lease
        return shard_lease(shard_of(cluster, self.shards), self.shards)

    def owns(self, cluster: str) -> bool:
        return self.lease_of(cluster) in self.held

    @property
    def owns_global(self) -> bool:
        return self.global_lease in self.held

    def narrow_state(self, state: State) -> State:
        """The recorded state a replica plans with: the records of the clusters it owns, every node's
        (placement counts every recorded port on a hypervisor), the SIP labels if it owns shard 0.
        Compile and plan then never walk the other shards' clusters."""
        return State(clusters={n: r for n, r in state.clusters.items() if self.owns(n)}, nodes=state.nodes,
                     sip_labels=state.sip_labels if self.owns_global else {}, hypervisor_ca=state.hypervisor_ca,
                     rollout=state.rollout if self.owns_global else None)

    def merge(self, theirs: State, mine: State) -> State:
        """The state to publish: our records for what we own, the branch's (`theirs`) for the rest."""
        out = State()
        for name in sorted(theirs.clusters.keys() | mine.clusters.keys()):
            source = mine if self.owns(name) else theirs
            if name in source.clusters:
                out.clusters[name] = source.clusters[name].copy()
        for name in sorted(theirs.nodes.keys() | mine.nodes.keys()):
            record = mine.nodes.get(name) or theirs.nodes[name]
            source = mine if self.owns(record.cluster) else theirs
            if name in source.nodes:
                out.nodes[name] = source.nodes[name].copy()
        labels = mine.sip_labels if self.owns_global else theirs.sip_labels
        out.sip_labels = {host: dict(values) for host, values in labels.items()}
        ca = (mine if self.owns_global else theirs).hypervisor_ca or theirs.hypervisor_ca  # (no replica makes one)
        out.hypervisor_ca = ca.copy() if ca else None
        rollout = mine.rollout if self.owns_global else theirs.rollout  # (waves need one replica: leader mode)
        out.rollout = rollout.copy() if rollout else None
        return out

    def clashes(self, theirs: State, mine: State) -> list[str]:
        """Ports that our new or moved node records take on a hypervisor where another replica's
        record (on the branch, `theirs`) already has them. Replicas place nodes concurrently on
        hypervisors they share, each from the branch as it was when it planned; the status branch
        is the compare-and-swap that orders them, so the later one must see and refuse the clash."""
        used: dict[tuple[str, int], str] = {}
        for name, record in theirs.nodes.items():
            if not self.owns(record.cluster):
                for port in record.ports.values():
                    used[(record.hypervisor, port)] = name
        out = []
        for name, record in sorted(mine.nodes.items()):
            if not self.owns(record.cluster):
                continue
            published = theirs.nodes.get(name)
            if (published is not None and published.hypervisor == record.hypervisor
                    and published.ports == record.ports):
                continue  # on the branch already: whoever came later had to avoid it
            for purpose, port in sorted(record.ports.items()):
                other = used.get((record.hypervisor, port))
                if other is not None:
                    out.append(f"{name} on {record.hypervisor}: port {port} ({purpose}) is {other}'s")
        return out


def file_owner(rel: str, node_cluster: Callable[[str], str | None]) -> str | None:
    """The cluster a status-branch file belongs to (None: global). `node_cluster(node)`: a node's cluster."""
    parts = rel.split("/")
    stem = parts[-1].rsplit(".", 1)[0]
    if len(parts) == 3 and parts[0] == "observed" and parts[1] in ("clusters", "converged"):
        return stem
    if len(parts) == 3 and parts[0] == "status" and parts[1] == "Cluster":
        return stem
    if len(parts) == 3 and parts[0] == "status" and parts[1] == "Node":
        return node_cluster(stem)
    if len(parts) == 2 and parts[0] == "kubeconfig":
        return stem
    return None
