"""End to end on `gitops lab`: the example clusters applied to 3 real containerd hypervisors.

All real: containerd + runc (one of the three reached through an haproxy mTLS front),
etcd, kube-apiserver, kube-controller-manager and kube-scheduler of the example's releases (team-a the
newest, team-b the one before; built from their Go modules by scripts/build-kubernetes.sh), haproxy as
the ingress, etcdctl and kubectl as clients, and the `gitops` command itself.
No stand-in runs here. The tests run in file order and share one lab.
"""
from __future__ import annotations

import base64
import dataclasses
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import threading
import time
import http.client
import urllib.request
import socket
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from conftest import running_lab

from gitops.compile.authorities import authority
from gitops.compile.bootstrap import bootstrap_objects
from gitops.cri.client import CRIClient
from gitops.lab.probe import admin_tls as kubeconfig_tls
from gitops.lab import kubebin
from gitops.lab.probe import Probe
from gitops.model import versions
from gitops.model.validate import load_model
from gitops.pki import issue_cert
from gitops.pods import MANAGED, MANAGER, NODE
from gitops.state import LocalDirStore

pytestmark = pytest.mark.lab("apply")

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
    #: the example repo has been applied in this module run (by its first test, or `_applied_first`)
    applied: bool = False

    def gitops(self, *args: str, check: bool = True, timeout: float = 240) -> subprocess.CompletedProcess:
        proc = subprocess.run([GITOPS, *args], capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"gitops {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
        return proc

    def apply(self, *extra: str) -> subprocess.CompletedProcess:
        return self.gitops("apply", str(self.repo), "--state-dir", str(self.state), *extra)

    def apply_incomplete(self, hypervisor: str) -> subprocess.CompletedProcess:
        """`gitops apply` with `hypervisor` unreachable: what could be checked applied, exit 3 naming it."""
        proc = self.gitops("apply", str(self.repo), "--state-dir", str(self.state), check=False)
        assert proc.returncode == 3, f"exit {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
        assert f"error: incomplete apply: hypervisor {hypervisor} is unreachable" in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr
        return proc

    def apply_stamped(self) -> str:
        """`apply`, each line of its output prefixed with the wall-clock time it came (to set beside the
        probe's errors)."""
        proc = subprocess.Popen([GITOPS, "apply", str(self.repo), "--state-dir", str(self.state)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        lines = [f"{time.strftime('%H:%M:%S')}.{int(time.time() * 1000) % 1000:03d} {line}" for line in proc.stdout]
        out = "".join(lines)
        if proc.wait(timeout=600) != 0:
            raise AssertionError(f"gitops apply exited {proc.returncode}:\n{out}")
        return out

    def apply_killed_when(self, hit: Callable[[str], bool]) -> str:
        """`gitops apply`, SIGKILLed as soon as it prints a line `hit` accepts; its output up to there."""
        proc = subprocess.Popen([GITOPS, "apply", str(self.repo), "--state-dir", str(self.state)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if hit(line):
                proc.send_signal(signal.SIGKILL)
                break
        proc.wait(timeout=30)
        assert proc.returncode == -signal.SIGKILL, "".join(seen)
        return "".join(seen)

    def plan(self, *extra: str, check: bool = True) -> subprocess.CompletedProcess:
        return self.gitops("plan", str(self.repo), "--state-dir", str(self.state), *extra, check=check)

    def hypervisors(self):
        return load_model(self.repo).hypervisors

    def sandboxes(self, skip: str = "") -> dict[str, list]:
        """Managed pod sandboxes per node, across all hypervisors (but lab hypervisor `skip`), read directly
        over CRI."""
        out: dict[str, list] = {}
        for hv in self.lab.hypervisors:
            if hv.name == skip:
                continue
            with CRIClient(hv.local().cri_endpoint()) as client:
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
    with running_lab("gitops-e2e-", hypervisors=3, public=1, remote=True, subnet="127.0.22") as (base, lab):
        repo = base / "repo"
        mapping = world_gitops("lab", "example-repo", "--ingress-nodes", "1", "--dir", str(base / "lab"),
                               str(repo)).stderr
        assert mapping.splitlines()[:2] == [
            "hv-private-1 -> lab-hv-2 (" + lab.hypervisors[1].socket + ")",
            "hv-private-2 -> lab-hv-3 (mTLS " + lab.hypervisors[2].remote_uri + ")",
        ]
        yield World(base, repo, base / "state", lab)


@pytest.fixture(autouse=True)
def _applied_first(request, world):
    """Every test but the first starts from the example repo applied, whatever ran before (or did not:
    `pytest -k NAME` runs one test alone)."""
    if request.node.originalname != "test_apply_creates_the_example_clusters_exactly_as_planned" and not world.applied:
        world.apply()
        world.applied = True


def etcd_client_files(world: World, cluster: str, subject: str, folder: str) -> Path:
    """`world.dir/folder` holding ca.crt, client.crt and client.key: a client certificate for `subject` from the
    cluster's etcd CA (recorded state)."""
    state = LocalDirStore(world.state).load()
    ca = authority(state.clusters[cluster].authorities, "etcd")
    cert = issue_cert(ca, subject, client=True)
    tls = world.dir / folder
    tls.mkdir(exist_ok=True)
    for name, text in (("ca.crt", ca.cert_pem), ("client.crt", cert.cert_pem), ("client.key", cert.key_pem)):
        (tls / name).write_text(text)
    return tls


def etcdctl(world: World, cluster: str, *args: str) -> subprocess.CompletedProcess:
    """The real etcd client, with a client certificate from the cluster's etcd CA."""
    state = LocalDirStore(world.state).load()
    tls = etcd_client_files(world, cluster, "e2e-test", "etcd-client")
    hvs = world.hypervisors()
    endpoints = ",".join(f"https://{hvs[r.hypervisor].ip_address}:{r.ports['etcd-client']}"
                         for name, r in sorted(state.nodes.items()) if r.cluster == cluster and "etcd-client" in r.ports)
    etcdctl_bin = str(kubebin.etcd_program("etcdctl", versions.DEFAULT_ETCD))
    return subprocess.run([etcdctl_bin, f"--endpoints={endpoints}", f"--cacert={tls}/ca.crt",
                           f"--cert={tls}/client.crt", f"--key={tls}/client.key", "--dial-timeout=3s", *args],
                          capture_output=True, text=True, env={**os.environ, "ETCDCTL_API": "3"}, timeout=30)


def etcd_status(world: World, cluster: str) -> list[dict]:
    """`etcdctl endpoint status` of each member: its server version among the rest."""
    proc = etcdctl(world, cluster, "endpoint", "status", "-w", "json")
    assert proc.returncode == 0, proc.stderr
    return [entry["Status"] for entry in json.loads(proc.stdout)]


def version_of(world: World, cluster: str) -> str:
    """The gitVersion the cluster's API answers with ("v1.37.2"), through the ingress."""
    wait_ready(world, cluster)
    return json.loads(kubectl(world, cluster, "version", "-o", "json").stdout)["serverVersion"]["gitVersion"]


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


def etcd_leader(world: World, cluster: str) -> str:
    """The name of the cluster's etcd leader."""
    status = json.loads(etcdctl(world, cluster, "endpoint", "status", "-w", "json").stdout)
    leader = status[0]["Status"]["leader"]
    members = json.loads(etcdctl(world, cluster, "member", "list", "-w", "json").stdout)["members"]
    return next(m["name"] for m in members if m["ID"] == leader)


def admin_tls(world: World, cluster: str, with_credentials: bool = True) -> tuple[str, int, ssl.SSLContext]:
    """(ingress host, port, TLS context) from the admin kubeconfig `gitops kubeconfig` prints."""
    return kubeconfig_tls(kubeconfig_file(world, cluster).read_text(), with_credentials)


def api_get(world: World, cluster: str, path: str, with_credentials: bool = True) -> tuple[int, bytes]:
    """GET through the cluster's ingress with the admin kubeconfig from `gitops kubeconfig`."""
    host, port, context = admin_tls(world, cluster, with_credentials)
    deadline = time.monotonic() + 20
    while True:
        try:
            conn = http.client.HTTPSConnection(host, port, context=context, timeout=5)
            conn.request("GET", path)
            response = conn.getresponse()
            return response.status, response.read()
        except (ConnectionError, ssl.SSLError, OSError):
            if not with_credentials or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def kubeconfig_file(world: World, cluster: str) -> Path:
    """The admin kubeconfig `gitops kubeconfig` prints, in a 0600 file."""
    path = world.dir / f"{cluster}.kubeconfig"
    text = world.gitops("kubeconfig", str(world.repo), "--state-dir", str(world.state), "--cluster", cluster).stdout
    path.touch(mode=0o600)
    path.write_text(text)
    return path


def kubectl(world: World, cluster: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """The real kubectl through the cluster's ingress, as kubernetes-admin."""
    proc = subprocess.run([str(kubebin.kubectl()), "--kubeconfig", str(kubeconfig_file(world, cluster)),
                           "--request-timeout=10s", *args], capture_output=True, text=True, timeout=60)
    if check and proc.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} exited {proc.returncode}: {proc.stdout}{proc.stderr}")
    return proc


def wait_ready(world: World, cluster: str, timeout: float = 120) -> None:
    """Until /readyz answers `ok` through the ingress."""
    deadline = time.monotonic() + timeout
    while True:
        proc = kubectl(world, cluster, "get", "--raw", "/readyz", check=False)
        if proc.returncode == 0 and proc.stdout.strip() == "ok":
            return
        assert time.monotonic() < deadline, f"{cluster} never became ready: {proc.stdout}{proc.stderr}"
        time.sleep(1)


def start_probe(world: World, cluster: str) -> Probe:
    """The API probe (`gitops.lab.probe`) with the admin kubeconfig `gitops kubeconfig` prints, started."""
    probe = Probe(kubeconfig_file(world, cluster).read_text())
    probe.start()
    return probe


def under_probe(world: World, cluster: str, name: str, change: Callable[[], str]) -> str:
    """Run `change` (it applies something and returns apply's output, each line stamped) while the probe
    asks the cluster's API through the ingress every 100 ms: no request fails, and a ConfigMap written
    through the ingress just before is still there after. Returns the output without the stamps."""
    wait_ready(world, cluster)
    marker = f"e2e-{name}"
    kubectl(world, cluster, "-n", "default", "create", "configmap", marker, f"--from-literal=made={name}")
    probe = start_probe(world, cluster)
    started = time.monotonic()
    try:
        output = change()
        took = time.monotonic() - started
        wait_ready(world, cluster)
        time.sleep(2)  # a restarted API server back behind the ingress (rise 2 x 1 s)
    finally:
        counts = probe.stop()
    print(f"{name}: {counts.requests} requests, {counts.failures} failed, {counts.outages} outages, "
          f"apply {took:.1f} s")
    assert counts.requests > 20, counts
    assert (counts.failures, counts.outages) == (0, 0), (counts.errors, output)
    assert kubectl(world, cluster, "-n", "default", "get", "configmap", marker,
                   "-o", "jsonpath={.data.made}").stdout == name
    return "".join(line.split(" ", 1)[1] for line in output.splitlines(keepends=True))  # without the times


def assert_converged(world: World) -> None:
    """`gitops plan` is empty, after at most one healing apply for leader-elected components.

    kube-controller-manager and kube-scheduler exit by design when they cannot renew their
    Lease within 10 s, which an etcd membership change on this loaded 2-core machine can
    cause. A kubelet would restart them; gitops restarts exited containers on its next
    apply (the controller: its next poll). Only that may be left, nothing else.
    """
    plan = world.plan("--detailed-exitcode", check=False)
    if plan.returncode == 2:
        changes = [line.strip() for line in plan.stdout.splitlines() if line.strip().startswith(("+", "~", "-"))]
        assert changes and all(c in LEASE_EXITS for c in changes), plan.stdout
        world.apply()
        plan = world.plan("--detailed-exitcode", check=False)
    assert plan.returncode == 0, plan.stdout + plan.stderr


LEASE_EXITS = ("~ recreate container kube-controller-manager: container is exited",
               "~ recreate container kube-scheduler: container is exited")


def assert_complete(applied: str) -> None:
    """The plan apply executed was complete: its follow-up plan, if any, holds only restarts of
    leader-elected components that exited while etcd changed (see `assert_converged`)."""
    assert "Apply complete: " in applied and "exactly as planned" in applied, applied
    if "Follow-up plan" in applied:
        rest = applied.split("Follow-up plan", 1)[1]
        changes = [line.strip() for line in rest.splitlines() if line.strip().startswith(("+", "~", "-"))]
        assert changes and all(c in LEASE_EXITS for c in changes), applied


def test_apply_creates_the_example_clusters_exactly_as_planned(world):
    saved = world.dir / "first.plan.json"
    before = world.plan("--out", str(saved))
    # 40 + 13 for the clusters (5 of the changes: SIP host labels), 4 + 2 for tenant-1's two service pods,
    # then each cluster's worker-bootstrap objects in its new API
    objects = len(bootstrap_objects("https://127.0.0.1:1", "CA"))
    total = 59 + 2 * objects
    assert f"Plan: {44 + 2 * objects} to add, 15 to change, 0 to remove." in before.stdout
    # values that only exist once keys are generated on the nodes are shown as such, not left for later
    assert "file sa-pub.pem: (known after apply): service-account keys generated on team-a-cp-1, team-a-cp-2, " \
           "team-a-cp-3" in before.stdout
    planned = json.loads(saved.read_text())
    assert oct(saved.stat().st_mode & 0o777) == "0o600"
    subjects = [(a["kind"], a["cluster"], a["node"], a["component"]) for a in planned["plan"]["actions"]]
    assert len(subjects) == total
    done = world.gitops("apply", str(saved), "--repo", str(world.repo), "--state-dir", str(world.state))
    assert f"Apply complete: {total} action(s), exactly as planned." in done.stdout
    assert_complete(done.stdout)
    ran = [line for line in done.stdout.splitlines() if line.startswith("[") and line.endswith("s)")]
    assert len(ran) == total and all(f"[{i + 1}/{total}]" in line for i, line in enumerate(ran))
    for line, (kind, cluster, node, component) in zip(ran, subjects):  # in the saved order
        assert f" {cluster}/{node}{'/' + component if component else ''} " in line, (line, kind)
    pods = world.sandboxes()
    assert sorted(pods) == sorted([*load_model(world.repo).nodes, "tenant-1-jump", "tenant-1-lb"])
    assert all(len(p) == 1 for p in pods.values()), pods
    where = {node: hv for node, [(hv, _)] in pods.items()}
    assert where["team-a-ingress"] == where["team-b-ingress"] == "lab-hv-1"  # the public one
    assert {where[f"team-a-cp-{i}"] for i in (1, 2, 3)} == {"lab-hv-2", "lab-hv-3"}  # spread
    world.applied = True


def test_etcd_members_form_a_healthy_cluster_over_tls(world):
    for cluster in ("team-a", "team-b"):
        assert etcd_members(world, cluster) == [f"{cluster}-cp-{i}" for i in (1, 2, 3)]


def test_kubeconfig_credentials_work_through_the_ingress(world):
    for cluster in ("team-a", "team-b"):
        wait_ready(world, cluster)
        status, body = api_get(world, cluster, "/version")
        assert status == 200 and json.loads(body)["gitVersion"] == load_model(world.repo).clusters[cluster].kubernetes_version
    status, body = api_get(world, "team-a", "/api/v1/namespaces")
    assert status == 200 and b'"name":"kube-system"' in body
    status, body = api_get(world, "team-a", "/api/v1/namespaces", with_credentials=False)
    assert status == 403 and 'User "system:anonymous" cannot list' in json.loads(body)["message"]


def test_second_apply_plans_nothing(world):
    assert world.plan("--detailed-exitcode").returncode == 0
    assert "No changes." in world.apply().stdout


def test_a_state_that_does_not_know_the_live_clusters_is_refused_and_changes_nothing(world):
    """#26: an empty state dir (a fresh clone) or one with other CAs never plans new CAs over running clusters."""
    from gitops.pki import create_ca

    assert_converged(world)
    before = {c: (running(world, c), file_serials(world, c)) for c in ("team-a", "team-b")}
    empty = world.dir / "empty-state"
    for command in ("plan", "apply"):
        refused = world.gitops(command, str(world.repo), "--state-dir", str(empty), check=False)
        assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stdout + refused.stderr
        assert "cluster team-a: no certificate authority recorded for it" in refused.stderr
        assert "cluster team-b: no certificate authority recorded for it" in refused.stderr
        assert "gitops state pull" in refused.stderr and "Apply complete" not in refused.stdout
        assert not (empty / "state.json").exists()
    other = LocalDirStore(world.state).load()
    other.clusters["team-a"].authorities["cluster"].cert_pem = create_ca("another team-a CA").cert_pem
    LocalDirStore(world.dir / "other-state").save(other)
    refused = world.gitops("apply", str(world.repo), "--state-dir", str(world.dir / "other-state"), check=False)
    assert refused.returncode == 1
    assert "cluster team-a: the cluster CA on node(s) team-a-cp-1, team-a-cp-2, team-a-cp-3" in refused.stderr
    assert "team-b" not in refused.stderr.split("live cluster(s)")[1].split("\n")[0]
    assert {c: (running(world, c), file_serials(world, c)) for c in ("team-a", "team-b")} == before
    assert world.plan("--detailed-exitcode").returncode == 0


def test_the_controller_refuses_a_lab_applied_by_hand_until_its_state_is_pushed(world):
    """#26: the controller's first reconcile finds running clusters its (empty) status branch does not
    record: refused, nothing changed; after `gitops state push` of the hand-applied state it carries on."""
    assert_converged(world)
    before = {c: running(world, c) for c in ("team-a", "team-b")}
    origin = world.dir / "handover.git"
    shutil.copytree(world.repo, origin)
    for argv in (["init", "-q", "-b", "main"], ["add", "-A"],
                 ["-c", "user.name=t", "-c", "user.email=t@x", "commit", "-q", "-m", "applied by hand"]):
        subprocess.run(["git", *argv], cwd=origin, check=True, capture_output=True)
    key = world.dir / "handover.key"
    key.write_text(subprocess.run(["age-keygen"], capture_output=True, text=True, check=True).stdout)
    reconcile = [GITOPS, "reconcile", "--repo", str(origin), "--workdir", str(world.dir / "handover-work"),
                 "--identity", str(key), "--log-format", "text"]
    try:
        refused = subprocess.run(reconcile, capture_output=True, text=True, timeout=300)
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert "does not match what runs on the hypervisors" in refused.stdout + refused.stderr
        assert "cluster team-a: no certificate authority recorded for it" in refused.stdout + refused.stderr
        assert {c: running(world, c) for c in ("team-a", "team-b")} == before
        # signed with the controller's own status key (made by `status-key`), which it trusts
        world.gitops("status-key", "--workdir", str(world.dir / "handover-work"))
        signing = world.dir / "handover-work" / "status-signing-key"
        pushed = world.gitops("state", "push", "--repo", str(origin), "--state-dir", str(world.state),
                              "--identity", str(key), "--signing-key", str(signing), "--status-signers",
                              f"{signing}.pub")
        assert "as generation 1" in pushed.stdout
        done = subprocess.run(reconcile, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.startswith("Applied: commit"), done.stdout
        assert {c: running(world, c) for c in ("team-a", "team-b")} == before
    finally:
        shutil.rmtree(world.dir / "handover-work", ignore_errors=True)


def test_a_stale_saved_plan_is_refused_and_changes_nothing(world):
    saved = world.dir / "stale.plan.json"
    world.plan("--out", str(saved))
    cluster = world.repo / "clusters/team-b/cluster.yaml"
    original = cluster.read_text()
    cluster.write_text(original + "# a reviewer's late edit\n")
    before = world.sandboxes()
    try:
        refused = world.gitops("apply", str(saved), "--repo", str(world.repo), "--state-dir", str(world.state),
                               check=False)
    finally:
        cluster.write_text(original)
    assert refused.returncode == 4, refused.stdout + refused.stderr
    assert "the saved plan is stale: the repo changed since it was made; nothing was applied" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert {n: [s.id for _, s in p] for n, p in world.sandboxes().items()} == \
           {n: [s.id for _, s in p] for n, p in before.items()}
    # the repo is back as it was: the same file applies (nothing to do)
    again = world.gitops("apply", str(saved), "--repo", str(world.repo), "--state-dir", str(world.state))
    assert "No changes." in again.stdout


def test_an_edited_saved_plan_is_refused_and_changes_nothing(world):
    """#26: apply FILE re-makes the plan from its inputs: an edited payload, an added action or a replaced
    key in the planned state is refused (exit 4), nothing is written; the untouched file applies."""
    assert_converged(world)
    victim = None
    for hv in world.lab.hypervisors:  # a missing scheduler: a plan with one cheap action to edit
        with CRIClient(hv.local().cri_endpoint()) as client:
            found = client.list_containers({NODE: "team-b-cp-1", "gitops.infra/component": "kube-scheduler"})
            if found:
                victim = found[0]
                client.stop_container(victim.id, timeout=0)
                client.remove_container(victim.id)
    assert victim is not None
    saved = world.dir / "edited.plan.json"
    world.plan("--out", str(saved))
    original = json.loads(saved.read_text())
    [create] = [a for a in original["plan"]["actions"] if a["kind"] == "create-container"]

    def relabel(data):
        [mine] = [a for a in data["plan"]["actions"] if a["kind"] == "create-container"]
        mine["payload"]["container"]["labels"]["gitops.infra/node"] = "team-b-cp-2"

    def add_action(data):
        data["plan"]["actions"].append(dict(create, node="team-b-cp-2"))

    def admin_key(data):
        from gitops.pki import create_ca
        data["plannedState"]["clusters"]["team-b"]["admin"]["key_pem"] = create_ca("attacker").key_pem

    state_before = (world.state / "state.json").read_bytes()
    for edit in (relabel, add_action, admin_key):
        data = json.loads(json.dumps(original))
        edit(data)
        edited = world.dir / f"{edit.__name__}.plan.json"
        edited.write_text(json.dumps(data))
        refused = world.gitops("apply", str(edited), "--repo", str(world.repo), "--state-dir", str(world.state),
                               check=False)
        assert refused.returncode == 4, (edit.__name__, refused.stdout + refused.stderr)
        assert "the saved plan is not what its inputs make" in refused.stderr and "Traceback" not in refused.stderr
        assert (world.state / "state.json").read_bytes() == state_before
        assert "Apply complete" not in refused.stdout
    done = world.gitops("apply", str(saved), "--repo", str(world.repo), "--state-dir", str(world.state))
    assert "Apply complete: 1 action(s), exactly as planned." in done.stdout, done.stdout
    assert world.plan("--detailed-exitcode").returncode == 0


def test_real_control_planes_answer_through_the_ingress(world):
    for cluster in ("team-a", "team-b"):
        wait_ready(world, cluster)
        want = "v" + load_model(world.repo).clusters[cluster].kubernetes_version.removeprefix("v")
        assert version_of(world, cluster) == want
        assert want == (kubebin.KUBERNETES_BUILT[-1] if cluster == "team-a" else kubebin.KUBERNETES_BUILT[-2])
        assert kubectl(world, cluster, "get", "--raw", "/readyz").stdout == "ok"
        assert "kube-system" in kubectl(world, cluster, "get", "ns", "-o", "name").stdout
        kubectl(world, cluster, "-n", "default", "create", "configmap", "e2e", "--from-literal=made=before")
        assert kubectl(world, cluster, "-n", "default", "get", "configmap", "e2e",
                       "-o", "jsonpath={.data.made}").stdout == "before"


def test_controller_managers_and_schedulers_hold_their_leases(world):
    for cluster in ("team-a", "team-b"):
        for lease in ("kube-controller-manager", "kube-scheduler"):
            deadline = time.monotonic() + 90
            while True:
                proc = kubectl(world, cluster, "-n", "kube-system", "get", "lease", lease, "-o", "json", check=False)
                spec = json.loads(proc.stdout)["spec"] if proc.returncode == 0 else {}
                if spec.get("holderIdentity"):
                    break
                assert time.monotonic() < deadline, f"{cluster}: nobody holds the {lease} lease: {proc.stderr}"
                time.sleep(1)
            assert spec["leaseDurationSeconds"] == 15


def _default_token(world: World, cluster: str) -> str:
    """A token of the `default` service account from the TokenRequest API (`kubectl create token`; since 1.24
    the controller-manager no longer makes Secrets of them), once the account exists."""
    deadline = time.monotonic() + 90
    while True:
        proc = kubectl(world, cluster, "-n", "default", "create", "token", "default", check=False)
        if proc.returncode == 0 and proc.stdout.strip():
            return proc.stdout.strip()
        assert time.monotonic() < deadline, f"{cluster}: no token for the default service account: {proc.stderr}"
        time.sleep(1)


def _signer(token: str, keys: dict[str, str]) -> str | None:
    """The node whose service-account key (EC P-256, ES256) signed `token`."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

    def unb64(part: str) -> bytes:
        return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))

    header, payload, signature = token.split(".")
    assert json.loads(unb64(header))["alg"] == "ES256"
    raw = unb64(signature)
    der = encode_dss_signature(int.from_bytes(raw[:32], "big"), int.from_bytes(raw[32:], "big"))
    for node, pem in sorted(keys.items()):
        key = serialization.load_pem_public_key(pem.encode())
        try:
            key.verify(der, f"{header}.{payload}".encode(), ec.ECDSA(hashes.SHA256()))
            return node
        except InvalidSignature:
            continue
    return None


def test_service_account_token_is_signed_by_a_node_key_and_works_on_every_api_server(world):
    cluster = "team-a"
    token = _default_token(world, cluster)
    state = LocalDirStore(world.state).load()
    signer = _signer(token, state.clusters[cluster].service_account_keys)
    assert signer in {f"{cluster}-cp-{i}" for i in (1, 2, 3)}, "no node's service-account key signed the token"
    _, _, context = admin_tls(world, cluster, with_credentials=False)
    hvs = world.hypervisors()
    servers = sorted((n, hvs[r.hypervisor].ip_address, r.ports["apiserver"]) for n, r in state.nodes.items()
                     if r.cluster == cluster and "etcd-client" in r.ports)
    assert len(servers) == 3
    for node, ip, port in servers:  # straight to each API server, not through the ingress
        for bearer, expected in ((token, 403), (token[:-4] + "AAAA", 401)):
            conn = http.client.HTTPSConnection(ip, port, context=context, timeout=10)
            conn.request("GET", "/api/v1/namespaces/kube-system/secrets", headers={"Authorization": f"Bearer {bearer}"})
            response = conn.getresponse()
            body = response.read().decode()
            assert response.status == expected, f"{node}: {response.status} {body}"
            if expected == 403:  # authenticated as the service account, just not allowed to read secrets
                assert 'User "system:serviceaccount:default:default"' in json.loads(body)["message"], body


def test_a_controlplane_pod_removed_by_hand_is_healed_and_the_api_stays_up(world):
    wait_ready(world, "team-a")
    probe = start_probe(world, "team-a")
    saved = world.dir / "before-removal.plan.json"
    world.plan("--out", str(saved))
    # not the etcd leader: removing the leader by hand makes etcd elect another, and every API
    # server's /readyz fails until it has (etcd's behaviour, whoever removes the pod)
    leader = etcd_leader(world, "team-a")
    node = next(n for n in ("team-a-cp-1", "team-a-cp-2", "team-a-cp-3") if n != leader)
    [(hv_name, _)] = world.sandboxes()[node]
    try:
        time.sleep(1)
        hv = next(h for h in world.lab.hypervisors if h.name == hv_name).local()
        with CRIClient(hv.cri_endpoint()) as client:
            [victim] = client.list_sandboxes({MANAGED: MANAGER, NODE: node})
            client.stop_sandbox(victim.id)  # what `crictl rmp -f` does
            client.remove_sandbox(victim.id)
        stale = world.gitops("apply", str(saved), "--repo", str(world.repo), "--state-dir", str(world.state),
                             check=False)
        assert stale.returncode == 4 and "the live state changed since it was made" in stale.stderr, stale.stderr
        assert node not in world.sandboxes()  # refused: nothing healed behind the reviewer's back
        plan = world.plan("--detailed-exitcode", check=False)
        assert plan.returncode == 2 and node in plan.stdout
        t0 = time.strftime('%H:%M:%S')
        healed = t0 + " apply start\n" + world.apply().stdout + time.strftime('%H:%M:%S') + " apply end\n"
        wait_ready(world, "team-a")
        time.sleep(3)  # the healed API server back behind the ingress
    finally:
        probe.stop()
    assert probe.requests > 20
    assert probe.outages == 0, (probe.errors, plan.stdout, healed)
    [(_, healed_pod)] = world.sandboxes()[node]
    assert healed_pod.id != victim.id
    assert etcd_members(world, "team-a") == ["team-a-cp-1", "team-a-cp-2", "team-a-cp-3"]
    assert_converged(world)


def test_scaling_from_3_to_1_controlplane_node_and_back_keeps_the_data(world):
    nodes = world.repo / "clusters/team-a/nodes.yaml"
    original = nodes.read_text()
    world.remove_nodes("clusters/team-a/nodes.yaml", ["team-a-cp-2", "team-a-cp-3"])
    world.apply()
    assert etcd_members(world, "team-a") == ["team-a-cp-1"]
    wait_ready(world, "team-a")
    assert kubectl(world, "team-a", "-n", "default", "get", "configmap", "e2e",
                   "-o", "jsonpath={.data.made}").stdout == "before"
    kubectl(world, "team-a", "-n", "default", "create", "configmap", "e2e-small", "--from-literal=made=at-one")
    assert_converged(world)
    nodes.write_text(original)
    plan = world.plan().stdout
    # the new nodes' keys join the bundle every API server trusts: in this plan, known after apply
    assert "file sa-pub.pem: (known after apply): service-account keys generated on team-a-cp-2, " \
           "team-a-cp-3" in plan
    assert "~ recreate container kube-apiserver: spec changed" in plan  # team-a-cp-1's, for the new bundle
    # each new member joins as a learner and votes once caught up, one at a time
    assert plan.count("+ add etcd member: new controlplane node joins etcd, as a learner") == 2
    assert plan.count("~ promote etcd member etcd: the learner votes once it has caught up") == 2
    assert_complete(world.apply().stdout)
    assert etcd_members(world, "team-a") == ["team-a-cp-1", "team-a-cp-2", "team-a-cp-3"]
    members = json.loads(etcdctl(world, "team-a", "member", "list", "-w", "json").stdout)["members"]
    assert not [m["name"] for m in members if m.get("isLearner")], members
    wait_ready(world, "team-a")
    for name, made in (("e2e", "before"), ("e2e-small", "at-one")):
        assert kubectl(world, "team-a", "-n", "default", "get", "configmap", name,
                       "-o", "jsonpath={.data.made}").stdout == made
    assert_converged(world)


def test_a_version_skipping_or_reverting_a_minor_is_refused_against_the_live_cluster(world):
    """issue #13: the running API servers' image tags say which minor runs; a repo asking for a minor back
    (team-a runs the newest) or two ahead (team-b, from the one before, to a version outside the range) is
    refused by plan and by apply, and nothing on the hypervisors changes."""
    path = world.repo / "clusters/team-a/cluster.yaml"
    original = path.read_text()
    before = world.sandboxes()
    newest, previous = kubebin.KUBERNETES_BUILT[-1], kubebin.KUBERNETES_BUILT[-2]
    path.write_text(original.replace(f'kubernetesVersion: "{newest[1:]}"', f'kubernetesVersion: "{previous[1:]}"'))
    try:
        for command in (world.plan, lambda check: world.gitops("apply", str(world.repo), "--state-dir",
                                                               str(world.state), check=check)):
            refused = command(check=False)
            text = refused.stdout + refused.stderr
            assert refused.returncode == 1, text
            assert (f"Cluster team-a runs {newest.rsplit('.', 1)[0]} and the repo asks for {previous}: "
                    "Kubernetes does not support downgrading a minor version") in text, text
            assert "Traceback" not in text, text
    finally:
        path.write_text(original)
    assert world.sandboxes() == before


def test_a_minor_version_upgrade_rolls_in_the_supported_order_and_the_api_stays_up(world):
    """issue #59.4: team-b from the release before the newest to the newest, on the real binaries of both
    (and etcd to the minor the newest pairs with): node by node its etcd member (health-gated) with its API
    server, which talks to that member only, stopped before and started after on the new version (ready
    before the next node), then the controller-managers, then the schedulers, while no request through the
    ingress fails and no acknowledged write is lost; the API then says the new version."""
    newest, previous = kubebin.KUBERNETES_BUILT[-1], kubebin.KUBERNETES_BUILT[-2]
    assert version_of(world, "team-b") == previous
    path, config = world.repo / "clusters/team-b/cluster.yaml", world.repo / "gitops.yaml"
    before, config_before = path.read_text(), config.read_text()
    path.write_text(before.replace(f'kubernetesVersion: "{previous[1:]}"', f'kubernetesVersion: "{newest[1:]}"'))
    # etcd's minor changes too (its data is rewritten for good): refused until the Cluster has spec.backup
    refused = world.plan(check=False)
    assert refused.returncode == 1 and "clusters/team-b/cluster.yaml:" in refused.stderr and (
        "a new etcd minor version rewrites its data and cannot be undone, so a snapshot is taken first: give the "
        "Cluster spec.backup") in refused.stderr, refused.stdout + refused.stderr
    config.write_text(config_before + "  backup:\n    targets:\n      - name: local\n"
                      f"        repository: {world.dir / 'backups'}\n        password: lab backup password\n")
    first, sep, rest = path.read_text().partition("\n---")
    path.write_text(first.rstrip("\n") + "\n  backup:\n    target: local\n    keep: 2\n" + sep + rest)
    try:
        applied = under_probe(world, "team-b", "upgrade", world.apply_stamped)
        listed = world.gitops("backup", "list", str(world.repo), "--cluster", "team-b", "--json")
    finally:  # the rest of the module runs team-b on the newest release, without backups
        path.write_text(before.replace(f'kubernetesVersion: "{previous[1:]}"', f'kubernetesVersion: "{newest[1:]}"'))
        config.write_text(config_before)
    steps = [line for line in applied.splitlines() if line.startswith("[")]
    assert "back up etcd" in steps[0] and "team-b" in steps[0], applied  # the snapshot before anything changes
    [snapshot] = json.loads(listed.stdout)
    assert snapshot["revision"] > 0, snapshot
    ran = [line for line in applied.splitlines() if line.startswith("[") and " container " in line]
    order = [(line.split()[3], *line.split()[2].split("/")[1:3]) for line in ran]
    members = etcd_members(world, "team-b")
    assert order == [
        *(step for node in members for step in (("remove", node, "kube-apiserver"), ("recreate", node, "etcd"),
                                                ("create", node, "kube-apiserver"))),
        *(("recreate", node, component) for component in ("kube-controller-manager", "kube-scheduler")
          for node in members)], applied
    assert version_of(world, "team-b") == newest
    etcd = versions.etcd_for(newest)
    assert {m["version"] for m in etcd_status(world, "team-b")} == {etcd}
    assert_converged(world)


def test_container_removed_by_hand_is_healed(world):
    hv = world.lab.hypervisors[1].local()
    with CRIClient(hv.cri_endpoint()) as client:
        victim = client.list_containers({NODE: "team-a-cp-1", "gitops.infra/component": "kube-scheduler"})[0]
        client.stop_container(victim.id, timeout=0)
        client.remove_container(victim.id)
    plan = world.plan("--detailed-exitcode", check=False)
    assert plan.returncode == 2, plan.stdout + plan.stderr
    assert "+ create container kube-scheduler: container is missing" in plan.stdout
    world.apply()
    with CRIClient(hv.cri_endpoint()) as client:
        healed = client.list_containers({NODE: "team-a-cp-1", "gitops.infra/component": "kube-scheduler"})
    assert len(healed) == 1 and healed[0].state.value == "running" and healed[0].id != victim.id
    assert world.plan("--detailed-exitcode").returncode == 0


def test_a_plan_leaves_out_the_clusters_whose_live_state_is_as_last_converged(world):
    """Issue #31 with a live observation: apply records each cluster it left with nothing to do; a plan
    compiles and verifies only the clusters whose repo part, records or live fingerprint moved since, and
    is the full plan (`--out` leaves nothing out) action for action."""
    world.apply()
    assert_converged(world)
    records = json.loads((world.state / "converged.json").read_text())["clusters"]
    assert {"team-a", "team-b"} <= set(records), records
    quiet = world.plan("--detailed-exitcode")
    assert f"{len(records)} cluster(s) not planned again" in quiet.stdout, quiet.stdout
    hv = world.lab.hypervisors[1].local()
    with CRIClient(hv.cri_endpoint()) as client:
        victim = client.list_containers({NODE: "team-b-cp-1", "gitops.infra/component": "kube-scheduler"})
    if not victim:  # team-b-cp-1 is on the other private hypervisor
        hv = world.lab.hypervisors[2].local()
        with CRIClient(hv.cri_endpoint()) as client:
            victim = client.list_containers({NODE: "team-b-cp-1", "gitops.infra/component": "kube-scheduler"})
    with CRIClient(hv.cri_endpoint()) as client:
        client.stop_container(victim[0].id, timeout=0)
        client.remove_container(victim[0].id)
    shown = json.loads(world.plan("-o", "json").stdout)
    assert {a["cluster"] for a in shown["actions"]} == {"team-b"}, shown["actions"]
    assert "team-a" in shown["unchanged"] and "team-b" not in shown["unchanged"]
    saved = world.dir / "full.plan.json"
    world.plan("--out", str(saved), "-o", "json")
    full = json.loads(saved.read_text())["plan"]
    assert [a["kind"] + a["node"] + a["component"] for a in full["actions"]] == \
        [a["kind"] + a["node"] + a["component"] for a in shown["actions"]]
    assert full["actions"] == shown["actions"] and full["warnings"] == shown["warnings"]
    world.apply()
    assert_converged(world)


def test_a_dead_files_agent_is_started_again_and_nothing_restarts(world):
    """A running pod's files agent killed: the plan starts it again and checks the node's files once it
    runs (known after apply); no certificate is re-issued and no component restarts."""
    before = running(world, "team-a")
    hv = world.hypervisors()[LocalDirStore(world.state).load().nodes["team-a-cp-2"].hypervisor]
    with CRIClient(hv.cri_endpoint()) as client:
        [agent] = client.list_containers({NODE: "team-a-cp-2", "gitops.infra/component": "files"})
        client.stop_container(agent.id, timeout=0)
    plan = world.plan("--detailed-exitcode", check=False)
    assert plan.returncode == 3, plan.stdout  # incomplete: the node's files could not be read
    assert "~ recreate container files: container is exited" in plan.stdout, plan.stdout
    assert "files of team-a-cp-2: (known after apply)" in plan.stdout, plan.stdout
    assert "Incomplete: the files of 1 node could not be observed." in plan.stdout, plan.stdout
    assert "write files" not in plan.stdout and plan.stdout.count("recreate container") == 1, plan.stdout
    out = world.apply().stdout
    assert "Apply complete: 1 action(s)" in out and "Follow-up plan" not in out, out  # checked after: fine
    after = running(world, "team-a")
    assert after[("team-a-cp-2", "files")] != agent.id
    assert {k: v for k, v in after.items() if k != ("team-a-cp-2", "files")} == {
        k: v for k, v in before.items() if k != ("team-a-cp-2", "files")}
    assert world.plan("--detailed-exitcode").returncode == 0


def test_a_run_killed_after_writing_certificates_restarts_their_readers_next_time(world):
    """SIGKILL right after a node's re-issued certificates are written, before its readers restart: they
    recorded the digests of the certificates they started with, so the next plan restarts exactly those
    that still run on an old one, gated as usual, and then nothing is left."""
    # every leaf (365 days) is inside a 365-day window; the new ones (366 days) are inside the 366-day
    # window of the renewal test that follows in this module, so it still renews every leaf
    original = edit(world, "clusters/team-a/cluster.yaml", "    validityDays: 365\n    renewBeforeDays: 30\n",
                    "    validityDays: 366\n    renewBeforeDays: 365\n")
    try:
        out = world.apply_killed_when(lambda line: "write files" in line and "done" in line)
        node = out.splitlines()[-1].split()[2].split("/")[1]
    finally:
        (world.repo / "clusters/team-a/cluster.yaml").write_text(original)
    plan = world.plan().stdout  # back to 365/30: the new leaves are outside the window, nothing re-issued
    assert "re-issued" not in plan and "write files" not in plan, plan
    stale, where = set(), ""
    for line in plan.splitlines():
        where = line.split()[1] if line.startswith("  Node ") else where
        if "written since it started: restarts to read it" in line:
            stale.add((where, line.split()[3].rstrip(":")))
    assert stale and {n for n, _ in stale} == {node}, plan  # only the node whose files were written
    assert ("etcd" not in {c for _, c in stale}) or "one member at a time" in plan, plan  # gated as usual
    world.apply()
    assert_converged(world)


def test_sigkill_in_the_middle_then_rerun_converges_without_duplicates(world):
    text = (world.repo / "clusters/team-a/nodes.yaml").read_text().replace("team-a", "team-c")
    (world.repo / "clusters/team-c").mkdir()
    (world.repo / "clusters/team-c/nodes.yaml").write_text(text)
    cluster = (world.repo / "clusters/team-a/cluster.yaml").read_text().replace("team-a", "team-c")
    (world.repo / "clusters/team-c/cluster.yaml").write_text(cluster)
    world.apply_killed_when(lambda line: "create pod" in line and "team-c-cp-2" in line)
    assert not [n for n in world.sandboxes() if n == "team-c-cp-3"], "killed too late to test anything"
    world.apply()
    pods = world.sandboxes()
    counts = Counter({node: len(p) for node, p in pods.items()})
    assert all(n == 1 for n in counts.values()), counts
    assert {"team-c-cp-1", "team-c-cp-2", "team-c-cp-3", "team-c-ingress"} <= set(pods)
    assert etcd_members(world, "team-c") == ["team-c-cp-1", "team-c-cp-2", "team-c-cp-3"]
    assert_converged(world)


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
    assert_converged(world)


def test_unreachable_hypervisor_is_left_alone(world):
    hv_file = world.repo / "hypervisors/hv-private-2.yaml"
    good = hv_file.read_text()
    hv_file.write_text(good.replace(world.lab.hypervisors[2].remote_uri, "tcp://127.0.22.3:1"))  # nobody listens
    before = world.sandboxes()
    there = sorted(n for n, pods in before.items() if pods[0][0] == "lab-hv-3")
    team_b_there = [n for n in there if n.startswith("team-b-")]
    assert team_b_there, before
    world.remove_nodes("clusters/team-b/nodes.yaml", team_b_there)
    result = world.apply_incomplete("hv-private-2")
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
    assert_converged(world)


def test_a_failing_action_stops_apply_with_a_clear_message(world):
    text = (world.repo / "clusters/team-a/cluster.yaml").read_text().replace("team-a", "team-d")
    text = text.replace('  apiServer:\n', '  images:\n    etcd: registry.invalid/etcd:does-not-exist\n  apiServer:\n', 1)
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


# ------------------------------------------------------------------ day-2 operations under the probe (issue #13)

def running(world: World, cluster: str) -> dict[tuple[str, str], str]:
    """(node, component) -> id of each running container of the cluster's pods, over CRI."""
    out = {}
    for hv in world.lab.hypervisors:
        with CRIClient(hv.local().cri_endpoint()) as client:
            for c in client.list_containers({MANAGED: MANAGER, "gitops.infra/cluster": cluster}):
                if c.state.value == "running":
                    out[(c.labels[NODE], c.labels["gitops.infra/component"])] = c.id
    return out


def restarted(before: dict[tuple[str, str], str], after: dict[tuple[str, str], str]) -> set[tuple[str, str]]:
    """The (node, component)s running in `before` that run another container in `after`. One no longer
    running may only be a leader-elected component that exited for its Lease (see `assert_converged`)."""
    gone = {k for k in before if k not in after}
    assert all(c in ("kube-controller-manager", "kube-scheduler") for _, c in gone), gone
    return {k for k in before if k in after and after[k] != before[k]}


def serving_serials(world: World, cluster: str) -> dict[str, int]:
    """`node/apiserver` and `node/etcd` -> serial of the certificate each serves, read over TLS from each one."""
    from cryptography import x509

    state = LocalDirStore(world.state).load()
    record = state.clusters[cluster]
    etcd_ca = authority(record.authorities, "etcd")
    client = issue_cert(etcd_ca, "e2e-serials", client=True)
    tls = world.dir / "serials"
    tls.mkdir(exist_ok=True)
    (tls / "c.crt").write_text(client.cert_pem)
    (tls / "c.key").write_text(client.key_pem)
    hvs = world.hypervisors()
    out = {}
    for node, r in sorted(state.nodes.items()):
        if r.cluster != cluster or "etcd-client" not in r.ports:
            continue
        for what, port, ca in (("apiserver", r.ports["apiserver"], record.authorities["cluster"].cert_pem),
                               ("etcd", r.ports["etcd-client"], etcd_ca.cert_pem)):
            context = ssl.create_default_context(cadata=ca)
            context.check_hostname = False
            if what == "etcd":  # etcd wants a client certificate of its CA; the API server none to show its own
                context.load_cert_chain(str(tls / "c.crt"), str(tls / "c.key"))
            with socket.create_connection((hvs[r.hypervisor].ip_address, port), timeout=5) as raw:
                with context.wrap_socket(raw) as conn:
                    der = conn.getpeercert(binary_form=True)
            out[f"{node}/{what}"] = x509.load_der_x509_certificate(der).serial_number
    return out


def file_serials(world: World, cluster: str) -> dict[str, int]:
    """`node/name` -> serial of every leaf certificate file (not the CAs) on the cluster's nodes."""
    from gitops.pki import load_cert_pem

    state = LocalDirStore(world.state).load()
    hvs = world.hypervisors()
    out = {}
    for node, r in sorted(state.nodes.items()):
        if r.cluster != cluster:
            continue
        files = Path(hvs[r.hypervisor].data_dir) / cluster / node / "files"
        for crt in sorted(files.glob("*.crt")):
            if not crt.name.endswith("ca.crt"):
                out[f"{node}/{crt.stem}"] = load_cert_pem(crt.read_text()).serial_number
    return out


def command_lines(program: str) -> list[list[str]]:
    """The arguments of every running process of `program`."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue  # gone meanwhile
        if os.path.basename(argv[0]) == program:
            out.append(argv)
    return out


def edit(world: World, rel: str, old: str, new: str) -> str:
    """Replace `old` (which must be there once) by `new` in repo file `rel`; returns the original text."""
    path = world.repo / rel
    text = path.read_text()
    assert text.count(old) == 1, f"{rel}: {old!r}"
    path.write_text(text.replace(old, new))
    return text


def test_an_api_server_flag_change_rolls_the_api_servers_with_no_failed_request(world):
    """(b) spec.apiServer.extraArgs: the API servers restart one at a time, each back behind the ingress
    (readiness-gated) before the next; nothing else restarts."""
    before = running(world, "team-a")
    original = edit(world, "clusters/team-a/cluster.yaml", "      - api.team-a.example.com\n",
                    "      - api.team-a.example.com\n    extraArgs:\n      event-ttl: 2h0m0s\n")
    applied = under_probe(world, "team-a", "flag", world.apply_stamped)
    ran = [line.split()[2] for line in applied.splitlines() if line.startswith("[")]
    assert ran == [f"team-a/team-a-cp-{n}/kube-apiserver" for n in (1, 2, 3)], applied
    assert restarted(before, running(world, "team-a")) == {(f"team-a-cp-{n}", "kube-apiserver") for n in (1, 2, 3)}
    state, hvs = LocalDirStore(world.state).load(), world.hypervisors()
    mine = {(f"--bind-address={hvs[r.hypervisor].ip_address}", f"--secure-port={r.ports['apiserver']}")
            for r in state.nodes.values() if r.cluster == "team-a" and "etcd-client" in r.ports}
    servers = [argv for argv in command_lines("kube-apiserver") if any(a in argv and p in argv for a, p in mine)]
    assert len(servers) == 3 and all("--event-ttl=2h0m0s" in argv for argv in servers), servers
    assert_converged(world)
    (world.repo / "clusters/team-a/cluster.yaml").write_text(original)  # left to the next apply


def test_sip_oidc_provider_runs_in_its_pod_and_team_a_trusts_it(world):
    """(#47) tenant-1's provider declares a user: its pod runs on the public hypervisor over TLS (a certificate
    from the CA gitops keeps for tenant-1's services), team-a trusts it by name (its API servers roll, no
    request failed), the user's kubectl gets 403 then 200 once RBAC binds its group; a provider removed by hand
    is healed with the keys it had."""
    import secrets as random

    from gitops.compile.authorities import SERVICE_AUTHORITY
    from gitops.lab.example import declare_oidc_user
    from gitops.oidc.passwords import hash_password

    world_gitops("lab", "images", "oidc", "--dir", str(world.dir / "lab"))
    password = random.token_urlsafe(12)
    declare_oidc_user(world.repo, "alice", hash_password(password))
    applied = under_probe(world, "team-a", "oidc", world.apply_stamped)
    assert "tenant-1-auth" in applied and "team-a/team-a-cp-3/kube-apiserver" in applied, applied
    state, hvs = LocalDirStore(world.state).load(), world.hypervisors()
    placed = state.nodes["tenant-1-auth"]
    logs = Path(hvs[placed.hypervisor].data_dir) / "sip-tenant-1" / "tenant-1-auth" / "logs"

    def provider_logs() -> str:
        return "".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(logs.glob("*.log")))
    issuer = f"https://{hvs[placed.hypervisor].ip_address}:{placed.ports['oidc']}"
    assert hvs[placed.hypervisor].public
    ca = state.clusters["sip-tenant-1"].authorities[SERVICE_AUTHORITY].cert_pem
    context = ssl.create_default_context(cadata=ca)  # the issuer's address is in its certificate

    def answer(path: str) -> dict:
        """The provider's answer at `path`, once it is up (started just now: a few seconds)."""
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{issuer}{path}", timeout=5, context=context) as got:
                    return json.loads(got.read())
            except OSError:
                assert time.monotonic() < deadline, f"{issuer} never answered:\n{provider_logs()}"
                time.sleep(0.5)

    def discovery() -> dict:
        return answer("/.well-known/openid-configuration")

    assert discovery()["issuer"] == issuer
    try:
        assert_converged(world)  # (a controller-manager or scheduler may have lost its Lease during the roll)
    except AssertionError as err:
        raise AssertionError(f"{err}\n{provider_logs()}") from None
    kids = {k["kid"] for k in answer("/keys")["keys"]}
    kubeconfig = world.dir / "alice.kubeconfig"
    kubeconfig.write_text(world.gitops("kubeconfig", str(world.repo), "--state-dir", str(world.state),
                                       "--cluster", "team-a", "--oidc", "alice").stdout)
    env = {**os.environ, "HOME": str(world.dir), "XDG_CACHE_HOME": str(world.dir / "oidc-cache"),
           "GITOPS_OIDC_PASSWORD": password,
           "PATH": f"{Path(GITOPS).parent}:{os.environ['PATH']}"}

    def as_alice(*args: str, password_env: dict | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([str(kubebin.kubectl()), "--kubeconfig", str(kubeconfig), "--request-timeout=20s",
                               *args], capture_output=True, text=True, env=password_env or env, timeout=90)

    deadline = time.monotonic() + 90  # the API servers fetch the issuer's keys in the background
    while any(w in (denied := as_alice("get", "configmaps", "-n", "default")).stderr
              for w in ("Unauthorized", "the server doesn't have a resource type")):
        assert time.monotonic() < deadline, denied.stderr
        time.sleep(1)
    assert 'User "oidc:alice@example.com" cannot list resource "configmaps"' in denied.stderr, denied.stderr
    kubectl(world, "team-a", "create", "role", "cm-reader", "-n", "default", "--verb=get,list",
            "--resource=configmaps")
    kubectl(world, "team-a", "create", "rolebinding", "tenant-1-viewers", "-n", "default", "--role=cm-reader",
            "--group=oidc:tenant-1-viewers")
    deadline = time.monotonic() + 30
    while (allowed := as_alice("get", "configmaps", "-n", "default", "-o", "name")).returncode != 0:
        assert time.monotonic() < deadline and "Forbidden" in allowed.stderr, allowed.stderr
        time.sleep(0.5)
    assert "configmap/e2e-oidc" in allowed.stdout
    wrong = {**env, "XDG_CACHE_HOME": str(world.dir / "oidc-cache-wrong"), "GITOPS_OIDC_PASSWORD": "wrong"}
    refused = as_alice("get", "configmaps", "-n", "default", password_env=wrong)
    assert refused.returncode != 0 and "refused the login" in refused.stderr, refused.stderr
    # neither the hash nor the provider's keys are in the recorded state
    hashed = yaml.safe_load((world.repo / "sip/tenant-1.yaml").read_text())["spec"]["services"]["auth"]["users"][0]
    assert not [p for p in world.state.rglob("*") if p.is_file() and hashed["passwordHash"].encode() in p.read_bytes()]
    # the provider removed by hand: planned back, and it serves the keys it had (born on the hypervisor)
    lab_hv = next(hv for hv in world.lab.hypervisors if hv.ip == hvs[placed.hypervisor].ip_address)

    def provider_container(client: CRIClient):
        (found,) = [c for c in client.list_containers({MANAGED: MANAGER, NODE: "tenant-1-auth"})
                    if c.labels["gitops.infra/component"] == "oidc" and c.state.value == "running"]
        return found

    with CRIClient(lab_hv.local().cri_endpoint()) as client:
        provider = provider_container(client)
        client.stop_container(provider.id, timeout=5)
        client.remove_container(provider.id)
    healing = world.plan().stdout
    assert "tenant-1-auth" in healing and "oidc" in healing, healing
    world.apply()
    assert discovery()["issuer"] == issuer
    assert {k["kid"] for k in answer("/keys")["keys"]} == kids
    # a new signing key on request, in the provider's container: published at once, the old one still there
    with CRIClient(lab_hv.local().cri_endpoint()) as client:
        code, out, err = client.exec_sync(provider_container(client).id, ["gitops", "oidc", "rotate-keys", "--keys",
                                                        "/var/lib/gitops-oidc", "--user", "10001"], timeout=60)
    assert code == 0, err
    assert kids < {k["kid"] for k in answer("/keys")["keys"]}, out
    assert world.plan("--detailed-exitcode").returncode == 0


def test_renewing_every_leaf_certificate_restarts_its_readers_with_no_failed_request(world):
    """(c) renewal, driven honestly: a renewal window wider than what the leaves have left (365 days of 400)
    re-issues every leaf of the cluster, then every component that reads one restarts, rolling and gated,
    and serves the new certificate."""
    files, serving, before = file_serials(world, "team-a"), serving_serials(world, "team-a"), running(world, "team-a")
    assert len(files) == 3 * 8 and len(serving) == 6
    # the flag of the test before goes back in the same apply (the API servers restart anyway)
    original = edit(world, "clusters/team-a/cluster.yaml", "    validityDays: 365\n    renewBeforeDays: 30\n",
                    "    validityDays: 400\n    renewBeforeDays: 366\n")
    try:
        plan = world.plan().stdout
        assert plan.count("(renewal window 366 days)") == 3 * 8, plan
        applied = under_probe(world, "team-a", "renewal", world.apply_stamped)
    finally:
        (world.repo / "clusters/team-a/cluster.yaml").write_text(original)
    assert_complete(applied)
    new_files, new_serving, after = file_serials(world, "team-a"), serving_serials(world, "team-a"), \
        running(world, "team-a")
    assert not {k for k in files if new_files[k] == files[k]}, "leaves not re-issued"
    assert not {k for k in serving if new_serving[k] == serving[k]}, "still serving the old certificate"
    readers = {(f"team-a-cp-{n}", c) for n in (1, 2, 3)
               for c in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")}
    changed = restarted(before, after)
    assert changed <= readers and readers - changed <= {k for k in readers if k not in after}, changed
    # (the agents and the ingress stay; a reader not running now exited for its Lease, after its restart)
    assert etcd_members(world, "team-a") == ["team-a-cp-1", "team-a-cp-2", "team-a-cp-3"]
    assert_converged(world)  # back to 365/30: the new leaves (400 days) are outside the window


def test_containerd_killed_during_apply_loses_nothing_on_its_hypervisor(world):
    """A hypervisor's containerd SIGKILLed while apply runs: apply stops at its first action there; with it
    down, nothing of it is pruned or recreated elsewhere; once it is back, its pods are the same and a
    later apply converges."""
    from gitops import lab as labmod

    newest = kubebin.KUBERNETES_BUILT[-1]
    for role in (f"kube-controller-manager/{newest}", f"kube-scheduler/{newest}"):
        labmod.alias_image(world.lab.images[role], world.lab.images[role].rsplit(":", 1)[0] + ":killed",
                           world.lab.dir)
    names = {"hv-private-1": "lab-hv-2", "hv-private-2": "lab-hv-3"}
    where = {n: r.hypervisor for n, r in LocalDirStore(world.state).load().nodes.items()}
    victim = names[where["team-a-cp-1"]]  # its scheduler restarts 3 actions after the first one is done
    before = {n: [s.id for _, s in p] for n, p in world.sandboxes().items()}
    mine = sorted(n for n, hv in where.items() if names.get(hv) == victim)
    original = edit(world, "clusters/team-a/cluster.yaml", '  apiServer:\n',
                    '  images:\n' + "".join(
                        f"    {k}: {world.lab.images[r].rsplit(':', 1)[0]}:killed\n" for k, r in (
                            ("kubeControllerManager", f"kube-controller-manager/{newest}"),
                            ("kubeScheduler", f"kube-scheduler/{newest}"))) + '  apiServer:\n')
    restarted = False
    try:
        proc = subprocess.Popen([GITOPS, "apply", str(world.repo), "--state-dir", str(world.state)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if line.startswith("[1/"):
                labmod.kill_containerd(world.lab.dir, victim)
        assert proc.wait(timeout=120) == 1, "".join(seen)
        out = "".join(seen)
        assert "Traceback" not in out and "FAILED" in out and "unreachable" in out, out
        down = world.apply_incomplete(where["team-a-cp-1"]).stdout  # nothing of the victim planned, pruned or moved
        assert f"hypervisor {where['team-a-cp-1']} is unreachable" in down, down
        assert "remove pod" not in down and "create pod" not in down, down
        during = world.sandboxes(skip=victim)
        assert not set(mine) & set(during), "a node of the dead hypervisor was recreated elsewhere"
        assert {n: [s.id for _, s in p] for n, p in during.items()} == {n: ids for n, ids in before.items()
                                                                        if n not in mine}
        labmod.start_containerd(world.lab.dir, victim)
        restarted = True
        after_restart = world.sandboxes()
        assert {n: [s.id for _, s in p] for n, p in after_restart.items()} == before  # nothing lost
        # as the runtime recovered them (a not-ready one here is containerd's doing, before gitops acts)
        states = {n: [s.state.value for _, s in p] for n, p in after_restart.items()}
    finally:
        (world.repo / "clusters/team-a/cluster.yaml").write_text(original)
        if not restarted:
            labmod.start_containerd(world.lab.dir, victim)
    back = world.apply().stdout  # back to the default references; the victim's components too
    log = Path(world.lab.get(victim).dir, "logs", "containerd.log").read_text(errors="replace")
    ours = {s for n in mine for s in before.get(n, [])}  # (a node recorded there may have no pod)
    assert {n: [s.id for _, s in p] for n, p in world.sandboxes().items()} == before, (
        f"{back}\nsandbox states right after the restart: {states}\n" + "\n".join(
            line for line in log.splitlines() if "level=error" in line or "level=warn" in line
            or any(s[:12] in line for s in ours)))
    assert_converged(world)


def test_replacing_a_controlplane_node_keeps_quorum_with_no_failed_request(world):
    """(e) one Node leaves the repo and another joins in the same commit: members change one at a time
    (the leaving one removed while the others are healthy, the new one a learner until caught up). The
    first run is SIGKILLed right after the new member was added as a learner: the state records it as a
    learner and the next run promotes it, with no failed request through the ingress across both."""
    nodes = world.repo / "clusters/team-a/nodes.yaml"
    docs = list(yaml.safe_load_all(nodes.read_text()))
    leaving = next(d for d in docs if d and d["metadata"]["name"] == "team-a-cp-3")
    leaving["metadata"]["name"] = "team-a-cp-4"
    nodes.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    plan = world.plan().stdout
    assert "- remove etcd member: Node team-a-cp-3 is no longer a controlplane node of team-a" in plan, plan
    assert "+ add etcd member: new controlplane node joins etcd, as a learner" in plan, plan

    def killed_after_the_add_then_again() -> str:
        world.apply_killed_when(lambda line: "add etcd member" in line and "done" in line)
        assert LocalDirStore(world.state).load().clusters["team-a"].etcd_learners == ["team-a-cp-4"]
        again = world.plan().stdout
        assert "a learner added by an earlier run: it votes once it has caught up" in again, again
        return world.apply_stamped()

    applied = under_probe(world, "team-a", "replace", killed_after_the_add_then_again)
    assert_complete(applied)
    assert LocalDirStore(world.state).load().clusters["team-a"].etcd_learners == []
    assert etcd_members(world, "team-a") == ["team-a-cp-1", "team-a-cp-2", "team-a-cp-4"]
    listed = etcdctl(world, "team-a", "member", "list").stdout
    assert [line.split(", ")[-1] for line in listed.splitlines()] == ["false"] * 3, listed  # no learner
    pods = world.sandboxes()
    assert "team-a-cp-3" not in pods and len(pods["team-a-cp-4"]) == 1


def _api_status(host: str, port: int, context: ssl.SSLContext, path: str) -> int | str:
    """One GET on a fresh TLS connection: the status, or the error's type and text."""
    try:
        conn = http.client.HTTPSConnection(host, port, context=context, timeout=5)
        conn.request("GET", path)
        status = conn.getresponse().status
        conn.close()
        return status
    except (OSError, http.client.HTTPException) as err:
        return f"{type(err).__name__}: {err}"


def test_a_ca_rotation_runs_its_three_phases_and_the_api_stays_up(world):
    """issue #13 (d): caGeneration raised on a live cluster: trust both, re-issue, drop old, one phase per apply,
    while a probe through the ingress never finds the API away; during the overlap the old admin kubeconfig and
    the re-issued one both work (the probe switches to the new one once gitops publishes it); afterwards the old
    one is refused, data written before is readable and the plan is empty. Leaves team-a at generation 2."""
    wait_ready(world, "team-a")
    kubectl(world, "team-a", "-n", "default", "create", "configmap", "before-ca-rotation", "--from-literal=k=v")
    host, port, old = admin_tls(world, "team-a")
    old_kubeconfig = world.dir / "team-a-generation-1.kubeconfig"
    shutil.copy(kubeconfig_file(world, "team-a"), old_kubeconfig)
    path = world.repo / "clusters/team-a/cluster.yaml"
    path.write_text(path.read_text().replace("caGeneration: 1", "caGeneration: 2"))
    read = "/api/v1/namespaces/default/configmaps/before-ca-rotation"
    members = etcd_members(world, "team-a")
    probe = start_probe(world, "team-a")
    phases: list[int] = []
    overlap: dict[str, int | str] = {}
    outputs = []
    try:
        for _ in range(8):
            plan = world.plan("--detailed-exitcode", check=False)
            if plan.returncode == 0:
                break
            assert plan.returncode == 2, plan.stdout + plan.stderr
            phase = next((int(line.split(", phase ")[1][0]) for line in plan.stdout.splitlines()
                          if "CA rotation 1 -> 2, phase " in line), 0)
            changes = [line.strip() for line in plan.stdout.splitlines() if line.strip().startswith(("+", "~", "-"))]
            assert phase or all(c in LEASE_EXITS for c in changes), plan.stdout
            if phase and (not phases or phases[-1] != phase):
                phases.append(phase)
            started = time.monotonic()
            outputs.append(world.apply().stdout)
            seen = probe.counts()
            print(f"CA rotation phase {phase or phases[-1]}: apply {time.monotonic() - started:.1f}s, probe so far "
                  f"{seen.requests} requests, {seen.failures} failed, {seen.outages} outages")
            assert "Apply complete: " in outputs[-1] and "exactly as planned" in outputs[-1], outputs[-1]
            if phases == [1, 2] and not overlap:
                # re-issued: gitops publishes a new admin kubeconfig (new client certificate, both CAs)
                _, _, new = admin_tls(world, "team-a")
                overlap = {"old": _api_status(host, port, old, read), "new": _api_status(host, port, new, read)}
                probe.use_kubeconfig(kubeconfig_file(world, "team-a").read_text())
    finally:
        counts = probe.stop()
    assert phases == [1, 2, 3], (phases, outputs)
    assert overlap == {"old": 200, "new": 200}, overlap
    assert "one per apply" in outputs[0] and "phase 1 of 3 runs now: trust both" in outputs[0], outputs[0]
    assert counts.requests > 50
    print(f"CA rotation probe: {counts.requests} requests, {counts.failures} failed, {counts.outages} outages",
          *counts.errors, sep="\n  ")
    assert (counts.failures, counts.outages) == (0, 0), (counts.errors, outputs)
    # afterwards: the old admin kubeconfig is refused (its client certificate and CA are gone), the new works
    refused = subprocess.run([str(kubebin.kubectl()), "--kubeconfig", str(old_kubeconfig), "--request-timeout=10s",
                              "get", "--raw", "/readyz"], capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0, refused.stdout
    _, _, new_only = admin_tls(world, "team-a", with_credentials=False)
    old_cert = world.dir / "gen1-admin"
    old_cert.mkdir(exist_ok=True)
    kube = yaml.safe_load(old_kubeconfig.read_text())["users"][0]["user"]
    (old_cert / "crt").write_bytes(base64.b64decode(kube["client-certificate-data"]))
    (old_cert / "key").write_bytes(base64.b64decode(kube["client-key-data"]))
    new_only.load_cert_chain(str(old_cert / "crt"), str(old_cert / "key"))
    assert _api_status(host, port, new_only, read) == 401  # the old client certificate, the server trusted
    assert kubectl(world, "team-a", "-n", "default", "get", "configmap", "before-ca-rotation", "-o",
                   "jsonpath={.data.k}").stdout == "v"
    state = LocalDirStore(world.state).load().clusters["team-a"]
    assert state.ca_generation == 2 and state.rotation is None
    assert authority(state.authorities, "cluster").cert.subject.rfc4514_string() == "CN=team-a-kubernetes-ca-2"
    assert etcd_members(world, "team-a") == members
    assert_converged(world)
