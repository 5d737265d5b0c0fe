"""Desired-state compilation: repo model + recorded state in, desired state out.

`compile_desired` is deterministic for a given recorded state: everything
random (CA keys, port choices) is generated once, returned in the new state,
and reused from then on. It performs no I/O.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import sys
from collections.abc import Iterable
from dataclasses import dataclass

from gitops.compile.authorities import ensure_authorities
from gitops.compile.bootstrap import bootstrap_objects
from gitops.compile.components import etcd_member, pod_for
from gitops.compile.desired import DesiredCluster, DesiredPod, DesiredState, KubeObject, VirtualIP
from gitops.compile import vip
from gitops.compile.placement import PlacementError, place
from gitops.hostport import host_port
from gitops.memo import Memo, key_of
from gitops.model.components import CONTROLPLANE
from gitops.model.resources import BareMetalHost, Cluster, Hypervisor, Node, RepoModel
from gitops.compile.sip_services import pinned_ports, service_nodes, service_pods
from gitops.state.records import ClusterRecord, NodeRecord, State

__all__ = ["Compiled", "PlacementError", "compile_desired"]


@dataclass(frozen=True)
class Compiled:
    desired: DesiredState
    #: the recorded state with new placements, authorities and etcd bootstrap flags
    state: State
    #: nodes left out for now (only unreachable hypervisors could take them)
    deferred: tuple[str, ...] = ()


def compile_desired(model: RepoModel, state: State, *, now: dt.datetime | None = None,
                    unavailable: Iterable[str] = (), hosts: Iterable[BareMetalHost] = ()) -> Compiled:
    """`hosts`: the BareMetalHosts with the labels they have once the plan's label changes are made
    (SIP load balancers point at the hosts labeled for them)."""
    now = now or dt.datetime.now(dt.timezone.utc)
    deferred: list[str] = []
    services = service_nodes(model)
    placement_model = dataclasses.replace(model, nodes={**model.nodes, **services}) if services else model
    new = place(placement_model, state, unavailable, deferred, fixed=pinned_ports(model))
    for name, cluster in model.clusters.items():
        new.clusters[name] = ensure_authorities(cluster, new.clusters.get(name), now)
    placed_in = {r.cluster for r in new.nodes.values()}
    for name in [n for n in new.clusters if n not in model.clusters and n not in placed_in]:
        del new.clusters[name]  # left the repo and its last pod is gone
    vip.allocate(model, new)
    pods = {}
    clusters = {}
    hypervisor_text = {name: repr(hv) for name, hv in model.hypervisors.items()}  # each shared by many clusters
    for name, cluster in sorted(model.clusters.items()):
        nodes = model.nodes_of(name)
        placed: dict[str, tuple[Hypervisor, NodeRecord]] = {
            node.name: (model.hypervisors[new.nodes[node.name].hypervisor], new.nodes[node.name])
            for node in nodes if node.name in new.nodes
        }
        _freeze_etcd_flags(new, name, model, placed)
        record = new.clusters[name]
        address = vip.of(cluster, model, new)
        cluster_pods, clusters[name] = COMPILED_CLUSTERS.get(
            _cluster_key(cluster, nodes, placed, record, hypervisor_text, address),
            lambda: _compile_cluster(cluster, {n.name: n for n in nodes}, placed, record, address))
        pods.update((pod.node, pod) for pod in cluster_pods)
    if services:
        placed = {n: (model.hypervisors[new.nodes[n].hypervisor], new.nodes[n]) for n in services if n in new.nodes}
        pods.update(service_pods(model, placed, hosts, deferred))
    return Compiled(desired=DesiredState(pods=dict(sorted(pods.items())), clusters=clusters), state=new,
                    deferred=tuple(deferred))


#: compiled clusters by a digest of their inputs: a plan recompiles only the clusters that changed
#: (a fleet larger than this recompiles every cluster on every plan)
COMPILED_CLUSTERS: Memo[bytes, tuple[tuple[DesiredPod, ...], DesiredCluster]] = Memo(maxsize=1 << 16)


def _cluster_key(cluster: Cluster, nodes: list[Node], placed: dict[str, tuple[Hypervisor, NodeRecord]],
                 record: ClusterRecord, hypervisor_text: dict[str, str], address: VirtualIP | None) -> bytes:
    """A digest of everything a cluster's pods are made of: the Cluster, its Nodes, their hypervisors
    (`hypervisor_text`: their reprs, by name) and records (etcd flags frozen), the cluster's record.
    The reprs of these dataclasses show every field."""
    placements = [(node, hypervisor_text[hv.name], rec) for node, (hv, rec) in sorted(placed.items())]
    return key_of(repr((cluster, sorted(nodes, key=lambda n: n.name), placements, record, address)))


def _compile_cluster(cluster: Cluster, nodes: dict[str, Node], placed: dict[str, tuple[Hypervisor, NodeRecord]],
                     record: ClusterRecord, address: VirtualIP | None = None,
                     ) -> tuple[tuple[DesiredPod, ...], DesiredCluster]:
    """The pods of a cluster's placed nodes (by name) and the cluster's etcd members and API endpoint (its
    virtual IP's, when it has one)."""
    pods = tuple(pod_for(nodes[n], cluster, hv, rec, record, placed, address)
                 for n, (hv, rec) in sorted(placed.items()))
    members = tuple(etcd_member(hv, nodes[n], rec) for n, (hv, rec) in sorted(placed.items())
                    if nodes[n].role == CONTROLPLANE)
    ingress = sorted((n, hv, rec) for n, (hv, rec) in placed.items() if nodes[n].role != CONTROLPLANE)
    endpoint = None
    objects: tuple = ()
    if ingress:
        _, hv, rec = ingress[0]
        endpoint = (address.url if address is not None
                    else f"https://{host_port(hv.ip_address, rec.ports['apiserver'])}")
        objects = tuple(_shared_object(o) for o in bootstrap_objects(endpoint, record.trust_bundle("cluster")))
    return pods, DesiredCluster(name=cluster.name, etcd_members=members, api_endpoint=endpoint, objects=objects,
                                backup=cluster.backup, restore=cluster.restore, recovery=cluster.recovery,
                                etcd_quota=cluster.etcd_quota)


def _shared_object(obj: KubeObject) -> KubeObject:
    """`obj` with its body and spec hash interned: every cluster keeps the same RBAC objects."""
    return dataclasses.replace(obj, body=sys.intern(obj.body), spec_hash=sys.intern(obj.spec_hash))


def _freeze_etcd_flags(state: State, cluster: str, model: RepoModel,
                       placed: dict[str, tuple[Hypervisor, NodeRecord]]) -> None:
    """Give every controlplane node its etcd --initial-cluster flags, once.

    A cluster with no recorded members bootstraps all its controlplane nodes
    together (`new`). Later nodes join an existing cluster one at a time, in
    name order (`existing`), each listing the surviving members, the nodes
    that joined before it in this round, and itself. A member that moves to another hypervisor
    (`NodeRecord.moved_from`) joins again the same way, beside its old member when that one stays until
    the new one votes (`NodeRecord.leaving_peer`).
    """
    desired = sorted(n for n in placed if model.nodes[n].role == CONTROLPLANE)
    peer = {n: etcd_member(placed[n][0], model.nodes[n], placed[n][1]).peer_url for n in desired}
    recorded = state.clusters[cluster].etcd_members
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
