"""A real Kubernetes API server for tests: etcd + kube-apiserver of the newest release as host processes.

`kube_api_server()` starts the real etcd and kube-apiserver (built once from their Go modules by
``scripts/build-kubernetes.sh`` into ``$GITOPS_KUBE_CACHE/v1.37.2/`` and ``etcd-v3.7.3/``, default
``~/.cache/gitops/kubernetes``) on a loopback address with free ports, waits for
``/readyz`` and yields a `KubeAPI`: the server URL, an admin kubeconfig (client
certificate, ``O=system:masters``), ServiceAccount bearer-token kubeconfigs (TokenRequest
API), a raw JSON `request` helper and a `kubectl` runner using the cached kubectl.
On exit it stops exactly the processes it started and removes its temp directory.

Missing binaries FAIL the test (naming the build script): a skipped test would hide
that the suite did not run against a real API server.

No controller-manager runs: nothing garbage-collects or finalizes, so deleting a
namespace leaves it Terminating. Tests share one server per module (`kubeapi`
fixture) and clean up the objects they create (`delete`), not namespaces.
"""
from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from conftest import require_lab_group
from ports import free_ports

from gitops.lab import kubebin
from gitops.lab.errors import LabError
from gitops.model import versions
from gitops.pki import CertKey, create_ca, generate_key, issue_cert, key_to_pem

VERSION = kubebin.DEFAULT_VERSION
DEFAULT_IP = "127.0.31.1"
READY_TIMEOUT = 90.0


def kube_binary(name: str) -> Path:
    """The cached real binary `name`; fails the test (not skip) when it has not been built."""
    try:
        return kubebin.binary(name)
    except LabError as err:
        pytest.fail(str(err), pytrace=False)


def etcd_binary(name: str = "etcd") -> Path:
    """The cached etcd (or etcdctl, etcdutl) the newest release runs, for a test that starts it (in a lab group:
    `conftest.require_lab_group`); fails the test when it has not been built."""
    require_lab_group()
    try:
        return kubebin.etcd_program(name, versions.DEFAULT_ETCD)
    except LabError as err:
        pytest.fail(str(err), pytrace=False)


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@dataclass
class KubeAPI:
    """A running real kube-apiserver (see module docstring)."""

    url: str  # https://ip:port
    ip: str
    dir: Path  # the private temp directory: certificates, kubeconfigs, logs, etcd data
    ca: CertKey  # signs the serving certificate and client certificates the server accepts
    admin: CertKey  # client certificate, O=system:masters
    kubectl_path: Path
    ssl_context: ssl.SSLContext = field(repr=False)  # verifies the server, presents `admin`
    etcd_url: str = ""  # the plain-HTTP client URL of its etcd (loopback)

    @property
    def admin_kubeconfig(self) -> Path:
        """Cluster admin by client certificate (files next to it, in ``<dir>/pki``)."""
        return self.dir / "kubeconfigs" / "admin"

    # -- kubeconfigs

    def kubeconfig(self, name: str, user: dict, *, server: str | None = None, ca_pem: str | None = None) -> Path:
        """Write ``<dir>/kubeconfigs/<name>`` for `user` (a kubeconfig ``user`` mapping)."""
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "test",
            "clusters": [{"name": "test", "cluster": {
                "server": server or self.url,
                "certificate-authority-data": b64(ca_pem if ca_pem is not None else self.ca.cert_pem)}}],
            "users": [{"name": name, "user": user}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": name}}],
        }
        path = self.dir / "kubeconfigs" / name
        path.parent.mkdir(exist_ok=True)
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path

    def cert_kubeconfig(self, name: str, user: str, groups: Sequence[str] = (), **kwargs) -> Path:
        """A kubeconfig with a fresh client certificate (CN=`user`, O=`groups`) signed by the CA."""
        cert = issue_cert(self.ca, user, organizations=groups, client=True)
        return self.kubeconfig(name, {"client-certificate-data": b64(cert.cert_pem),
                                      "client-key-data": b64(cert.key_pem)}, **kwargs)

    def service_account_token(self, namespace: str, name: str, seconds: int = 3600) -> str:
        """A bound token of ServiceAccount `namespace/name` (created if missing), via TokenRequest."""
        if self.request("GET", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}", ok=(200, 404))[0] == 404:
            self.ensure_namespace(namespace)
            self.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts",
                         {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}})
        _, body = self.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
                               {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                                "spec": {"expirationSeconds": seconds}})
        return body["status"]["token"]

    def token_kubeconfig(self, namespace: str, service_account: str, *, name: str | None = None,
                         token_file: bool = False) -> Path:
        """A bearer-token kubeconfig for ServiceAccount `namespace/service_account` (no RBAC granted
        here: bind roles with `kubectl`). ``token_file=True`` writes the token to a file next to it
        and references it as ``tokenFile``."""
        name = name or f"sa-{namespace}-{service_account}"
        token = self.service_account_token(namespace, service_account)
        if not token_file:
            return self.kubeconfig(name, {"token": token})
        (self.dir / "kubeconfigs").mkdir(exist_ok=True)
        (self.dir / "kubeconfigs" / f"{name}.token").write_text(token + "\n")
        return self.kubeconfig(name, {"tokenFile": f"{name}.token"})

    # -- talking to it

    def kubectl(self, *args: str, kubeconfig: Path | None = None, input: str | None = None,
                check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run the cached kubectl (admin kubeconfig unless given); raises on failure if `check`."""
        argv = [str(self.kubectl_path), f"--kubeconfig={kubeconfig or self.admin_kubeconfig}", *args]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.dir)}  # no ~/.kube cache
        proc = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout, env=env)
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc

    def kubectl_json(self, *args: str, **kwargs) -> dict:
        return json.loads(self.kubectl(*args, "-o", "json", **kwargs).stdout)

    def request(self, method: str, path: str, body: object | None = None, *,
                content_type: str = "application/json", ok: Sequence[int] = (200, 201)) -> tuple[int, dict]:
        """A raw API call as admin; (status, JSON body). Statuses outside `ok` raise AssertionError."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Accept": "application/json", "Content-Type": content_type})
        try:
            with urllib.request.urlopen(req, context=self.ssl_context, timeout=30) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as err:
            with err:
                status, raw = err.code, err.read()
        if status not in ok:
            raise AssertionError(f"{method} {path}: HTTP {status}: {raw[:500].decode(errors='replace')}")
        return status, json.loads(raw or b"{}")

    def ensure_namespace(self, name: str) -> None:
        self.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                    "metadata": {"name": name}}, ok=(201, 409))

    def apply_file(self, path: Path) -> None:
        self.kubectl("apply", "-f", str(path))

    def wait_for_crd(self, name: str, timeout: float = 30) -> None:
        """Until CRD `name` is Established and its resources are served."""
        self.kubectl("wait", "--for=condition=Established", f"crd/{name}", f"--timeout={int(timeout)}s")
        crd = self.kubectl_json("get", "crd", name)
        group, plural = crd["spec"]["group"], crd["spec"]["names"]["plural"]
        version = crd["spec"]["versions"][0]["name"]
        deadline = time.monotonic() + timeout
        # served, and in kubectl's discovery cache (kubectl may not re-discover on a miss;
        # api-resources refreshes the cache)
        while (self.request("GET", f"/apis/{group}/{version}/{plural}?limit=1", ok=(200, 404))[0] != 200
               or f"{plural}.{group}" not in self.kubectl("api-resources", f"--api-group={group}", "-o", "name")
               .stdout.split()):
            if time.monotonic() > deadline:
                raise AssertionError(f"CRD {name} established but {plural}.{group} not served/discovered")
            time.sleep(0.2)


@dataclass
class _Proc:
    name: str
    popen: subprocess.Popen
    log: Path

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        """SIGTERM the process (its own session/group), then SIGKILL; always reaped."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(timeout=10)


def _start(name: str, argv: list[str], workdir: Path) -> _Proc:
    log = workdir / f"{name}.log"
    with open(log, "wb") as out:
        popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                 cwd=workdir, start_new_session=True)
    return _Proc(name, popen, log)


def _wait(proc: _Proc, ready, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.popen.poll() is not None:
            raise AssertionError(f"{proc.name} exited ({proc.popen.returncode}) before {what}:\n{proc.tail()}")
        if ready():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{proc.name}: not {what} after {timeout:.0f}s:\n{proc.tail()}")
        time.sleep(0.2)


def _start_listening(name: str, ip: str, count: int, argv_of: Callable[..., list[str]], workdir: Path,
                     ready_of: Callable[..., Callable[[], bool]], timeout: float, what: str) -> tuple[_Proc, list[int]]:
    """Start `name` on `count` fresh ports of `ip` (`argv_of(*ports)`) and wait until `ready_of(*ports)()`.
    A port is only known free until the process binds it: one that lost it to another process in
    the meantime is started again on other ports (at most 3 times)."""
    for attempt in range(3):
        ports = free_ports(ip, count)
        proc = _start(name, argv_of(*ports), workdir)
        try:
            _wait(proc, ready_of(*ports), timeout, what)
            return proc, ports
        except AssertionError:
            proc.stop()
            if attempt == 2 or "address already in use" not in proc.tail():
                raise
    raise AssertionError("unreachable")


def _get_ok(url: str, context: ssl.SSLContext | None = None) -> bool:
    try:
        with urllib.request.urlopen(url, context=context, timeout=2) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


@contextlib.contextmanager
def kube_api_server(ip: str = DEFAULT_IP, *, crds: Sequence[Path] = (),
                    extra_args: Sequence[str] = ()) -> Iterator[KubeAPI]:
    """Start etcd + kube-apiserver on `ip`, install `crds`, yield a `KubeAPI`; stop and clean up."""
    apiserver_bin, kubectl_bin, etcd_bin = kube_binary("kube-apiserver"), kube_binary("kubectl"), etcd_binary()
    workdir = Path(tempfile.mkdtemp(prefix="gitops-kubeapi-"))
    procs: list[_Proc] = []
    try:
        workdir.chmod(0o700)
        pki = workdir / "pki"
        pki.mkdir()
        ca = create_ca("kubeapi-test-ca")
        serving = issue_cert(ca, "kube-apiserver", ip_addresses=[ip],
                             dns_names=["localhost", "kubernetes", "kubernetes.default.svc"], server=True)
        admin = issue_cert(ca, "kubeapi-test-admin", organizations=["system:masters"], client=True)
        sa_key = generate_key("rsa")
        files = {"ca.crt": ca.cert_pem, "apiserver.crt": serving.cert_pem, "apiserver.key": serving.key_pem,
                 "admin.crt": admin.cert_pem, "admin.key": admin.key_pem, "sa.key": key_to_pem(sa_key)}
        for fname, content in files.items():
            (pki / fname).write_text(content)
            (pki / fname).chmod(0o600)

        def etcd_argv(client: int, peer: int) -> list[str]:
            shutil.rmtree(workdir / "etcd", ignore_errors=True)  # a start that lost its port begins anew
            return [str(etcd_bin), "--name=kubeapi-test", f"--data-dir={workdir / 'etcd'}",
                    f"--listen-client-urls=http://{ip}:{client}", f"--advertise-client-urls=http://{ip}:{client}",
                    f"--listen-peer-urls=http://{ip}:{peer}", f"--initial-advertise-peer-urls=http://{ip}:{peer}",
                    f"--initial-cluster=kubeapi-test=http://{ip}:{peer}", "--initial-cluster-state=new",
                    "--listen-metrics-urls=", "--log-level=warn"]

        etcd, (etcd_client, _) = _start_listening(
            "etcd", ip, 2, etcd_argv, workdir, lambda client, _peer: lambda: _get_ok(f"http://{ip}:{client}/health"),
            30, "healthy")
        procs.append(etcd)
        etcd_url = f"http://{ip}:{etcd_client}"
        context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        context.load_cert_chain(pki / "admin.crt", pki / "admin.key")

        def apiserver_argv(secure_port: int) -> list[str]:
            return [
                str(apiserver_bin), f"--etcd-servers={etcd_url}",
                f"--bind-address={ip}", f"--advertise-address={ip}", f"--secure-port={secure_port}",
                f"--cert-dir={pki}", f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}", f"--client-ca-file={pki / 'ca.crt'}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki / 'sa.key'}", f"--service-account-signing-key-file={pki / 'sa.key'}",
                "--service-cluster-ip-range=10.96.0.0/24", "--authorization-mode=Node,RBAC",
                "--endpoint-reconciler-type=none",  # a loopback address may not be a Service endpoint
                "--profiling=false", "--v=0", *extra_args,
            ]

        apiserver, (secure_port,) = _start_listening(
            "kube-apiserver", ip, 1, apiserver_argv, workdir,
            lambda port: lambda: _get_ok(f"https://{ip}:{port}/readyz", context), READY_TIMEOUT, "ready (/readyz)")
        procs.append(apiserver)
        url = f"https://{ip}:{secure_port}"

        api = KubeAPI(url=url, ip=ip, dir=workdir, ca=ca, admin=admin, kubectl_path=kubectl_bin, ssl_context=context,
                      etcd_url=etcd_url)
        api.kubeconfig("admin", {"client-certificate": str(pki / "admin.crt"), "client-key": str(pki / "admin.key")})
        for crd in crds:
            api.apply_file(crd)
            for doc in yaml.safe_load_all(crd.read_text()):
                if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
                    api.wait_for_crd(doc["metadata"]["name"])
        yield api
    finally:
        for proc in reversed(procs):  # the API server before its etcd
            proc.stop()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="module")
def kubeapi() -> Iterator[KubeAPI]:
    """One real kube-apiserver (no CRDs) per test module; use `kube_api_server` for more."""
    with kube_api_server() as api:
        yield api
