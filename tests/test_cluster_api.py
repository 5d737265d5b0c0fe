"""What gitops plans inside a cluster's own API (pure): bootstrap objects and node certificates."""
from __future__ import annotations

import dataclasses
import ipaddress

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gitops.compile.bootstrap import bootstrap_objects
from gitops.compile.desired import DesiredCluster, DesiredState
from gitops.observe.types import (
    ObservedCluster,
    ObservedContainer,
    ObservedCSR,
    ObservedHypervisor,
    ObservedPod,
    ObservedState,
)
from gitops.plan.actions import Kind, Plan, UnknownKind
from gitops.plan.cluster_api import CLIENT_SIGNER, SERVING_SIGNER, cluster_api_actions, sign_decision
from gitops.plan.payloads import payload_from_dict, payload_to_dict

ENDPOINT = "https://127.0.0.1:30000"
OBJECTS = bootstrap_objects(ENDPOINT, "CA PEM")


def _csr(common_name: str, orgs=("system:nodes",), dns=(), ips=(), email: str = "") -> str:
    key = ec.generate_private_key(ec.SECP256R1())
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    attrs += [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
    builder = x509.CertificateSigningRequestBuilder().subject_name(x509.Name(attrs))
    names = [x509.DNSName(d) for d in dns] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
    names += [x509.RFC822Name(email)] if email else []
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM).decode()


def _request(signer: str, pem: str, username: str = "system:node:w1", approved: bool = False,
             usages=("digital signature", "key encipherment", "server auth")) -> ObservedCSR:
    return ObservedCSR("csr-1", "uid-1", signer, username, ("system:nodes", "system:authenticated"),
                       tuple(usages), pem, approved)


def _world(objects: dict[str, str] | None, csrs=(), reachable=True, api_running=True):
    desired = DesiredState(pods={}, clusters={"a": DesiredCluster("a", (), ENDPOINT, OBJECTS)})
    pods = ()
    if api_running:
        pods = (ObservedPod("s1", "a-cp-1", "a", "controlplane", "hv", True, "h", 1,
                            (ObservedContainer("c1", "kube-apiserver", "running", "h", 1),)),)
    clusters = {} if objects is None else {"a": ObservedCluster("a", reachable, "" if reachable else "timed out",
                                                                objects, (), tuple(csrs))}
    return desired, ObservedState({"hv": ObservedHypervisor("hv", True, "", pods)}, clusters=clusters)


def test_objects_are_created_when_missing_updated_on_drift_and_left_alone_when_equal():
    converged = {o.key: o.spec_hash for o in OBJECTS}
    actions, warnings, unknowns = cluster_api_actions(*_world(converged), 60)
    assert (actions, warnings, unknowns) == ([], [], [])
    drifted = {**converged, OBJECTS[0].key: "edited"}
    del drifted[OBJECTS[1].key]
    actions, _, _ = cluster_api_actions(*_world(drifted), 60)
    assert [(a.kind, a.component) for a in actions] == [(Kind.UPDATE_OBJECT, OBJECTS[0].name),
                                                       (Kind.CREATE_OBJECT, OBJECTS[1].name)]
    assert actions[0].reason == f"spec hash edited != {OBJECTS[0].spec_hash}"
    assert actions[0].payload.body == OBJECTS[0].body and actions[0].payload.wait_ready == 0


def test_a_new_cluster_gets_its_objects_after_its_api_is_ready_and_an_unanswering_api_is_unknown():
    actions, _, unknowns = cluster_api_actions(*_world(None, api_running=False), 90)
    assert len(actions) == len(OBJECTS) and {a.payload.wait_ready for a in actions} == {90}
    assert not unknowns
    actions, _, unknowns = cluster_api_actions(*_world({}, reachable=False), 60)
    assert actions == [] and [(u.kind, u.name) for u in unknowns] == [(UnknownKind.CLUSTER_API, "a")]
    assert "did not answer (timed out)" in unknowns[0].describe()
    # an API server runs but nothing observed it (no admin credential recorded): unknown, not "new"
    actions, _, unknowns = cluster_api_actions(*_world(None), 60)
    assert actions == [] and unknowns[0].kind == UnknownKind.CLUSTER_API


def test_gitops_signs_exactly_what_a_node_may_have():
    serving = _request(SERVING_SIGNER, _csr("system:node:w1", dns=("w1",), ips=("10.250.0.1",)))
    decided = sign_decision(serving)
    assert decided == {"common_name": "system:node:w1", "organizations": ("system:nodes",), "dns_names": ("w1",),
                       "ip_addresses": ("10.250.0.1",), "server_auth": True, "days": 365, "approve": True}
    client = _request(CLIENT_SIGNER, _csr("system:node:w1"), username="system:bootstrap:abcdef", approved=True,
                      usages=("digital signature", "key encipherment", "client auth"))
    assert sign_decision(client)["client_auth"] is True
    # not approved by the controller-manager yet: wait, quietly
    assert sign_decision(dataclasses.replace(client, approved=False)) == ""
    # another signer's request is none of gitops's business
    assert sign_decision(_request("example.com/other", _csr("x"))) == ""


def test_gitops_refuses_requests_beyond_a_node():
    other_node = _request(SERVING_SIGNER, _csr("system:node:w2", ips=("10.0.0.1",)))
    assert "not by the node system:node:w2 itself" in sign_decision(other_node)
    admin = _request(SERVING_SIGNER, _csr("system:node:w1", orgs=("system:masters",), ips=("10.0.0.1",)))
    assert "is not CN=system:node:NAME,O=system:nodes" in sign_decision(admin)
    email = _request(SERVING_SIGNER, _csr("system:node:w1", ips=("10.0.0.1",), email="a@b.c"))
    assert "neither DNS nor IP" in sign_decision(email)
    client_auth = _request(SERVING_SIGNER, _csr("system:node:w1", ips=("10.0.0.1",)),
                           usages=("digital signature", "client auth"))
    assert "usages ['client auth'] are not allowed" in sign_decision(client_auth)
    forged = dataclasses.replace(client_auth, request="-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n"
                                                      "-----END CERTIFICATE REQUEST-----\n")
    assert sign_decision(forged).startswith("not a PEM certificate request")
    _, warnings, _ = cluster_api_actions(*_world({o.key: o.spec_hash for o in OBJECTS}, csrs=[admin]), 60)
    assert warnings == ["cluster a: certificate request csr-1 not signed: subject "
                        "O=system:masters,CN=system:node:w1 is not CN=system:node:NAME,O=system:nodes"]


def test_sign_actions_round_trip_through_a_saved_plan():
    serving = _request(SERVING_SIGNER, _csr("system:node:w1", ips=("10.250.0.1",)))
    actions, _, _ = cluster_api_actions(*_world({o.key: o.spec_hash for o in OBJECTS}, csrs=[serving]), 60)
    (sign,) = actions
    assert sign.kind == Kind.SIGN_CERTIFICATE_REQUEST and sign.node == "w1" and sign.payload.approve
    assert payload_from_dict(payload_to_dict(sign.payload)) == sign.payload
    plan = Plan(actions=tuple(actions))
    assert Plan.from_dict(plan.to_dict()).actions[0].payload == sign.payload


def test_observation_lists_every_collection_bootstrap_writes_to():
    """Otherwise an object would never be seen and be planned as missing on every pass."""
    from gitops.observe.clusters import COLLECTIONS

    assert {o.collection for o in OBJECTS} <= set(COLLECTIONS)


def test_a_new_certificate_request_ends_a_quiet_streak_and_survives_the_status_snapshot():
    """The controller skips planning while the live fingerprint holds: a worker's request must change it,
    and the per-cluster snapshot on the status branch must keep what the cluster's API showed."""
    from gitops.status.poll import live_fingerprint
    from gitops.status.snapshot import CLUSTERS_DIR, load_snapshot, snapshot_files

    converged = {o.key: o.spec_hash for o in OBJECTS}
    _, quiet = _world(converged)
    _, asking = _world(converged, csrs=[_request(SERVING_SIGNER, _csr("system:node:w1", ips=("10.0.0.1",)))])
    assert live_fingerprint(quiet) != live_fingerprint(asking)
    files = snapshot_files(asking)
    names = [p.split("/")[-1] for p in files if p.startswith(CLUSTERS_DIR)]
    assert load_snapshot(files.get, names).clusters == asking.clusters
