"""A cluster's API endpoint that moves, said in the plan (issue #44.3).

A cluster that gets a second ingress node is reached at a virtual IP from then on; one that drops back to a
single ingress node, at that node's address; a virtual IP outside a changed pool is replaced. The plan's
actions change what gitops writes (the API serving certificate, `cluster-info`, the admin kubeconfig on the
status branch); clients gitops does not write keep the old address, so the plan names them.
"""
from __future__ import annotations

from gitops.compile import vip
from gitops.hostport import host_port
from gitops.model.components import INGRESS
from gitops.model.resources import RepoModel
from gitops.state.records import State


def endpoint(model: RepoModel, state: State, cluster: str) -> str:
    """`cluster`'s API endpoint as `state` records it ("" before any ingress node is placed)."""
    spec = model.clusters.get(cluster)
    address = vip.of(spec, model, state) if spec is not None else None
    if address is not None:
        return address.url
    ingress = sorted(node.name for node in model.nodes_of(cluster)
                     if node.role == INGRESS and "apiserver" in getattr(state.nodes.get(node.name), "ports", {}))
    if not ingress:
        return ""
    placed = state.nodes[ingress[0]]
    hv = model.hypervisors.get(placed.hypervisor)
    if hv is None:
        return ""
    return f"https://{host_port(hv.ip_address, placed.ports['apiserver'])}"


def endpoint_notes(model: RepoModel, before: State, after: State) -> list[str]:
    """One note per cluster whose recorded endpoint this plan changes (a new cluster's first one is no move)."""
    notes = []
    for name in sorted(model.clusters):
        old, new = endpoint(model, before, name), endpoint(model, after, name)
        if old and new and old != new:
            was_virtual = bool(before.clusters[name].virtual_ip)
            notes.append(
                f"Cluster {name}'s API endpoint moves from {old} to {new}: this apply writes the new one into "
                "the API serving certificate, cluster-info and the admin kubeconfig (status branch, `gitops "
                f"kubeconfig`). Move the clients gitops does not write: people's kubeconfigs and the workers "
                f"joined before (their kubelet and kube-proxy kubeconfigs: `gitops follow {new}` on each). "
                + ("The old virtual IP stops answering once keepalived leaves the ingress pods." if was_virtual
                   else "The old address keeps answering while the ingress node behind it stays."))
    return notes
