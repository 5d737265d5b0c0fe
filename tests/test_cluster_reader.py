"""The controller's reader of clusters' APIs (`ClusterReader`), against a real kube-apiserver.

Between applies a quiet poll reads each cluster's API: nodes and certificate requests every time
(a joining worker waits for them), gitops's own objects only after the drift interval, over
clients (and TLS connections) kept from one poll to the next.
"""
from __future__ import annotations

import base64
from collections.abc import Iterator

import pytest

from gitops.apipaths import CSRS
from gitops.observe.clusters import ClusterReader, observe_clusters
from gitops.observe.types import ClusterTarget
from gitops.pods import MANAGED, MANAGER, SPEC_HASH

from kubeapi import KubeAPI, kube_api_server
from ports import free_port
from test_cluster_api import _csr
from test_coordination import Clock

pytestmark = pytest.mark.lab("kubeapi")

CONFIGMAPS = "/api/v1/namespaces/kube-public/configmaps"


@pytest.fixture(scope="module")
def kube() -> Iterator[KubeAPI]:
    with kube_api_server("127.0.32.1") as api:
        yield api


def target(kube: KubeAPI, servers: tuple[str, ...] | None = None) -> ClusterTarget:
    return ClusterTarget("team-x", servers or (kube.url,), kube.ca.cert_pem, kube.admin.cert_pem,
                         kube.admin.key_pem)


def managed_configmap(kube: KubeAPI, name: str) -> None:
    kube.request("POST", CONFIGMAPS, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": name, "labels": {MANAGED: MANAGER}, "annotations": {SPEC_HASH: f"hash-{name}"}}})


def test_objects_are_listed_again_only_after_the_interval_while_nodes_and_requests_are_fresh(kube):
    clock = Clock()
    reader = ClusterReader(objects_interval=300, clock=clock)
    try:
        managed_configmap(kube, "reader-a")
        first = reader.observe([target(kube)])["team-x"]
        assert first.reachable, first.error
        assert first.objects[f"{CONFIGMAPS}/reader-a"] == "hash-reader-a"
        assert reader.listed == 1

        managed_configmap(kube, "reader-b")  # somebody's edit between applies
        csr = {"apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
               "metadata": {"name": "reader-csr"},
               "spec": {"signerName": "kubernetes.io/kube-apiserver-client-kubelet",
                        "request": base64.b64encode(_csr("system:node:w9").encode()).decode(),
                        "usages": ["digital signature", "key encipherment", "client auth"]}}
        kube.request("POST", CSRS, csr)
        clock.now += 299
        second = reader.observe([target(kube)])["team-x"]
        assert f"{CONFIGMAPS}/reader-b" not in second.objects  # within the interval: the listing is reused
        assert second.objects == first.objects
        assert "reader-csr" in [c.name for c in second.pending_csrs]  # read on every poll
        assert reader.listed == 1

        clock.now += 1
        third = reader.observe([target(kube)])["team-x"]
        assert third.objects[f"{CONFIGMAPS}/reader-b"] == "hash-reader-b"
        assert reader.listed == 2
        assert third == observe_clusters([target(kube)])["team-x"]  # what a one-shot observation sees

        reader.remember({"team-x": third})  # after an apply: its full observation counts as listed now
        clock.now += 100
        reader.observe([target(kube)])
        assert reader.listed == 2
    finally:
        reader.close()
        for name in ("reader-a", "reader-b"):
            kube.request("DELETE", f"{CONFIGMAPS}/{name}", ok=(200, 404))
        kube.request("DELETE", f"{CSRS}/reader-csr", ok=(200, 404))


def test_clients_are_kept_between_polls_and_replaced_when_the_credentials_or_servers_change(kube):
    reader = ClusterReader(objects_interval=0)
    try:
        reader.observe([target(kube)])
        kept = dict(reader._clients)
        reader.observe([target(kube)])
        assert reader._clients == kept and len(kept) == 1  # the same client object, its connections reused
        assert reader.listed == 2  # interval 0: listed on every poll

        other = target(kube)
        rotated = ClusterTarget(other.cluster, other.servers, other.ca_pem + "\n", other.cert_pem, other.key_pem)
        assert reader.observe([rotated])["team-x"].reachable
        assert len(reader._clients) == 1 and set(reader._clients) != set(kept)  # the old client was closed

        dead = f"https://127.0.32.1:{free_port('127.0.32.1')}"
        found = reader.observe([target(kube, (dead, kube.url))])["team-x"]
        assert found.reachable  # the next server answered
        assert [k[1] for k in reader._clients] == [kube.url]  # the unanswering server's client was dropped

        down = reader.observe([target(kube, (dead,))])["team-x"]
        assert not down.reachable and dead in down.error
        assert reader._clients == {}
        assert reader.observe([]) == {}
    finally:
        reader.close()
