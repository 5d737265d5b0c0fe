"""Workers join a gitops cluster, on real parts only.

The example repo's team-a cluster (real etcd, kube-apiserver, controller-manager and
scheduler, haproxy ingress) on 3 lab containerd hypervisors; a worker with its
own lab containerd, Debian's bridge CNI plugins, and the real kubelet and kube-proxy
of the newest release, built from their Go modules; kubectl as the client; iptables from
Debian. The worker is a machine of its own: a network namespace joined to the host by a veth
(`gitops lab exec` runs join and leave there), so nothing of it reaches the host's interfaces or
iptables. The tests share one lab (bootstrap objects, refused joins, a join, workloads: logs, exec, a
Service, then the worker leaves and nothing is left); each joins the worker first if it needs it
and it has not joined, so any one runs alone.
"""
from __future__ import annotations

import dataclasses
import json
import shutil
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
import crashpoints
from conftest import running_lab
from repo_helpers import add_node

from gitops.lab import hostcheck, kubebin
from gitops.lab.network import LabNetwork
from gitops.lab.workloads import manifest

pytestmark = pytest.mark.lab("workers")

GITOPS = str(Path(sys.executable).parent / "gitops")
SUBNET = "127.0.24"
NET = LabNetwork.for_subnet(SUBNET).worker(1, "lab-worker-1")


@dataclasses.dataclass
class Cluster:
    dir: Path
    repo: Path
    state: Path
    lab: object
    kubeconfig: Path
    worker_dir: Path
    busybox: str
    joined: bool = False

    def gitops(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
        proc = subprocess.run([GITOPS, *args], capture_output=True, text=True, timeout=timeout, cwd=self.dir)
        if check and proc.returncode != 0:
            raise AssertionError(f"gitops {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
        return proc

    def apply(self) -> subprocess.CompletedProcess:
        return self.gitops("apply", str(self.repo), "--state-dir", str(self.state))

    def plan(self, *extra: str, check: bool = True) -> subprocess.CompletedProcess:
        return self.gitops("plan", str(self.repo), "--state-dir", str(self.state), *extra, check=check)

    def kubectl(self, *args: str, check: bool = True, timeout: float = 120,
                stdin: str | None = None) -> subprocess.CompletedProcess:
        proc = subprocess.run([str(kubebin.kubectl()), "--kubeconfig", str(self.kubeconfig), *args],
                              capture_output=True, text=True, timeout=timeout, input=stdin)
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
        return proc

    def token(self, ttl: str = "1h") -> list[str]:
        """`gitops join-token create`'s printed command, as argv run on the lab worker."""
        out = self.gitops("join-token", "create", str(self.repo), "--state-dir", str(self.state),
                          "--cluster", "team-a", "--ttl", ttl).stdout
        command = out.strip().splitlines()[-1].split()
        assert command[:2] == ["gitops", "join"], out
        return self.on_worker(GITOPS, *command[1:])

    def on_worker(self, *argv: str) -> list[str]:
        """`argv` run on lab-worker-1: in its network namespace, through `gitops lab exec`."""
        return [GITOPS, "lab", "exec", "--dir", str(self.dir / "lab"), "lab-worker-1", "--", *argv]

    def worker_has(self, *argv: str) -> str:
        return subprocess.run(self.on_worker(*argv), capture_output=True, text=True, timeout=60, check=True).stdout


def _host_leftovers(base: Path) -> dict[str, list[str]]:
    """What this lab's worker could leave on the host (another lab may run beside it)."""
    return {
        "processes": subprocess.run(["pgrep", "-f", f"(kubelet|kube-proxy) --config={base}/"], capture_output=True,
                                    text=True).stdout.split(),
        "chains": hostcheck.kube_chains(),
        "links": [line for line in subprocess.run(["ip", "-o", "link"], capture_output=True, text=True)
                  .stdout.splitlines() if f" {NET.lab.host_link}@" in line or f"gitops{SUBNET.split('.')[2]}w" in line],
        # this lab's namespaces (the worker's own among them) and its pods' (the worker's containerd makes
        # cni-*: the only one here with a pod network; the other labs' pods share their machine's network)
        "netns": sorted(name for name in (line.split()[0] for line in subprocess.run(
            ["ip", "netns", "list"], capture_output=True, text=True).stdout.splitlines())
            if name.startswith((f"gitops-0-{SUBNET.split('.')[2]}-", "cni-"))),
        "routes": subprocess.run(["ip", "route", "show", "dev", NET.lab.host_link], capture_output=True,
                                 text=True).stdout.split(),
        "ip_forward": [Path("/proc/sys/net/ipv4/ip_forward").read_text().strip()],
        "addresses": hostcheck.addresses(),
    }


@pytest.fixture(scope="module")
def cluster():
    from gitops import lab as labmod

    with running_lab("gitops-workers-") as (base, _):  # (the lab comes up after `before`)
        before = _host_leftovers(base)
        assert before["chains"] == [] and NET.netns not in before["netns"], before
        try:
            # two public machines: `test_the_worker_follows_its_cluster_to_a_virtual_ip` gives team-a a second
            # ingress
            lab = labmod.up(base / "lab", hypervisors=4, public=2, subnet=SUBNET)
            repo = base / "repo"
            subprocess.run([GITOPS, "lab", "example-repo", "--ingress-nodes", "1", "--dir", str(base / "lab"),
                            str(repo)], check=True, capture_output=True)
            shutil.rmtree(repo / "clusters" / "team-b")  # one cluster is enough here, and faster
            c = Cluster(base, repo, base / "state", lab, base / "team-a.kubeconfig", base / "worker",
                        lab.images["busybox"])
            c.apply()
            c.kubeconfig.write_text(c.gitops("kubeconfig", str(repo), "--state-dir", str(c.state),
                                             "--cluster", "team-a").stdout)
            yield c
        finally:
            subprocess.run([GITOPS, "lab", "exec", "--dir", str(base / "lab"), "lab-worker-1", "--", GITOPS, "leave",
                            "--dir", str(base / "worker")], capture_output=True, timeout=120)
    assert _host_leftovers(base) == before


def test_bootstrap_objects_are_in_the_plan_and_applied(cluster):
    assert cluster.plan("--detailed-exitcode", check=False).returncode == 0
    bindings = cluster.kubectl("get", "clusterrolebindings", "-l", "gitops.infra/managed-by=gitops",
                               "-o", "json").stdout
    subjects = {b["metadata"]["name"]: b["subjects"][0]["name"] for b in json.loads(bindings)["items"]}
    assert subjects["gitops:kubelet-bootstrap"] == "system:bootstrappers"
    assert subjects["gitops:node-autoapprove-bootstrap"] == "system:bootstrappers"
    # cluster-info is readable without credentials, and names the ingress
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # as `gitops join` reads it: no trust yet
    with urllib.request.urlopen(f"{_server(cluster)}/api/v1/namespaces/kube-public/configmaps/cluster-info",
                                context=context, timeout=30) as response:
        info = json.load(response)
    assert yaml.safe_load(info["data"]["kubeconfig"])["clusters"][0]["cluster"]["server"] == _server(cluster)
    # drift is seen and planned: an object changed behind gitops's back is put back
    cluster.kubectl("patch", "clusterrolebinding", "gitops:node-proxier", "--type=merge",
                    "-p", '{"metadata":{"annotations":{"gitops.infra/spec-hash":"edited"}}}')
    planned = cluster.plan().stdout
    assert "~ update object gitops:node-proxier: spec hash edited !=" in planned, planned
    cluster.apply()
    assert cluster.plan("--detailed-exitcode", check=False).returncode == 0


def _tail(cluster: Cluster, log: str, lines: int = 40) -> str:
    path = cluster.worker_dir / log
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else f"(no {log})"


def _server(cluster: Cluster) -> str:
    return yaml.safe_load(cluster.kubeconfig.read_text())["clusters"][0]["cluster"]["server"]


def test_bad_tokens_and_pins_are_refused(cluster):
    command = cluster.token()
    flags = cluster.gitops("lab", "worker", "--dir", str(cluster.lab.dir)).stdout.split()
    token_at = command.index("--token") + 1
    # a token the cluster never issued
    wrong = [*command[:token_at], "abcdef.0123456789abcdef", *command[token_at + 1:]]
    refused = subprocess.run([*wrong, *flags, "--dir", str(cluster.worker_dir)], capture_output=True, text=True,
                             timeout=60)
    assert refused.returncode == 1
    assert "the bootstrap token was refused (invalid or expired)" in refused.stderr
    # an expired one
    expired = cluster.token(ttl="1s")
    time.sleep(3)
    refused = subprocess.run([*expired, *flags, "--dir", str(cluster.worker_dir)], capture_output=True, text=True,
                             timeout=60)
    assert refused.returncode == 1 and "refused (invalid or expired)" in refused.stderr, refused.stderr
    # the right token, but a CA pin that is not this cluster's
    pin_at = command.index("--ca-cert-hash") + 1
    other = [*command[:pin_at], "sha256:" + "0" * 64, *command[pin_at + 1:]]
    refused = subprocess.run([*other, *flags, "--dir", str(cluster.worker_dir)], capture_output=True, text=True,
                             timeout=60)
    assert refused.returncode == 1 and "does not match the pinned hash" in refused.stderr, refused.stderr
    assert not cluster.worker_dir.exists()  # nothing written before the checks pass


def test_join_can_write_systemd_units_instead(cluster):
    flags = cluster.gitops("lab", "worker", "--dir", str(cluster.lab.dir)).stdout.split()
    units, directory = cluster.dir / "units", cluster.dir / "worker-units"
    done = subprocess.run([*cluster.token(), *flags, "--dir", str(directory), "--systemd-dir", str(units)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "wrote gitops-kubelet.service and gitops-kube-proxy.service" in done.stdout
    kubelet = (units / "gitops-kubelet.service").read_text()
    assert f"ExecStart={kubebin.binary('kubelet')} --config={directory}/kubelet.yaml " in kubelet
    assert f"--bootstrap-kubeconfig={directory}/bootstrap.kubeconfig" in kubelet
    proxy = (units / "gitops-kube-proxy.service").read_text()
    assert "Requires=gitops-kubelet.service" in proxy and f"--config={directory}/kube-proxy.yaml" in proxy
    assert oct((directory / "bootstrap.kubeconfig").stat().st_mode & 0o777) == "0o600"  # it holds the token
    assert subprocess.run(["pgrep", "-f", f"{directory}/kubelet.yaml"]).returncode == 1  # nothing started
    cluster.worker_has(GITOPS, "leave", "--dir", str(directory))
    assert not directory.exists()


def join_worker(cluster: Cluster) -> dict[str, str]:
    """lab-worker-1 joins team-a: `gitops join` in its namespace, gitops signing its client and
    serving certificates through plan and apply. Returns what the join printed and the two plans."""
    flags = cluster.gitops("lab", "worker", "--dir", str(cluster.lab.dir)).stdout.split()
    join = subprocess.Popen([*cluster.token(), *flags, "--dir", str(cluster.worker_dir), "--timeout", "180"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cluster.dir)
    cluster.joined = True
    seen = {}
    try:
        planned = ""
        for _ in range(60):  # the kubelet asks for its client certificate; the plan shows gitops signing it
            planned = cluster.plan().stdout
            if "sign certificate request kubelet" in planned:
                break
            time.sleep(1)
        seen["client"] = planned
        assert "worker lab-worker-1 asks for a kubelet client certificate" in planned, planned
        cluster.apply()
        seen["join"], _ = join.communicate(timeout=120)
        assert join.returncode == 0, seen["join"]
    finally:
        if join.poll() is None:
            join.kill()
    # then its serving certificate: approved and signed by gitops too
    for _ in range(60):
        planned = cluster.plan().stdout
        if "kubelet serving certificate" in planned:
            break
        time.sleep(1)
    seen["serving"] = planned
    assert "approve it (gitops approves kubelet serving requests)" in planned, planned + _tail(cluster, "kubelet.log")
    cluster.apply()
    cluster.kubectl("wait", "--for=condition=Ready", "node/lab-worker-1", "--timeout=120s")
    return seen


def ensure_joined(cluster: Cluster) -> None:
    """What the tests after the join need, when run alone (`pytest -k NAME`)."""
    if not cluster.joined:
        join_worker(cluster)


def test_worker_joins_and_gitops_signs_its_certificates(cluster):
    seen = join_worker(cluster)
    assert "sign for system:node:lab-worker-1 O=system:nodes" in seen["client"]
    assert "node lab-worker-1 registered" in seen["join"]
    assert "10.250.24.1" in seen["serving"]
    assert cluster.plan("--detailed-exitcode", check=False).returncode == 0
    csrs = json.loads(cluster.kubectl("get", "csr", "-o", "json").stdout)["items"]
    assert {c["spec"]["signerName"] for c in csrs if c["status"].get("certificate")} == {
        "kubernetes.io/kube-apiserver-client-kubelet", "kubernetes.io/kubelet-serving"}


def test_a_run_killed_while_signing_a_workers_requests_leaves_none_unsigned(cluster):
    """Issue #26.5, a worker's certificate signing (the crash-point harness's scenario, one point): the
    worker's kubelet asks for a new client and serving certificate (made with the node's own credentials,
    as its certificate manager does when it rotates them); `gitops apply` is SIGKILLed once the first is
    signed; the next apply signs what is left: each request holds a certificate of the cluster CA for its
    own key, the plan is empty, and nothing else moved (etcd members, a ConfigMap, the API probe)."""
    ensure_joined(cluster)
    ws = crashpoints.Workspace(cluster.dir, cluster.repo, cluster.state, cluster.lab, worker=cluster.worker_dir)
    crashpoints.worker_requests(ws, 0)
    outcome = crashpoints.run_crash_point(ws, "team-a", "worker-certificate-signing", "",
                                          crashpoints.KillPoint(after=1), "crash-worker-signing")
    outcome.problems += crashpoints.worker_certificates_issued(ws)
    print(outcome.row())
    # (the kill comes as the first one's line is read: the second, tens of milliseconds of requests, is
    # then cut short; should the harness be that late, it finished, and the rest still holds)
    assert outcome.actions == 2 and outcome.killed.startswith(("killed after ", "not killed: apply exited 0")), \
        outcome.row()
    assert outcome.ok, outcome.problems
    signed = json.loads(cluster.kubectl("get", "csr", "-l", "crash-points=worker", "-o", "json").stdout)["items"]
    assert sorted(c["metadata"]["name"] for c in signed) == ["crash-1-client", "crash-1-serving"]


def test_workloads_run_logs_exec_and_a_service_answers(cluster):
    ensure_joined(cluster)
    cluster.kubectl("apply", "-f", "-", stdin=manifest("web", cluster.busybox))
    cluster.kubectl("rollout", "status", "deployment/web", "--timeout=120s")
    pods = json.loads(cluster.kubectl("get", "pods", "-l", "app=web", "-o", "json").stdout)["items"]
    assert len(pods) == 2 and {p["spec"]["nodeName"] for p in pods} == {"lab-worker-1"}
    assert all(p["status"]["phase"] == "Running" for p in pods)
    name = pods[0]["metadata"]["name"]
    assert "serving" in cluster.kubectl("logs", name).stdout  # the API server reaches the kubelet, verified
    assert cluster.kubectl("exec", name, "--", "busybox", "cat", "/www/index.html").stdout.strip() \
        == f"hello from {name}"
    cluster.kubectl("apply", "-f", "-", stdin=manifest("client", cluster.busybox))
    cluster.kubectl("wait", "--for=condition=Ready", "pod/client", "--timeout=120s")
    answers: set[str] = set()
    for _ in range(30):  # through the ClusterIP (kube-proxy's iptables rules) to both pods
        answers = {line for line in cluster.kubectl("logs", "client").stdout.splitlines() if line.startswith("hello")}
        if len(answers) == 2:
            break
        time.sleep(1)
    assert answers == {f"hello from {p['metadata']['name']}" for p in pods}


def _configmaps(cluster: Cluster) -> set[str]:
    listed = json.loads(cluster.kubectl("get", "configmaps", "-n", "default", "-l", "restore-test", "-o", "json").stdout)
    return {c["metadata"]["name"] for c in listed["items"]}


def test_etcd_restored_from_a_snapshot_brings_back_what_it_held(cluster):
    """Issue #29.2 on the real team-a with a joined worker: ConfigMap A, a snapshot (restic, a
    local target), ConfigMap B, A deleted; spec.restore names the snapshot: the plan says what is lost,
    apply restores every member; A is back, B gone, /readyz ok, the worker Ready, the next plan empty."""
    ensure_joined(cluster)
    config, spec = cluster.repo / "gitops.yaml", cluster.repo / "clusters/team-a/cluster.yaml"
    config.write_text(config.read_text() + "  backup:\n    targets:\n      - name: local\n"
                      f"        repository: {cluster.dir / 'backups'}\n        password: lab backup password\n")
    first, sep, rest = spec.read_text().partition("\n---")
    with_backup = first.rstrip("\n") + "\n  backup:\n    target: local\n    keep: 3"
    spec.write_text(with_backup + sep + rest)
    cluster.kubectl("create", "configmap", "a", "--from-literal=k=a")
    cluster.kubectl("label", "configmap", "a", "restore-test=yes")
    made = cluster.gitops("backup", "create", str(cluster.repo), "--state-dir", str(cluster.state),
                          "--cluster", "team-a").stdout.strip()
    cluster.kubectl("create", "configmap", "b", "--from-literal=k=b")
    cluster.kubectl("label", "configmap", "b", "restore-test=yes")
    cluster.kubectl("delete", "configmap", "a")
    assert _configmaps(cluster) == {"b"}
    # quoted: a short restic ID may be all digits (38337321 once), which YAML reads as a number
    spec.write_text(with_backup + f"\n  restore:\n    snapshot: \"{made[:8]}\"" + sep + rest)
    planned = cluster.plan().stdout
    assert "~ restore etcd: spec.restore.snapshot: " + made[:8] in planned, planned
    assert f"snapshot {made[:8]} of backup target local" in planned and "LOST: every change" in planned
    cluster.apply()
    assert _configmaps(cluster) == {"a"}
    assert cluster.kubectl("get", "--raw", "/readyz").stdout.strip() == "ok"
    cluster.kubectl("wait", "--for=condition=Ready", "node/lab-worker-1", "--timeout=180s")
    assert cluster.plan("--detailed-exitcode", check=False).returncode == 0
    state = json.loads((cluster.state / "state.json").read_text())
    assert state["clusters"]["team-a"]["restored"] == made[:8]


def test_status_shows_the_joined_worker(cluster):
    ensure_joined(cluster)
    from gitops.engine import observe_all
    from gitops.model.validate import validate_repo
    from gitops.state import LocalDirStore
    from gitops.status.report import workers_status

    result = validate_repo(cluster.repo)
    observed = observe_all(result.model, result.repo.config, LocalDirStore(cluster.state).load())
    status = workers_status(observed, "team-a")
    assert status["observed"] and status["total"] == 1 and status["ready"] == 1
    assert status["nodes"]["lab-worker-1"]["address"] == "10.250.24.1"
    assert status["nodes"]["lab-worker-1"]["kubeletVersion"] == kubebin.DEFAULT_VERSION


def test_the_worker_is_a_machine_of_its_own(cluster):
    """Its address, kube-proxy's chains, ip_forward and the pod bridge are in its namespace, not the host's."""
    ensure_joined(cluster)
    assert f"{NET.ip}/32" in cluster.worker_has("ip", "-o", "addr", "show", "dev", "eth0")
    assert ":KUBE-SERVICES" in cluster.worker_has("iptables-save", "-t", "nat")
    assert cluster.worker_has("cat", "/proc/sys/net/ipv4/ip_forward").strip() == "1"
    assert f"gitops{SUBNET.split('.')[2]}w1" in cluster.worker_has("ip", "-o", "link")
    # the host holds none of it: no address beyond loopback added, no KUBE-* chain, no bridge
    assert hostcheck.problems(cluster.dir / "lab") == []
    assert not any(NET.ip in a for a in hostcheck.addresses())
    host_links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert f"gitops{SUBNET.split('.')[2]}w1" not in host_links
    # the host's link to the lab bridge has no address at all, IPv6 link-local included
    assert subprocess.run(["ip", "-o", "addr", "show", "dev", NET.lab.host_link], capture_output=True,
                          text=True).stdout.strip() == ""
    checked = cluster.gitops("lab", "check-host", "--dir", str(cluster.dir / "lab"))
    assert "no address added outside 127.0.0.0/8" in checked.stdout


def test_worker_leaves_and_nothing_is_left(cluster):
    ensure_joined(cluster)
    out = cluster.worker_has(GITOPS, "leave", "--dir", str(cluster.worker_dir))
    cluster.joined = False
    assert "deleted Node lab-worker-1" in out
    assert "lab-worker-1" not in cluster.kubectl("get", "nodes").stdout
    left = _host_leftovers(cluster.dir)
    assert left["processes"] == [] and left["chains"] == []
    # inside the worker's namespace too: kube-proxy's chains and the bridge are gone, ip_forward back
    assert ":KUBE-" not in cluster.worker_has("iptables-save")
    assert f"gitops{SUBNET.split('.')[2]}w1" not in cluster.worker_has("ip", "-o", "link")
    host_forward = Path("/proc/sys/net/ipv4/ip_forward").read_text().strip()  # what the namespace inherited
    assert cluster.worker_has("cat", "/proc/sys/net/ipv4/ip_forward").strip() == host_forward
    assert not cluster.worker_dir.exists()
    assert not list(Path("/var/log/pods").glob("default_*"))  # kubelet's pod logs, outside its root dir


def _mounts_under(path: Path) -> list[str]:
    """Mount points at or below `path`, from /proc/self/mountinfo."""
    root = str(path)
    points = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    return sorted(p for p in points if p == root or p.startswith(root + "/"))


def test_the_worker_follows_its_cluster_to_a_virtual_ip(cluster):
    """#44.3: a second ingress node moves team-a's endpoint to a virtual IP; the plan names `gitops follow`, the
    old address keeps answering the worker meanwhile, and `gitops follow` moves it (a server that is not its
    cluster refused first, nothing changed). After the leave test (it joins again, at the old address): the
    next test takes the lab down with this worker joined."""
    ensure_joined(cluster)
    kubeconfig = cluster.worker_dir / "kubelet.kubeconfig"

    def server() -> str:
        return yaml.safe_load(cluster.worker_has("cat", str(kubeconfig)))["clusters"][0]["cluster"]["server"]
    old = server()
    add_node(cluster.repo, "team-a", "team-a-ingress-2", "controlplane-ingress")
    planned = cluster.plan().stdout
    cluster.apply()
    from gitops.state import LocalDirStore
    new = f"https://{LocalDirStore(cluster.state).load().clusters['team-a'].virtual_ip}:6443"
    assert new.startswith("https://10.249.24.2"), new
    assert f"`gitops follow {new}` on each" in " ".join(planned.split()), planned
    assert server() == old  # untouched: the old address still answers it
    cluster.kubectl("wait", "--for=condition=Ready", "node/lab-worker-1", "--timeout=60s")

    refused = subprocess.run(cluster.on_worker(GITOPS, "follow", "https://10.249.24.1:9", "--dir",
                                               str(cluster.worker_dir)), capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and "is not this worker's cluster, or does not answer" in refused.stderr, refused
    assert "Traceback" not in refused.stderr and server() == old

    out = cluster.worker_has(GITOPS, "follow", new, "--dir", str(cluster.worker_dir))
    assert f"node lab-worker-1 Ready, its kubelet renewing its Lease through {new}" in out, out
    assert server() == new
    recorded = json.loads(cluster.worker_has("cat", str(cluster.worker_dir / "worker.json")))
    assert recorded["spec"]["server"] == new
    cluster.kubectl("wait", "--for=condition=Ready", "node/lab-worker-1", "--timeout=60s")

    # a follow killed after it stopped kubelet and kube-proxy, before it started them: run again, it starts
    # them from the command lines it kept
    cluster.worker_has(sys.executable, "-c", "import sys; from pathlib import Path; from gitops.worker.run import "
                       "stop; stop(Path(sys.argv[1]))", str(cluster.worker_dir))
    assert subprocess.run(["pgrep", "-f", f"{cluster.worker_dir}/kubelet.yaml"]).returncode == 1
    again = cluster.worker_has(GITOPS, "follow", new, "--dir", str(cluster.worker_dir))
    assert "restarted kubelet" in again and f"Ready, its kubelet renewing its Lease through {new}" in again, again


def test_lab_down_with_the_worker_joined_leaves_no_mount_or_process(cluster):
    """Issue #43.6: `gitops lab down` while the worker is still joined and runs pods: kubelet's mounts (the
    pods' secret volumes and its rshared root, in the host's mount namespace under the worker's directory)
    are undone, kubelet, kube-proxy and every process of the worker stopped, its namespace and directory
    removed. The module's last test: its lab goes down here (the fixture then finds nothing to undo)."""
    ensure_joined(cluster)
    cluster.kubectl("apply", "-f", "-", stdin=manifest("web", cluster.busybox))  # back on the worker if it left
    cluster.kubectl("rollout", "status", "deployment/web", "--timeout=120s")
    volumes = [m for m in _mounts_under(cluster.worker_dir) if "/kubelet/pods/" in m]
    assert volumes, _mounts_under(cluster.dir)
    in_namespace = subprocess.run(["ip", "netns", "pids", NET.netns], capture_output=True, text=True,
                                  check=True).stdout.split()
    assert in_namespace
    down = cluster.gitops("lab", "down", "--dir", str(cluster.dir / "lab"))
    cluster.joined = False
    assert f"worker {cluster.worker_dir}: removed {cluster.worker_dir}" in down.stdout, down.stdout
    assert _mounts_under(cluster.dir) == []  # the lab's (containerd) and the worker's (kubelet)
    assert not cluster.worker_dir.exists() and not (cluster.dir / "lab").exists()
    assert [pid for pid in in_namespace if Path(f"/proc/{pid}").exists()] == []
    assert subprocess.run(["pgrep", "-f", str(cluster.dir)], capture_output=True, text=True).stdout.split() == []
    assert not Path("/run/netns", NET.netns).exists()
    assert not list(Path("/var/log/pods").glob("default_*"))  # kubelet's pod logs, outside its root dir
