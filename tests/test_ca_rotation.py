"""CA rotation on request (spec.certificates.caGeneration): the three phases against recorded state.

Each phase is planned against a synthetic observation of the previous one converged (as
tests/test_plan_diff.py does); the recorded state moves on by executing the plan's own
`advance-ca-rotation` action with the real executor. The lab test in test_apply_lab.py runs
it on real components.
"""
from __future__ import annotations

import base64
import dataclasses
import json
import shutil
import subprocess

import pytest
import yaml
from test_plan_diff import NOW, converged, repo, settle  # noqa: F401 - fixture

from gitops.apply.executor import ApplyError, Connections, execute
from gitops.compile import compile_desired
from gitops.compile.authorities import CAGenerationError
from gitops.engine import make_plan
from gitops.kubeconfig import admin_kubeconfig
from gitops.model.validate import validate_repo
from gitops.pki import cert_to_pem, is_signed_by, load_cert_pem, load_certs_pem
from gitops.plan.actions import Kind, Plan
from gitops.plan.payloads import WriteFiles
from gitops.state.records import DROP_OLD, RE_ISSUE, TRUST_BOTH
from gitops.state.store import LocalDirStore
from gitops.status.sealed_state import merge, split

ROLES = ("cluster", "etcd", "front-proxy")
BUNDLES = ("ca.crt", "etcd-ca.crt", "front-proxy-ca.crt")


def bump(model, cluster="team-a", generation=2):
    changed = dataclasses.replace(model.clusters[cluster], ca_generation=generation)
    return dataclasses.replace(model, clusters={**model.clusters, cluster: changed})


def step(model, config, state):
    """The live state once a plan made against `state` (a plan's recorded state) has been applied."""
    return converged(compile_desired(model, state, now=NOW).desired, state, model)


def executed(planned, tmp_path):
    """The recorded state once the plan ran: its rotation step executed by the executor (the plan's other
    actions reach hypervisors, which `step` stands in for)."""
    steps = [a for a in planned.plan.actions if a.kind == Kind.ADVANCE_CA_ROTATION]
    assert planned.plan.actions[-len(steps):] == tuple(steps), "a rotation step comes after every other action"

    def unreachable(*_):
        raise AssertionError("a rotation step reaches nothing")
    store = LocalDirStore(tmp_path / f"state-{len(list(tmp_path.iterdir()))}")
    run = execute(Plan(actions=tuple(steps)), planned.state, Connections(unreachable, unreachable), store)
    assert run.executed == steps
    return store.load()


def pems(text: str) -> set[str]:
    return {cert_to_pem(cert) for cert in load_certs_pem(text)}


def bundle(planned, node: str, name: str) -> str:
    return next(f.content for f in planned.compiled.desired.pods[node].files if f.name == name)


def team_a(plan: Plan) -> list:
    return [a for a in plan.actions if a.cluster == "team-a"]


def test_rotation_runs_trust_both_reissue_drop_old_then_forgets_the_old_cas(repo, tmp_path):
    config = repo.repo.config
    state, observed = settle(repo.model)
    old = {r: state.clusters["team-a"].authorities[r].cert_pem for r in ROLES}
    old_admin = state.clusters["team-a"].admin.cert_pem
    model = bump(repo.model)

    # phase 1, trust both: new CAs recorded as the next authorities, every bundle holds old + new
    one = make_plan(model, config, state, observed, now=NOW)
    record = one.state.clusters["team-a"]
    assert record.rotation.phase == TRUST_BOTH and record.rotation.generation == 2 and record.ca_generation == 1
    new = {r: record.rotation.other[r].cert_pem for r in ROLES}
    assert {r: record.authorities[r].cert_pem for r in ROLES} == old and record.admin.cert_pem == old_admin
    assert "team-a-kubernetes-ca-2" in load_cert_pem(new["cluster"]).subject.rfc4514_string()
    assert any("CA rotation 1 -> 2, phase 1 of 3 runs now: trust both" in n and "phase 2 (re-issue), phase 3 "
               "(drop-old)" in n for n in one.plan.notes), one.plan.notes
    for name, role in zip(BUNDLES, ROLES):
        assert pems(bundle(one, "team-a-cp-1", name)) == {old[role], new[role]}
    assert pems(bundle(one, "team-a-ingress", "ca.crt")) == {old["cluster"], new["cluster"]}
    info = next(o for o in one.compiled.desired.clusters["team-a"].objects if o.name == "cluster-info")
    ca_data = yaml.safe_load(info.manifest()["data"]["kubeconfig"])["clusters"][0]["cluster"]
    assert pems(base64.b64decode(ca_data["certificate-authority-data"]).decode()) == {old["cluster"], new["cluster"]}
    actions = team_a(one.plan)
    assert actions and all(a.cluster == "team-a" for a in one.plan.actions)  # team-b untouched
    last = actions[-1]  # once every action of the phase ran, the plan records phase 2
    assert last.kind == Kind.ADVANCE_CA_ROTATION and (last.payload.generation, last.payload.phase) == (2, TRUST_BOTH)
    assert "phase 1 of 3 (trust-both) has run: the next plan runs phase 2 (re-issue)" in last.reason
    writes = [a for a in actions if a.kind == Kind.WRITE_FILES]
    assert all(not a.payload.certificates for a in writes)  # nothing re-issued yet
    recreates = [(a.kind, a.node, a.component) for a in actions
                 if a.kind in (Kind.RECREATE_CONTAINER, Kind.REMOVE_CONTAINER, Kind.CREATE_CONTAINER)]
    assert recreates == [  # node by node: etcd, its API server stopped before and started after; then the rest
        *((kind, f"team-a-cp-{n}", c) for n in (1, 2, 3) for kind, c in (
            (Kind.REMOVE_CONTAINER, "kube-apiserver"), (Kind.RECREATE_CONTAINER, "etcd"),
            (Kind.CREATE_CONTAINER, "kube-apiserver"))),
        (Kind.RECREATE_CONTAINER, "team-a-ingress", "haproxy"), (Kind.RECREATE_CONTAINER, "team-a-ingress-2", "haproxy"),
        *((Kind.RECREATE_CONTAINER, f"team-a-cp-{n}", c) for c in ("kube-controller-manager", "kube-scheduler")
          for n in (1, 2, 3))]
    assert [a.node for a in actions if a.kind == Kind.UPDATE_OBJECT] == ["cluster-info"] or \
        any(a.kind == Kind.UPDATE_OBJECT for a in actions), actions
    # planned again from the same recorded state (a crash before anything ran): the same new CAs
    again = make_plan(model, config, one.state, observed, now=NOW)
    assert again.state.clusters["team-a"].rotation.other == record.rotation.other
    assert [a.to_dict() for a in team_a(again.plan)] == [a.to_dict() for a in actions]

    # phase 2, re-issue: the new CAs sign every leaf (server ones carry the cross-signed CA), admin re-issued
    two = make_plan(model, config, executed(one, tmp_path), step(model, config, one.state), now=NOW)
    record = two.state.clusters["team-a"]
    assert record.rotation.phase == RE_ISSUE
    assert {r: record.authorities[r].cert_pem for r in ROLES} == new
    assert {r: record.rotation.other[r].cert_pem for r in ROLES} == old
    admin = load_cert_pem(record.admin.cert_pem)
    assert record.admin.cert_pem != old_admin and is_signed_by(admin, load_cert_pem(new["cluster"]))
    assert any("phase 2 of 3 runs now: re-issue" in n for n in two.plan.notes), two.plan.notes
    writes = [a for a in team_a(two.plan) if a.kind == Kind.WRITE_FILES]
    cp1 = next(a.payload for a in writes if a.node == "team-a-cp-1")
    assert isinstance(cp1, WriteFiles) and not cp1.files  # bundles unchanged: same sorted old + new
    issued = {i.spec.name: i for i in cp1.certificates}
    assert len(issued) == 8
    assert issued["apiserver"].chain == record.rotation.cross["cluster"]
    assert issued["etcd-server"].chain == record.rotation.cross["etcd"] and not issued["scheduler"].chain
    assert all("not signed by the current authority" in d for d in next(a for a in writes
                                                                         if a.node == "team-a-cp-1").details)
    restarts = [a for a in team_a(two.plan) if a.kind in (Kind.RECREATE_CONTAINER, Kind.CREATE_CONTAINER)]
    assert {a.component for a in restarts} == {"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"}
    assert all("re-issued: restarts to read it" in a.reason for a in restarts)
    kubeconfig = yaml.safe_load(admin_kubeconfig("team-a", record, "https://127.0.0.1:6443"))
    ca = base64.b64decode(kubeconfig["clusters"][0]["cluster"]["certificate-authority-data"]).decode()
    assert pems(ca) == {old["cluster"], new["cluster"]}

    # phase 3, drop old: bundles hold only the new CAs, server certificates lose the cross-signed CA
    three = make_plan(model, config, executed(two, tmp_path), step(model, config, two.state), now=NOW)
    record = three.state.clusters["team-a"]
    assert record.rotation.phase == DROP_OLD and not record.rotation.other and record.ca_generation == 1
    assert any("phase 3 of 3 runs now: drop old" in n and "ends with this plan" in n for n in three.plan.notes)
    assert "the rotation ends at generation 2" in team_a(three.plan)[-1].reason
    for name, role in zip(BUNDLES, ROLES):
        assert pems(bundle(three, "team-a-cp-2", name)) == {new[role]}
    cp1 = next(a.payload for a in team_a(three.plan) if a.kind == Kind.WRITE_FILES and a.node == "team-a-cp-1")
    assert {i.spec.name for i in cp1.certificates} == {"apiserver", "etcd-server", "etcd-peer"}
    assert all(not i.chain for i in cp1.certificates)
    assert {f.name for f in cp1.files} == set(BUNDLES)

    # phase 3 ran: the rotation ended, the old CAs are forgotten, nothing left to do
    done = make_plan(model, config, executed(three, tmp_path), step(model, config, three.state), now=NOW)
    record = done.state.clusters["team-a"]
    assert done.plan.empty and record.rotation is None and record.ca_generation == 2
    assert {r: record.authorities[r].cert_pem for r in ROLES} == new
    assert not done.plan.notes
    assert old["cluster"] not in json.dumps(done.state.to_dict())
    quiet = make_plan(model, config, done.state, step(model, config, done.state), now=NOW)
    assert quiet.plan.empty and not quiet.plan.notes and quiet.state.to_dict() == done.state.to_dict()


def test_a_phase_interrupted_after_its_actions_plans_only_its_step_and_a_stale_step_is_refused(repo, tmp_path):
    """Killed after phase 1's actions, before its step: the next plan is that step alone (the phase is done
    live). Killed in the middle of phase 1: what is left of it, then the step. Planning never re-enters
    compile for the next phase: the next phase is the next plan's. A step whose recorded phase moved on is
    refused by the executor, changing nothing."""
    config = repo.repo.config
    state, observed = settle(repo.model)
    model = bump(repo.model)
    one = make_plan(model, config, state, observed, now=NOW)
    after = step(model, config, one.state)
    only = make_plan(model, config, one.state, after, now=NOW)
    assert [(a.kind, a.cluster) for a in only.plan.actions] == [(Kind.ADVANCE_CA_ROTATION, "team-a")]
    assert only.plan.actions[0].payload.phase == TRUST_BOTH
    assert only.state.clusters["team-a"].rotation.phase == TRUST_BOTH
    two = make_plan(model, config, executed(only, tmp_path), after, now=NOW)
    assert two.state.clusters["team-a"].rotation.phase == RE_ISSUE
    assert {a.kind for a in team_a(two.plan)} > {Kind.WRITE_FILES, Kind.RECREATE_CONTAINER}
    # half of phase 1 applied (cp-1 has the bundle, the rest not): still phase 1, only what is left, then the step
    mixed = dataclasses.replace(observed, hypervisors={
        name: dataclasses.replace(hv, pods=tuple(
            next(p for h in after.hypervisors.values() for p in h.pods if p.node == pod.node)
            if pod.node == "team-a-cp-1" else pod for pod in hv.pods))
        for name, hv in observed.hypervisors.items()})
    partial = make_plan(model, config, one.state, mixed, now=NOW)
    assert partial.state.clusters["team-a"].rotation.phase == TRUST_BOTH
    assert "team-a-cp-1" not in {a.node for a in partial.plan.actions}
    assert {"team-a-cp-2", "team-a-cp-3", "team-a-ingress"} <= {a.node for a in partial.plan.actions}
    assert partial.plan.actions[-1].kind == Kind.ADVANCE_CA_ROTATION
    # the step of a phase already recorded as done: refused, the state kept
    store = LocalDirStore(tmp_path / "stale")
    moved = executed(only, tmp_path)
    store.save(moved)
    with pytest.raises(ApplyError, match="ends CA rotation phase 2/trust-both, but the recorded rotation is "
                                         "2/re-issue; plan again"):
        execute(Plan(actions=only.plan.actions), moved, Connections(None, None), store)
    assert store.load().to_dict() == moved.to_dict()


def test_no_step_while_a_node_of_the_cluster_cannot_be_observed(repo):
    """An unreachable hypervisor with a node of the rotating cluster: the phase may not have run there, so the
    plan does not record it as done (other clusters go on)."""
    config = repo.repo.config
    state, observed = settle(repo.model)
    model = bump(repo.model)
    one = make_plan(model, config, state, observed, now=NOW)
    after = step(model, config, one.state)
    hv = one.state.nodes["team-a-cp-2"].hypervisor
    down = dataclasses.replace(after, hypervisors={
        **after.hypervisors, hv: dataclasses.replace(after.hypervisors[hv], reachable=False, error="unreachable",
                                                     pods=())})
    planned = make_plan(model, config, one.state, down, now=NOW)
    assert not any(a.kind == Kind.ADVANCE_CA_ROTATION for a in planned.plan.actions), planned.plan.actions
    assert any(u.name == hv for u in planned.plan.unknowns)


def test_caGeneration_only_goes_up_and_the_error_names_file_line_field(repo, tmp_path):
    state, observed = settle(repo.model)
    model = bump(repo.model, generation=3)
    started = make_plan(model, repo.repo.config, state, observed, now=NOW).state
    assert started.clusters["team-a"].rotation.generation == 3  # a jump rotates once, to the target
    shutil.copytree(repo.repo.root, tmp_path / "repo")
    path = tmp_path / "repo" / "clusters/team-a/cluster.yaml"
    path.write_text(path.read_text().replace("caGeneration: 1", "caGeneration: 2"))
    lowered = dataclasses.replace(validate_repo(tmp_path / "repo").model, sip_clusters={})
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if "caGeneration" in text)
    with pytest.raises(CAGenerationError) as err:
        make_plan(lowered, repo.repo.config, started, observed, now=NOW)
    assert str(err.value) == (f"clusters/team-a/cluster.yaml:{line}: Cluster/team-a: spec.certificates.caGeneration: "
                              "2 is below the rotation to generation 3 the cluster already has; a CA generation "
                              "only goes up")
    path.write_text(path.read_text().replace("caGeneration: 2", "caGeneration: 0"))
    result = validate_repo(tmp_path / "repo")
    assert any(d.field == "spec.certificates.caGeneration" and d.line == line for d in result.diagnostics), \
        result.diagnostics


def test_server_certificates_of_the_new_ca_verify_with_only_the_old_one_during_reissue(repo, tmp_path):
    """The cross-signed CA sent after a re-issued server certificate: a client that still trusts only the old
    CA (an old admin kubeconfig, a worker) verifies it; one that trusts only the new CA does too (openssl)."""
    from gitops.compile.authorities import authority
    from gitops.pki import issue_cert

    state, observed = settle(repo.model)
    model = bump(repo.model)
    one = make_plan(model, repo.repo.config, state, observed, now=NOW)
    two = make_plan(model, repo.repo.config, executed(one, tmp_path), step(model, repo.repo.config, one.state),
                    now=NOW)
    record = two.state.clusters["team-a"]
    leaf = issue_cert(authority(record.authorities, "cluster"), "kube-apiserver", server=True)
    (tmp_path / "leaf.pem").write_text(leaf.cert_pem)
    (tmp_path / "cross.pem").write_text(record.rotation.cross["cluster"])
    for name, pem in (("old", record.rotation.other["cluster"].cert_pem), ("new", record.authorities["cluster"].cert_pem)):
        (tmp_path / f"{name}.pem").write_text(pem)
        proc = subprocess.run(["openssl", "verify", "-CAfile", str(tmp_path / f"{name}.pem"), "-untrusted",
                               str(tmp_path / "cross.pem"), str(tmp_path / "leaf.pem")], capture_output=True, text=True)
        assert proc.returncode == 0, (name, proc.stdout, proc.stderr)
    proc = subprocess.run(["openssl", "verify", "-CAfile", str(tmp_path / "old.pem"), str(tmp_path / "leaf.pem")],
                          capture_output=True, text=True)
    assert proc.returncode != 0  # without the cross-signed CA the old trust does not reach it


def test_the_status_branch_keeps_the_rotation_keys_sealed(repo):
    state, observed = settle(repo.model)
    one = make_plan(bump(repo.model), repo.repo.config, state, observed, now=NOW).state
    public, secrets = split(one)
    other = public["clusters"]["team-a"]["rotation"]["other"]
    assert other and all(r["key_pem"] == "" for r in other.values())
    assert "PRIVATE KEY" not in json.dumps(public)
    assert merge(public, secrets).to_dict() == one.to_dict()


def test_a_new_cluster_starts_at_its_generation_and_a_keyless_public_state_still_plans(repo):
    """A Cluster created with caGeneration 3 rotates nothing; `plan --against-status` (the status branch's
    public state: no private keys) shows phase 1 of a rotation instead of failing."""
    model = bump(repo.model, generation=3)
    state, observed = settle(model)
    record = state.clusters["team-a"]
    assert record.ca_generation == 3 and record.rotation is None
    assert "CN=team-a-kubernetes-ca-3" in load_cert_pem(record.authorities["cluster"].cert_pem).subject.rfc4514_string()
    assert make_plan(model, repo.repo.config, state, observed, now=NOW).plan.empty
    state, observed = settle(repo.model)
    public, _ = split(state)
    keyless = merge(public, None)
    planned = make_plan(bump(repo.model), repo.repo.config, keyless, observed, now=NOW)
    assert any("phase 1 of 3 runs now" in n for n in planned.plan.notes)
    assert {a.cluster for a in planned.plan.actions} == {"team-a"}
