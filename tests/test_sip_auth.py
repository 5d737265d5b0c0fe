"""SIP's OIDC provider as a pod (issue #47), planned from the example repo: its pod, certificate, files and the
clusters that trust it by name (pure: the lab test is tests/test_sip_auth_lab.py)."""
from __future__ import annotations

import dataclasses
import io
import json
import shutil

import pytest
from repo_helpers import EXAMPLE_REPO
from rich.console import Console
from test_plan_diff import NOW, nothing_observed, settle

from gitops.apply import Timing
from gitops.compile.authorities import SERVICE_AUTHORITY
from gitops.engine import make_plan
from gitops.lab.example import declare_oidc_user
from gitops.model.validate import validate_repo
from gitops.oidc.passwords import hash_password
from gitops.plan.render import render_json, render_markdown, render_text
from gitops.state import State

PASSWORD = "correct horse battery staple"


@pytest.fixture(scope="module")
def declared(tmp_path_factory):
    repo = tmp_path_factory.mktemp("sip-auth") / "repo"
    shutil.copytree(EXAMPLE_REPO, repo)
    declare_oidc_user(repo, "alice", hash_password(PASSWORD))
    result = validate_repo(repo)
    assert result.ok, result.diagnostics
    return repo, result


def test_the_provider_runs_behind_tls_on_the_public_hypervisor(declared):
    _, result = declared
    model, config = result.model, result.repo.config
    planned = make_plan(model, config, State(), nothing_observed(model), now=NOW)
    pod = planned.compiled.desired.pods["tenant-1-auth"]
    assert pod.cluster == "sip-tenant-1" and pod.role == "sip-auth" and pod.hypervisor == "hv-public-1"
    assert [c.spec.name for c in pod.containers] == ["files", "haproxy", "oidc"]
    port = planned.state.nodes["tenant-1-auth"].ports["oidc"]
    ip = model.hypervisors["hv-public-1"].ip_address
    files = {f.name: f.content for f in pod.files}
    front = files["haproxy.cfg"]
    assert f"bind {ip}:{port} ssl crt /etc/gitops/oidc-serving.crt" in front
    assert f"server provider 127.0.0.1:{port}" in front and "sc_http_req_rate(0) gt 30" in front
    provider = next(c.spec for c in pod.containers if c.spec.name == "oidc")
    assert provider.command == ("gitops", "oidc", "serve") and f"127.0.0.1:{port}" in provider.args
    assert provider.user == 0 and "--user" in provider.args  # root only until its key directory is its own
    config_doc = json.loads(files["oidc.json"])
    assert config_doc["issuer"] == f"https://{ip}:{port}"
    assert [u["username"] for u in config_doc["users"]] == ["alice"]
    assert PASSWORD not in files["oidc.json"] and config_doc["users"][0]["passwordHash"].startswith("$2b$")
    (cert,) = pod.certificates
    assert cert.signer == SERVICE_AUTHORITY and cert.server and cert.ip_addresses == (ip,)
    record = planned.state.clusters["sip-tenant-1"]
    assert set(record.authorities) == {SERVICE_AUTHORITY} and record.authorities[SERVICE_AUTHORITY].key_pem
    # a cluster that trusts the provider by name gets its issuer URL, client and CA
    apiserver = next(c.spec for p in planned.compiled.desired.pods.values() if p.node == "team-a-cp-1"
                     for c in p.containers if c.spec.name == "kube-apiserver")
    assert f"--oidc-issuer-url=https://{ip}:{port}" in apiserver.args
    assert "--oidc-client-id=tenant-1-kubernetes" in apiserver.args
    assert "--oidc-ca-file=/etc/gitops/oidc-ca.crt" in apiserver.args
    ca = next(f.content for f in planned.compiled.desired.pods["team-a-cp-1"].files if f.name == "oidc-ca.crt")
    assert ca == record.trust_bundle(SERVICE_AUTHORITY)
    assert planned.compiled.oidc["team-a"].issuer_url == f"https://{ip}:{port}"
    team_b = next(c.spec for c in planned.compiled.desired.pods["team-b-cp-1"].containers
                  if c.spec.name == "kube-apiserver")
    assert not any(a.startswith("--oidc-") for a in team_b.args)
    # what a plan shows (a terminal, a pull request) never holds a hash (a saved plan does: apply writes it)
    out = io.StringIO()
    render_text(planned.plan, Console(file=out, highlight=False, soft_wrap=True, color_system=None))
    shown = out.getvalue() + render_markdown(planned.plan)
    assert "tenant-1-auth" in shown and config_doc["users"][0]["passwordHash"] not in shown
    assert config_doc["users"][0]["passwordHash"] in render_json(planned.plan)


def test_once_settled_the_plan_is_empty_and_the_ca_stays(declared):
    _, result = declared
    model, config = result.model, result.repo.config
    # (the load balancer and jump host follow the hosts' labels, which this settling does not apply)
    tenant = dataclasses.replace(model.sip_clusters["tenant-1"], load_balancer=None, jump_host=None)
    model = dataclasses.replace(model, sip_clusters={"tenant-1": tenant})
    state, observed = settle(model)
    again = make_plan(model, config, state, observed, now=NOW)
    assert "tenant-1-auth" in {p.node for p in observed.pods()}
    assert {a.kind.value for a in again.plan.actions} == {"label-host"}  # (the hosts' labels are not settled here)
    assert again.state.clusters["sip-tenant-1"].authorities == state.clusters["sip-tenant-1"].authorities


def test_without_users_or_clients_no_provider_runs():
    result = validate_repo(EXAMPLE_REPO)
    model = result.model
    planned = make_plan(model, result.repo.config, State(), nothing_observed(model), now=NOW)
    assert "tenant-1-auth" not in planned.compiled.desired.pods
    assert "sip-tenant-1" not in planned.state.clusters


def _diagnostics(repo, rel: str, edit) -> list[str]:
    """What validation says of `repo` with file `rel` edited by `edit` (text -> text); the file is put back."""
    path = repo / rel
    before = path.read_text()
    path.write_text(edit(before))
    try:
        return [str(d) for d in validate_repo(repo).diagnostics]
    finally:
        path.write_text(before)


@pytest.mark.parametrize("edit, words", [
    (lambda t: t.replace("sipCluster: tenant-1", "sipCluster: tenant-9"), "no SIPCluster 'tenant-9' in the repo"),
    (lambda t: t.replace("sipCluster: tenant-1", "sipCluster: tenant-1\n      clientID: nobody"),
     "client 'nobody' is not a client of SIPCluster tenant-1's provider"),
    (lambda t: t.replace("sipCluster: tenant-1", "sipCluster: tenant-1\n      issuerURL: https://x.example"),
     "either issuerURL and clientID"),
    # a prefix the API server puts before every name may not make one of Kubernetes' own (issue #60.2)
    (lambda t: t.replace('groupsPrefix: "oidc:"', 'groupsPrefix: "system:"'),
     "oidc.groupsPrefix: 'system:': put before a name it spells, or can spell, a system: name"),
    (lambda t: t.replace('groupsPrefix: "oidc:"', 'groupsPrefix: "SyStem:x-"'), "'SyStem:x-': put before a name"),
    (lambda t: t.replace('usernamePrefix: "oidc:"', 'usernamePrefix: "system:node:"'),
     "oidc.usernamePrefix: 'system:node:': put before a name"),
    (lambda t: t.replace('groupsPrefix: "oidc:"', 'groupsPrefix: "sys"'), "'sys': put before a name it spells, or"),
])
def test_a_cluster_trusting_a_provider_by_name_is_checked(declared, edit, words):
    repo, _ = declared
    errors = _diagnostics(repo, "clusters/team-a/cluster.yaml", edit)
    assert any(words in e and "cluster.yaml" in e for e in errors), errors


def test_the_trusted_client_must_be_declared(declared):
    repo, _ = declared
    errors = _diagnostics(repo, "sip/tenant-1.yaml",
                          lambda t: t.replace("clientID: tenant-1-kubernetes", "clientID: someone-else"))
    assert any("'someone-else' is not one of the clients declared below" in e and "tenant-1.yaml" in e
               for e in errors), errors


def test_a_provider_that_is_not_placed_yet_leaves_the_flags_out(declared):
    _, result = declared
    from gitops.compile import compile_desired

    compiled = compile_desired(result.model, State(), now=NOW, unavailable=("hv-public-1", "hv-public-2"))
    assert "team-a" not in compiled.oidc
    assert any("OIDC provider of SIPCluster tenant-1 is not placed yet" in n for n in compiled.deferred)


def test_the_status_shows_the_issuer_and_the_apply_record_holds_no_hash(declared):
    from gitops.status.commit import placements_of
    from gitops.status.report import _service_endpoints, apply_document

    _, result = declared
    model, config = result.model, result.repo.config
    planned = make_plan(model, config, State(), nothing_observed(model), now=NOW)
    placed = planned.state.nodes["tenant-1-auth"]
    ip = model.hypervisors[placed.hypervisor].ip_address
    auth = _service_endpoints(model, "tenant-1", planned.compiled.desired, placements_of(planned.state))["auth"]
    assert auth == {"users": 1, "clients": ["tenant-1-kubernetes"],
                    "oidcIssuerURL": f"https://{ip}:{placed.ports['oidc']}", "endpoint": f"{ip}:{placed.ports['oidc']}"}
    done = {i: Timing(0.0, 0.0) for i in range(len(planned.plan.actions))}
    record = apply_document("0" * 40, planned.plan, done, {}, "", False, None, [], NOW)
    password_hash = model.sip_clusters["tenant-1"].auth.users[0].password_hash
    assert b"tenant-1-auth" in record and password_hash.encode() not in record


def test_a_user_may_not_claim_a_system_group(declared):
    repo, _ = declared
    declared_group = '- "tenant-1-viewers"\n'
    errors = _diagnostics(repo, "sip/tenant-1.yaml",
                          lambda t: t.replace(declared_group, declared_group + "            - system:masters\n"))
    assert any("'system:masters': the system: groups are Kubernetes' own" in e and "tenant-1.yaml" in e
               and "groups[1]" in e for e in errors), errors


@pytest.mark.parametrize("declared_as, key, name, words", [
    ("username: alice", "username", "system:kube-controller-manager", "does not match"),
    ("email: alice@example.com", "email", "System:x@example.com", "the system: names are Kubernetes' own"),
])
def test_a_user_may_not_take_a_system_name(declared, declared_as, key, name, words):
    repo, _ = declared
    errors = _diagnostics(repo, "sip/tenant-1.yaml", lambda t: t.replace(declared_as, f"{key}: {name!r}"))
    assert any(words in e and "tenant-1.yaml" in e and f"users[0].{key}: {name!r}" in e for e in errors), errors


def test_an_unprefixed_issuer_with_declared_names_validates(declared):
    """No prefix at all (- or absent) is allowed: the names the provider sends are checked one by one."""
    repo, _ = declared
    errors = _diagnostics(repo, "clusters/team-a/cluster.yaml",
                          lambda t: t.replace('usernamePrefix: "oidc:"', 'usernamePrefix: "-"')
                          .replace('      groupsPrefix: "oidc:"\n', ""))
    assert errors == []
