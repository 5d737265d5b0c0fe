"""BareMetalHost providers: the repo files with a label overlay, and a Metal3 management cluster.

No kube-apiserver binary exists on these machines, so the `kubernetes` provider is
tested against `FakeAPIServer`: a small HTTPS server (http.server + ssl on 127.0.0.1,
certificates from `gitops.pki`) standing in for kube-apiserver. It implements exactly
what the provider uses -- list (all namespaces or one, with limit/continue), GET one,
and JSON merge PATCH with the resourceVersion precondition (409 Conflict when stale) --
plus a "concurrent writer" hook that bumps an object's resourceVersion (or changes its
labels) just before a PATCH is handled.
"""
from __future__ import annotations

import base64
import copy
import json
import ssl
import threading
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml

from gitops.model.validate import load_model
from gitops.pki import CertKey, create_ca, issue_cert
from gitops.sip import SIPError
from gitops.sip.providers import FileProvider, KubernetesProvider, hosts_from_yaml, load_kubeconfig
from gitops.sip.selection import CLUSTER_LABEL, LabelChange, select_hosts
from test_sip_selection import demanding

EXAMPLE_REPO = Path(__file__).resolve().parents[1] / "example-repo"
INVENTORY = EXAMPLE_REPO / "inventory" / "baremetalhosts.yaml"
PREFIX = "/apis/metal3.io/v1alpha1"
TOKEN = "s3cr3t-token"


def inventory_objects() -> list[dict]:
    """The example inventory plus a third rack (r03), so tenant-1 can be satisfied."""
    items = yaml.safe_load(INVENTORY.read_text())["items"]
    for name, flavor in (("r03-node-01", "control-plane"), ("r03-node-02", "worker")):
        extra = copy.deepcopy(items[0])
        extra["metadata"]["name"] = name
        extra["metadata"]["labels"] = {"sip.airshipit.org/rack": "r03", "sip.airshipit.org/server": name,
                                       "vino.airshipit.org/flavor": flavor}
        items.append(extra)
    return items


def merge_patch(target: object, patch: object) -> object:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


class FakeAPIServer:
    """Stands in for kube-apiserver (none exists here): BareMetalHost list / get / merge-patch only."""

    def __init__(self, objects: list[dict], tls: CertKey, ca: CertKey, tmp: Path):
        self.lock = threading.Lock()
        self.version = 100
        self.objects: dict[str, dict] = {}
        for obj in objects:
            obj = copy.deepcopy(obj)
            obj["metadata"]["resourceVersion"] = self._next()
            self.objects[f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"] = obj
        #: host key -> how many of its next PATCHes a concurrent writer races (bumps resourceVersion)
        self.race: dict[str, int] = {}
        #: host key -> labels a concurrent writer merges in just before the next PATCH
        self.hostile: dict[str, dict] = {}
        self.log: list[tuple[str, str, int]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # keep pytest output clean
                pass

            def do_GET(self) -> None:
                server.handle(self, "GET")

            def do_PATCH(self) -> None:
                server.handle(self, "PATCH")

        (tmp / "server.crt").write_text(tls.cert_pem)
        (tmp / "server.key").write_text(tls.key_pem)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(tmp / "server.crt", tmp / "server.key")
        ctx.load_verify_locations(cadata=ca.cert_pem)
        ctx.verify_mode = ssl.CERT_OPTIONAL  # a client certificate or a bearer token
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def _next(self) -> str:
        self.version += 1
        return str(self.version)

    def handle(self, req: BaseHTTPRequestHandler, method: str) -> None:
        url = urlsplit(req.path)
        with self.lock:
            status, body = self._route(req, method, url.path, parse_qs(url.query))
            self.log.append((method, url.path, status))
        data = json.dumps(body).encode()
        req.send_response(status)
        req.send_header("Content-Type", "application/json")
        req.send_header("Content-Length", str(len(data)))
        req.end_headers()
        req.wfile.write(data)

    @staticmethod
    def status(code: int, reason: str, message: str) -> tuple[int, dict]:
        return code, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason,
                      "message": message, "code": code}

    def _route(self, req, method: str, path: str, query: dict) -> tuple[int, dict]:
        if not req.connection.getpeercert() and req.headers.get("Authorization") != f"Bearer {TOKEN}":
            return self.status(401, "Unauthorized", "Unauthorized")
        parts = path.removeprefix(PREFIX).strip("/").split("/")
        if method == "GET" and parts == ["baremetalhosts"]:
            return self._list(None, query)
        if method == "GET" and len(parts) == 3 and parts[0] == "namespaces" and parts[2] == "baremetalhosts":
            return self._list(parts[1], query)
        if len(parts) == 4 and parts[0] == "namespaces" and parts[2] == "baremetalhosts":
            key = f"{parts[1]}/{parts[3]}"
            if key not in self.objects:
                return self.status(404, "NotFound", f'baremetalhosts.metal3.io "{parts[3]}" not found')
            if method == "GET":
                return 200, self.objects[key]
            return self._patch(req, key)
        return self.status(404, "NotFound", "the server could not find the requested resource")

    def _list(self, namespace: str | None, query: dict) -> tuple[int, dict]:
        items = [o for k, o in sorted(self.objects.items()) if namespace in (None, k.split("/")[0])]
        start = int(query.get("continue", ["0"])[0])
        limit = int(query.get("limit", [str(len(items))])[0])
        page, more = items[start:start + limit], start + limit < len(items)
        meta = {"resourceVersion": str(self.version)} | ({"continue": str(start + limit)} if more else {})
        return 200, {"apiVersion": "metal3.io/v1alpha1", "kind": "BareMetalHostList", "metadata": meta,
                     "items": page}

    def _patch(self, req, key: str) -> tuple[int, dict]:
        if req.headers.get("Content-Type") != "application/merge-patch+json":
            return self.status(415, "UnsupportedMediaType", "only merge patches here")
        patch = json.loads(req.rfile.read(int(req.headers["Content-Length"])))
        obj = self.objects[key]
        if self.race.get(key):  # a concurrent writer gets there first
            self.race[key] -= 1
            obj["metadata"].setdefault("annotations", {})["touched-by"] = "someone-else"
            obj["metadata"]["resourceVersion"] = self._next()
        if key in self.hostile:
            obj["metadata"]["labels"].update(self.hostile.pop(key))
            obj["metadata"]["resourceVersion"] = self._next()
        wanted = patch.get("metadata", {}).get("resourceVersion")
        if wanted is not None and wanted != obj["metadata"]["resourceVersion"]:
            return self.status(409, "Conflict", f'Operation cannot be fulfilled on baremetalhosts.metal3.io '
                                                f'"{key.split("/")[1]}": the object has been modified; please '
                                                "apply your changes to the latest version and try again")
        patch.get("metadata", {}).pop("resourceVersion", None)
        updated = merge_patch(obj, patch)
        updated["metadata"]["resourceVersion"] = self._next()
        self.objects[key] = updated
        return 200, updated

    def labels(self, key: str) -> dict:
        return self.objects[key]["metadata"].get("labels", {})

    def __enter__(self) -> FakeAPIServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


@pytest.fixture(scope="module")
def pki() -> dict[str, CertKey]:
    ca = create_ca("fake-kube-ca")
    return {"ca": ca,
            "server": issue_cert(ca, "kube-apiserver", ip_addresses=["127.0.0.1"], server=True),
            "client": issue_cert(ca, "gitops-sip", organizations=["system:masters"], client=True)}


@pytest.fixture
def api(pki, tmp_path) -> Iterator[FakeAPIServer]:
    with FakeAPIServer(inventory_objects(), pki["server"], pki["ca"], tmp_path) as server:
        yield server


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def kubeconfig(tmp_path: Path, server: str, pki, *, user: dict | None = None) -> Path:
    if user is None:
        user = {"client-certificate-data": b64(pki["client"].cert_pem),
                "client-key-data": b64(pki["client"].key_pem)}
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "mgmt",
        "clusters": [{"name": "mgmt", "cluster": {"server": server,
                                                   "certificate-authority-data": b64(pki["ca"].cert_pem)}}],
        "users": [{"name": "sip", "user": user}],
        "contexts": [{"name": "mgmt", "context": {"cluster": "mgmt", "user": "sip"}}],
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


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


def test_kubernetes_list_all_namespaces_with_pages(api, pki, tmp_path):
    provider = KubernetesProvider.from_kubeconfig(kubeconfig(tmp_path, api.url, pki), page_size=5)
    hosts = provider.list_hosts()
    assert [f"{h.namespace}/{h.name}" for h in hosts] == sorted(api.objects)
    model = load_model(EXAMPLE_REPO)
    assert {f"{h.namespace}/{h.name}": h for h in hosts if h.name[:3] != "r03"} == model.baremetal_hosts
    assert [p for m, p, _ in api.log] == [f"{PREFIX}/baremetalhosts"] * 3  # 12 hosts, pages of 5


def test_kubernetes_list_one_namespace_with_a_token(api, pki, tmp_path):
    (tmp_path / "token").write_text(TOKEN + "\n")
    config = kubeconfig(tmp_path, api.url, pki, user={"tokenFile": "token"})
    assert len(KubernetesProvider.from_kubeconfig(config, namespace="metal3").list_hosts()) == 12
    assert KubernetesProvider.from_kubeconfig(config, namespace="other").list_hosts() == []
    assert api.log[0][1] == f"{PREFIX}/namespaces/metal3/baremetalhosts"


def test_kubernetes_label_with_a_conflict_then_converge(api, pki, tmp_path):
    provider = KubernetesProvider.from_kubeconfig(kubeconfig(tmp_path, api.url, pki))
    model = demanding(load_model(EXAMPLE_REPO))  # wants the r03 hosts too
    result = select_hosts(model.sip_clusters, provider.list_hosts())
    assert result.selection("tenant-1").ready
    api.race["metal3/r02-node-01"] = 1  # someone else updates that host once, between our list and patch
    api.log.clear()
    provider.apply_labels(result.changes)
    raced = [(m, s) for m, p, s in api.log if p.endswith("/r02-node-01")]
    assert raced == [("PATCH", 409), ("GET", 200), ("PATCH", 200)]
    assert api.labels("metal3/r02-node-01")[CLUSTER_LABEL] == "tenant-1"
    assert api.objects["metal3/r02-node-01"]["metadata"]["annotations"] == {"touched-by": "someone-else"}
    assert api.labels("metal3/r03-node-02")["sip.airshipit.org/standby"] == "true"
    assert select_hosts(model.sip_clusters, provider.list_hosts()).empty  # applying twice changes nothing
    # the SIPCluster leaves the repo: every host unlabeled, other labels kept
    provider.apply_labels(select_hosts({}, provider.list_hosts()).changes)
    assert all(not k.startswith("sip.airshipit.org/") or k in ("sip.airshipit.org/rack", "sip.airshipit.org/server")
               for o in api.objects.values() for k in o["metadata"]["labels"])
    assert api.labels("metal3/r01-node-04")["hardware.example.com/gpu"] == "a100"


def test_kubernetes_refuses_when_someone_else_changed_the_sip_labels(api, pki, tmp_path):
    provider = KubernetesProvider.from_kubeconfig(kubeconfig(tmp_path, api.url, pki))
    model = load_model(EXAMPLE_REPO)
    result = select_hosts(model.sip_clusters, provider.list_hosts())
    api.hostile["metal3/r01-node-01"] = {CLUSTER_LABEL: "tenant-9"}
    with pytest.raises(SIPError, match="BareMetalHost metal3/r01-node-01: its SIP labels changed while labeling"):
        provider.apply_labels(result.changes)
    assert api.labels("metal3/r01-node-01")[CLUSTER_LABEL] == "tenant-9"  # not overwritten


def test_kubernetes_gives_up_after_the_retries(api, pki, tmp_path):
    provider = KubernetesProvider.from_kubeconfig(kubeconfig(tmp_path, api.url, pki), retries=2)
    provider.list_hosts()
    api.race["metal3/r01-node-01"] = 99
    change = LabelChange("metal3/r01-node-01", "t", set=((CLUSTER_LABEL, "t"),))
    with pytest.raises(SIPError, match="still conflicting after 2 retries"):
        provider.apply_labels([change])
    assert [s for m, p, s in api.log if m == "PATCH"] == [409, 409, 409]


def test_kubernetes_patch_without_a_prior_list_and_a_missing_host(api, pki, tmp_path):
    provider = KubernetesProvider.from_kubeconfig(kubeconfig(tmp_path, api.url, pki))
    provider.apply_labels([LabelChange("metal3/r01-node-01", "t", set=((CLUSTER_LABEL, "t"),))])
    assert api.labels("metal3/r01-node-01")[CLUSTER_LABEL] == "t"
    with pytest.raises(SIPError, match='reading BareMetalHost metal3/ghost: HTTP 404: .*"ghost" not found'):
        provider.apply_labels([LabelChange("metal3/ghost", "t", set=((CLUSTER_LABEL, "t"),))])


def test_kubernetes_errors_are_one_clear_line(api, pki, tmp_path):
    bad_token = kubeconfig(tmp_path, api.url, pki, user={"token": "wrong"})
    with pytest.raises(SIPError, match="listing BareMetalHosts at https://127.0.0.1:.*: HTTP 401: Unauthorized"):
        KubernetesProvider.from_kubeconfig(bad_token).list_hosts()
    other_ca = create_ca("someone-else")
    wrong_ca = kubeconfig(tmp_path, api.url, {**pki, "ca": other_ca})
    with pytest.raises(SIPError, match="cannot reach the management cluster: .*CERTIFICATE_VERIFY_FAILED"):
        KubernetesProvider.from_kubeconfig(wrong_ca).list_hosts()
    closed = kubeconfig(tmp_path, "https://127.0.0.1:9", pki)
    with pytest.raises(SIPError, match="cannot reach the management cluster"):
        KubernetesProvider.from_kubeconfig(closed, timeout=2).list_hosts()


@pytest.mark.parametrize(("user", "context", "message"), [
    ({"exec": {"command": "aws"}}, None, "uses exec, which is not supported"),
    ({"token": "t"}, "nope", "no context named 'nope' in contexts"),
    ({"client-certificate-data": "!!", "client-key-data": "!!"}, None, "client-certificate-data is not base64 PEM"),
    ({"tokenFile": "missing"}, None, "cannot read tokenFile"),
])
def test_kubeconfig_errors(pki, tmp_path, user, context, message):
    path = kubeconfig(tmp_path, "https://127.0.0.1:6443", pki, user=user)
    with pytest.raises(SIPError, match=message):
        load_kubeconfig(path, context)


def test_kubeconfig_needs_https(pki, tmp_path):
    with pytest.raises(SIPError, match="needs an https:// server, got 'http://x'"):
        load_kubeconfig(kubeconfig(tmp_path, "http://x", pki))
