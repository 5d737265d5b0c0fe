"""The flags gitops compiles for each Kubernetes version, checked against the real binaries of that version.

Every kube-apiserver / kube-controller-manager / kube-scheduler / etcd container of the
example repo's clusters, compiled for each supported release, is run with exactly its compiled
arguments plus `--version` by the binary of that release (built from its Go module): the real binary
parses every flag first and exits non-zero on an unknown one, so this proves each flag is accepted
without starting a server.
"""
from __future__ import annotations

import dataclasses
import subprocess

import pytest
from repo_helpers import EXAMPLE_REPO

from gitops.compile import compile_desired
from gitops.lab import kubebin
from gitops.model import versions
from gitops.model.resources import ApiServerOIDC
from gitops.model.validate import validate_repo
from gitops.state import State

KUBE = kubebin.CONTROL_PLANE
BUILT = kubebin.KUBERNETES_BUILT
NEWEST = kubebin.DEFAULT_VERSION


def compiled_containers(version: str, **changes) -> dict[str, list[tuple[str, ...]]]:
    """component -> the compiled args of each of its containers, with every cluster at `version`
    (and the other Cluster fields in `changes`)."""
    model = validate_repo(EXAMPLE_REPO).model
    assert model is not None
    clusters = {n: dataclasses.replace(c, kubernetes_version=version, etcd_version=versions.etcd_for(version),
                                       **changes) for n, c in model.clusters.items()}
    model = dataclasses.replace(model, clusters=clusters, sip_clusters={})
    out: dict[str, list[tuple[str, ...]]] = {c: [] for c in (*KUBE, "etcd")}
    for pod in compile_desired(model, State()).desired.pods.values():
        for container in pod.containers:
            if container.spec.name in out:
                out[container.spec.name].append(container.spec.args)
    return out


def run_real(component: str, args: tuple[str, ...], version: str = NEWEST) -> subprocess.CompletedProcess:
    return subprocess.run([str(kubebin.binary(component, version)), *args, "--version"],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("version", BUILT)
def test_every_compiled_flag_is_accepted_by_the_real_binaries_of_its_version(version):
    containers = compiled_containers(version)
    for component in KUBE:
        assert len(containers[component]) == 6  # two clusters of three controlplane nodes
        for args in containers[component]:
            proc = run_real(component, args, version)
            assert proc.returncode == 0 and proc.stdout.strip() == f"Kubernetes {version}", \
                f"{component} {version} refused its compiled flags: {proc.stdout}{proc.stderr}"
            assert "deprecated" not in proc.stderr.lower(), f"{component} {version}: {proc.stderr}"
    etcd = versions.etcd_for(version)
    for args in containers["etcd"]:
        proc = subprocess.run([str(kubebin.etcd_program("etcd", etcd)), *args, "--version"], capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 0 and proc.stdout.splitlines()[0] == f"etcd Version: {etcd}", proc.stderr


def test_the_check_fails_on_a_flag_the_real_binary_does_not_know():
    args = compiled_containers(NEWEST)["kube-scheduler"][0]
    proc = run_real("kube-scheduler", (*args, "--no-such-flag=1"))
    assert proc.returncode != 0 and "unknown flag: --no-such-flag" in proc.stderr
    # and a flag removed since 1.20 (the insecure ports went in 1.24) is refused as unknown
    proc = run_real("kube-apiserver", (*compiled_containers(NEWEST)["kube-apiserver"][0], "--insecure-port=0"))
    assert proc.returncode != 0 and "unknown flag: --insecure-port" in proc.stderr


@pytest.mark.parametrize("version", BUILT)
def test_no_flag_removed_since_1_20_is_compiled(version):
    removed = ("--insecure-port", "--port=", "--address=", "--insecure-bind-address", "--logtostderr", "--log-dir",
               "--service-account-api-audiences", "--container-runtime=", "PodSecurityPolicy")
    for component, all_args in compiled_containers(version).items():
        for args in all_args:
            assert not [a for a in args if a.startswith(removed) or "PodSecurityPolicy" in a], (component, args)


def test_the_flags_gitops_sets_are_the_ones_extra_args_may_not_set():
    """spec.apiServer.extraArgs is refused for exactly the flags compile sets (API_SERVER_FLAGS)."""
    from gitops.model.resources import API_SERVER_FLAGS

    for version in BUILT:
        for args in compiled_containers(version)["kube-apiserver"]:
            names = {a.split("=", 1)[0].removeprefix("--") for a in args}
            assert names <= API_SERVER_FLAGS, sorted(names - API_SERVER_FLAGS)
    assert API_SERVER_FLAGS == {a.split("=", 1)[0].removeprefix("--")
                                for a in compiled_containers(NEWEST, oidc=EVERY_OIDC)["kube-apiserver"][0]}


#: spec.apiServer.oidc with every field set
EVERY_OIDC = ApiServerOIDC("https://auth.example.test:8443/dex", "kubernetes", "sub", "roles", "oidc:", "oidc:",
                           "-----BEGIN CERTIFICATE-----\n...\n-----END CERTIFICATE-----\n")


def test_the_oidc_flags_reach_the_real_api_server_and_read_the_issuer_ca_from_its_files():
    """spec.apiServer.oidc becomes --oidc-* flags the real binary accepts; its CA is a file of the pod."""
    for args in compiled_containers(NEWEST, oidc=EVERY_OIDC)["kube-apiserver"]:
        oidc = [a for a in args if a.startswith("--oidc-")]
        assert oidc == ["--oidc-issuer-url=https://auth.example.test:8443/dex", "--oidc-client-id=kubernetes",
                        "--oidc-username-claim=sub", "--oidc-groups-claim=roles", "--oidc-username-prefix=oidc:",
                        "--oidc-groups-prefix=oidc:", "--oidc-ca-file=/etc/gitops/oidc-ca.crt"], oidc
        proc = run_real("kube-apiserver", args)
        assert proc.returncode == 0 and proc.stdout.strip() == f"Kubernetes {NEWEST}", proc.stderr
    model = validate_repo(EXAMPLE_REPO).model
    clusters = {n: dataclasses.replace(c, oidc=EVERY_OIDC) for n, c in model.clusters.items()}
    desired = compile_desired(dataclasses.replace(model, clusters=clusters, sip_clusters={}), State()).desired
    for pod in desired.pods.values():
        if any(c.spec.name == "kube-apiserver" for c in pod.containers):
            assert {f.name: f.content for f in pod.files}["oidc-ca.crt"] == EVERY_OIDC.ca_bundle


def test_extra_args_reach_the_real_api_server_last_and_sorted():
    extra = (("event-ttl", "2h0m0s"), ("max-requests-inflight", "500"))
    for args in compiled_containers(NEWEST, api_server_args=extra)["kube-apiserver"]:
        assert args[-2:] == ("--event-ttl=2h0m0s", "--max-requests-inflight=500")
        proc = run_real("kube-apiserver", args)
        assert proc.returncode == 0 and proc.stdout.strip() == f"Kubernetes {NEWEST}", proc.stderr


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
