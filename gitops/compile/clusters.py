"""Each cluster's pods, etcd members, API endpoint and bootstrap objects (pure), compiled once per content of
its inputs (`COMPILED_CLUSTERS`): its Cluster and Nodes, their hypervisors and records (placed, etcd flags
frozen), its record (authorities, virtual IP).
"""
from __future__ import annotations

import dataclasses
import sys

from gitops.compile import vip
from gitops.compile.bootstrap import bootstrap_objects
from gitops.compile.components import pod_for
from gitops.compile.desired import ClusterTrust, DesiredCluster, DesiredPod, KubeObject, VirtualIP
from gitops.compile.placement import etcd_member
from gitops.hostport import host_port
from gitops.memo import Memo, key_of
from gitops.model.components import CONTROLPLANE
from gitops.model.resources import Cluster, Hypervisor, Node, RepoModel
from gitops.state.records import ClusterRecord, NodeRecord, State


def compile_clusters(model: RepoModel, state: State) -> tuple[dict[str, DesiredPod], dict[str, DesiredCluster]]:
    """Every cluster of `model` as `state` places it: the pods by node, the clusters by name."""
    pods = {}
    clusters = {}
    hypervisor_text = {name: repr(hv) for name, hv in model.hypervisors.items()}  # each shared by many clusters
    for name, cluster in sorted(model.clusters.items()):
        nodes = model.nodes_of(name)
        placed: dict[str, tuple[Hypervisor, NodeRecord]] = {
            node.name: (model.hypervisors[state.nodes[node.name].hypervisor], state.nodes[node.name])
            for node in nodes if node.name in state.nodes
        }
        record = state.clusters[name]
        address = vip.of(cluster, model, state)
        cluster_pods, clusters[name] = COMPILED_CLUSTERS.get(
            _cluster_key(cluster, nodes, placed, record, hypervisor_text, address),
            lambda: _compile_cluster(cluster, {n.name: n for n in nodes}, placed, record, address))
        pods.update((pod.node, pod) for pod in cluster_pods)
    return pods, clusters


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
    trust = _trust(record)
    pods = tuple(pod_for(nodes[n], cluster, hv, rec, trust, placed, address)
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
        objects = tuple(_shared_object(o) for o in bootstrap_objects(endpoint, trust.bundles["cluster"]))
    return pods, DesiredCluster(name=cluster.name, etcd_members=members, api_endpoint=endpoint, objects=objects,
                                backup=cluster.backup, restore=cluster.restore, recovery=cluster.recovery,
                                etcd_quota=cluster.etcd_quota)


def _trust(record: ClusterRecord) -> ClusterTrust:
    """What the cluster's pods trust and present, from its record (the bundles interned: each is in every pod)."""
    roles = sorted(record.authorities)
    return ClusterTrust(bundles={role: sys.intern(record.trust_bundle(role)) for role in roles},
                        chains={role: record.chain(role) for role in roles},
                        keyed=frozenset(record.service_account_keys),
                        service_account_keys=sys.intern("".join(record.trusted_service_account_keys())))


def _shared_object(obj: KubeObject) -> KubeObject:
    """`obj` with its body and spec hash interned: every cluster keeps the same RBAC objects."""
    return dataclasses.replace(obj, body=sys.intern(obj.body), spec_hash=sys.intern(obj.spec_hash))
