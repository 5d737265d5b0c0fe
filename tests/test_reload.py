"""A component that takes new files in place (`RELOAD`: keepalived, on SIGHUP) is reloaded, not replaced, when
only the files it reads change (issue #44.3: a keepalived restart would hand the virtual IP to another node).

The plan writes the file, then reloads the running container and records that it did in the node's
`keepalived.reloaded`; a plan after that (or after a run killed before the record) knows from that file's
digest whether the running container took the new spec.
"""
from __future__ import annotations

import dataclasses

import pytest
from repo_helpers import EXAMPLE_REPO
from test_plan_diff import NOW, converged, nothing_observed

from gitops.compile import compile_desired
from gitops.engine import make_plan
from gitops.model.config import IngressConfig, RepoConfig
from gitops.model.resources import Node
from gitops.model.validate import load_model
from gitops.observe.types import ObservedHypervisor, ObservedPod, ObservedState
from gitops.plan.actions import Kind
from gitops.plan.payloads import Reload, payload_from_dict, payload_to_dict
from gitops.pods import file_digest, reloaded_record
from gitops.state import State
from gitops.status.report import Outcome, Result, node_phase

NODE = "team-a-ingress"


@pytest.fixture(scope="module")
def model():
    """The example repo (no SIP): team-a behind a virtual IP over its two ingress nodes (unpinned), team-b with
    one ingress node."""
    base = load_model(EXAMPLE_REPO)
    nodes = {**{k: v for k, v in base.nodes.items() if k != "team-b-ingress-2"},
             "team-a-ingress-2": Node("team-a-ingress-2", "team-a", "controlplane-ingress")}
    return dataclasses.replace(base, nodes=nodes, sip_clusters={},
                               ingress=IngressConfig(("127.0.10.200-127.0.10.201",)))


def _settled(model):
    first = make_plan(model, RepoConfig(), State(), nothing_observed(model), now=NOW)
    state = first.state.copy()
    for name, cluster in first.compiled.desired.clusters.items():
        state.clusters[name].etcd_members = [m.node for m in cluster.etcd_members]
        for m in cluster.etcd_members:
            state.clusters[name].service_account_keys[m.node] = "-----BEGIN PUBLIC KEY-----\nMFkw\n-----END PUBLIC KEY-----\n"
    compiled = compile_desired(model, state, now=NOW)
    return compiled.state, converged(compiled.desired, compiled.state, model, now=NOW)


def _with_pod(observed: ObservedState, node: str, change) -> ObservedState:
    """`observed` with `node`'s pod replaced by `change(pod)`."""
    hvs = {}
    for name, hv in observed.hypervisors.items():
        pods = tuple(change(p) if p.node == node else p for p in hv.pods)
        hvs[name] = ObservedHypervisor(name, hv.reachable, hv.error, pods)
    return ObservedState(hvs, clusters=observed.clusters)


def _files_written(model, state, observed, extra: dict[str, str]) -> ObservedState:
    """As after a run that wrote the node's new files (and `extra`) and changed no container."""
    desired = compile_desired(model, state, now=NOW).desired.pods[NODE]

    def written(pod: ObservedPod) -> ObservedPod:
        digests = {**pod.files.digests, **{f.name: f.digest for f in desired.files},
                   **{name: file_digest(text) for name, text in extra.items()}}
        return dataclasses.replace(pod, files=dataclasses.replace(pod.files, digests=digests))
    return _with_pod(observed, NODE, written)


def test_a_keepalived_configuration_change_reloads_it_in_place_once(model):
    state, observed = _settled(model)
    assert make_plan(model, RepoConfig(), state, observed, now=NOW).plan.actions == ()
    hv = state.nodes[NODE].hypervisor
    # the hypervisor's interface changes: only keepalived.conf of its ingress node reads it
    changed = dataclasses.replace(model, hypervisors={**model.hypervisors,
                                                      hv: dataclasses.replace(model.hypervisors[hv], interface="eth1")})
    plan = make_plan(changed, RepoConfig(), state, observed, now=NOW).plan
    mine = [a for a in plan.actions if a.node == NODE]
    assert [(a.kind, a.component) for a in mine] == [(Kind.WRITE_FILES, ""), (Kind.RELOAD_CONTAINER, "keepalived")]
    assert [a for a in plan.actions if a.node != NODE] == []
    reload = mine[1]
    pod = next(p for p in observed.hypervisors[hv].pods if p.node == NODE)
    running = pod.running("keepalived")
    want = compile_desired(changed, state, now=NOW).desired.pods[NODE]
    new_hash = next(c.spec_hash for c in want.containers if c.spec.name == "keepalived")
    assert new_hash != running.spec_hash
    assert reload.payload == Reload(reload.payload.pod, running.id, ("kill", "-HUP", "1"), "keepalived.reloaded",
                                    reloaded_record(running.id, new_hash))
    assert payload_from_dict(payload_to_dict(reload.payload)) == reload.payload  # (a saved plan carries it)
    assert "file keepalived.conf: content changed" in mine[0].details
    assert reload.details[-1] == "runs: kill -HUP 1"

    # killed after the files were written, before the reload: the next plan reloads
    written = _files_written(changed, state, observed, {})
    assert [a.kind for a in make_plan(changed, RepoConfig(), state, written, now=NOW).plan.actions] == [
        Kind.RELOAD_CONTAINER]
    # reloaded and recorded: nothing left to do, and the node's status says it runs its spec
    done = _files_written(changed, state, observed, {"keepalived.reloaded": reloaded_record(running.id, new_hash)})
    assert make_plan(changed, RepoConfig(), state, done, now=NOW).plan.actions == ()
    pod_done = next(p for p in done.hypervisors[hv].pods if p.node == NODE)
    phase, components = node_phase(want, done, pod_done, Outcome("c0ffee", Result.APPLIED))
    assert components["keepalived"] == "running", (phase, components)
    # a record of another container (one that ran before) counts for nothing
    other = _files_written(changed, state, observed, {"keepalived.reloaded": reloaded_record("c-old", new_hash)})
    assert [a.kind for a in make_plan(changed, RepoConfig(), state, other, now=NOW).plan.actions] == [
        Kind.RELOAD_CONTAINER]


def test_keepalived_is_replaced_when_more_than_its_files_change_or_it_is_not_running(model):
    state, observed = _settled(model)
    image = dataclasses.replace(model, clusters={**model.clusters, "team-a": dataclasses.replace(
        model.clusters["team-a"], image_overrides={**model.clusters["team-a"].image_overrides,
                                                   "keepalived": "example/keepalived:2"})})
    plan = make_plan(image, RepoConfig(), state, observed, now=NOW).plan
    assert {(a.node, a.kind) for a in plan.actions if a.component == "keepalived"} == {
        (NODE, Kind.RECREATE_CONTAINER), ("team-a-ingress-2", Kind.RECREATE_CONTAINER)}

    def exited(pod: ObservedPod) -> ObservedPod:
        return dataclasses.replace(pod, containers=tuple(
            dataclasses.replace(c, state="exited") if c.component == "keepalived" else c for c in pod.containers))
    hv = state.nodes[NODE].hypervisor
    changed = dataclasses.replace(model, hypervisors={**model.hypervisors,
                                                      hv: dataclasses.replace(model.hypervisors[hv], interface="eth1")})
    plan = make_plan(changed, RepoConfig(), state, _with_pod(observed, NODE, exited), now=NOW).plan
    assert [(a.kind, a.component) for a in plan.actions if a.node == NODE] == [
        (Kind.WRITE_FILES, ""), (Kind.RECREATE_CONTAINER, "keepalived")]


def test_nothing_but_keepalived_reloads(model):
    """haproxy's configuration changes replace it beside itself (OVERLAP): its port never closes."""
    from gitops.model.components import COMPONENTS, RELOAD
    assert [c.name for c in COMPONENTS.values() if c.rollout == RELOAD] == ["keepalived"]
    assert all(c.reload for c in COMPONENTS.values() if c.rollout == RELOAD)


def test_a_moved_ingress_nodes_peers_reload_before_its_new_keepalived_starts(model):
    """The node moved sorts first by name: its new keepalived still starts after the other's reload."""
    public_3 = dataclasses.replace(model.hypervisors["hv-public-1"], name="hv-public-3", ip_address="127.0.10.10")
    wide = dataclasses.replace(model, hypervisors={**model.hypervisors, "hv-public-3": public_3})
    state, observed = _settled(wide)
    used = {state.nodes[n].hypervisor for n in (NODE, "team-a-ingress-2")}
    target = next(h for h in ("hv-public-1", "hv-public-2", "hv-public-3") if h not in used)
    moved = dataclasses.replace(wide, nodes={**wide.nodes, NODE: dataclasses.replace(wide.nodes[NODE],
                                                                                    hypervisor=target)})
    plan = make_plan(moved, RepoConfig(), state, observed, now=NOW).plan
    steps = [(a.kind, a.node, a.component) for a in plan.actions if a.cluster == "team-a"]
    reload = steps.index((Kind.RELOAD_CONTAINER, "team-a-ingress-2", "keepalived"))
    start = steps.index((Kind.CREATE_CONTAINER, NODE, "keepalived"))
    assert reload < start, steps
    assert (Kind.REMOVE_POD, NODE, "") in steps
