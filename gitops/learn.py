"""Learning, its own stage between observe and compile: what only the hypervisors know, recorded in state (pure)."""
from __future__ import annotations

from gitops.observe.types import ObservedState
from gitops.state.records import ClusterRecord, State


def learn(state: State, observed: ObservedState, desired_nodes: dict[str, str]) -> State:
    """Record each node's service-account public key as its files agent reports it.

    `desired_nodes` maps node -> cluster for the nodes in the repo. A node whose
    files are readable but hold no key any more has its recorded key retired (the
    plan generates a new one; tokens signed with the old one stay valid). Records that learn nothing
    are shared with `state`, not copied (compile copies what it changes).
    """
    new = State(clusters=dict(state.clusters), nodes=dict(state.nodes), sip_labels=dict(state.sip_labels),
                hypervisor_ca=state.hypervisor_ca, rollout=state.rollout)
    copied: set[str] = set()

    def record(cluster: str) -> ClusterRecord:
        """The cluster's record, copied before its first change: `state` is never modified."""
        if cluster not in copied:
            new.clusters[cluster] = new.clusters[cluster].copy()
            copied.add(cluster)
        return new.clusters[cluster]

    for pod in observed.pods():
        cluster = desired_nodes.get(pod.node)
        if cluster != pod.cluster or pod.files is None or cluster not in new.clusters:
            continue
        public = pod.files.public_keys.get("sa")
        if public:
            if new.clusters[cluster].service_account_keys.get(pod.node) != public:
                record(cluster).set_service_account_key(pod.node, public)
        elif "sa" not in pod.files.keys and pod.ready:
            if pod.node in new.clusters[cluster].service_account_keys:
                record(cluster).retire_service_account_key(pod.node)
    return new
