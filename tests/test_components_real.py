"""The flags gitops compiles for each Kubernetes version, checked against the real v1.20.2 binaries.

Every kube-apiserver / kube-controller-manager / kube-scheduler container of the
example repo's clusters (1.20.2) is run with exactly its compiled arguments plus
`--version`: the real binary parses every flag first and exits non-zero on an
unknown one, so this proves each flag is accepted without starting a server.
"""
from __future__ import annotations

import dataclasses
import subprocess

import pytest
from repo_helpers import EXAMPLE_REPO

from gitops.compile import compile_desired
from gitops.lab import kubebin
from gitops.model.resources import ApiServerOIDC
from gitops.model.validate import validate_repo
from gitops.state import State

KUBE = kubebin.CONTROL_PLANE


def compiled_containers(version: str, **changes) -> dict[str, list[tuple[str, ...]]]:
    """component -> the compiled args of each of its containers, with every cluster at `version`
    (and the other Cluster fields in `changes`)."""
    model = validate_repo(EXAMPLE_REPO).model
    assert model is not None
    clusters = {n: dataclasses.replace(c, kubernetes_version=version, **changes) for n, c in model.clusters.items()}
    model = dataclasses.replace(model, clusters=clusters, sip_clusters={})
    out: dict[str, list[tuple[str, ...]]] = {c: [] for c in KUBE}
    for pod in compile_desired(model, State()).desired.pods.values():
        for container in pod.containers:
            if container.spec.name in KUBE:
                out[container.spec.name].append(container.spec.args)
    return out


def run_real(component: str, args: tuple[str, ...]) -> subprocess.CompletedProcess:
    return subprocess.run([str(kubebin.binary(component)), *args, "--version"],
                          capture_output=True, text=True, timeout=60)


def test_every_compiled_flag_is_accepted_by_the_real_1_20_binaries():
    containers = compiled_containers("v1.20.2")
    for component in KUBE:
        assert len(containers[component]) == 6  # two clusters of three controlplane nodes
        for args in containers[component]:
            proc = run_real(component, args)
            assert proc.returncode == 0 and proc.stdout.strip() == "Kubernetes v1.20.2", \
                f"{component} refused its compiled flags: {proc.stdout}{proc.stderr}"


def test_the_check_fails_on_a_flag_the_real_binary_does_not_know():
    args = compiled_containers("v1.20.2")["kube-scheduler"][0]
    proc = run_real("kube-scheduler", (*args, "--no-such-flag=1"))
    assert proc.returncode != 0 and "unknown flag: --no-such-flag" in proc.stderr


@pytest.mark.parametrize(("version", "legacy"), [("v1.20.2", True), ("v1.23.17", True), ("v1.24.0", False),
                                                 ("v1.31.2", False)])
def test_insecure_ports_are_turned_off_only_where_the_flags_exist(version, legacy):
    containers = compiled_containers(version)
    expected = {"kube-apiserver": "--insecure-port=0", "kube-controller-manager": "--port=0",
                "kube-scheduler": "--port=0"}
    for component, flag in expected.items():
        for args in containers[component]:
            assert (flag in args) is legacy, f"{component} {version}: {args}"


def test_the_flags_gitops_sets_are_the_ones_extra_args_may_not_set():
    """spec.apiServer.extraArgs is refused for exactly the flags compile sets (API_SERVER_FLAGS)."""
    from gitops.model.resources import API_SERVER_FLAGS

    for version in ("v1.20.2", "v1.31.2"):
        for args in compiled_containers(version)["kube-apiserver"]:
            names = {a.split("=", 1)[0].removeprefix("--") for a in args}
            assert names <= API_SERVER_FLAGS, sorted(names - API_SERVER_FLAGS)
    assert API_SERVER_FLAGS == {a.split("=", 1)[0].removeprefix("--")
                                for a in compiled_containers("v1.20.2", oidc=EVERY_OIDC)["kube-apiserver"][0]}


#: spec.apiServer.oidc with every field set
EVERY_OIDC = ApiServerOIDC("https://auth.example.test:8443/dex", "kubernetes", "sub", "roles", "oidc:", "oidc:",
                           "-----BEGIN CERTIFICATE-----\n...\n-----END CERTIFICATE-----\n")


def test_the_oidc_flags_reach_the_real_api_server_and_read_the_issuer_ca_from_its_files():
    """spec.apiServer.oidc becomes --oidc-* flags the real v1.20.2 binary accepts; its CA is a file of the pod."""
    for args in compiled_containers("v1.20.2", oidc=EVERY_OIDC)["kube-apiserver"]:
        oidc = [a for a in args if a.startswith("--oidc-")]
        assert oidc == ["--oidc-issuer-url=https://auth.example.test:8443/dex", "--oidc-client-id=kubernetes",
                        "--oidc-username-claim=sub", "--oidc-groups-claim=roles", "--oidc-username-prefix=oidc:",
                        "--oidc-groups-prefix=oidc:", "--oidc-ca-file=/etc/gitops/oidc-ca.crt"], oidc
        proc = run_real("kube-apiserver", args)
        assert proc.returncode == 0 and proc.stdout.strip() == "Kubernetes v1.20.2", proc.stderr
    model = validate_repo(EXAMPLE_REPO).model
    clusters = {n: dataclasses.replace(c, oidc=EVERY_OIDC) for n, c in model.clusters.items()}
    desired = compile_desired(dataclasses.replace(model, clusters=clusters, sip_clusters={}), State()).desired
    for pod in desired.pods.values():
        if any(c.spec.name == "kube-apiserver" for c in pod.containers):
            assert {f.name: f.content for f in pod.files}["oidc-ca.crt"] == EVERY_OIDC.ca_bundle


def test_extra_args_reach_the_real_api_server_last_and_sorted():
    extra = (("event-ttl", "2h0m0s"), ("max-requests-inflight", "500"))
    for args in compiled_containers("v1.20.2", api_server_args=extra)["kube-apiserver"]:
        assert args[-2:] == ("--event-ttl=2h0m0s", "--max-requests-inflight=500")
        proc = run_real("kube-apiserver", args)
        assert proc.returncode == 0 and proc.stdout.strip() == "Kubernetes v1.20.2", proc.stderr


def test_each_api_server_talks_to_its_own_etcd_member_only():
    """Stacked etcd as kubeadm has it: before a member changes, the plan stops the API server beside it
    (gitops.plan.diff), and no API server ever sends a call to another node's member shutting down."""
    model = validate_repo(EXAMPLE_REPO).model
    pods = compile_desired(dataclasses.replace(model, sip_clusters={}), State()).desired.pods.values()
    checked = 0
    for pod in pods:
        specs = {c.spec.name: c.spec for c in pod.containers}
        if "kube-apiserver" not in specs:
            continue
        own = next(a for a in specs["etcd"].args if a.startswith("--advertise-client-urls=")).split("=", 1)[1]
        servers = next(a for a in specs["kube-apiserver"].args if a.startswith("--etcd-servers=")).split("=", 1)[1]
        assert servers == own, (pod.node, servers)
        checked += 1
    assert checked >= 3
