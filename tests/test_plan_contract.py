"""The plan is the contract (pure parts): complete, carrying its payload, serializable, saved and checked.

The lab tests (test_apply_lab.py) apply saved plans on real containerd and real
Kubernetes binaries; these check the values the plan carries.
"""
from __future__ import annotations

import dataclasses
import io
import json

import pytest
from rich.console import Console
from test_plan_diff import NOW, converged, nothing_observed, repo, settle  # noqa: F401 - fixture

from gitops.compile import compile_desired
from gitops.compile.desired import AFTER_APPLY, resolve_container
from gitops.engine import make_plan
from gitops.plan.actions import KINDS, Kind, Plan
from gitops.plan.payloads import CreateContainer, CreatePod, EtcdMemberChange, GenerateKeys, WriteFiles
from gitops.plan.render import render_json, render_markdown, render_text
from gitops.plan.saved import SavedPlan, StalePlan, observed_digest, state_digest
from gitops.pods import SPEC_HASH
from gitops.state import State

NEW_KEY = "-----BEGIN PUBLIC KEY-----\nMFkwEw-new\n-----END PUBLIC KEY-----\n"


def test_every_kind_has_one_entry_and_one_apply_handler_taking_its_payload():
    """issue #45.1: an action kind is one unit: its entry (order, title, payload type) and its handler, which
    apply finds in a table (no `getattr` on a name), each handler's payload the type the entry names."""
    import inspect
    import typing

    from gitops.apply.handlers import HANDLERS

    assert set(KINDS) == set(Kind) == set(HANDLERS)
    for kind, handler in HANDLERS.items():
        hints = typing.get_type_hints(handler)
        payload = list(inspect.signature(handler).parameters)[2]
        assert hints[payload] is KINDS[kind].payload, (kind, hints[payload], KINDS[kind].payload)


def test_apply_refuses_an_action_whose_payload_is_not_its_kinds(tmp_path):
    """A saved plan is someone else's file: a payload of another kind's type is refused before anything runs."""
    from gitops.apply.executor import ApplyError, Connections, execute
    from gitops.plan.actions import Action
    from gitops.plan.payloads import LabelHost, RotationStep
    from gitops.state.store import LocalDirStore

    wrong = Action(Kind.ADVANCE_CA_ROTATION, "", "team-a", "", payload=LabelHost("host-1", (), ()))
    with pytest.raises(ApplyError, match="carries a LabelHost, not the RotationStep a advance-ca-rotation action"):
        execute(Plan((wrong,)), State(), Connections(cri=lambda name: None, hosts=lambda state: None),
                LocalDirStore(tmp_path))
    assert RotationStep.__name__ == KINDS[Kind.ADVANCE_CA_ROTATION].payload.__name__


def test_no_class_of_apply_has_more_than_20_methods():
    import ast
    from pathlib import Path

    for path in sorted((Path(__file__).resolve().parents[1] / "gitops" / "apply").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                methods = [n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
                assert len(methods) <= 20, (path.name, node.name, len(methods))


def test_the_plan_round_trips_through_json_with_its_payloads(repo):
    plan = make_plan(repo.model, repo.repo.config, State(), nothing_observed(repo.model), now=NOW).plan
    again = Plan.from_dict(json.loads(json.dumps(plan.to_dict())))
    assert again == plan
    # new clusters bootstrap: their API servers become ready only once the later members run, so none waits
    assert not [a for a in plan.actions if isinstance(a.payload, CreateContainer) and a.payload.ready]
    assert [a.payload for a in again.actions] == [a.payload for a in plan.actions]
    assert all(a.payload is not None for a in plan.actions)
    pods = [a.payload for a in plan.actions if a.kind == Kind.CREATE_POD]
    assert all(isinstance(p, CreatePod) and p.images for p in pods)
    # a new control plane's first members start together: the plan says who
    cp1 = next(a.payload for a in plan.actions if a.kind == Kind.CREATE_POD and a.node == "team-a-cp-1")
    assert cp1.bootstrap_members == ("team-a-cp-1", "team-a-cp-2", "team-a-cp-3")


def test_keys_generated_by_the_plan_make_the_bundle_and_api_server_known_after_apply(repo):
    """A control plane from nothing: every node's sa-pub.pem and kube-apiserver depend on keys the plan
    generates, so they are in the plan as (known after apply) instead of in a later round."""
    planned = make_plan(repo.model, repo.repo.config, State(), nothing_observed(repo.model), now=NOW)
    actions = [a for a in planned.plan.actions if a.cluster == "team-a" and a.node == "team-a-cp-2"]
    assert [a.kind for a in actions] == [Kind.CREATE_POD, Kind.GENERATE_KEYS, Kind.WRITE_FILES, *[
        Kind.CREATE_CONTAINER] * 4]
    keys, files = actions[1].payload, actions[2].payload
    assert isinstance(keys, GenerateKeys) and [k.name for k in keys.keys] == ["sa"]
    assert isinstance(files, WriteFiles)
    bundle = next(f for f in files.files if f.name == "sa-pub.pem")
    assert bundle.bundle is not None and bundle.bundle.generated == ("team-a-cp-1", "team-a-cp-2", "team-a-cp-3")
    assert "file sa-pub.pem: (known after apply): service-account keys generated on team-a-cp-1, team-a-cp-2, " \
           "team-a-cp-3" in actions[2].details
    api = next(a.payload for a in actions if a.component == "kube-apiserver")
    assert isinstance(api, CreateContainer) and api.container.labels[SPEC_HASH] == AFTER_APPLY
    assert [f.name for f in api.files] == ["sa-pub.pem"]
    etcd = next(a.payload for a in actions if a.component == "etcd")
    assert etcd.container.labels[SPEC_HASH] != AFTER_APPLY and not etcd.files  # etcd reads no pending file
    # apply fills the value in from the generated keys: exactly what the next plan will want
    state = planned.state.copy()
    for node in bundle.bundle.generated:
        state.clusters["team-a"].set_service_account_key(node, NEW_KEY.replace("new", node))
    contents = {"sa-pub.pem": "".join(state.clusters["team-a"].trusted_service_account_keys())}
    resolved = resolve_container(api.container, contents)
    wanted = compile_desired(repo.model, state, now=NOW).desired.pods["team-a-cp-2"]
    spec = next(c.spec for c in wanted.containers if c.spec.name == "kube-apiserver")
    assert resolved == spec
    assert next(f for f in wanted.files if f.name == "sa-pub.pem").content == contents["sa-pub.pem"]


def test_a_node_joining_a_running_control_plane_is_planned_in_one_pass(repo):
    """Scaling 1 -> 2: the new node's key changes the bundle of the running API server, and the etcd
    member add names the URLs to ask: all in the first plan."""
    nodes = {n: v for n, v in repo.model.nodes.items() if n != "team-a-cp-2"}
    small = dataclasses.replace(repo.model, nodes=nodes)
    state, observed = settle(small)
    plan = make_plan(repo.model, repo.repo.config, state, observed, now=NOW).plan
    add = next(a for a in plan.actions if a.kind == Kind.ETCD_MEMBER_ADD)
    assert add.node == "team-a-cp-2" and isinstance(add.payload, EtcdMemberChange)
    assert add.payload.peer_url.startswith("https://") and len(add.payload.client_urls) == 2
    running = [a for a in plan.actions if a.node == "team-a-cp-1"]
    assert [(a.kind, a.component) for a in running] == [(Kind.WRITE_FILES, ""),
                                                        (Kind.RECREATE_CONTAINER, "kube-apiserver")]
    assert running[0].details == ("file sa-pub.pem: (known after apply): service-account keys generated on "
                                  "team-a-cp-2",)
    assert "files.sa-pub.pem: (known after apply)" in running[1].details
    # a running API server is replaced one at a time: ready again before anything else goes
    ready = running[1].payload.ready
    assert ready is not None and ready.url.startswith("https://127.0.10.") and ready.url.endswith("/readyz")
    assert "one at a time: waits until its /readyz answers ok (up to 60s), then 3s for the ingress to count it in" \
        in running[1].details
    # the ingress's check (every 1 s, 2 answers in a row) counts it in before another API server stops: with
    # one API server gone or not behind the ingress yet, stopping the next at once left it none (seen by the
    # crash-point harness: a leaf renewal in the same plan as a node replacement, its run killed after 1)
    assert ready.ingress == 3
    out = io.StringIO()
    render_text(plan, Console(file=out, width=200))
    assert "(known after apply)" in out.getvalue()
    assert "(known after apply)" in render_markdown(plan)
    assert AFTER_APPLY in render_json(plan)


def test_saved_plan_round_trip_and_staleness(repo, tmp_path):
    state, observed = settle(repo.model)
    planned = make_plan(repo.model, repo.repo.config, state, observed, now=NOW)
    saved = SavedPlan(planned.plan, "sha256:repo", state_digest(state), observed_digest(observed), planned.state)
    path = tmp_path / "p.json"
    saved.write(path)
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    back = SavedPlan.read(path)
    assert back.plan == saved.plan and back.planned_state.to_dict() == planned.state.to_dict()
    back.check("sha256:repo", state_digest(state), observed_digest(observed))
    moved = dataclasses.replace(observed, hypervisors={**observed.hypervisors})
    first = next(iter(moved.hypervisors))
    moved.hypervisors[first] = dataclasses.replace(moved.hypervisors[first], pods=())
    with pytest.raises(StalePlan, match="the live state changed since it was made; nothing was applied"):
        back.check("sha256:repo", state_digest(state), observed_digest(moved))
    with pytest.raises(StalePlan, match="the repo and the recorded state changed"):
        back.check("sha256:other", state_digest(State()), observed_digest(observed))


def test_saved_plan_errors_name_the_file(tmp_path):
    from gitops.errors import GitopsError

    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(GitopsError, match=f"{bad}: not a saved plan"):
        SavedPlan.read(bad)
    bad.write_text(json.dumps({"format": "gitops.infra/saved-plan", "version": 99}))
    with pytest.raises(GitopsError, match="saved plan version 99; this gitops reads version 1"):
        SavedPlan.read(bad)


def test_scaling_down_keeps_the_leaving_nodes_keys_trusted(repo):
    """Tokens signed by a removed node stay valid: its key moves to the retired list, so the bundle
    the remaining API server reads does not change, before or after the removal. The API server
    restarts (gated) only for its shorter list of etcd members."""
    state, _ = settle(repo.model)
    for node in ("team-a-cp-1", "team-a-cp-2", "team-a-cp-3"):  # three distinct keys
        state.clusters["team-a"].service_account_keys[node] = NEW_KEY.replace("new", node)
    compiled = compile_desired(repo.model, state, now=NOW)
    observed = converged(compiled.desired, compiled.state, repo.model)
    keys = compiled.state.clusters["team-a"].service_account_keys
    observed = dataclasses.replace(observed, hypervisors={
        name: dataclasses.replace(hv, pods=tuple(
            dataclasses.replace(p, files=dataclasses.replace(p.files, public_keys={"sa": keys[p.node]}))
            if p.node in keys else p for p in hv.pods))
        for name, hv in observed.hypervisors.items()})
    assert make_plan(repo.model, repo.repo.config, compiled.state, observed, now=NOW).plan.empty
    nodes = {n: v for n, v in repo.model.nodes.items() if n not in ("team-a-cp-2", "team-a-cp-3")}
    plan = make_plan(dataclasses.replace(repo.model, nodes=nodes), repo.repo.config, compiled.state, observed,
                     now=NOW).plan
    assert {(a.kind, a.node) for a in plan.actions if a.cluster == "team-a"} >= {
        (Kind.ETCD_MEMBER_REMOVE, "team-a-cp-2"), (Kind.REMOVE_POD, "team-a-cp-3")}
    # a leaving pod's components stop gracefully, the last started first, before its sandbox goes
    removal = next(a for a in plan.actions if a.kind == Kind.REMOVE_POD and a.node == "team-a-cp-3")
    pod = next(p for p in observed.pods() if p.node == "team-a-cp-3")
    expected = sorted((c for c in pod.containers if c.component != "files"), key=lambda c: -c.created_at)
    assert removal.payload.stop_first == tuple(c.id for c in expected) and len(expected) == 4
    # the API server that stays talks to its own member only and keeps trusting the leaving keys: untouched
    assert not [a for a in plan.actions if a.node == "team-a-cp-1"]


def test_an_api_server_is_not_stopped_for_its_member_while_etcd_is_unhealthy(repo, tmp_path):
    """The stop that opens an etcd member's roll checks the members first: with none answering, the run
    stops there, naming them, before any container is touched."""
    from gitops.apply.executor import ApplyError, Connections, execute
    from gitops.state.store import LocalDirStore

    state, observed = settle(repo.model)
    cluster = dataclasses.replace(repo.model.clusters["team-b"], image_overrides={"etcd": "lab/etcd:next"})
    model = dataclasses.replace(repo.model, clusters={**repo.model.clusters, "team-b": cluster})
    plan = make_plan(model, dataclasses.replace(repo.repo.config, health_timeout=1), state, observed, now=NOW).plan
    stop = plan.actions[0]
    assert (stop.kind, stop.component, len(stop.payload.etcd.peers)) == (Kind.REMOVE_CONTAINER, "kube-apiserver", 2)
    assert stop.details[0] == "the 3 etcd member(s) healthy first (up to 1s)"

    def no_cri(name):
        raise AssertionError(f"CRI of {name} reached before the etcd check")
    with pytest.raises(ApplyError, match=r"action 1/\d+ failed: - team-b/team-b-cp-1/kube-apiserver remove-container: "
                                         r"before stopping kube-apiserver on team-b-cp-1 for its etcd member: etcd "
                                         r"not healthy after 1s: https://"):
        execute(plan, state, Connections(no_cri, no_cri), LocalDirStore(tmp_path / "state"))


def test_a_joining_member_is_a_learner_promoted_right_after_its_etcd_starts(repo):
    nodes = {n: v for n, v in repo.model.nodes.items() if n != "team-a-cp-2"}
    state, observed = settle(dataclasses.replace(repo.model, nodes=nodes))
    plan = make_plan(repo.model, repo.repo.config, state, observed, now=NOW).plan
    joining = [(a.kind, a.component) for a in plan.actions if a.node == "team-a-cp-2"]
    assert joining == [(Kind.CREATE_POD, ""), (Kind.GENERATE_KEYS, ""), (Kind.WRITE_FILES, ""),
                       (Kind.ETCD_MEMBER_ADD, ""), (Kind.CREATE_CONTAINER, "etcd"),
                       (Kind.ETCD_MEMBER_PROMOTE, "etcd"), (Kind.CREATE_CONTAINER, "kube-apiserver"),
                       (Kind.CREATE_CONTAINER, "kube-controller-manager"), (Kind.CREATE_CONTAINER, "kube-scheduler")]
    # the cluster serves (2 of 2 members run): the new API server is ready before anything routes to it,
    # and the ingress gets it through a new haproxy started beside the old one (the port never closes)
    api = next(a for a in plan.actions if a.node == "team-a-cp-2" and a.component == "kube-apiserver")
    assert api.payload.ready is not None and api.payload.ready.url.endswith("/readyz"), api
    ingress = next(a for a in plan.actions if a.node == "team-a-ingress" and a.component == "haproxy")
    assert ingress.kind == Kind.RECREATE_CONTAINER and ingress.payload.overlap == 2, ingress
    assert "started beside the running one, which soft-stops 2s later: the port never closes" in ingress.details
    promote = next(a for a in plan.actions if a.kind == Kind.ETCD_MEMBER_PROMOTE)
    assert isinstance(promote.payload, EtcdMemberChange)
    assert promote.payload.client_url and len(promote.payload.client_urls) == 2 and promote.payload.timeout == 60
    assert "as a learner" in next(a for a in plan.actions if a.kind == Kind.ETCD_MEMBER_ADD).reason


def test_a_member_recreated_after_one_joined_in_the_same_plan_needs_the_new_one_healthy_too(repo):
    """A scale-up and an etcd change in one plan: team-a-cp-2 joins (promoted) before cp-1 and cp-3 are
    recreated; stopping cp-1 leaves cp-2 and cp-3, so both must be healthy first, not only the member
    recorded when the plan was made (3 voters: with cp-2 down and cp-1 stopped, no quorum)."""
    nodes = {n: v for n, v in repo.model.nodes.items() if n != "team-a-cp-2"}
    state, observed = settle(dataclasses.replace(repo.model, nodes=nodes))
    cluster = dataclasses.replace(repo.model.clusters["team-a"], image_overrides={"etcd": "lab/etcd:next"})
    model = dataclasses.replace(repo.model, clusters={**repo.model.clusters, "team-a": cluster})
    plan = make_plan(model, repo.repo.config, state, observed, now=NOW).plan
    team_a = [a for a in plan.actions if a.cluster == "team-a"]
    promote = next(i for i, a in enumerate(team_a) if a.kind == Kind.ETCD_MEMBER_PROMOTE)
    joined = team_a[promote].payload.client_url
    rolled = [(i, a) for i, a in enumerate(team_a) if a.kind == Kind.RECREATE_CONTAINER and a.component == "etcd"]
    assert [a.node for _, a in rolled] == ["team-a-cp-1", "team-a-cp-3"] and promote < rolled[0][0]
    for i, action in rolled:
        gate = action.payload.etcd
        # asked last: a leadership hand-off prefers a member that was there before
        assert gate.peers[-1] == joined and len(gate.peers) == 2 and gate.client_url not in gate.peers, gate
        assert any(d.startswith("one member at a time: the 2 other member(s) healthy before") for d in action.details)
        stop = team_a[i - 1]
        assert (stop.kind, stop.component, stop.node) == (Kind.REMOVE_CONTAINER, "kube-apiserver", action.node)
        assert stop.payload.etcd.peers == gate.peers and stop.details[0].startswith("the 3 etcd member(s) healthy first")
    assert Plan.from_dict(json.loads(json.dumps(plan.to_dict()))).actions == plan.actions


def test_an_etcd_spec_change_rolls_one_member_at_a_time_with_health_gates(repo):
    state, observed = settle(repo.model)
    cluster = dataclasses.replace(repo.model.clusters["team-b"],
                                  image_overrides={"etcd": "registry.example.com/etcd:3.6.17-0"})
    model = dataclasses.replace(repo.model, clusters={**repo.model.clusters, "team-b": cluster})
    config = dataclasses.replace(repo.repo.config, health_timeout=90)
    plan = make_plan(model, config, state, observed, now=NOW).plan
    etcd = [a for a in plan.actions if a.component == "etcd"]
    assert [a.node for a in etcd] == ["team-b-cp-1", "team-b-cp-2", "team-b-cp-3"]
    for action in etcd:
        gate = action.payload.etcd
        assert gate is not None and gate.timeout == 90 and len(gate.peers) == 2
        assert gate.client_url not in gate.peers
        assert any(d.startswith("one member at a time: the 2 other member(s) healthy before") for d in action.details)
    loaded = Plan.from_dict(json.loads(json.dumps(plan.to_dict())))
    assert loaded.actions == plan.actions and loaded.actions[1].payload == etcd[0].payload
    # its API server, which talks to it only, stops right before and starts right after it
    stop, start = plan.actions[0], plan.actions[2]
    assert (stop.kind, stop.anchor, stop.step, start.kind, start.anchor, start.step) == (
        Kind.REMOVE_CONTAINER, Kind.RECREATE_CONTAINER, -1, Kind.CREATE_CONTAINER, Kind.RECREATE_CONTAINER, 1)
    assert (loaded.actions[0].anchor, loaded.actions[0].step) == (Kind.RECREATE_CONTAINER, -1)
    # a missing etcd is started without a gate: it is down already
    first = next(p for p in observed.hypervisors.values() if any(x.node == "team-b-cp-1" for x in p.pods))
    gone = dataclasses.replace(observed, hypervisors={**observed.hypervisors, first.name: dataclasses.replace(
        first, pods=tuple(dataclasses.replace(x, containers=tuple(c for c in x.containers if c.component != "etcd"))
                          if x.node == "team-b-cp-1" else x for x in first.pods))})
    heal = [a for a in make_plan(repo.model, repo.repo.config, state, gone, now=NOW).plan.actions]
    assert [(a.kind, a.node, a.component) for a in heal] == [(Kind.CREATE_CONTAINER, "team-b-cp-1", "etcd")]
    assert heal[0].payload.etcd is None


def _saved_then_read(planned, state, observed, tmp_path, edit=None):
    """`planned` saved to a file, optionally edited as JSON by `edit(data)`, and read back."""
    path = tmp_path / "p.json"
    SavedPlan(planned.plan, "sha256:repo", state_digest(state), observed_digest(observed), planned.state).write(path)
    if edit is not None:
        data = json.loads(path.read_text())
        edit(data)
        path.write_text(json.dumps(data))
    return SavedPlan.read(path)


def _verify(saved, model, config, recorded, observed):
    fresh = make_plan(model, config, recorded, observed, now=NOW)
    again = make_plan(model, config, saved.planned_state, observed, now=NOW)
    saved.verify(recorded, fresh.state, (again.plan, again.state))


def test_a_saved_plan_is_applied_only_if_its_inputs_make_exactly_it(repo, tmp_path):
    """#26: the first plan of new clusters (their CAs generated at plan time) verifies; an edited payload,
    an added action or a changed planned state is refused."""
    model, config = repo.model, repo.repo.config
    observed = nothing_observed(model)
    planned = make_plan(model, config, State(), observed, now=NOW)
    _verify(_saved_then_read(planned, State(), observed, tmp_path), model, config, State(), observed)

    def relabel(data):
        sandbox = next(a for a in data["plan"]["actions"] if a["kind"] == "create-pod")["payload"]["sandbox"]
        sandbox["labels"]["gitops.infra/cluster"] = "someone-else"

    def add_action(data):
        data["plan"]["actions"].append(data["plan"]["actions"][-1])

    def other_port(data):
        node = next(iter(data["plannedState"]["nodes"].values()))
        node["ports"] = {k: v + 1 for k, v in node["ports"].items()}

    for edit, where in ((relabel, "actions differ at actions["), (add_action, "entries in the file"),
                        (other_port, "planned state differ at nodes.")):
        saved = _saved_then_read(planned, State(), observed, tmp_path, edit)
        with pytest.raises(StalePlan, match="not what its inputs make") as refused:
            _verify(saved, model, config, State(), observed)
        assert where in str(refused.value), str(refused.value)


def test_a_replaced_key_of_an_existing_cluster_is_refused(repo, tmp_path):
    from gitops.pki import create_ca

    model, config = repo.model, repo.repo.config
    state, observed = settle(model)
    planned = make_plan(model, config, state, observed, now=NOW)
    _verify(_saved_then_read(planned, state, observed, tmp_path), model, config, state, observed)
    other = create_ca("attacker")

    def admin_key(data):
        data["plannedState"]["clusters"]["team-a"]["admin"]["key_pem"] = other.key_pem

    saved = _saved_then_read(planned, state, observed, tmp_path, admin_key)
    with pytest.raises(StalePlan, match="planned state differ at clusters.team-a.admin.key_pem"):
        _verify(saved, model, config, state, observed)


def test_a_saved_plans_keys_are_sealed_to_the_identity(repo, tmp_path):
    import subprocess

    from gitops.errors import GitopsError
    from gitops.secrets import load_identity, public_recipient

    identity = subprocess.run(["age-keygen"], capture_output=True, text=True, check=True).stdout
    model, config = repo.model, repo.repo.config
    observed = nothing_observed(model)
    planned = make_plan(model, config, State(), observed, now=NOW)
    path = tmp_path / "sealed.plan"
    SavedPlan(planned.plan, "sha256:repo", state_digest(State()), observed_digest(observed), planned.state,
              public_recipient(load_identity(identity))).write(path)
    text = path.read_text()
    keys = [c.authorities["cluster"].key_pem for c in planned.state.clusters.values()]
    assert keys and not any(k in text for k in keys) and "PRIVATE KEY" not in text
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    with pytest.raises(GitopsError, match="sealed to an age identity: pass --identity"):
        SavedPlan.read(path)
    other = subprocess.run(["age-keygen"], capture_output=True, text=True, check=True).stdout
    with pytest.raises(GitopsError, match="cannot open the plan's sealed keys"):
        SavedPlan.read(path, other)
    back = SavedPlan.read(path, identity)
    assert back.planned_state.to_dict() == planned.state.to_dict() and back.plan == planned.plan


def test_the_first_api_server_a_plan_stops_waits_for_another_to_serve_steadily(repo):
    """A plan cannot know how long a cluster's other API servers have served (a controller killed while one
    started leaves it running, maybe not yet behind the ingress): the first running API server it stops waits
    for another to answer /readyz steadily; later ones follow a start that waited so already. A cluster with one
    API server has no other to wait for."""
    state, observed = settle(repo.model)
    cluster = dataclasses.replace(repo.model.clusters["team-a"], api_server_args=(("watch-cache-sizes", "pods#7"),))
    model = dataclasses.replace(repo.model, clusters={**repo.model.clusters, "team-a": cluster})
    plan = make_plan(model, repo.repo.config, state, observed, now=NOW).plan
    rolls = [a for a in plan.actions if a.component == "kube-apiserver" and a.kind == Kind.RECREATE_CONTAINER]
    assert [a.node for a in rolls] == ["team-a-cp-1", "team-a-cp-2", "team-a-cp-3"]
    first = rolls[0].payload.serving
    urls = {n: p.api_url for n, p in compile_desired(model, state, now=NOW).desired.pods.items()}
    assert first.url == f"{urls['team-a-cp-1']}/readyz"
    assert first.peers == (f"{urls['team-a-cp-2']}/readyz", f"{urls['team-a-cp-3']}/readyz")
    assert first.steady >= 2 and first.timeout == repo.repo.config.health_timeout
    assert rolls[0].details[-1] == (f"before it stops: team-a-cp-2 or team-a-cp-3 answers /readyz for {first.steady}s "
                                    f"in a row, so the ingress has another (up to {first.timeout}s; not waited for "
                                    "when nothing serves)")
    assert [a.payload.serving for a in rolls[1:]] == [None, None]

    alone = {n: v for n, v in model.nodes.items() if n not in ("team-a-cp-2", "team-a-cp-3")}
    state, observed = settle(dataclasses.replace(repo.model, nodes=alone))
    plan = make_plan(dataclasses.replace(model, nodes=alone), repo.repo.config, state, observed, now=NOW).plan
    [roll] = [a for a in plan.actions if a.component == "kube-apiserver" and a.kind == Kind.RECREATE_CONTAINER]
    assert roll.payload.serving is None
