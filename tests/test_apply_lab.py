"""End to end on `gitops lab`: the example clusters applied to 3 real containerd hypervisors.

Real: containerd + runc (one of the three reached through an haproxy mTLS front),
etcd (Debian's etcd-server), haproxy as the ingress, etcdctl as the etcd client,
and the `gitops` command itself. Not real: no kube-apiserver binary exists on these
machines, so the lab's images stand in for it: a TLS server (haproxy) using the
generated serving certificate that demands a client certificate from the cluster CA;
controller-manager and scheduler stand-ins only check their kubeconfig and files.
The tests run in file order and share one lab.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
import http.client
import socket
from collections import Counter
from pathlib import Path

import pytest
import yaml
from conftest import lab_tempdir, require_root

from gitops.compile.authorities import authority
from gitops.compile.desired import MANAGED, MANAGER, NODE
from gitops.cri.client import CRIClient
from gitops.model.validate import load_model
from gitops.pki import issue_cert
from gitops.state import LocalDirStore

GITOPS = str(Path(sys.executable).parent / "gitops")


def world_gitops(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([GITOPS, *args], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, f"gitops {' '.join(args)}: {proc.stdout}{proc.stderr}"
    return proc


@dataclasses.dataclass
class World:
    dir: Path
    repo: Path
    state: Path
    lab: object

    def gitops(self, *args: str, check: bool = True, timeout: float = 240) -> subprocess.CompletedProcess:
        proc = subprocess.run([GITOPS, *args], capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"gitops {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
        return proc

    def apply(self, *extra: str) -> subprocess.CompletedProcess:
        return self.gitops("apply", str(self.repo), "--state-dir", str(self.state), *extra)

    def plan(self, *extra: str, check: bool = True) -> subprocess.CompletedProcess:
        return self.gitops("plan", str(self.repo), "--state-dir", str(self.state), *extra, check=check)

    def hypervisors(self):
        return load_model(self.repo).hypervisors

    def sandboxes(self) -> dict[str, list]:
        """Managed pod sandboxes per node, across all hypervisors, read directly over CRI."""
        out: dict[str, list] = {}
        for hv in self.lab.hypervisors:
            with CRIClient(hv.local()) as client:
                for s in client.list_sandboxes({MANAGED: MANAGER}):
                    out.setdefault(s.labels[NODE], []).append((hv.name, s))
        return out

    def remove_nodes(self, rel: str, names: list[str]) -> None:
        """Delete the Node documents called `names` from the repo file `rel`."""
        path = self.repo / rel
        docs = list(yaml.safe_load_all(path.read_text()))
        kept = [d for d in docs if d["metadata"]["name"] not in names]
        assert len(kept) == len(docs) - len(names), f"not all of {names} are in {rel}"
        path.write_text(yaml.safe_dump_all(kept, sort_keys=False))


@pytest.fixture(scope="module")
def world():
    require_root()
    from gitops import lab as labmod

    base = lab_tempdir("gitops-e2e-")
    try:
        lab = labmod.up(base / "lab", hypervisors=3, public=1, remote=True, subnet="127.0.22")
        repo = base / "repo"
        mapping = world_gitops("lab", "example-repo", "--dir", str(base / "lab"), str(repo)).stderr
        assert mapping.splitlines()[:2] == [
            "hv-private-1 -> lab-hv-2 (" + lab.hypervisors[1].socket + ")",
            "hv-private-2 -> lab-hv-3 (mTLS " + lab.hypervisors[2].remote_uri + ")",
        ]
        yield World(base, repo, base / "state", lab)
    finally:
        try:
            labmod.down(base / "lab")
        finally:
            shutil.rmtree(base, ignore_errors=True)


def etcdctl(world: World, cluster: str, *args: str) -> subprocess.CompletedProcess:
    """The real etcd client, with a client certificate from the cluster's etcd CA."""
    state = LocalDirStore(world.state).load()
    ca = authority(state.clusters[cluster].authorities, "etcd")
    cert = issue_cert(ca, "e2e-test", client=True)
    tls = world.dir / "etcd-client"
    tls.mkdir(exist_ok=True)
    for name, text in (("ca.crt", ca.cert_pem), ("client.crt", cert.cert_pem), ("client.key", cert.key_pem)):
        (tls / name).write_text(text)
    hvs = world.hypervisors()
    endpoints = ",".join(f"https://{hvs[r.hypervisor].ip_address}:{r.ports['etcd-client']}"
                         for name, r in sorted(state.nodes.items()) if r.cluster == cluster and "etcd-client" in r.ports)
    return subprocess.run(["etcdctl", f"--endpoints={endpoints}", f"--cacert={tls}/ca.crt",
                           f"--cert={tls}/client.crt", f"--key={tls}/client.key", "--dial-timeout=3s", *args],
                          capture_output=True, text=True, env={**os.environ, "ETCDCTL_API": "3"}, timeout=30)


def etcd_members(world: World, cluster: str) -> list[str]:
    deadline = time.monotonic() + 30
    while True:
        proc = etcdctl(world, cluster, "member", "list")
        names = sorted(line.split(", ")[2] for line in proc.stdout.splitlines() if ", started, " in line)
        healthy = etcdctl(world, cluster, "endpoint", "health")
        if healthy.returncode == 0 or time.monotonic() > deadline:
            assert healthy.returncode == 0, healthy.stdout + healthy.stderr
            return names
        time.sleep(1)


def api_get(world: World, cluster: str, path: str, with_credentials: bool = True) -> tuple[int, bytes]:
    """GET through the cluster's ingress with the admin kubeconfig from `gitops kubeconfig`."""
    kubeconfig = yaml.safe_load(world.gitops("kubeconfig", str(world.repo), "--state-dir", str(world.state),
                                             "--cluster", cluster).stdout)
    import base64

    tls = world.dir / f"kube-{cluster}"
    tls.mkdir(exist_ok=True)
    files = {"ca.crt": kubeconfig["clusters"][0]["cluster"]["certificate-authority-data"],
             "admin.crt": kubeconfig["users"][0]["user"]["client-certificate-data"],
             "admin.key": kubeconfig["users"][0]["user"]["client-key-data"]}
    for name, data in files.items():
        (tls / name).write_bytes(base64.b64decode(data))
    context = ssl.create_default_context(cafile=str(tls / "ca.crt"))
    if with_credentials:
        context.load_cert_chain(str(tls / "admin.crt"), str(tls / "admin.key"))
    server = kubeconfig["clusters"][0]["cluster"]["server"]
    host, port = server.removeprefix("https://").rsplit(":", 1)
    deadline = time.monotonic() + 20
    while True:
        try:
            conn = http.client.HTTPSConnection(host, int(port), context=context, timeout=5)
            conn.request("GET", path)
            response = conn.getresponse()
            return response.status, response.read()
        except (ConnectionError, ssl.SSLError, OSError):
            if not with_credentials or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_apply_creates_the_example_clusters(world):
    before = world.plan()
    # 40 + 13 for the clusters (5 of the changes: SIP host labels), 4 + 2 for tenant-1's two service pods
    assert "Plan: 44 to add, 15 to change, 0 to remove." in before.stdout
    world.apply()
    pods = world.sandboxes()
    assert sorted(pods) == sorted([*load_model(world.repo).nodes, "tenant-1-jump", "tenant-1-lb"])
    assert all(len(p) == 1 for p in pods.values()), pods
    where = {node: hv for node, [(hv, _)] in pods.items()}
    assert where["team-a-ingress"] == where["team-b-ingress"] == "lab-hv-1"  # the public one
    assert {where[f"team-a-cp-{i}"] for i in (1, 2, 3)} == {"lab-hv-2", "lab-hv-3"}  # spread


def test_etcd_members_form_a_healthy_cluster_over_tls(world):
    for cluster in ("team-a", "team-b"):
        assert etcd_members(world, cluster) == [f"{cluster}-cp-{i}" for i in (1, 2, 3)]


def test_kubeconfig_credentials_work_through_the_ingress(world):
    status, body = api_get(world, "team-a", "/version")
    assert status == 200 and b'"gitVersion":"v1.31.2"' in body
    status, body = api_get(world, "team-b", "/version")
    assert status == 200 and b'"gitVersion":"v1.30.6"' in body
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        api_get(world, "team-a", "/version", with_credentials=False)


def test_second_apply_plans_nothing(world):
    assert world.plan("--detailed-exitcode").returncode == 0
    assert "No changes." in world.apply().stdout


def test_container_removed_by_hand_is_healed(world):
    hv = world.lab.hypervisors[1].local()
    with CRIClient(hv) as client:
        victim = client.list_containers({NODE: "team-a-cp-1", "gitops.infra/component": "kube-scheduler"})[0]
        client.stop_container(victim.id, timeout=0)
        client.remove_container(victim.id)
    plan = world.plan("--detailed-exitcode", check=False)
    assert plan.returncode == 2
    assert "+ create container kube-scheduler: container is missing" in plan.stdout
    world.apply()
    with CRIClient(hv) as client:
        healed = client.list_containers({NODE: "team-a-cp-1", "gitops.infra/component": "kube-scheduler"})
    assert len(healed) == 1 and healed[0].state.value == "running" and healed[0].id != victim.id
    assert world.plan("--detailed-exitcode").returncode == 0


def test_sigkill_in_the_middle_then_rerun_converges_without_duplicates(world):
    text = (world.repo / "clusters/team-a/nodes.yaml").read_text().replace("team-a", "team-c")
    (world.repo / "clusters/team-c").mkdir()
    (world.repo / "clusters/team-c/nodes.yaml").write_text(text)
    cluster = (world.repo / "clusters/team-a/cluster.yaml").read_text().replace("team-a", "team-c")
    (world.repo / "clusters/team-c/cluster.yaml").write_text(cluster)
    proc = subprocess.Popen([GITOPS, "apply", str(world.repo), "--state-dir", str(world.state)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if "create pod" in line and "team-c-cp-2" in line:
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL, "".join(seen)
    assert not [n for n in world.sandboxes() if n == "team-c-cp-3"], "killed too late to test anything"
    world.apply()
    pods = world.sandboxes()
    counts = Counter({node: len(p) for node, p in pods.items()})
    assert all(n == 1 for n in counts.values()), counts
    assert {"team-c-cp-1", "team-c-cp-2", "team-c-cp-3", "team-c-ingress"} <= set(pods)
    assert etcd_members(world, "team-c") == ["team-c-cp-1", "team-c-cp-2", "team-c-cp-3"]
    assert world.plan("--detailed-exitcode").returncode == 0


def test_deleting_a_node_removes_only_its_pod_and_etcd_member(world):
    before = world.sandboxes()
    world.remove_nodes("clusters/team-c/nodes.yaml", ["team-c-cp-3"])
    plan = world.plan().stdout
    assert "- remove pod: Node team-c-cp-3 left the repo" in plan
    assert "- remove etcd member: Node team-c-cp-3" in plan
    world.apply()
    after = world.sandboxes()
    assert "team-c-cp-3" not in after
    for node, pods in before.items():
        if node != "team-c-cp-3":
            assert [s.id for _, s in after[node]] == [s.id for _, s in pods], node  # untouched
    assert etcd_members(world, "team-c") == ["team-c-cp-1", "team-c-cp-2"]
    assert world.plan("--detailed-exitcode").returncode == 0


def test_unreachable_hypervisor_is_left_alone(world):
    hv_file = world.repo / "hypervisors/hv-private-2.yaml"
    good = hv_file.read_text()
    hv_file.write_text(good.replace(world.lab.hypervisors[2].remote_uri, "tcp://127.0.22.3:1"))  # nobody listens
    before = world.sandboxes()
    there = sorted(n for n, pods in before.items() if pods[0][0] == "lab-hv-3")
    team_b_there = [n for n in there if n.startswith("team-b-")]
    assert team_b_there, before
    world.remove_nodes("clusters/team-b/nodes.yaml", team_b_there)
    result = world.apply()
    assert "hypervisor hv-private-2 is unreachable" in result.stdout
    during = world.sandboxes()
    for node in there:  # nothing on the unreachable hypervisor was touched
        assert [s.id for _, s in during[node]] == [s.id for _, s in before[node]], node
    hv_file.write_text(good)
    world.apply()  # reachable again: now the nodes that left the repo go, with their etcd members
    after = world.sandboxes()
    assert not set(team_b_there) & set(after)
    remaining = sorted(n for n in load_model(world.repo).nodes if n.startswith("team-b-cp"))
    assert etcd_members(world, "team-b") == remaining
    assert world.plan("--detailed-exitcode").returncode == 0


def test_a_failing_action_stops_apply_with_a_clear_message(world):
    text = (world.repo / "clusters/team-a/cluster.yaml").read_text().replace("team-a", "team-d")
    text = text.replace('  etcdVersion: "3.5.16"\n', '  etcdVersion: "3.5.16"\n  images:\n'
                                                          '    etcd: registry.invalid/etcd:does-not-exist\n')
    (world.repo / "clusters/team-d").mkdir()
    (world.repo / "clusters/team-d/cluster.yaml").write_text(text)
    nodes = (world.repo / "clusters/team-a/nodes.yaml").read_text().replace("team-a", "team-d")
    (world.repo / "clusters/team-d/nodes.yaml").write_text(nodes)
    before = world.sandboxes()
    result = world.gitops("apply", str(world.repo), "--state-dir", str(world.state), check=False)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith("error: action ") and "+ team-d/team-d-cp-1 create-pod:" in error, error
    assert "CRI PullImage" in error and "registry.invalid/etcd:does-not-exist" in error, error
    assert "FAILED" in result.stdout
    after = world.sandboxes()
    assert not [n for n in after if n.startswith("team-d-cp")], "actions ran after the failure"
    assert {n: [s.id for _, s in p] for n, p in after.items() if n in before} == \
           {n: [s.id for _, s in p] for n, p in before.items()}
    shutil.rmtree(world.repo / "clusters/team-d")
    world.apply()  # the cluster left the repo again: nothing of it may remain
    assert not [n for n in world.sandboxes() if n.startswith("team-d")]
    assert world.plan("--detailed-exitcode").returncode == 0


def test_sip_services_load_balancer_and_jump_host(world):
    """The tenant API load balancer forwards to the active ControlPlane host (a test listener on its
    networkData address stands in for the bare-metal host), and the jump host is real sshd."""
    import socketserver
    import threading

    key = world.dir / "jump-key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "e2e", "-f", str(key)], check=True)
    sip = world.repo / "sip/tenant-1.yaml"
    text = sip.read_text()
    old = next(line for line in text.splitlines() if line.strip().startswith("- ssh-ed25519"))
    sip.write_text(text.replace(old, "        - " + key.with_suffix(".pub").read_text().strip()))

    class Hello(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            self.request.sendall(b"hello from r01-node-01\n")

    server = socketserver.ThreadingTCPServer(("127.0.20.11", 6443), Hello)  # r01-node-01's networkData address
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        world.apply()
        assert world.plan("--detailed-exitcode").returncode == 0
        pods = world.sandboxes()
        assert pods["tenant-1-lb"][0][0] == pods["tenant-1-jump"][0][0] == "lab-hv-1"  # the public hypervisor
        public_ip = world.hypervisors()["hv-public-1"].ip_address
        deadline = time.monotonic() + 45
        while True:
            try:
                with socket.create_connection((public_ip, 30443), timeout=3) as conn:
                    data = conn.recv(100)
                if data:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "the load balancer never forwarded"
            time.sleep(0.5)
        assert data == b"hello from r01-node-01\n"
    finally:
        server.shutdown()
        server.server_close()
    state = LocalDirStore(world.state).load()
    port = state.nodes["tenant-1-jump"].ports["ssh"]
    ssh = ["ssh", "-p", str(port), "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
           "-o", "BatchMode=yes", "-o", "ConnectTimeout=5"]
    for _ in range(90):
        ok = subprocess.run([*ssh, "-i", str(key), f"jump@{public_ip}", "echo", "ok"], capture_output=True, text=True)
        if ok.returncode == 0:
            break
        time.sleep(0.5)
    assert ok.returncode == 0 and ok.stdout.strip() == "ok", ok.stderr
    other = world.dir / "other-key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    refused = subprocess.run([*ssh, "-i", str(other), f"jump@{public_ip}", "true"], capture_output=True, text=True)
    assert refused.returncode == 255 and "Permission denied" in refused.stderr
