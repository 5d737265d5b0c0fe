"""Diffing desired against observed state (pure): actions, reasons, order, safety rules.

The observed states here are built from the compiled desired state the way
`gitops.observe` would report a converged hypervisor; the end-to-end tests on
real containerd (test_apply_lab.py) cover observation itself.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import io
import json
import re

import pytest
from repo_helpers import EXAMPLE_REPO
from rich.console import Console

from gitops.compile import compile_desired
from gitops.compile.clusters import COMPILED_CLUSTERS
from gitops.compile.authorities import authority
from gitops.compile.desired import DesiredState
from gitops.engine import MassDeleteRefused, apply_repo, make_plan
from gitops.model.config import BareMetalSource, RepoConfig
from gitops.model.resources import ClusterBackup
from gitops.model.validate import validate_repo
from gitops.observe.types import ObservedCluster, ObservedContainer, ObservedHypervisor, ObservedPod, ObservedState
from gitops.compile.bootstrap import bootstrap_objects
from gitops.pki import cert_to_pem, generate_key, sign_public_key
from gitops.plan.actions import Kind, Plan, Unknown, UnknownKind
from gitops.pki.facts import CERTIFICATE_FACTS
from gitops.plan.diff import certificates_read
from gitops.plan.clusters import CLUSTER_DIFFS
from gitops.plan.render import headline, render_json, render_markdown, render_text
from gitops.pods import NodeFiles, file_digest
from gitops.state import LocalDirStore, State

NOW = dt.datetime(2026, 11, 1, tzinfo=dt.timezone.utc)
SA_KEY = "-----BEGIN PUBLIC KEY-----\nMFkw\n-----END PUBLIC KEY-----\n"


@pytest.fixture(scope="module")
def repo():
    """The example repo without its SIPCluster: these tests are about pods (SIP has its own test below)."""
    result = validate_repo(EXAMPLE_REPO)
    assert result.model is not None
    return dataclasses.replace(result, model=dataclasses.replace(result.model, sip_clusters={}))


def nothing_observed(model) -> ObservedState:
    return ObservedState({n: ObservedHypervisor(n, True) for n in model.hypervisors})


#: objects gitops keeps in each cluster's API (RBAC, cluster-info: gitops.compile.bootstrap)
OBJECTS = len(bootstrap_objects("https://127.0.0.1:6443", "CA"))


def converged(desired: DesiredState, state: State, model, now=NOW) -> ObservedState:
    """What observe() reports once every desired pod runs with all its files."""
    pods: dict[str, list[ObservedPod]] = {n: [] for n in model.hypervisors}
    for i, pod in enumerate(desired.pods.values()):
        certs = {}
        for spec in pod.certificates:
            authorities = state.clusters[pod.cluster].authorities
            cert = sign_public_key(authority(authorities, spec.signer), generate_key().public_key(), spec.common_name,
                                   organizations=spec.organizations, dns_names=spec.dns_names,
                                   ip_addresses=spec.ip_addresses, server=spec.server, client=spec.client,
                                   days=365, now=now)
            certs[spec.name] = cert_to_pem(cert) + dict(pod.chains).get(spec.name, "")
        digests = {**{f.name: f.digest for f in pod.files}, **{f"{n}.crt": file_digest(c) for n, c in certs.items()}}
        files = NodeFiles(digests=digests, certificates=certs,
                          keys=tuple(sorted([*certs, *(k.name for k in pod.keys)])),
                          public_keys={"sa": SA_KEY} if pod.keys else {})
        containers = tuple(ObservedContainer(
            f"c-{pod.node}-{c.spec.name}", c.spec.name, "running", c.spec_hash, i,
            json.loads(c.spec.annotations["gitops.infra/spec"]),
            json.dumps({n: digests[f"{n}.crt"] for n in sorted(certificates_read(pod, c))}))
            for c in pod.containers)
        pods[pod.hypervisor].append(ObservedPod(f"s-{pod.node}", pod.node, pod.cluster, pod.role, pod.hypervisor,
                                                True, pod.sandbox.labels["gitops.infra/spec-hash"], i,
                                                containers, files))
    clusters = {name: ObservedCluster(name, True, objects={o.key: o.spec_hash for o in cluster.objects})
                for name, cluster in desired.clusters.items()}
    return ObservedState({n: ObservedHypervisor(n, True, "", tuple(p)) for n, p in pods.items()}, clusters=clusters)


def settle(model, config=RepoConfig(), now=NOW):
    """Plan from nothing, then record what apply would: bootstrap members and service-account keys."""
    first = make_plan(model, config, State(), nothing_observed(model), now=now)
    state = first.state.copy()
    for name, cluster in first.compiled.desired.clusters.items():
        state.clusters[name].etcd_members = [m.node for m in cluster.etcd_members]
        for m in cluster.etcd_members:
            state.clusters[name].service_account_keys[m.node] = SA_KEY
    compiled = compile_desired(model, state, now=now)
    return compiled.state, converged(compiled.desired, compiled.state, model, now=now)


def test_empty_hypervisors_plan_every_pod_in_order(repo):
    planned = make_plan(repo.model, repo.repo.config, State(), nothing_observed(repo.model), now=NOW)
    kinds = [a.kind for a in planned.plan.actions if a.node == "team-a-cp-1"]
    assert kinds == [Kind.CREATE_POD, Kind.GENERATE_KEYS, Kind.WRITE_FILES] + [Kind.CREATE_CONTAINER] * 4
    components = [a.component for a in planned.plan.actions if a.node == "team-a-cp-1" and a.component]
    assert components == ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"]
    assert not [a for a in planned.plan.actions if a.kind == Kind.ETCD_MEMBER_ADD]  # bootstrap: start together
    # all pods before any key, all keys before any file, files before containers
    phases = [a.kind for a in planned.plan.actions]
    assert phases.index(Kind.GENERATE_KEYS) > max(i for i, k in enumerate(phases) if k == Kind.CREATE_POD)
    # pods (6 control-plane, 4 ingress), keys, containers (4 per control-plane node, haproxy and keepalived per
    # ingress node), etcd promotions; then the worker-bootstrap objects in each cluster's API
    assert planned.plan.summary() == {"add": 10 + 6 + 6 * 4 + 4 * 2 + 2 * OBJECTS, "change": 10, "remove": 0}


def test_converged_state_plans_nothing(repo):
    state, observed = settle(repo.model)
    planned = make_plan(repo.model, repo.repo.config, state, observed, now=NOW)
    assert planned.plan.actions == ()
    assert planned.plan.warnings == ()


def test_drift_missing_and_exited_containers_are_healed(repo):
    state, observed = settle(repo.model)
    hv = observed.hypervisors["hv-public-1"]
    ingress = next(p for p in hv.pods if p.node == "team-a-ingress")
    without_haproxy = dataclasses.replace(ingress, containers=tuple(c for c in ingress.containers
                                                                    if c.component != "haproxy"))
    pods = tuple(without_haproxy if p is ingress else p for p in hv.pods)
    observed.hypervisors["hv-public-1"] = dataclasses.replace(hv, pods=pods)
    hv2 = observed.hypervisors["hv-private-1"]
    pod = hv2.pods[0]
    exited = tuple(dataclasses.replace(c, state="exited") if c.component == "etcd" else c for c in pod.containers)
    observed.hypervisors["hv-private-1"] = dataclasses.replace(
        hv2, pods=(dataclasses.replace(pod, containers=exited), *hv2.pods[1:]))
    actions = make_plan(repo.model, repo.repo.config, state, observed, now=NOW).plan.actions
    # missing containers first, then running ones replaced (in the supported rolling order)
    assert [(a.kind, a.node, a.component, a.reason) for a in actions] == [
        (Kind.CREATE_CONTAINER, "team-a-ingress", "haproxy", "container is missing"),
        (Kind.RECREATE_CONTAINER, pod.node, "etcd", "container is exited"),
    ]


def test_spec_change_names_the_changed_fields(repo):
    state, observed = settle(repo.model)
    cluster = repo.model.clusters["team-b"]
    changed = dataclasses.replace(cluster, image_overrides={"etcd": "registry.example.com/etcd:3.6.17-0"},
                                  service_cidr="10.112.0.0/13")
    model = dataclasses.replace(repo.model, clusters={**repo.model.clusters, "team-b": changed})
    actions = make_plan(model, repo.repo.config, state, observed, now=NOW).plan.actions
    etcd = [a for a in actions if a.component == "etcd"]
    assert {a.node for a in etcd} == {"team-b-cp-1", "team-b-cp-2", "team-b-cp-3"}
    assert all(a.kind == Kind.RECREATE_CONTAINER and a.reason == "spec changed" for a in etcd)
    assert "image: 'registry.k8s.io/etcd:3.6.16-0' -> 'registry.example.com/etcd:3.6.17-0'" in etcd[0].details
    # each API server talks to its own member only: it stops before that member changes, and its own
    # change is made by the start right after it (node by node), ready before the next member goes
    assert [(a.kind, a.node, a.component) for a in actions] == [
        step for n in (1, 2, 3) for step in ((Kind.REMOVE_CONTAINER, f"team-b-cp-{n}", "kube-apiserver"),
                                             (Kind.RECREATE_CONTAINER, f"team-b-cp-{n}", "etcd"),
                                             (Kind.CREATE_CONTAINER, f"team-b-cp-{n}", "kube-apiserver"))] + [
        (Kind.RECREATE_CONTAINER, f"team-b-cp-{n}", "kube-controller-manager") for n in (1, 2, 3)]
    stop, _, api = actions[:3]
    assert stop.payload.target_id == stop.target_id and stop.target_id
    assert any(d.startswith("args[24]: '--service-cluster-ip-range=10.112.0.0/12' -> ") for d in api.details), \
        api.details
    assert api.reason == "spec changed; starts after its etcd member" and api.payload.ready is not None
    # the service IP is unchanged (10.112.0.1), so the serving certificate needs no reissue
    assert not [a for a in actions if a.kind == Kind.WRITE_FILES]
    assert not [a for a in actions if a.cluster == "team-a"]


def test_a_missing_api_server_starts_after_its_etcd_member_changes(repo):
    """A run killed between stopping an API server and its member's recreate: the next plan starts the API
    server after the member, not before (it would meet its only member shutting down)."""
    state, observed = settle(repo.model)
    hv = next(h for h in observed.hypervisors.values() if any(p.node == "team-b-cp-1" for p in h.pods))
    gone = dataclasses.replace(observed, hypervisors={**observed.hypervisors, hv.name: dataclasses.replace(
        hv, pods=tuple(dataclasses.replace(p, containers=tuple(c for c in p.containers
                                                                if c.component != "kube-apiserver"))
                       if p.node == "team-b-cp-1" else p for p in hv.pods))})
    cluster = dataclasses.replace(repo.model.clusters["team-b"], image_overrides={"etcd": "lab/etcd:next"})
    model = dataclasses.replace(repo.model, clusters={**repo.model.clusters, "team-b": cluster})
    actions = make_plan(model, repo.repo.config, state, gone, now=NOW).plan.actions
    assert [(a.kind, a.component) for a in actions if a.node == "team-b-cp-1"] == [
        (Kind.RECREATE_CONTAINER, "etcd"), (Kind.CREATE_CONTAINER, "kube-apiserver")]
    start = next(a for a in actions if a.node == "team-b-cp-1" and a.component == "kube-apiserver")
    assert start.reason == "container is missing" and start.payload.ready is not None
    assert actions.index(start) < next(i for i, a in enumerate(actions) if a.node == "team-b-cp-2")


@pytest.mark.parametrize("state_of_etcd", ["created", "exited"])
def test_a_missing_api_server_starts_after_its_stopped_etcd_member(repo, state_of_etcd):
    """A run killed inside an etcd member's recreate, while CRI started the new container (it stays `created`,
    or ends `exited`: the start was cancelled), after its API server was stopped: the next plan starts that
    member again first, and only then its API server (whose /readyz needs its member), on each node."""
    state, observed = settle(repo.model)

    def stopped(pod):
        return dataclasses.replace(pod, containers=tuple(
            dataclasses.replace(c, state=state_of_etcd) if c.component == "etcd" else c
            for c in pod.containers if c.component != "kube-apiserver"))
    actions = make_plan(repo.model, repo.repo.config, state, _with_pod(observed, "team-b-cp-1", stopped),
                        now=NOW).plan.actions
    mine = [(a.kind, a.component, a.reason) for a in actions if a.node == "team-b-cp-1"]
    assert mine == [(Kind.RECREATE_CONTAINER, "etcd", f"container is {state_of_etcd}"),
                    (Kind.CREATE_CONTAINER, "kube-apiserver", "container is missing")], mine
    start = next(a for a in actions if a.component == "kube-apiserver")
    assert start.payload.ready is not None  # the cluster serves: ready before the plan goes on


def test_without_a_quorum_every_stopped_member_starts_before_any_api_server(repo):
    """Two of three members exited and an API server change in the same plan: the API servers, each gated
    on a /readyz that needs a quorum, roll only after every member started again (not each right after
    its own member, which would wait for the member started after it)."""
    state, observed = settle(repo.model)
    down = _etcd_exited(_etcd_exited(observed, "team-b-cp-1"), "team-b-cp-2")
    changed = dataclasses.replace(repo.model.clusters["team-b"], api_server_args=(("event-ttl", "2h0m0s"),))
    model = dataclasses.replace(repo.model, clusters={**repo.model.clusters, "team-b": changed})
    actions = [a for a in make_plan(model, repo.repo.config, state, down, now=NOW).plan.actions
               if a.cluster == "team-b"]
    assert [(a.kind, a.node, a.component) for a in actions] == [
        (Kind.RECREATE_CONTAINER, "team-b-cp-1", "etcd"), (Kind.RECREATE_CONTAINER, "team-b-cp-2", "etcd")] + [
        (Kind.RECREATE_CONTAINER, f"team-b-cp-{n}", "kube-apiserver") for n in (1, 2, 3)]


def test_a_missing_files_agent_starts_before_the_files_it_writes(repo):
    """A run killed between a pod's sandbox and its files agent: the next plan starts the agent before the
    keys and files that go through it (and that cannot be checked without it)."""
    state, observed = settle(repo.model)
    hv = next(h for h in observed.hypervisors.values() if any(p.node == "team-b-cp-1" for p in h.pods))
    bare = dataclasses.replace(observed, hypervisors={**observed.hypervisors, hv.name: dataclasses.replace(
        hv, pods=tuple(dataclasses.replace(p, files=None, containers=()) if p.node == "team-b-cp-1" else p
                       for p in hv.pods))})
    actions = make_plan(repo.model, repo.repo.config, state, bare, now=NOW).plan.actions
    mine = [(a.kind, a.component) for a in actions if a.node == "team-b-cp-1"]
    assert mine[:2] == [(Kind.CREATE_CONTAINER, "files"), (Kind.WRITE_FILES, "")], mine
    assert [c for _, c in mine[2:]] == ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"]


def test_an_api_server_flag_rolls_the_api_servers_only(repo):
    state, observed = settle(repo.model)
    changed = dataclasses.replace(repo.model.clusters["team-b"], api_server_args=(("event-ttl", "2h0m0s"),))
    model = dataclasses.replace(repo.model, clusters={**repo.model.clusters, "team-b": changed})
    actions = make_plan(model, repo.repo.config, state, observed, now=NOW).plan.actions
    assert [(a.kind, a.node, a.component) for a in actions] == [
        (Kind.RECREATE_CONTAINER, f"team-b-cp-{n}", "kube-apiserver") for n in (1, 2, 3)]
    assert all(a.payload.ready is not None and "args[30]: added" in a.details for a in actions), actions[0].details


def test_removed_node_is_pruned_after_leaving_etcd(repo):
    state, observed = settle(repo.model)
    nodes = {k: v for k, v in repo.model.nodes.items() if k != "team-a-cp-3"}
    model = dataclasses.replace(repo.model, nodes=nodes)
    plan = make_plan(model, repo.repo.config, state, observed, now=NOW).plan
    drain, first, second = plan.actions[:3]
    # its API server talks to its own member only: it stops (leaving the ingress) before the member leaves
    assert (drain.kind, drain.node, drain.component) == (Kind.REMOVE_CONTAINER, "team-a-cp-3", "kube-apiserver")
    assert drain.payload.target_id == next(c.id for p in observed.hypervisors[drain.hypervisor].pods
                                           if p.node == "team-a-cp-3" for c in p.containers
                                           if c.component == "kube-apiserver")
    assert (first.kind, first.node) == (Kind.ETCD_MEMBER_REMOVE, "team-a-cp-3")
    assert (second.kind, second.node, second.prune) == (Kind.REMOVE_POD, "team-a-cp-3", True)
    assert second.reason == "Node team-a-cp-3 left the repo"
    # the rest of team-a: the ingress drops a backend, the API servers drop a service-account key
    rest = {(a.kind, a.node, a.component) for a in plan.actions[3:]}
    assert (Kind.RECREATE_CONTAINER, "team-a-ingress", "haproxy") in rest
    assert all(a.cluster == "team-a" for a in plan.actions)
    no_prune = make_plan(model, RepoConfig(prune=dataclasses.replace(RepoConfig().prune, enabled=False)),
                         state, observed, now=NOW).plan
    assert not [a for a in no_prune.actions if a.kind == Kind.REMOVE_POD]
    assert any("pruning is disabled" in w for w in no_prune.warnings)


def _etcd_exited(observed: ObservedState, node: str) -> ObservedState:
    """`observed` with `node`'s etcd container exited (its hypervisor answers)."""
    def pod(p):
        if p.node != node:
            return p
        return dataclasses.replace(p, containers=tuple(dataclasses.replace(c, state="exited")
                                                       if c.component == "etcd" else c for c in p.containers))
    return dataclasses.replace(observed, hypervisors={
        name: dataclasses.replace(hv, pods=tuple(pod(p) for p in hv.pods)) for name, hv in observed.hypervisors.items()})


def test_a_removal_that_would_break_etcd_quorum_is_refused_at_plan_time(repo):
    """team-a-cp-3 leaves the repo while cp-2's etcd is down: 1 of the 2 members that would stay runs, below
    their quorum of 2, so neither the member nor its pod is removed (a warning says which member must run
    first). With cp-3's own etcd down instead, removing it keeps 2 of 2 running: it goes."""
    state, observed = settle(repo.model)
    nodes = {k: v for k, v in repo.model.nodes.items() if k != "team-a-cp-3"}
    model = dataclasses.replace(repo.model, nodes=nodes)
    held = make_plan(model, repo.repo.config, state, _etcd_exited(observed, "team-a-cp-2"), now=NOW).plan
    assert not [a for a in held.actions if a.node == "team-a-cp-3"], held.actions
    assert ("cluster team-a: removing etcd member team-a-cp-3 would leave 1 of 2 members running, below the quorum "
            "of 2, so it is not removed: team-a-cp-2 must run again first") in held.warnings, held.warnings
    assert any(a.node == "team-a-cp-2" and a.component == "etcd" for a in held.actions)  # the dead member restarts
    dead = make_plan(model, repo.repo.config, state, _etcd_exited(observed, "team-a-cp-3"), now=NOW).plan
    assert [(a.kind, a.node) for a in dead.actions[:3]] == [(Kind.REMOVE_CONTAINER, "team-a-cp-3"),
                                                            (Kind.ETCD_MEMBER_REMOVE, "team-a-cp-3"),
                                                            (Kind.REMOVE_POD, "team-a-cp-3")]
    assert not [w for w in dead.warnings if "quorum" in w]


def test_unreachable_hypervisor_is_left_alone(repo):
    state, observed = settle(repo.model)
    observed.hypervisors["hv-private-2"] = ObservedHypervisor("hv-private-2", False, "CRI Version: unreachable")
    nodes = {k: v for k, v in repo.model.nodes.items() if state.nodes[k].hypervisor != "hv-private-2"}
    plan = make_plan(dataclasses.replace(repo.model, nodes=nodes), repo.repo.config, state, observed, now=NOW).plan
    assert not [a for a in plan.actions if a.hypervisor == "hv-private-2"]
    assert not [a for a in plan.actions if a.kind == Kind.ETCD_MEMBER_REMOVE]
    # the nodes that left the repo are still recorded there: the plan says they were not checked
    gone = tuple(sorted(set(repo.model.nodes) - set(nodes)))
    assert gone and all(n.startswith("team-") for n in gone)
    assert plan.unknowns == (Unknown(UnknownKind.HYPERVISOR, "hv-private-2", "CRI Version: unreachable", gone),)
    assert not plan.complete
    assert not [w for w in plan.warnings if "hv-private-2" in w]  # said once, as an unknown


def private_2_down(observed: ObservedState) -> ObservedState:
    error = "CRI ListPodSandbox: unreachable: failed to connect to all addresses [unix:/run/hv-2.sock]"
    hypervisors = {**observed.hypervisors, "hv-private-2": ObservedHypervisor("hv-private-2", False, error)}
    return dataclasses.replace(observed, hypervisors=hypervisors)


def text_of(plan: Plan) -> str:
    out = io.StringIO()
    render_text(plan, Console(file=out, highlight=False, soft_wrap=True, color_system=None))
    return out.getvalue()


def test_incomplete_plan_without_changes_says_what_is_unknown_in_every_rendering(repo):
    state, observed = settle(repo.model)
    there = sorted(n for n, r in state.nodes.items() if r.hypervisor == "hv-private-2")
    assert len(there) >= 3
    plan = make_plan(repo.model, repo.repo.config, state, private_2_down(observed), now=NOW).plan
    assert plan.actions == () and plan.empty and not plan.complete
    [unknown] = plan.unknowns
    assert (unknown.kind, unknown.name, unknown.nodes) == (UnknownKind.HYPERVISOR, "hv-private-2", tuple(there))
    assert unknown.error.startswith("CRI ListPodSandbox: unreachable")
    assert plan.warnings == ()  # the hypervisor is an unknown, not a warning as well

    summary = "No changes in what could be checked. Incomplete: 1 hypervisor could not be observed."
    assert headline(plan) == summary
    line = (f"Unknown: hypervisor hv-private-2 is unreachable ({unknown.error}); nothing on it is planned; "
            f"its {len(there)} node(s) were not checked: {', '.join(there)}")
    text = text_of(plan)
    assert text.splitlines()[:2] == [summary, f"? {line}"]  # brackets in the error survive rich markup
    assert "No changes." not in text

    md = render_markdown(plan)
    assert f"**{summary}**" in md
    assert "**Unknown** (could not be observed: not checked, nothing planned there)" in md
    assert f"- :question: {line.removeprefix('Unknown: ')}" in md

    data = json.loads(render_json(plan))
    assert data["complete"] is False
    assert data["summary"] == {"add": 0, "change": 0, "remove": 0} and data["actions"] == []
    assert data["unknown"] == [{"kind": "hypervisor", "name": "hv-private-2", "error": unknown.error,
                                "nodes": there, "sip_clusters": []}]
    assert Unknown.from_dict(data["unknown"][0]) == unknown  # a saved plan can carry it back


def test_incomplete_plan_with_changes_keeps_its_counts_and_says_incomplete(repo):
    state, observed = settle(repo.model)
    hv = observed.hypervisors["hv-public-1"]
    ingress = next(p for p in hv.pods if p.node == "team-a-ingress")
    drifted = dataclasses.replace(ingress, containers=tuple(c for c in ingress.containers if c.component != "haproxy"))
    observed.hypervisors["hv-public-1"] = dataclasses.replace(
        hv, pods=tuple(drifted if p is ingress else p for p in hv.pods))
    plan = make_plan(repo.model, repo.repo.config, state, private_2_down(observed), now=NOW).plan
    assert [(a.kind, a.node, a.component) for a in plan.actions] == [
        (Kind.CREATE_CONTAINER, "team-a-ingress", "haproxy")]
    summary = "Plan: 1 to add, 0 to change, 0 to remove. Incomplete: 1 hypervisor could not be observed."
    assert headline(plan) == summary
    text = text_of(plan)
    assert text.startswith(summary + "\n? Unknown: hypervisor hv-private-2 is unreachable (")
    assert "+ create container haproxy: container is missing" in text
    assert f"**{summary}**" in render_markdown(plan)
    data = json.loads(render_json(plan))
    assert data["complete"] is False and [u["name"] for u in data["unknown"]] == ["hv-private-2"]
    # a complete plan says so
    complete = make_plan(repo.model, repo.repo.config, state, observed, now=NOW).plan
    assert complete.complete and complete.unknowns == ()
    assert headline(complete) == "Plan: 1 to add, 0 to change, 0 to remove."
    assert json.loads(render_json(complete))["complete"] is True
    assert "Unknown" not in text_of(complete) and "Unknown" not in render_markdown(complete)


def test_nodes_on_a_hypervisor_that_left_the_repo_are_unknown(repo):
    state, observed = settle(repo.model)
    orphan = dataclasses.replace(state.nodes["team-b-cp-3"], hypervisor="hv-retired")
    state.nodes["team-b-old"] = orphan
    plan = make_plan(repo.model, repo.repo.config, state, observed, now=NOW).plan
    assert plan.unknowns == (Unknown(UnknownKind.HYPERVISOR, "hv-retired",
                                     "it left the repo; put the Hypervisor back to clean up its pods",
                                     ("team-b-old",)),)
    assert not [a for a in plan.actions if a.node == "team-b-old" and a.kind == Kind.REMOVE_POD]
    assert headline(plan).endswith("Incomplete: 1 hypervisor could not be observed.")


def test_unlisted_bare_metal_hosts_are_unknown(repo):
    result = validate_repo(EXAMPLE_REPO)
    model = result.model
    config = dataclasses.replace(result.repo.config, bare_metal=BareMetalSource(provider="kubernetes"))
    state, observed = settle(dataclasses.replace(model, sip_clusters={}))
    assert observed.hosts is None  # the provider could not be listed
    plan = make_plan(model, config, state, observed, now=NOW).plan
    assert plan.unknowns == (Unknown(UnknownKind.BARE_METAL_HOSTS, "kubernetes", sip_clusters=("tenant-1",)),)
    assert headline(plan).endswith(" Incomplete: the BareMetalHosts could not be observed.")
    assert "? Unknown: BareMetalHosts could not be listed from the kubernetes provider; SIPCluster(s) not " \
           "planned: tenant-1" in text_of(plan)
    assert json.loads(render_json(plan))["unknown"] == [
        {"kind": "bare-metal-hosts", "name": "kubernetes", "error": "", "nodes": [], "sip_clusters": ["tenant-1"]}]
    both = make_plan(model, config, state, private_2_down(observed), now=NOW).plan
    assert [u.kind for u in both.unknowns] == [UnknownKind.HYPERVISOR, UnknownKind.BARE_METAL_HOSTS]
    assert "Incomplete: 1 hypervisor and the BareMetalHosts could not be observed." in headline(both)


def test_plan_without_unknowns_is_still_built_the_old_way():
    plan = Plan((), ("pruning is disabled",), "abc")
    assert plan.complete and plan.unknowns == ()
    assert headline(plan) == "No changes planned, with warnings (see below)."
    assert headline(Plan()) == "No changes. The live state matches the repo."


def test_expiring_certificate_is_renewed(repo):
    state, observed = settle(repo.model)
    later = NOW + dt.timedelta(days=340)  # 25 days before expiry, inside the 30-day window
    plan = make_plan(repo.model, repo.repo.config, state, observed, now=later).plan
    files = [a for a in plan.actions if a.kind == Kind.WRITE_FILES]
    assert len(files) == 6  # every controlplane node
    assert any(d.startswith("certificate etcd-server: expires 2027-11-01") for d in files[0].details)
    # every component reading a re-issued certificate restarts, after the files, in the rolling order: node
    # by node its etcd member with its API server stopped around it (restarting reads its own certificates),
    # then the controller-managers, then the schedulers
    restarts = [a for a in plan.actions if a.kind in (Kind.RECREATE_CONTAINER, Kind.REMOVE_CONTAINER,
                                                      Kind.CREATE_CONTAINER)]
    assert [(a.cluster, a.kind, a.component, a.node) for a in restarts] == [
        (cluster, *step, f"{cluster}-cp-{n}") for cluster in ("team-a", "team-b") for steps in (
            [(Kind.REMOVE_CONTAINER, "kube-apiserver"), (Kind.RECREATE_CONTAINER, "etcd"),
             (Kind.CREATE_CONTAINER, "kube-apiserver")],
            [(Kind.RECREATE_CONTAINER, "kube-controller-manager")], [(Kind.RECREATE_CONTAINER, "kube-scheduler")])
        for n in (1, 2, 3) for step in steps]
    assert max(plan.actions.index(a) for a in files) < plan.actions.index(restarts[0])
    scheduler = restarts[-1]
    assert scheduler.reason == "certificate scheduler re-issued: restarts to read it"  # through its kubeconfig
    assert "certificate etcd-peer, etcd-server re-issued" in restarts[1].reason
    assert restarts[2].reason.startswith("certificate apiserver, apiserver-etcd-client")
    assert restarts[1].payload.etcd is not None and restarts[2].payload.ready is not None  # gated, one at a time


def test_certificates_are_verified_once_per_content_and_still_checked_against_now(repo):
    state, observed = settle(repo.model)
    CERTIFICATE_FACTS.clear()
    assert make_plan(repo.model, repo.repo.config, state, observed, now=NOW).plan.actions == ()
    parsed = CERTIFICATE_FACTS.misses
    # every node certificate, and each cluster's admin certificate (compile checks it against its CA)
    assert parsed == sum(len(p.files.certificates) for p in observed.pods()) + len(repo.model.clusters)
    # the same certificates later: nothing parsed or verified again, yet the renewal window is the new one
    later = NOW + dt.timedelta(days=340)
    files = [a for a in make_plan(repo.model, repo.repo.config, state, observed, now=later).plan.actions
             if a.kind == Kind.WRITE_FILES]
    assert CERTIFICATE_FACTS.misses == parsed and len(files) == 6
    # a new authority: the same certificate content is checked against it, and refused
    rotated = state.copy()
    del rotated.clusters["team-a"].authorities["etcd"]
    plan = make_plan(repo.model, repo.repo.config, rotated, observed, now=NOW).plan
    details = [d for a in plan.actions if a.kind == Kind.WRITE_FILES and a.cluster == "team-a" for d in a.details]
    assert "certificate etcd-server: not signed by the current authority" in details
    assert CERTIFICATE_FACTS.misses > parsed


def test_a_plan_recompiles_only_the_clusters_whose_inputs_changed(repo):
    state, observed = settle(repo.model)
    COMPILED_CLUSTERS.clear()
    first = make_plan(repo.model, repo.repo.config, state, observed, now=NOW)
    assert COMPILED_CLUSTERS.misses == len(repo.model.clusters) and first.plan.actions == ()
    again = make_plan(repo.model, repo.repo.config, state, observed, now=NOW)
    assert COMPILED_CLUSTERS.misses == len(repo.model.clusters)
    assert again.compiled.desired == first.compiled.desired and again.compiled.state == first.compiled.state
    # an image override in team-a: only team-a is compiled again, and the plan is what a fresh compile gives
    cluster = repo.model.clusters["team-a"]
    changed = dataclasses.replace(repo.model, clusters={**repo.model.clusters, "team-a": dataclasses.replace(
        cluster, image_overrides={**cluster.image_overrides, "etcd": "registry.example.com/etcd:3.7.4-0"})})
    plan = make_plan(changed, repo.repo.config, state, observed, now=NOW).plan
    assert COMPILED_CLUSTERS.misses == len(repo.model.clusters) + 1
    COMPILED_CLUSTERS.clear()
    assert make_plan(changed, repo.repo.config, state, observed, now=NOW).plan == plan
    assert {(a.kind, a.cluster, a.component) for a in plan.actions} == {
        (Kind.RECREATE_CONTAINER, "team-a", "etcd"), (Kind.REMOVE_CONTAINER, "team-a", "kube-apiserver"),
        (Kind.CREATE_CONTAINER, "team-a", "kube-apiserver")}
    # a recorded port is an input too
    moved = state.copy()
    moved.nodes["team-b-cp-1"].ports["scheduler"] += 1000
    make_plan(repo.model, repo.repo.config, moved, observed, now=NOW)
    assert COMPILED_CLUSTERS.misses == len(repo.model.clusters) + 1


def test_a_plan_diffs_only_the_clusters_whose_inputs_changed(repo):
    state, observed = settle(repo.model)
    CLUSTER_DIFFS.clear()
    assert make_plan(repo.model, repo.repo.config, state, observed, now=NOW).plan.actions == ()
    clusters = CLUSTER_DIFFS.misses
    assert clusters == len(repo.model.clusters)
    assert make_plan(repo.model, repo.repo.config, state, observed, now=NOW).plan.actions == ()
    assert CLUSTER_DIFFS.misses == clusters  # nothing changed: every cluster's (empty) actions reused
    # a container exited in team-b: team-b alone is diffed again, and the plan heals it
    hv, pod = next((hv, p) for hv in observed.hypervisors.values() for p in hv.pods if p.node == "team-b-cp-1")
    exited = dataclasses.replace(pod, containers=tuple(dataclasses.replace(c, state="exited")
                                                       if c.component == "kube-scheduler" else c
                                                       for c in pod.containers))
    drift = dataclasses.replace(observed, hypervisors={**observed.hypervisors, hv.name: dataclasses.replace(
        hv, pods=tuple(exited if p is pod else p for p in hv.pods))})
    plan = make_plan(repo.model, repo.repo.config, state, drift, now=NOW).plan
    assert CLUSTER_DIFFS.misses == clusters + 1
    assert [(a.kind, a.node, a.component) for a in plan.actions] == [
        (Kind.RECREATE_CONTAINER, "team-b-cp-1", "kube-scheduler")]
    # the clock moves into the certificates' renewal window: the reused answers expire
    later = NOW + dt.timedelta(days=340)
    renew = make_plan(repo.model, repo.repo.config, state, observed, now=later).plan
    assert CLUSTER_DIFFS.misses == clusters * 2 + 1
    assert {a.kind for a in renew.actions} == {Kind.WRITE_FILES, Kind.RECREATE_CONTAINER, Kind.REMOVE_CONTAINER,
                                               Kind.CREATE_CONTAINER}
    # the same answer as a diff from scratch, whatever was reused
    CLUSTER_DIFFS.clear()
    assert make_plan(repo.model, repo.repo.config, state, observed, now=later).plan == renew
    assert make_plan(repo.model, repo.repo.config, state, drift, now=NOW).plan == plan


def test_mass_delete_is_refused_before_touching_anything(repo, tmp_path):
    state, observed = settle(repo.model)
    store = LocalDirStore(tmp_path)
    store.save(state)
    empty = dataclasses.replace(repo.model, nodes={}, clusters={})
    config = RepoConfig(prune=dataclasses.replace(RepoConfig().prune, max_deletes=3))
    with pytest.raises(MassDeleteRefused, match="removes 10 pods .* more than prune.maxDeletes=3"):
        apply_repo(empty, config, store, observe_fn=lambda m: observed)


def test_renderers(repo):
    plan = make_plan(repo.model, repo.repo.config, State(), nothing_observed(repo.model), now=NOW).plan
    md = render_markdown(plan)
    assert md.startswith(f"### gitops plan\n\n**Plan: {48 + 2 * OBJECTS} to add, 10 to change, 0 to remove.**")
    assert "#### Cluster `team-a`" in md and "```diff" in md
    assert "+ team-a-cp-1 on hv-private-1: create pod: pod does not exist" in md
    # the cluster's API comes after its nodes, once they run
    section = md.split("#### Cluster `team-a`")[1].split("#### Cluster")[0]
    assert section.index("team-a-ingress on") < section.index(
        "+ ClusterRoleBinding: create object gitops:kubelet-bootstrap: the cluster's API is new")
    data = json.loads(render_json(plan))
    assert data["summary"] == {"add": 48 + 2 * OBJECTS, "change": 10, "remove": 0}
    assert data["actions"][0]["kind"] == "create-pod"


def test_sip_host_labels_are_planned_and_applying_them_settles():
    from gitops.sip.providers import apply_change, provider_for

    result = validate_repo(EXAMPLE_REPO)
    model, config = result.model, result.repo.config
    # the example's services need hosts; here only the labels matter
    tenant = dataclasses.replace(model.sip_clusters["tenant-1"], load_balancer=None, jump_host=None)
    model = dataclasses.replace(model, sip_clusters={"tenant-1": tenant})
    state, observed = settle(dataclasses.replace(model, sip_clusters={}))
    planned = make_plan(model, config, state, observed, now=NOW)
    labels = [a for a in planned.plan.actions if a.kind == Kind.LABEL_HOST]
    assert [(a.node, a.reason) for a in labels] == [
        ("metal3/r01-node-01", "tenant-1/ControlPlane: selected as active"),
        ("metal3/r01-node-02", "tenant-1/Worker: selected as active"),
        ("metal3/r02-node-01", "tenant-1/ControlPlane: selected as standby"),
        ("metal3/r02-node-02", "tenant-1/Worker: selected as active"),
        ("metal3/r02-node-03", "tenant-1/Worker: selected as standby"),
    ]
    assert labels == list(planned.plan.actions)  # the pods are converged; only labels remain
    assert "set sip.airshipit.org/cluster-name=tenant-1" in labels[0].details
    state = planned.state.copy()
    for change in planned.sip.changes:
        apply_change(provider_for(model, config, state), change, state)
    again = make_plan(model, config, state, observed, now=NOW)
    assert again.plan.actions == ()
    assert state.sip_labels["metal3/r02-node-01"]["sip.airshipit.org/standby"] == "true"
    # the SIPCluster leaves the repo: every label it set is removed
    gone = make_plan(dataclasses.replace(model, sip_clusters={}), config, state, observed, now=NOW)
    assert len(gone.plan.actions) == 5
    assert all(a.kind == Kind.LABEL_HOST and a.details and all(d.startswith("remove ") for d in a.details)
               for a in gone.plan.actions)


def test_sip_services_are_pods_on_the_public_hypervisor_behind_the_host_labels():
    result = validate_repo(EXAMPLE_REPO)
    model, config = result.model, result.repo.config
    state, observed = settle(dataclasses.replace(model, sip_clusters={}))
    planned = make_plan(model, config, state, observed, now=NOW)
    services = {a.node for a in planned.plan.actions if a.cluster == "sip-tenant-1"}
    assert services == {"tenant-1-lb", "tenant-1-jump"}
    lb = planned.compiled.desired.pods["tenant-1-lb"]
    assert lb.hypervisor == "hv-public-1" and [c.spec.name for c in lb.containers] == ["files", "haproxy"]
    # no host is labeled yet, but the plan labels them: the load balancer already points at the active one
    assert "  server r01-node-01 127.0.20.11:6443 check" in lb.files[0].content
    state = planned.state.copy()
    from gitops.sip.providers import apply_change, provider_for

    for change in planned.sip.changes:
        apply_change(provider_for(model, config, state), change, state)
    after = make_plan(model, config, state, observed, now=NOW).compiled.desired.pods["tenant-1-lb"]
    assert "bind 127.0.10.1:30443" in after.files[0].content
    assert "  server r01-node-01 127.0.20.11:6443 check" in after.files[0].content  # the active ControlPlane host
    assert "r02-node-01" not in after.files[0].content  # the standby is not a backend
    jump = planned.compiled.desired.pods["tenant-1-jump"]
    keys = next(f for f in jump.files if f.name == "authorized_keys").content
    assert keys.startswith("ssh-ed25519 ") and keys.strip().endswith("ops@example.com")


def test_an_upgrade_rolls_component_by_component_and_never_skips_a_minor(repo):
    """Every component image changed (as an upgrade does): node by node its etcd member, with its API server
    (which talks to that member only) stopped before and started after on the new image, then the
    controller-managers, then the schedulers; a minor skipped or reverted is refused, of Kubernetes and of etcd."""
    from gitops.plan.upgrades import VersionSkew

    state, observed = settle(repo.model)
    cluster = repo.model.clusters["team-b"]
    images = {"etcd": "lab/etcd:next", "kubeApiserver": "lab/kube-apiserver:v1.36.3-next",
              "kubeControllerManager": "lab/kube-controller-manager:next", "kubeScheduler": "lab/kube-scheduler:next"}
    model = dataclasses.replace(repo.model, clusters={**repo.model.clusters,
                                                      "team-b": dataclasses.replace(cluster, image_overrides=images)})
    actions = make_plan(model, repo.repo.config, state, observed, now=NOW).plan.actions
    assert [(a.kind, a.component, a.node) for a in actions] == [
        *(step for n in (1, 2, 3) for step in (
            (Kind.REMOVE_CONTAINER, "kube-apiserver", f"team-b-cp-{n}"), (Kind.RECREATE_CONTAINER, "etcd", f"team-b-cp-{n}"),
            (Kind.CREATE_CONTAINER, "kube-apiserver", f"team-b-cp-{n}"))),
        *((Kind.RECREATE_CONTAINER, component, f"team-b-cp-{n}") for component in
          ("kube-controller-manager", "kube-scheduler") for n in (1, 2, 3))]
    assert all(a.payload.etcd is not None for a in actions[1:9:3])  # health-gated, one member at a time
    started = actions[2:9:3]  # each API server on its new image, ready before the next member goes
    assert all(a.payload.ready is not None and a.payload.container.image == "lab/kube-apiserver:v1.36.3-next"
               for a in started)
    for version, words in (("1.38.0", "upgrade one minor version at a time (v1.37 first)"),
                           ("1.35.4", "does not support downgrading a minor version")):
        skipped = dataclasses.replace(cluster, kubernetes_version=f"v{version}")
        model = dataclasses.replace(repo.model, clusters={**repo.model.clusters, "team-b": skipped})
        with pytest.raises(VersionSkew, match=rf"Cluster team-b runs v1\.36 and the repo asks for v{version}: .*{re.escape(words)}"):
            make_plan(model, repo.repo.config, state, observed, now=NOW)
    for etcd, words in (("3.8.0", "upgrade etcd one minor version at a time (3.7 first)"),
                        ("3.5.26", "etcd does not support downgrading a minor version")):
        skipped = dataclasses.replace(cluster, etcd_version=etcd)
        model = dataclasses.replace(repo.model, clusters={**repo.model.clusters, "team-b": skipped})
        with pytest.raises(VersionSkew, match=rf"Cluster team-b runs etcd 3\.6 and the repo asks for etcd "
                                              rf"{re.escape(etcd.rsplit('.', 1)[0])}: .*{re.escape(words)}"):
            make_plan(model, repo.repo.config, state, observed, now=NOW)
    # the next minor: refused without spec.backup (etcd's data is rewritten for good), naming where the versions
    # are written; with it, planned, the snapshot first
    one_minor = dataclasses.replace(cluster, kubernetes_version="v1.37.2", etcd_version="3.7.3")
    model = dataclasses.replace(repo.model, clusters={**repo.model.clusters, "team-b": one_minor})
    with pytest.raises(VersionSkew, match=r"^clusters/team-b/cluster\.yaml:\d+: Cluster team-b runs etcd 3\.6 and the "
                                          r"repo asks for etcd 3\.7: a new etcd minor version rewrites its data and "
                                          r"cannot be undone, so a snapshot is taken first: give the Cluster "
                                          r"spec\.backup \(a target of the repo's spec\.backup\.targets\)$"):
        make_plan(model, repo.repo.config, state, observed, now=NOW)
    backed_up = dataclasses.replace(one_minor, backup=ClusterBackup("local", 60, 3))
    model = dataclasses.replace(repo.model, clusters={**repo.model.clusters, "team-b": backed_up})
    actions = make_plan(model, repo.repo.config, state, observed, now=NOW).plan.actions
    assert (actions[0].kind, actions[0].cluster, actions[0].payload.target) == (Kind.BACKUP_ETCD, "team-b", "local")
    assert actions[0].reason == "before this plan replaces running etcd member team-b-cp-1"


def test_no_change_needing_an_unreachable_members_vote(repo):
    """issue #13: with an etcd member on an unreachable hypervisor, no node of its cluster gets a change that
    needs quorum (a running etcd replaced: with 1 of 3 members away, stopping a second loses quorum); the
    cluster's other changes and the other clusters go ahead."""
    state, healthy = settle(repo.model)
    observed = private_2_down(healthy)
    away = sorted(n for n, r in state.nodes.items() if r.hypervisor == "hv-private-2" and n.startswith("team-a-cp"))
    assert away  # team-a has a member there
    clusters = dict(repo.model.clusters)
    clusters["team-a"] = dataclasses.replace(clusters["team-a"], image_overrides={"etcd": "lab/etcd:next",
                                                                                 "kubeScheduler": "lab/sched:next"})
    clusters["team-b"] = dataclasses.replace(clusters["team-b"], image_overrides={"kubeScheduler": "lab/sched:next"})
    plan = make_plan(dataclasses.replace(repo.model, clusters=clusters), repo.repo.config, state, observed,
                     now=NOW).plan
    team_a = [(a.node, a.component) for a in plan.actions if a.cluster == "team-a"]
    assert not [c for _, c in team_a if c == "etcd"]  # held, with every action of those nodes
    held = [w for w in plan.warnings if w.startswith("cluster team-a: etcd member ")]
    assert len(held) == 1 and "is unreachable, so no change that needs its vote is made" in held[0], plan.warnings
    # team-b's scheduler changes only need no vote: they go ahead on its reachable nodes
    assert {a.component for a in plan.actions if a.cluster == "team-b"} == {"kube-scheduler"}
    # once the member answers again, the etcd roll is planned
    later = make_plan(dataclasses.replace(repo.model, clusters=clusters), repo.repo.config, state, healthy,
                      now=NOW).plan
    assert [a.node for a in later.actions if a.cluster == "team-a" and a.component == "etcd"] == \
        ["team-a-cp-1", "team-a-cp-2", "team-a-cp-3"]


def _with_pod(observed: ObservedState, node: str, change) -> ObservedState:
    """`observed` with the pod of `node` replaced by `change(pod)`."""
    hv = next(h for h in observed.hypervisors.values() if any(p.node == node for p in h.pods))
    pods = tuple(change(p) if p.node == node else p for p in hv.pods)
    return dataclasses.replace(observed, hypervisors={**observed.hypervisors, hv.name: dataclasses.replace(hv, pods=pods)})


def test_a_certificate_written_since_its_reader_started_restarts_it(repo):
    """A run stopped after writing a re-issued certificate and before restarting its readers: the next plan
    finds the file's digest differs from the one the running container recorded, and restarts it, gated."""
    state, observed = settle(repo.model)
    planned = make_plan(repo.model, repo.repo.config, state, observed, now=NOW)
    pod = next(p for p in planned.compiled.desired.pods.values() if p.node == "team-b-cp-1")
    readers = {c.spec.name: certificates_read(pod, c) for c in pod.containers}
    [name] = sorted(readers["etcd"] - set().union(*(r for c, r in readers.items() if c != "etcd")))[:1]
    later = _with_pod(observed, "team-b-cp-1", lambda p: dataclasses.replace(p, files=dataclasses.replace(
        p.files, digests={**p.files.digests, f"{name}.crt": "0123456789ab"})))
    actions = make_plan(repo.model, repo.repo.config, state, later, now=NOW).plan.actions
    mine = [a for a in actions if a.node == "team-b-cp-1"]
    # etcd restarts (its API server bracketed around it, as for any etcd restart); nothing is written
    assert {a.component for a in mine} == {"etcd", "kube-apiserver"} and Kind.WRITE_FILES not in {
        a.kind for a in mine}, mine
    [restart] = [a for a in mine if a.component == "etcd"]
    assert restart.reason == f"certificate {name} written since it started: restarts to read it"
    assert restart.payload.etcd is not None  # one member at a time, health-gated like any etcd restart
    assert dict(restart.payload.certificates)[name] == "0123456789ab"  # recorded when it starts again
    assert all(a.node == "team-b-cp-1" for a in actions)


def test_new_containers_record_their_certificates_known_after_apply(repo):
    """Certificates issued by the plan itself have digests known only after apply; the payload says so."""
    planned = make_plan(repo.model, repo.repo.config, State(), nothing_observed(repo.model), now=NOW)
    etcd = next(a for a in planned.plan.actions if a.node == "team-a-cp-1" and a.component == "etcd")
    assert etcd.payload.certificates and {d for _, d in etcd.payload.certificates} == {"(known after apply)"}
    assert etcd.payload.certificates_after_apply == tuple(n for n, _ in etcd.payload.certificates)


def test_a_dead_files_agent_is_restarted_without_reissuing_or_restarting(repo):
    """A running pod whose files agent died: the plan starts the agent again and checks the node's files
    once it runs (an unknown, known after apply); nothing is re-issued, no component restarts."""
    state, observed = settle(repo.model)
    dead = _with_pod(observed, "team-b-cp-1", lambda p: dataclasses.replace(p, files=None, containers=tuple(
        dataclasses.replace(c, state="exited") if c.component == "files" else c for c in p.containers)))
    plan = make_plan(repo.model, repo.repo.config, state, dead, now=NOW).plan
    assert [(a.kind, a.component, a.reason) for a in plan.actions] == [
        (Kind.RECREATE_CONTAINER, "files", "container is exited")]
    assert [(u.kind, u.nodes) for u in plan.unknowns] == [(UnknownKind.NODE_FILES, ("team-b-cp-1",))]
    assert headline(plan) == "Plan: 0 to add, 1 to change, 0 to remove. Incomplete: the files of 1 node could not " \
        "be observed."
    out = io.StringIO()
    render_text(plan, Console(file=out, highlight=False, soft_wrap=True, color_system=None))
    assert "files of team-b-cp-1: (known after apply)" in out.getvalue(), out.getvalue()
    # with no component running there is nothing to keep: the files are written whole, as for a new pod
    bare = _with_pod(observed, "team-b-cp-1", lambda p: dataclasses.replace(p, files=None, containers=tuple(
        dataclasses.replace(c, state="exited") for c in p.containers)))
    plan = make_plan(repo.model, repo.repo.config, state, bare, now=NOW).plan
    assert Kind.WRITE_FILES in [a.kind for a in plan.actions] and not plan.unknowns


def test_a_learner_left_by_a_stopped_run_is_promoted(repo):
    """A run stopped between adding a member as a learner and promoting it (the state records it as a
    learner): the next plan promotes it, and only that."""
    state, observed = settle(repo.model)
    state.clusters["team-b"].etcd_learners = ["team-b-cp-2"]
    actions = make_plan(repo.model, repo.repo.config, state, observed, now=NOW).plan.actions
    assert [(a.kind, a.node, a.reason) for a in actions] == [
        (Kind.ETCD_MEMBER_PROMOTE, "team-b-cp-2", "a learner added by an earlier run: it votes once it has caught up")]
    assert "team-b-cp-2" not in actions[0].payload.client_urls and actions[0].payload.client_url


def _with_backup(repo, cluster: str, change=lambda c: c, drop: tuple[str, ...] = (), backup: bool = True):
    """A plan for the settled example where `cluster` has spec.backup (or not), changed by `change`."""
    from gitops.model.resources import ClusterBackup
    state, observed = settle(repo.model)
    spec = dataclasses.replace(repo.model.clusters[cluster], backup=ClusterBackup("offsite", 60, 5) if backup else None)
    model = dataclasses.replace(repo.model, clusters={**repo.model.clusters, cluster: change(spec)},
                                nodes={k: v for k, v in repo.model.nodes.items() if k not in drop})
    return make_plan(model, repo.repo.config, state, observed, now=NOW).plan


def test_a_plan_that_changes_etcd_backs_it_up_first_when_the_cluster_asks(repo):
    """spec.backup (issue #29): membership, a running member replaced, or the API servers' image changed
    -> the cluster's first action snapshots its etcd; a flag of the API servers or no spec.backup -> none."""
    from gitops.plan.payloads import BackupEtcd, payload_from_dict, payload_to_dict
    removal = _with_backup(repo, "team-a", drop=("team-a-cp-3",))
    first = removal.actions[0]
    assert (first.kind, first.cluster, first.reason) == (Kind.BACKUP_ETCD, "team-a",
                                                         "before this plan changes etcd membership")
    # from the members that stay (the leaving one is not asked): recorded and still desired
    assert first.payload == BackupEtcd("offsite", 5, tuple(
        (f"team-a-cp-{n}", m.client_url) for n, m in zip((1, 2), _members(repo, "team-a"))))
    assert payload_from_dict(payload_to_dict(first.payload)) == first.payload
    assert first.details[-1] == "snapshot id: (known after apply)"
    assert [a.kind for a in removal.actions].count(Kind.BACKUP_ETCD) == 1
    assert not [a for a in _with_backup(repo, "team-a", drop=("team-a-cp-3",), backup=False).actions
                if a.kind == Kind.BACKUP_ETCD]
    etcd = _with_backup(repo, "team-b", lambda c: dataclasses.replace(c, image_overrides={"etcd": "lab/etcd:next"}))
    assert etcd.actions[0].reason == "before this plan replaces running etcd member team-b-cp-1"
    api = _with_backup(repo, "team-b", lambda c: dataclasses.replace(
        c, image_overrides={"kubeApiserver": "lab/kube-apiserver:v1.36.3-next"}))
    assert api.actions[0].reason == "before this plan changes the image of kube-apiserver on team-b-cp-1"
    flags = _with_backup(repo, "team-b", lambda c: dataclasses.replace(c, api_server_args=(("event-ttl", "2h0m0s"),)))
    assert Kind.BACKUP_ETCD not in {a.kind for a in flags.actions} and flags.actions
    text = text_of(removal)
    assert text.index("Backup:") < text.index("Node team-a-cp-3")
    assert "+ back up etcd: before this plan changes etcd membership" in text


def _members(repo, cluster: str):
    state, _ = settle(repo.model)
    return compile_desired(repo.model, state, now=NOW).desired.clusters[cluster].etcd_members


def _restoring(repo, value: str = "latest", snapshots: int = 2, restored: str = "", observed_change=None,
               listing_error: str = ""):
    """A plan for the settled example where team-a asks spec.restore.snapshot `value` from target
    offsite, which holds `snapshots` snapshots of it (listed unless `listing_error`)."""
    from gitops.backup.snapshot import Snapshot
    from gitops.model.resources import ClusterBackup, ClusterRestore
    from gitops.observe.types import SnapshotListing
    state, observed = settle(repo.model)
    state.clusters["team-a"].restored = restored
    spec = dataclasses.replace(repo.model.clusters["team-a"], backup=ClusterBackup("offsite", 60, 5),
                               restore=ClusterRestore(value))
    model = dataclasses.replace(repo.model, clusters={**repo.model.clusters, "team-a": spec})
    listed = tuple(Snapshot(f"{i:02d}" + "ab" * 31, NOW - dt.timedelta(hours=snapshots - i), "team-a", 100 * i,
                            1 << 20, "team-a-cp-2") for i in range(1, snapshots + 1))
    listing = SnapshotListing("offsite", () if listing_error else listed, listing_error)
    observed = dataclasses.replace(observed, snapshots={"team-a": listing})
    if observed_change is not None:
        observed = observed_change(observed)
    return make_plan(model, repo.repo.config, state, observed, now=NOW)


def test_a_restore_stops_the_control_plane_rewrites_every_member_then_starts_it_again(repo):
    """spec.restore (issue #29.2): one restore-etcd action naming the snapshot, what is lost and the
    token, stopping API servers before etcd; then every etcd member starts (the last waits for a quorum),
    then each API server (waiting for its /readyz), controller-managers and schedulers; team-b untouched."""
    from gitops.plan.payloads import CreateContainer, RestoreEtcd, payload_from_dict, payload_to_dict
    planned = _restoring(repo)
    actions = [a for a in planned.plan.actions if a.cluster == "team-a"]
    assert not [a for a in planned.plan.actions if a.cluster != "team-a"]
    restore = actions[0]
    assert restore.kind == Kind.RESTORE_ETCD and restore.reason == "spec.restore.snapshot: latest (the newest: 02ababab)"
    p = restore.payload
    assert isinstance(p, RestoreEtcd) and p.snapshot.startswith("02") and p.record == "latest"
    assert p.token == "gitops-team-a-restore-02ababab"
    assert [m.node for m in p.members] == ["team-a-cp-1", "team-a-cp-2", "team-a-cp-3"]
    assert p.initial_cluster.count("=https://") == 3
    assert all(m.restorer.args[:3] == ("snapshot", "restore", "/node/restore/snapshot.db") and m.pod.agent_id
               for m in p.members)
    # API servers stop first, etcd members last; every control-plane container of every member
    stopped = [cid.split("-", 5)[-1] for _, cid in p.stop]
    assert stopped == ["kube-apiserver"] * 3 + ["kube-controller-manager"] * 3 + ["kube-scheduler"] * 3 + ["etcd"] * 3
    assert any(d.startswith("LOST: every change to the cluster's API after 2026-11-01T00:00:00+00:00 (revision 200)")
               for d in restore.details)
    assert payload_from_dict(payload_to_dict(p)) == p
    starts = [(a.kind, a.component, a.node) for a in actions[1:]]
    assert starts == [(Kind.CREATE_CONTAINER, c, f"team-a-cp-{n}") for c in
                      ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler") for n in (1, 2, 3)]
    gates = {(a.component, a.node): a.payload for a in actions[1:]}
    assert isinstance(gates[("etcd", "team-a-cp-3")], CreateContainer)
    assert gates[("etcd", "team-a-cp-3")].etcd.peers == () and gates[("etcd", "team-a-cp-1")].etcd is None
    assert all(gates[("kube-apiserver", f"team-a-cp-{n}")].ready.url.endswith("/readyz") for n in (1, 2, 3))
    text = text_of(planned.plan)
    assert "~ restore etcd: spec.restore.snapshot: latest" in text
    assert text.index("Restore:") < text.index("Node team-a-cp-1")


def test_a_restore_runs_once_per_value_and_waits_until_it_can_run_whole(repo):
    """Recorded as restored: no action. A snapshot id that is not there, a listing that failed, or a
    member's files agent not running: no restore, and a warning saying why and what it waits for."""
    assert not _restoring(repo, restored="latest").plan.actions
    named = _restoring(repo, "01abab").plan
    assert named.actions[0].kind == Kind.RESTORE_ETCD and named.actions[0].payload.snapshot.startswith("01abab")
    missing = _restoring(repo, "deadbeef").plan
    assert not missing.actions
    assert any("spec.restore.snapshot deadbeef waits: no single snapshot deadbeef of it in backup target offsite"
               in w for w in missing.warnings), missing.warnings
    failed = _restoring(repo, listing_error="wrong password").plan
    assert not failed.actions and any("cannot list the snapshots of backup target offsite: wrong password" in w
                                      for w in failed.warnings)

    def agent_exited(observed):
        return _with_pod(observed, "team-a-cp-2", lambda p: dataclasses.replace(p, containers=tuple(
            dataclasses.replace(c, state="exited") if c.component == "files" else c for c in p.containers)))
    held = _restoring(repo, observed_change=agent_exited).plan
    assert Kind.RESTORE_ETCD not in {a.kind for a in held.actions}
    assert any("the pod or files agent of team-a-cp-2 is not running" in w for w in held.warnings), held.warnings


def _moved(repo, change_model, change_observed=lambda o: o, state_and_observed=None):
    """A plan for the settled example after `change_model(model)` (and `change_observed`)."""
    state, observed = state_and_observed or settle(repo.model)
    model = change_model(repo.model)
    return make_plan(model, repo.repo.config, state, change_observed(observed), now=NOW)


def _hypervisor(model, name, **fields):
    return dataclasses.replace(model, hypervisors={**model.hypervisors,
                                                   name: dataclasses.replace(model.hypervisors[name], **fields)})


def _membership(plan: Plan, cluster: str) -> list[tuple]:
    return [(a.kind, a.node, a.hypervisor) for a in plan.actions if a.cluster == cluster
            and a.kind in (Kind.ETCD_MEMBER_REMOVE, Kind.ETCD_MEMBER_ADD, Kind.ETCD_MEMBER_PROMOTE,
                           Kind.REMOVE_POD, Kind.CREATE_POD)]


def test_a_join_before_a_move_in_the_same_plan_asks_only_members_that_vote(repo):
    """team-a-cp-1 joins and team-a-cp-2 moves learner-first in one plan (cp-1's join sorts first): the join
    asks the members that vote now, never cp-2's new member, which only joins after it (asking it timed
    out, and the next plan was the same: the cluster was stuck). Actions after cp-2's promotion ask it."""
    nodes = {n: v for n, v in repo.model.nodes.items() if n != "team-a-cp-1"}
    state, observed = settle(dataclasses.replace(repo.model, nodes=nodes))
    where = state.nodes["team-a-cp-2"].hypervisor
    other = next(h for h in ("hv-private-1", "hv-private-2") if h != where)

    def pin(model):
        node = model.nodes["team-a-cp-2"]
        return dataclasses.replace(model, nodes={**model.nodes, "team-a-cp-2": dataclasses.replace(
            node, hypervisor=other)})
    planned = _moved(repo, pin, state_and_observed=(state, observed))
    team_a = [a for a in planned.plan.actions if a.cluster == "team-a"]
    promotes = {a.node: a for a in team_a if a.kind == Kind.ETCD_MEMBER_PROMOTE}
    assert sorted(promotes) == ["team-a-cp-1", "team-a-cp-2"], _membership(planned.plan, "team-a")
    moved = promotes["team-a-cp-2"].payload.client_url
    add_1 = next(a for a in team_a if a.kind == Kind.ETCD_MEMBER_ADD and a.node == "team-a-cp-1")
    assert team_a.index(add_1) < team_a.index(promotes["team-a-cp-2"])
    assert moved not in add_1.payload.client_urls and moved not in promotes["team-a-cp-1"].payload.client_urls
    # cp-2's old member still votes from where it was: asked there (its host, its old client port)
    was = state.nodes["team-a-cp-2"]
    host = planned.state.nodes["team-a-cp-2"].leaving_peer.split("//")[1].rsplit(":", 1)[0]
    old_url = f"https://{host}:{was.ports['etcd-client']}"
    assert add_1.payload.client_urls == promotes["team-a-cp-1"].payload.client_urls and len(add_1.payload.client_urls) == 2
    assert old_url in add_1.payload.client_urls and add_1.details[-1] == "the 2 member(s) must be healthy first"
    leave = next(a for a in team_a if a.kind == Kind.ETCD_MEMBER_REMOVE)
    assert moved in leave.payload.client_urls and promotes["team-a-cp-1"].payload.client_url in leave.payload.client_urls


def test_a_node_placed_while_another_moves_learner_first_never_gets_the_old_pods_ports(repo):
    """team-a-cp-3 moves learner-first while team-a-cp-1 joins: cp-3's old pod keeps its host ports where it
    was until its member is removed, so cp-1, placed on that hypervisor, gets others (it got cp-3's old
    etcd ports: its peer URL was the old member's, taken by etcd for an existing member). The state keeps
    the old ports through the move, for the plans after this one."""
    nodes = {n: v for n, v in repo.model.nodes.items() if n != "team-a-cp-1"}
    state, observed = settle(dataclasses.replace(repo.model, nodes=nodes))
    old = state.nodes["team-a-cp-3"]
    other = next(h for h in ("hv-private-1", "hv-private-2") if h != old.hypervisor)

    def pin(model):
        node = model.nodes["team-a-cp-3"]
        return dataclasses.replace(model, nodes={**model.nodes, "team-a-cp-3": dataclasses.replace(
            node, hypervisor=other)})
    planned = _moved(repo, pin, state_and_observed=(state, observed))
    moved = planned.state.nodes["team-a-cp-3"]
    assert (moved.leaving_from, moved.leaving_ports) == (old.hypervisor, old.ports)
    for name, record in planned.state.nodes.items():
        if record.hypervisor == old.hypervisor:
            assert not set(record.ports.values()) & set(old.ports.values()), (name, record.ports, old.ports)
    assert planned.state.nodes["team-a-cp-1"].hypervisor == old.hypervisor  # the case: placed where cp-3 was
    again = State.parse(json.loads(json.dumps(planned.state.to_dict())))
    assert again.nodes["team-a-cp-3"].leaving_ports == old.ports


def test_a_member_pinned_elsewhere_joins_from_there_before_its_old_member_leaves(repo):
    """A controlplane node moved off a live hypervisor (issue #29.4) is the same name in a new place, moved
    learner-first: its new pod starts, its new member joins as a learner (etcd told of the old one under
    another name) and is promoted, its new API server is ready; only then its old API server leaves the
    ingress, its old member is removed (by peer URL: both carry the node's name) and its old pod wiped. The
    cluster keeps a spare vote throughout (without this, its new etcd started empty under a name etcd still
    knew at the old address)."""
    def pin(model):
        node = model.nodes["team-a-cp-1"]
        return dataclasses.replace(model, nodes={**model.nodes, "team-a-cp-1": dataclasses.replace(
            node, hypervisor="hv-private-2")})
    planned = _moved(repo, pin)
    assert _membership(planned.plan, "team-a") == [
        (Kind.CREATE_POD, "team-a-cp-1", "hv-private-2"), (Kind.ETCD_MEMBER_ADD, "team-a-cp-1", "hv-private-2"),
        (Kind.ETCD_MEMBER_PROMOTE, "team-a-cp-1", "hv-private-2"),
        (Kind.ETCD_MEMBER_REMOVE, "team-a-cp-1", "hv-private-1"), (Kind.REMOVE_POD, "team-a-cp-1", "hv-private-1")]
    mine = [(a.kind, a.hypervisor, a.component) for a in planned.plan.actions if a.node == "team-a-cp-1"
            and a.kind in (Kind.CREATE_CONTAINER, Kind.REMOVE_CONTAINER, Kind.ETCD_MEMBER_REMOVE)]
    assert mine[-3:-1] == [(Kind.CREATE_CONTAINER, "hv-private-2", "kube-scheduler"),
                           (Kind.REMOVE_CONTAINER, "hv-private-1", "kube-apiserver")], mine
    new_api = next(a for a in planned.plan.actions if a.node == "team-a-cp-1" and a.component == "kube-apiserver"
                   and a.kind == Kind.CREATE_CONTAINER)
    assert new_api.payload.ready is not None  # ready before the old one goes
    removal = next(a for a in planned.plan.actions if a.kind == Kind.REMOVE_POD)
    assert removal.payload.wipe_agent_id
    record = planned.state.nodes["team-a-cp-1"]
    assert (record.hypervisor, record.moved_from, record.leaving_from, record.etcd_initial_state) == (
        "hv-private-2", "hv-private-1", "hv-private-1", "existing")
    add = next(a for a in planned.plan.actions if a.kind == Kind.ETCD_MEMBER_ADD)
    leave = next(a for a in planned.plan.actions if a.kind == Kind.ETCD_MEMBER_REMOVE)
    assert leave.payload.peer_url == record.leaving_peer != add.payload.peer_url
    # etcd matches members by peer URL: the new one lists the old one too, under a name of its own
    assert record.etcd_initial_cluster.split(",").count(f"team-a-cp-1={add.payload.peer_url}") == 1
    assert f"team-a-cp-1.hv-private-1={record.leaving_peer}" in record.etcd_initial_cluster.split(",")
    assert len(record.etcd_initial_cluster.split(",")) == 4
    # the other two, and its own old member, which votes until it is removed (at its old client port)
    was = settle(repo.model)[0].nodes["team-a-cp-1"]
    old_url = f"https://{record.leaving_peer.split('//')[1].rsplit(':', 1)[0]}:{was.ports['etcd-client']}"
    assert len(add.payload.client_urls) == 3 and add.payload.client_urls[-1] == old_url, add.payload.client_urls
    assert old_url not in leave.payload.client_urls  # the one removed is not asked
    assert len(leave.payload.client_urls) == 3  # the new member among those that stay
    # its new pod generates a new service-account key: every API server trusts it in the same plan
    assert planned.state.clusters["team-a"].service_account_keys.get("team-a-cp-1") is None
    bundles = [f for a in planned.plan.actions if a.kind == Kind.WRITE_FILES for f in a.payload.files
               if f.name == "sa-pub.pem"]
    assert len(bundles) == 3 and all(f.bundle and f.bundle.generated == ("team-a-cp-1",) for f in bundles)
    text = text_of(planned.plan)
    assert "Node team-a-cp-1 on hv-private-1" in text and "Node team-a-cp-1 on hv-private-2" in text
    assert "remove etcd member: Node team-a-cp-1 moved to hv-private-2: its old member leaves once the new one " \
        "votes" in text


def test_a_learner_first_move_stopped_midway_goes_on_from_its_recorded_step(repo):
    """A run stopped during a learner-first move goes on from what the state records: the new member
    added as a learner (recorded a learner) -> its promotion, then the old member's removal; promoted
    (moved_from cleared, the old member still recorded) -> only the old member's removal."""
    def pin(model):
        node = model.nodes["team-a-cp-1"]
        return dataclasses.replace(model, nodes={**model.nodes, "team-a-cp-1": dataclasses.replace(
            node, hypervisor="hv-private-2")})
    model = pin(repo.model)
    planned = _moved(repo, pin)

    def plan_with(change):
        state = planned.state.copy()
        change(state)
        compiled = compile_desired(model, state, now=NOW)
        return make_plan(model, repo.repo.config, compiled.state, converged(compiled.desired, compiled.state, model),
                         now=NOW).plan
    learner = plan_with(lambda s: s.clusters["team-a"].etcd_learners.append("team-a-cp-1"))
    assert _membership(learner, "team-a") == [(Kind.ETCD_MEMBER_PROMOTE, "team-a-cp-1", "hv-private-2"),
                                              (Kind.ETCD_MEMBER_REMOVE, "team-a-cp-1", "hv-private-1")]
    voting = plan_with(lambda s: setattr(s.nodes["team-a-cp-1"], "moved_from", ""))
    assert _membership(voting, "team-a") == [(Kind.ETCD_MEMBER_REMOVE, "team-a-cp-1", "hv-private-1")]
    removal = next(a for a in voting.actions if a.kind == Kind.ETCD_MEMBER_REMOVE)
    assert removal.payload.peer_url == planned.state.nodes["team-a-cp-1"].leaving_peer


def test_a_drained_hypervisor_moves_one_member_of_a_cluster_at_a_time(repo):
    """spec.drain: every node leaves hv-private-1; of team-a's two members there, one moves in this
    plan and the other waits (a warning naming it) until the first has joined again."""
    drained = lambda m: _hypervisor(m, "hv-private-1", drain=True)  # noqa: E731
    planned = _moved(repo, drained)
    moving = [a.node for a in planned.plan.actions if a.kind == Kind.ETCD_MEMBER_REMOVE and a.cluster == "team-a"]
    assert moving == ["team-a-cp-1"]
    assert any("Node team-a-cp-3 waits to move off Hypervisor hv-private-1: one etcd member of cluster team-a "
               "moves at a time (team-a-cp-1 first)" in w for w in planned.plan.warnings), planned.plan.warnings
    assert planned.state.nodes["team-a-cp-3"].hypervisor == "hv-private-1"
    assert not [a for a in planned.plan.actions if a.hypervisor == "hv-private-1" and a.kind in
                (Kind.CREATE_POD, Kind.CREATE_CONTAINER)]
    # once team-a-cp-1 joined again (its move recorded done, its pod running there): team-a-cp-3 moves
    state = planned.state.copy()
    moved = state.nodes["team-a-cp-1"]
    moved.moved_from = moved.leaving_from = moved.leaving_peer = ""
    model = drained(repo.model)
    compiled = compile_desired(model, state, now=NOW)
    after = make_plan(model, repo.repo.config, compiled.state, converged(compiled.desired, compiled.state, model),
                      now=NOW)
    assert [a.node for a in after.plan.actions if a.kind == Kind.ETCD_MEMBER_REMOVE and a.cluster == "team-a"] \
        == ["team-a-cp-3"]


def test_a_lost_hypervisors_member_is_replaced_and_it_is_no_unknown(repo):
    """spec.lost on hv-private-2 (team-a-cp-2, a minority of team-a): not observed, no unknown; the member
    is removed by the two that stay, placed on hv-private-1, and joins again; nothing is planned on the
    lost machine."""
    def lost(observed):
        return dataclasses.replace(observed, hypervisors={**observed.hypervisors, "hv-private-2": ObservedHypervisor(
            "hv-private-2", False, "marked lost (spec.lost)", (), lost=True)})
    planned = _moved(repo, lambda m: _hypervisor(m, "hv-private-2", lost=True), lost)
    assert planned.plan.complete, planned.plan.unknowns
    assert _membership(planned.plan, "team-a") == [
        (Kind.ETCD_MEMBER_REMOVE, "team-a-cp-2", "hv-private-2"), (Kind.CREATE_POD, "team-a-cp-2", "hv-private-1"),
        (Kind.ETCD_MEMBER_ADD, "team-a-cp-2", "hv-private-1"), (Kind.ETCD_MEMBER_PROMOTE, "team-a-cp-2", "hv-private-1")]
    assert not [a for a in planned.plan.actions if a.hypervisor == "hv-private-2" and a.kind != Kind.ETCD_MEMBER_REMOVE]


def _lose(name):
    def lost(observed):
        return dataclasses.replace(observed, hypervisors={**observed.hypervisors, name: ObservedHypervisor(
            name, False, "marked lost (spec.lost)", (), lost=True)})
    return lost


def test_a_lost_quorum_says_what_to_set_then_rebuilds_from_the_survivor(repo):
    """Issue #29.3: hv-private-1 lost takes team-a-cp-1 and team-a-cp-3 (2 of 3): without spec.recovery the
    plan changes nothing of team-a's etcd and says which field to set; with forceNewClusterFrom:
    team-a-cp-2, it first rebuilds etcd there, then the two join again from hv-private-2 one at a time."""
    from gitops.model.resources import ClusterRecovery
    from gitops.plan.payloads import RecoverEtcd, payload_from_dict, payload_to_dict
    lost = lambda m: _hypervisor(m, "hv-private-1", lost=True)  # noqa: E731
    waiting = _moved(repo, lost, _lose("hv-private-1"))
    assert not [a for a in waiting.plan.actions if a.cluster == "team-a" and a.kind in
                (Kind.RECOVER_ETCD, Kind.ETCD_MEMBER_REMOVE, Kind.ETCD_MEMBER_ADD)]
    assert any("cluster team-a: 2 of its 3 etcd members (team-a-cp-1, team-a-cp-3) were on lost hypervisor(s) "
               "hv-private-1, so it has no quorum" in w and "set spec.recovery.forceNewClusterFrom on Cluster team-a "
               "to one of: team-a-cp-2" in w for w in waiting.plan.warnings), waiting.plan.warnings

    def recover(model):
        model = lost(model)
        cluster = dataclasses.replace(model.clusters["team-a"], recovery=ClusterRecovery("team-a-cp-2"))
        return dataclasses.replace(model, clusters={**model.clusters, "team-a": cluster})
    planned = _moved(repo, recover, _lose("hv-private-1"))
    team_a = [a for a in planned.plan.actions if a.cluster == "team-a"]
    first = team_a[0]
    assert (first.kind, first.node, first.hypervisor) == (Kind.RECOVER_ETCD, "team-a-cp-2", "hv-private-2")
    assert isinstance(first.payload, RecoverEtcd) and first.payload.stop == ("c-team-a-cp-2-etcd",)
    assert payload_from_dict(payload_to_dict(first.payload)) == first.payload
    assert [(a.kind, a.node) for a in team_a if a.kind in (Kind.ETCD_MEMBER_ADD, Kind.ETCD_MEMBER_PROMOTE)] == [
        (Kind.ETCD_MEMBER_ADD, "team-a-cp-1"), (Kind.ETCD_MEMBER_PROMOTE, "team-a-cp-1"),
        (Kind.ETCD_MEMBER_ADD, "team-a-cp-3"), (Kind.ETCD_MEMBER_PROMOTE, "team-a-cp-3")]
    adds = [a for a in team_a if a.kind == Kind.ETCD_MEMBER_ADD]
    promote = next(a for a in team_a if a.kind == Kind.ETCD_MEMBER_PROMOTE)
    # the first asked of the survivor; the second of the survivor and the member that joined before it
    assert [a.payload.client_urls for a in adds] == [(first.payload.client_url,),
                                                     (first.payload.client_url, promote.payload.client_url)]
    assert adds[1].details[-1] == "the 2 member(s) must be healthy first"
    assert not [a for a in planned.plan.actions if a.hypervisor == "hv-private-1" and a.kind != Kind.ETCD_MEMBER_REMOVE]
    record = planned.state.clusters["team-a"]
    assert (record.etcd_members, record.forcing) == (["team-a-cp-2"], "team-a-cp-2")
    assert {planned.state.nodes[n].hypervisor for n in ("team-a-cp-1", "team-a-cp-3")} == {"hv-private-2"}
    assert any("etcd is rebuilt from team-a-cp-2" in n for n in planned.plan.notes)
    # team-b lost one member of three there: replaced as a move, no rebuild
    assert [a.node for a in planned.plan.actions if a.cluster == "team-b" and a.kind == Kind.ETCD_MEMBER_REMOVE] \
        == ["team-b-cp-2"]
    text = text_of(planned.plan)
    assert "~ rebuild etcd: spec.recovery.forceNewClusterFrom: team-a-cp-2" in text
    assert text.index("Rebuild etcd from team-a-cp-2 on hv-private-2") < text.index("Node team-a-cp-1 on hv-private-2")


def test_etcd_upkeep_runs_only_on_a_cluster_the_plan_leaves_alone(repo):
    """Issue #29.5: team-a's members have mostly free files: each is defragmented, one at a time; while the
    plan changes team-a otherwise, no upkeep (it waits for the next plan)."""
    from gitops.observe.types import EtcdMemberSpace, ObservedEtcd
    state, observed = settle(repo.model)
    compiled = compile_desired(repo.model, state, now=NOW)
    members = compiled.desired.clusters["team-a"].etcd_members
    spaces = ObservedEtcd(tuple(EtcdMemberSpace(m.node, m.client_url, 400 << 20, 10 << 20, leader=m.node.endswith("1"))
                                for m in members))
    observed = dataclasses.replace(observed, etcd={"team-a": spaces})
    plan = make_plan(repo.model, repo.repo.config, state, observed, now=NOW).plan
    assert [(a.kind, a.node) for a in plan.actions] == [(Kind.DEFRAGMENT_ETCD, n) for n in
                                                        ("team-a-cp-2", "team-a-cp-3", "team-a-cp-1")]
    assert "390.0 MiB of its 400.0 MiB database file is free" in plan.actions[0].reason
    changed = dataclasses.replace(repo.model, nodes={k: v for k, v in repo.model.nodes.items() if k != "team-a-cp-3"})
    busy = make_plan(changed, repo.repo.config, state, observed, now=NOW).plan
    assert busy.actions and Kind.DEFRAGMENT_ETCD not in {a.kind for a in busy.actions}
    # a controller-manager that exited (it could not renew its Lease while etcd was full) starts after the upkeep
    exited = _with_pod(observed, "team-a-cp-2", lambda p: dataclasses.replace(p, containers=tuple(
        dataclasses.replace(c, state="exited") if c.component == "kube-controller-manager" else c
        for c in p.containers)))
    both = make_plan(repo.model, repo.repo.config, state, exited, now=NOW).plan
    assert [(a.kind, a.node) for a in both.actions] == [
        *((Kind.DEFRAGMENT_ETCD, n) for n in ("team-a-cp-2", "team-a-cp-3", "team-a-cp-1")),
        (Kind.RECREATE_CONTAINER, "team-a-cp-2")]


def test_joined_kubelets_bound_the_version_a_cluster_may_run(repo):
    """The version-skew policy against the kubelets a cluster's API reports: at most three minors older than the
    version the repo asks for, never newer; each refusal names the node and where the version is written."""
    from gitops.observe.types import ObservedCluster, ObservedWorker
    from gitops.plan.upgrades import VersionSkew

    state, observed = settle(repo.model)
    assert repo.model.clusters["team-a"].kubernetes_version == "v1.37.2"

    def with_kubelet(version: str):
        seen = ObservedCluster("team-a", True, workers=(ObservedWorker("worker-1", True, version),))
        return dataclasses.replace(observed, clusters={**observed.clusters, "team-a": seen})

    for fine in ("v1.34.0", "v1.37.2+k3s1", "", "unknown"):  # three minors older, the same, none, unreadable
        make_plan(repo.model, repo.repo.config, state, with_kubelet(fine), now=NOW)
    for kubelet, words in (("v1.33.9", "node worker-1: kubelet v1.33.9 is more than 3 minor versions older than "
                                       "the cluster's API server v1.37.2"),
                           ("v1.38.0", "node worker-1: kubelet v1.38.0 is newer than the cluster's API server v1.37.2"),
                           ("v1.33.1+k3s1", "node worker-1: kubelet v1.33.1+k3s1 is more than 3 minor versions")):
        with pytest.raises(VersionSkew, match=rf"^clusters/team-a/cluster\.yaml:9: Cluster team-a asks for v1\.37\.2: "
                                              rf"{re.escape(words)}"):
            make_plan(repo.model, repo.repo.config, state, with_kubelet(kubelet), now=NOW)
