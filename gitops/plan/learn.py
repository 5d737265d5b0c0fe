"""Learning: what only the hypervisors know, recorded before compiling (pure)."""
from __future__ import annotations

from gitops.observe import ObservedState
from gitops.state.records import State


def learn(state: State, observed: ObservedState, desired_nodes: dict[str, str]) -> State:
    """Record each node's service-account public key as its files agent reports it.

    `desired_nodes` maps node -> cluster for the nodes in the repo. A node whose
    files are readable but hold no key any more has its recorded key retired (the
    plan generates a new one; tokens signed with the old one stay valid).
    """
    new = state.copy()
    for pod in observed.pods():
        cluster = desired_nodes.get(pod.node)
        if cluster != pod.cluster or pod.files is None or cluster not in new.clusters:
            continue
        public = pod.files.public_keys.get("sa")
        if public:
            new.clusters[cluster].set_service_account_key(pod.node, public)
        elif "sa" not in pod.files.keys and pod.ready:
            new.clusters[cluster].retire_service_account_key(pod.node)
    return new
