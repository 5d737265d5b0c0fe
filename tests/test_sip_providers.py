"""BareMetalHost providers: the repo files with a label overlay, and a Metal3 management cluster.

The `kubernetes` provider is tested against a real kube-apiserver with etcd
(`tests/kubeapi.py`; the binaries come from scripts/build-kubernetes.sh) serving the
BareMetalHost CRD gitops ships (deploy/crds/metal3.io_baremetalhosts.yaml). Hosts are
created through the API (status through the /status subresource), read back with the
real kubectl, and concurrent writers are real kubectl edits made between the provider's
read and its patch, so the 409 Conflicts are the API server's own.
"""
from __future__ import annotations

import os

import copy
import json
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from gitops.kubeapi import KubeAPIError
from gitops.model.validate import load_model
from gitops.model.yamlload import load_yaml_documents
from gitops.pki import create_ca
from gitops.sip import SIPError
from gitops.sip.fileprovider import FileProvider
from gitops.sip.hosts import hosts_from_yaml
from gitops.sip.kubeprovider import KubernetesProvider
from gitops.sip.selection import CLUSTER_LABEL, NODE_TYPE_LABEL, LabelChange, select_hosts
from kubeapi import KubeAPI, kube_api_server
from ports import free_port
from test_sip_selection import demanding

pytestmark = pytest.mark.lab("kubeapi")

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_REPO = ROOT / "example-repo"
INVENTORY = EXAMPLE_REPO / "inventory" / "baremetalhosts.yaml"
CRD = ROOT / "deploy" / "crds" / "metal3.io_baremetalhosts.yaml"
BMH_PATH = "/apis/metal3.io/v1alpha1/namespaces/{namespace}/baremetalhosts"


def inventory_objects() -> list[dict]:
    """The example inventory plus a third rack (r03), so tenant-1 can be satisfied.

    Read as Kubernetes tooling reads YAML: PyYAML's YAML 1.1 would make the unquoted MACs
    base-60 integers, which the real API server rightly refuses (bootMACAddress is a string).
    """
    items = load_yaml_documents(INVENTORY.read_text())[0].data["items"]
    for name, flavor in (("r03-node-01", "control-plane"), ("r03-node-02", "worker")):
        extra = copy.deepcopy(items[0])
        extra["metadata"]["name"] = name
        extra["metadata"]["labels"] = {"sip.airshipit.org/rack": "r03", "sip.airshipit.org/server": name,
                                       "vino.airshipit.org/flavor": flavor}
        items.append(extra)
    return items


# --------------------------------------------------------------------------- file provider


def test_file_provider_overlay_round_trip():
    model = demanding(load_model(EXAMPLE_REPO))  # wants the r03 hosts too
    extra = hosts_from_yaml(yaml.safe_dump({"kind": "List", "items": inventory_objects()[-2:]}), "extra.yaml")
    hosts = list(model.baremetal_hosts.values()) + extra
    provider = FileProvider(hosts)
    result = select_hosts(model.sip_clusters, provider.list_hosts())
    assert result.selection("tenant-1").ready and len(result.changes) == 7
    provider.apply_labels(result.changes)
    overlay = provider.overlay
    assert overlay["metal3/r01-node-01"] == {CLUSTER_LABEL: "tenant-1", "sip.airshipit.org/node-type": "ControlPlane",
                                             "sip.airshipit.org/sip-scheduled": "true"}
    # the caller records the overlay (e.g. on the status branch) and passes it back next time
    again = FileProvider(hosts, json.loads(json.dumps(overlay)))
    assert select_hosts(model.sip_clusters, again.list_hosts()).empty
    # SIPCluster removed: all unlabeled, and the overlay is empty again (the files never had SIP labels)
    again.apply_labels(select_hosts({}, again.list_hosts()).changes)
    assert again.overlay == {} and again.list_hosts() == sorted(hosts, key=lambda h: (h.namespace, h.name))


def test_file_provider_records_removal_of_labels_the_files_carry():
    model = load_model(EXAMPLE_REPO)
    host = model.baremetal_hosts["metal3/r01-node-02"]
    labeled = replace(host, labels=host.labels | {CLUSTER_LABEL: "gone"})
    provider = FileProvider([labeled], {"metal3/vanished": {CLUSTER_LABEL: "x"}})
    assert provider.overlay == {}  # entries of hosts no longer in the files are dropped
    provider.apply_labels(select_hosts({}, provider.list_hosts()).changes)
    assert provider.overlay == {"metal3/r01-node-02": {CLUSTER_LABEL: None}}
    assert CLUSTER_LABEL not in provider.list_hosts()[0].labels
    with pytest.raises(SIPError, match="unknown BareMetalHost.*metal3/nope"):
        provider.apply_labels([LabelChange("metal3/nope", "x", remove=(CLUSTER_LABEL,))])


def test_hosts_from_a_kubectl_export_match_the_repo_model():
    model = load_model(EXAMPLE_REPO)
    assert hosts_from_yaml(INVENTORY.read_text(), str(INVENTORY)) == list(model.baremetal_hosts.values())
    with pytest.raises(SIPError, match="bad.yaml: a BareMetalHost without metadata.name"):
        hosts_from_yaml("kind: BareMetalHost\nmetadata: {}\n", "bad.yaml")


# --------------------------------------------------------------------------- kubernetes provider


@pytest.fixture(scope="module")
def kube() -> Iterator[KubeAPI]:
    """A real kube-apiserver + etcd with the shipped BareMetalHost CRD, for this module."""
    with kube_api_server(crds=[CRD]) as api:
        yield api


def create_hosts(kube: KubeAPI, objects: list[dict]) -> None:
    """Create BareMetalHosts as a user would, then write their status as baremetal-operator does."""
    for obj in objects:
        namespace = obj["metadata"]["namespace"]
        kube.ensure_namespace(namespace)
        body = {k: v for k, v in obj.items() if k != "status"}
        _, created = kube.request("POST", BMH_PATH.format(namespace=namespace), body)
        created["status"] = obj["status"]  # ignored on create: the CRD has a status subresource
        kube.request("PUT", f"{BMH_PATH.format(namespace=namespace)}/{obj['metadata']['name']}/status", created)


@pytest.fixture
def api(kube) -> Iterator[KubeAPI]:
    """The inventory as real objects in namespace metal3; every BareMetalHost removed afterwards."""
    create_hosts(kube, inventory_objects())
    yield kube
    kube.kubectl("delete", "baremetalhosts", "--all", "--all-namespaces")


def labels(kube: KubeAPI, key: str) -> dict[str, str]:
    """A host's labels as the real kubectl reads them."""
    namespace, name = key.split("/")
    return kube.kubectl_json("get", "bmh", "-n", namespace, name)["metadata"].get("labels", {})


def sip_kubeconfig(kube: KubeAPI) -> Path:
    """An inline client certificate (``client-*-data``) of a cluster admin."""
    return kube.cert_kubeconfig("gitops-sip", "gitops-sip", groups=["system:masters"])


class Spy:
    """Records the provider's API requests (verb, host name, HTTP status); `before[name]` runs a
    concurrent writer just before the provider's PATCH of that host."""

    def __init__(self, provider: KubernetesProvider, monkeypatch: pytest.MonkeyPatch):
        self.log: list[tuple[str, str | None, int]] = []
        self.before: dict[str, Callable[[], None]] = {}
        monkeypatch.setattr(provider.api, "request", self._wrap(provider.api.request))

    def _wrap(self, real: Callable) -> Callable:
        def call(method, path, *args, **kwargs):
            collection, _, name = path.rpartition("/baremetalhosts")
            name = name.lstrip("/") or None
            verb = "LIST" if method == "GET" and name is None else method
            if verb == "PATCH" and name in self.before:
                self.before[name]()
            try:
                result = real(method, path, *args, **kwargs)
            except KubeAPIError as err:
                self.log.append((verb, name, err.status))
                raise
            self.log.append((verb, name, 200))
            return result
        return call

    def calls(self, name: str | None) -> list[tuple[str, int]]:
        return [(verb, status) for verb, n, status in self.log if n == name]


def test_kubernetes_list_all_namespaces_with_pages(api, monkeypatch):
    spare = copy.deepcopy(inventory_objects()[:2])
    for obj in spare:
        obj["metadata"]["namespace"] = "spare"
    create_hosts(api, spare)
    provider = KubernetesProvider.from_kubeconfig(sip_kubeconfig(api), page_size=5)
    spy = Spy(provider, monkeypatch)
    hosts = provider.list_hosts()
    names = api.kubectl("get", "bmh", "--all-namespaces", "-o",
                        "jsonpath={range .items[*]}{.metadata.namespace}/{.metadata.name} {end}").stdout.split()
    assert [f"{h.namespace}/{h.name}" for h in hosts] == sorted(names) and len(hosts) == 14
    assert spy.log == [("LIST", None, 200)] * 3  # 14 hosts in pages of 5, continued by the server's token
    model = load_model(EXAMPLE_REPO)  # spec, status (via /status) and labels survive the round trip
    assert {f"{h.namespace}/{h.name}": h for h in hosts
            if h.namespace == "metal3" and h.name[:3] != "r03"} == model.baremetal_hosts
    assert {h.name for h in hosts if h.namespace == "spare"} == {"r01-node-01", "r01-node-02"}


def test_kubernetes_one_namespace_with_a_service_account_token(api):
    api.kubectl("create", "serviceaccount", "sip", "-n", "metal3")
    api.kubectl("create", "role", "sip-hosts", "-n", "metal3", "--verb=get,list,patch",
                "--resource=baremetalhosts.metal3.io")
    api.kubectl("create", "rolebinding", "sip-hosts", "-n", "metal3", "--role=sip-hosts",
                "--serviceaccount=metal3:sip")
    try:
        config = api.token_kubeconfig("metal3", "sip", token_file=True)
        assert "tokenFile" in config.read_text()
        provider = KubernetesProvider.from_kubeconfig(config, namespace="metal3", page_size=5)
        assert len(provider.list_hosts()) == 12
        provider.apply_labels([LabelChange("metal3/r01-node-03", "t", set=((CLUSTER_LABEL, "t"),))])
        assert labels(api, "metal3/r01-node-03")[CLUSTER_LABEL] == "t"
        # RBAC is the real one: nothing outside the namespace the Role grants
        with pytest.raises(SIPError, match=r'listing BareMetalHosts \(all namespaces\) at https://127.0.31.1:\d+: '
                                           r'HTTP 403: .*"system:serviceaccount:metal3:sip" cannot list resource '
                                           r'"baremetalhosts" in API group "metal3.io" at the cluster scope'):
            KubernetesProvider.from_kubeconfig(config).list_hosts()
        with pytest.raises(SIPError, match='HTTP 403: .* in the namespace "other"'):
            KubernetesProvider.from_kubeconfig(config, namespace="other").list_hosts()
        api.ensure_namespace("empty")
        assert KubernetesProvider.from_kubeconfig(api.admin_kubeconfig, namespace="empty").list_hosts() == []
    finally:
        api.kubectl("delete", "-n", "metal3", "rolebinding/sip-hosts", "role/sip-hosts", "serviceaccount/sip")


def test_kubernetes_exec_credential_plugin(api):
    """The official client runs kubeconfig exec plugins (e.g. cloud token helpers)."""
    token = api.service_account_token("metal3", "exec-user")
    api.kubectl("create", "clusterrolebinding", "exec-user-admin", "--clusterrole=cluster-admin",
                "--serviceaccount=metal3:exec-user")
    try:
        credential = json.dumps({"apiVersion": "client.authentication.k8s.io/v1beta1", "kind": "ExecCredential",
                                 "status": {"token": token}})
        config = api.kubeconfig("exec", {"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1",
                                                  "command": "echo", "args": [credential]}})
        assert len(KubernetesProvider.from_kubeconfig(config).list_hosts()) == 12
        failing = api.kubeconfig("exec-fails", {"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1",
                                                         "command": "false"}})
        with pytest.raises(SIPError) as err:  # not a silent fall-back to an anonymous user
            KubernetesProvider.from_kubeconfig(failing)
        assert one_line(err) == f"{failing}: the exec credential plugin failed: process returned 1"
    finally:
        api.kubectl("delete", "clusterrolebinding", "exec-user-admin")
        api.kubectl("delete", "serviceaccount", "exec-user", "-n", "metal3")


def test_kubernetes_label_with_a_real_conflict_then_converge(api, monkeypatch):
    provider = KubernetesProvider.from_kubeconfig(sip_kubeconfig(api))
    spy = Spy(provider, monkeypatch)
    model = demanding(load_model(EXAMPLE_REPO))  # wants the r03 hosts too
    result = select_hosts(model.sip_clusters, provider.list_hosts())
    assert result.selection("tenant-1").ready and len(result.changes) == 7

    def someone_else() -> None:  # another writer gets in between our list and our patch, once
        del spy.before["r02-node-01"]
        api.kubectl("label", "bmh", "-n", "metal3", "r02-node-01", "example.com/touched-by=someone-else")

    spy.before["r02-node-01"] = someone_else
    provider.apply_labels(result.changes)
    assert spy.calls("r02-node-01") == [("PATCH", 409), ("GET", 200), ("PATCH", 200)]
    assert sorted(s for v, n, s in spy.log if v == "PATCH") == [200] * 7 + [409]  # one retry, seven labels
    raced = labels(api, "metal3/r02-node-01")  # both writers' edits are there
    assert raced["example.com/touched-by"] == "someone-else"
    assert raced[CLUSTER_LABEL] == "tenant-1" and raced[NODE_TYPE_LABEL] == "ControlPlane"
    assert labels(api, "metal3/r03-node-02")["sip.airshipit.org/standby"] == "true"
    assert select_hosts(model.sip_clusters, provider.list_hosts()).empty  # applying twice changes nothing
    # the SIPCluster leaves the repo: every host unlabeled, other labels kept
    provider.apply_labels(select_hosts({}, provider.list_hosts()).changes)
    everything = api.kubectl_json("get", "bmh", "-n", "metal3")["items"]
    assert len(everything) == 12
    assert all(not k.startswith("sip.airshipit.org/") or k in ("sip.airshipit.org/rack", "sip.airshipit.org/server")
               for o in everything for k in o["metadata"]["labels"])
    assert labels(api, "metal3/r01-node-04")["hardware.example.com/gpu"] == "a100"
    assert labels(api, "metal3/r02-node-01")["example.com/touched-by"] == "someone-else"


def test_kubernetes_refuses_when_someone_else_changed_the_sip_labels(api, monkeypatch):
    provider = KubernetesProvider.from_kubeconfig(sip_kubeconfig(api))
    spy = Spy(provider, monkeypatch)
    result = select_hosts(load_model(EXAMPLE_REPO).sip_clusters, provider.list_hosts())
    assert result.changes[0].host == "metal3/r01-node-01"
    spy.before["r01-node-01"] = lambda: api.kubectl("label", "bmh", "-n", "metal3", "r01-node-01",
                                                    f"{CLUSTER_LABEL}=tenant-9")
    with pytest.raises(SIPError, match="BareMetalHost metal3/r01-node-01: its SIP labels changed while labeling "
                                       r"\(planned over \{\}, now \{'sip.airshipit.org/cluster-name': 'tenant-9'\}\)"):
        provider.apply_labels(result.changes)
    assert spy.calls("r01-node-01") == [("PATCH", 409), ("GET", 200)]
    now = labels(api, "metal3/r01-node-01")
    assert now[CLUSTER_LABEL] == "tenant-9" and NODE_TYPE_LABEL not in now  # not overwritten, nothing half-done


def test_kubernetes_gives_up_after_the_retries(api, monkeypatch):
    provider = KubernetesProvider.from_kubeconfig(sip_kubeconfig(api), retries=2)
    spy = Spy(provider, monkeypatch)
    provider.list_hosts()
    bumps = iter(range(1, 100))
    spy.before["r01-node-01"] = lambda: api.kubectl("label", "--overwrite", "bmh", "-n", "metal3", "r01-node-01",
                                                    f"example.com/bump={next(bumps)}")
    change = LabelChange("metal3/r01-node-01", "t", set=((CLUSTER_LABEL, "t"),))
    with pytest.raises(SIPError, match="still conflicting after 2 retries"):
        provider.apply_labels([change])
    assert [s for v, n, s in spy.log if v == "PATCH"] == [409, 409, 409]
    now = labels(api, "metal3/r01-node-01")
    assert now["example.com/bump"] == "3" and CLUSTER_LABEL not in now


def test_kubernetes_patch_without_a_prior_list_and_a_missing_host(api):
    provider = KubernetesProvider.from_kubeconfig(sip_kubeconfig(api))
    provider.apply_labels([LabelChange("metal3/r01-node-01", "t", set=((CLUSTER_LABEL, "t"),))])
    assert labels(api, "metal3/r01-node-01")[CLUSTER_LABEL] == "t"
    provider.apply_labels([LabelChange("metal3/r01-node-01", "t", remove=(CLUSTER_LABEL,))])
    assert CLUSTER_LABEL not in labels(api, "metal3/r01-node-01")
    with pytest.raises(SIPError, match='^reading BareMetalHost metal3/ghost: HTTP 404: '
                                       'baremetalhosts.metal3.io "ghost" not found$'):
        provider.apply_labels([LabelChange("metal3/ghost", "t", set=((CLUSTER_LABEL, "t"),))])


def one_line(excinfo: pytest.ExceptionInfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message and "object at 0x" not in message, message
    return message


def test_kubernetes_errors_are_one_clear_line(kube, tmp_path):
    bad_token = kube.kubeconfig("bad-token", {"token": "wrong"})
    with pytest.raises(SIPError) as err:
        KubernetesProvider.from_kubeconfig(bad_token).list_hosts()
    assert one_line(err) == f"listing BareMetalHosts (all namespaces) at {kube.url}: HTTP 401: Unauthorized"
    wrong_ca = kube.kubeconfig("wrong-ca", {"token": "wrong"}, ca_pem=create_ca("someone-else").cert_pem)
    with pytest.raises(SIPError) as err:
        KubernetesProvider.from_kubeconfig(wrong_ca).list_hosts()
    assert one_line(err).startswith(f"listing BareMetalHosts (all namespaces) at {kube.url}: cannot reach the "
                                    f"management cluster at {kube.url}: CERTIFICATE_VERIFY_FAILED")
    closed = kube.kubeconfig("closed", {"token": "t"}, server=f"https://{kube.ip}:{free_port(kube.ip)}")
    with pytest.raises(SIPError) as err:
        KubernetesProvider.from_kubeconfig(closed, timeout=2).list_hosts()
    assert "cannot reach the management cluster" in one_line(err) and "Connection refused" in str(err.value)
    forbidden = kube.cert_kubeconfig("nobody", "nobody")  # authenticated, but no RBAC at all
    with pytest.raises(SIPError) as err:
        KubernetesProvider.from_kubeconfig(forbidden).apply_labels([LabelChange("metal3/x", "t", remove=("a",))])
    assert one_line(err) == ('reading BareMetalHost metal3/x: HTTP 403: baremetalhosts.metal3.io "x" is forbidden: '
                             'User "nobody" cannot get resource "baremetalhosts" in API group "metal3.io" '
                             'in the namespace "metal3"')


@pytest.mark.parametrize(("user", "context", "message"), [
    ({"token": "t"}, "nope", "unusable kubeconfig: Invalid kube-config file. Expected object with name nope in "),
    ({"client-certificate-data": "!!", "client-key-data": "!!"}, None, r"client certificate/key unusable: \[SSL\] PEM"),
    ({"client-certificate-data": "abc", "client-key-data": "abc"}, None, "unusable kubeconfig: bad base64 data"),
    ({"tokenFile": "missing"}, None, "unusable kubeconfig: .*No such file or directory: .*missing"),
    ({"token": "t"}, "no-ca", "unusable kubeconfig: File does not exist: /nonexistent/ca.crt"),
], ids=["unknown-context", "not-pem", "not-base64", "missing-token-file", "missing-ca-file"])
def test_kubeconfig_errors(kube, user, context, message):
    path = kube.kubeconfig("broken", user)
    config = yaml.safe_load(path.read_text())
    config["clusters"].append({"name": "no-ca", "cluster": {"server": kube.url,
                                                            "certificate-authority": "/nonexistent/ca.crt"}})
    config["contexts"].append({"name": "no-ca", "context": {"cluster": "no-ca", "user": "broken"}})
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(SIPError, match=message) as err:
        KubernetesProvider.from_kubeconfig(path, context)
    assert one_line(err).startswith(f"{path}: ")


def test_kubeconfig_needs_https_and_a_file(kube, tmp_path):
    with pytest.raises(SIPError, match="needs an https:// server, got 'http://x'"):
        KubernetesProvider.from_kubeconfig(kube.kubeconfig("plain", {"token": "t"}, server="http://x"))
    with pytest.raises(SIPError, match="nothing: cannot read kubeconfig: no such file"):
        KubernetesProvider.from_kubeconfig(tmp_path / "nothing")
    (tmp_path / "garbage").write_text("{not: [yaml")
    with pytest.raises(SIPError, match="garbage: unusable kubeconfig: not valid YAML"):
        KubernetesProvider.from_kubeconfig(tmp_path / "garbage")


def test_the_readiness_probe_apply_and_the_cluster_api_share(kube):
    """`gitops.kubeapi.KubeAPI.not_ready`: what apply waits on after replacing an API server."""
    from gitops.kubeapi import KubeAPI as Client

    with Client(kube.url, kube.ca.cert_pem, timeout=5) as anonymous:  # /readyz is public; the CA is verified
        assert anonymous.not_ready() == "" and anonymous.ready()
        assert anonymous.not_ready("/metrics") == "HTTP 403"  # anonymous: only the health endpoints
    with Client(kube.url, create_ca("someone-else").cert_pem, timeout=5) as wrong_ca:
        assert "CERTIFICATE_VERIFY_FAILED" in wrong_ca.not_ready() and not wrong_ca.ready()
    with Client(f"https://{kube.ip}:{free_port(kube.ip)}", kube.ca.cert_pem, timeout=2) as closed:
        assert "Connection refused" in closed.not_ready()


def test_one_client_from_pem_strings_and_from_a_kubeconfig(kube):
    """`gitops.kubeapi.KubeAPI` as the controller makes it (a bearer token, a client certificate, in memory)
    and as the provider makes it (a kubeconfig): the same server sees the same users."""
    from gitops.kubeapi import Credentials
    from gitops.kubeapi import KubeAPI as Client

    token = kube.service_account_token("default", "pem-token")
    whoami = "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews"
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectRulesReview", "spec": {"namespace": "x"}}
    with Client(kube.url, kube.ca.cert_pem, Credentials(token=token)) as by_token:
        by_token.create(whoami, review)  # any authenticated user may ask; anonymous may not
        with pytest.raises(KubeAPIError, match='403 .*"system:serviceaccount:default:pem-token" cannot list'):
            by_token.list("/api/v1/namespaces")
    with Client(kube.url, kube.ca.cert_pem, Credentials(kube.admin.cert_pem, kube.admin.key_pem)) as admin:
        assert "default" in {n["metadata"]["name"] for n in admin.list("/api/v1/namespaces")}
    with Client.from_kubeconfig(kube.admin_kubeconfig) as from_file:
        assert "default" in {n["metadata"]["name"] for n in from_file.list("/api/v1/namespaces")}
    # embedded key material (*-data) goes to memory at once: the loader's temporary files would outlive a kill -9
    from kubernetes.config import kube_config

    embedded = kube.cert_kubeconfig("embedded", "embedded-admin", ("system:masters",))
    with Client.from_kubeconfig(embedded) as from_data:
        config = from_data._config
        assert all(p.startswith(f"/proc/{os.getpid()}/fd/") for p in (config.ssl_ca_cert, config.cert_file,
                                                                       config.key_file))
        assert not [p for p in kube_config._temp_files.values() if os.path.exists(p)]
        assert "default" in {n["metadata"]["name"] for n in from_data.list("/api/v1/namespaces")}
    with Client(kube.url, kube.ca.cert_pem) as anonymous, pytest.raises(KubeAPIError) as err:
        anonymous.create(whoami, review)
    assert err.value.status == 403 and 'User "system:anonymous"' in err.value.details
    kube.kubectl("delete", "serviceaccount", "pem-token", "-n", "default")
