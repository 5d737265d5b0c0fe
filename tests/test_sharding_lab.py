"""Three `gitops watch` replicas sharding two real control planes (run under flock /tmp/gitops-lab.lock).

Real: the management cluster (kube-apiserver + etcd from tests/kubeapi.py) holding
the Leases, the lab's containerd hypervisors on 127.0.30.x, the two example clusters'
etcd, kube-apiserver, controller-manager, scheduler and haproxy ingress, git, and the
replicas as separate processes. One replica is SIGKILLed in the middle of an apply;
the API server is frozen (SIGSTOP) while a replica applies. Short Leases: 4 s / 3 s / 1 s.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import require_root, running_lab

from gitops.coordination.shards import shard_lease, shard_of
from gitops.engine import make_plan, observe_all
from gitops.model.validate import validate_repo
from gitops.plan.render import render_markdown
from gitops.status.branch import StatusBranch
from gitops.status.sealed_state import ControllerStateStore, Sealer
from tests.kubeapi import kube_api_server
from signing import shared_status_key

pytestmark = pytest.mark.lab("faults")

GITOPS = str(Path(sys.executable).parent / "gitops")
GIT_ID = ["-c", "user.name=Infra Team", "-c", "user.email=infra@example.com"]
SUBNET, API_IP = "127.0.30", "127.0.36.250"  # the API server apart: lab up refuses a busy subnet
SHARDS, CLUSTERS, REPLICAS = 4, ("team-a", "team-b"), ("r1", "r2", "r3")
LEASE, RENEW, RETRY, POLL = 4, 3, 1, 2
NODES = """\
apiVersion: gitops.infra/v1alpha1
kind: Node
metadata: {{name: {c}-cp-1}}
spec: {{cluster: {c}, role: controlplane}}
---
apiVersion: gitops.infra/v1alpha1
kind: Node
metadata: {{name: {c}-ingress}}
spec: {{cluster: {c}, role: controlplane-ingress, hypervisor: hv-public-1}}
"""


def git(cwd: Path, *args: str) -> str:
    proc = subprocess.run(["git", *GIT_ID, *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"git {' '.join(args)}: {proc.stderr}"
    return proc.stdout.strip()


def lease_of(cluster: str) -> str:
    return shard_lease(shard_of(cluster, SHARDS), SHARDS)


class Replicas:
    def __init__(self, base: Path, origin: Path, kubeconfig: Path):
        self.base, self.origin, self.kubeconfig = base, origin, kubeconfig
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str) -> None:
        with open(self.log_path(name), "ab") as out:
            self.procs[name] = subprocess.Popen(
                [GITOPS, "watch", "--repo", str(self.origin), "--workdir", str(self.base / name),
                 "--insecure-plaintext-secrets", "--interval", f"{POLL}s", "--metrics-address", "",
                 "--coordination-kubeconfig", str(self.kubeconfig), "--replica-id", name,
                 "--status-signing-key", str(shared_status_key(self.base))],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def log_path(self, name: str) -> Path:
        return self.base / f"{name}.log"

    def events(self, name: str) -> list[dict]:
        out = []
        for line in self.log_path(name).read_text(errors="replace").splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and "time" in event:
                event["t"] = dt.datetime.strptime(event["time"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(
                    tzinfo=dt.timezone.utc).timestamp()
                out.append(event)
        return out

    def actions(self, name: str) -> list[dict]:
        return [e for e in self.events(name) if e["msg"].startswith("action ") and "cluster" in e]

    def tails(self) -> str:
        return "\n".join(f"--- {n}\n" + "\n".join(self.log_path(n).read_text(errors="replace").splitlines()[-12:])
                         for n in self.procs)

    def wait(self, what: str, check, timeout: float):
        deadline = time.monotonic() + timeout
        while True:
            found = check()
            if found:
                return found
            if time.monotonic() > deadline:
                raise AssertionError(f"not {what} after {timeout:.0f}s\n{self.tails()}")
            time.sleep(0.1)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


def api_server_pid(ip: str) -> int:
    """The kube-apiserver this test module started (tests/kubeapi.py), found by its bind address."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv and argv[0].endswith(b"kube-apiserver") and f"--bind-address={ip}".encode() in argv:
                return int(entry.name)
    raise AssertionError(f"no kube-apiserver bound to {ip}")


def recorded_state(base: Path, origin: Path):
    """The state the replicas share on the status branch."""
    status = StatusBranch(str(origin), base / "check")
    status.sync()
    store = ControllerStateStore(Sealer(None, insecure_plaintext=True), base / "check-cache")
    store.restore(status.read, use_cache=False)
    return store.load()


def live_plan(base: Path, origin: Path, work: Path):
    """`gitops plan` of the repo against the live lab, with the state the replicas share on the branch."""
    state = recorded_state(base, origin)
    validation = validate_repo(work)
    model, config = validation.model, validation.repo.config
    return make_plan(model, config, state.copy(), observe_all(model, config, state)).plan


@pytest.fixture(scope="module")
def world():
    require_root()
    with kube_api_server(API_IP) as api:
        api.ensure_namespace("gitops")
        with running_lab("gitops-shards-", hypervisors=3, public=1, subnet=SUBNET) as (base, _):
            work, origin = base / "work", base / "origin.git"
            subprocess.run([GITOPS, "lab", "example-repo", "--ingress-nodes", "1", "--dir", str(base / "lab"), str(work)], check=True,
                           capture_output=True)
            shutil.rmtree(work / "sip")
            shutil.rmtree(work / "inventory")
            for cluster in CLUSTERS:
                (work / "clusters" / cluster / "nodes.yaml").write_text(NODES.format(c=cluster))
            config = yaml.safe_load((work / "gitops.yaml").read_text())
            config["spec"]["paths"] = ["hypervisors", "clusters"]
            config["spec"]["coordination"] = {"mode": "shards", "shards": SHARDS, "namespace": "gitops",
                                              "leaseDurationSeconds": LEASE, "renewDeadlineSeconds": RENEW,
                                              "retryPeriodSeconds": RETRY}
            (work / "gitops.yaml").write_text(yaml.safe_dump(config))
            subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(origin)], check=True)
            git(work, "init", "-q", "-b", "main")
            git(work, "remote", "add", "origin", str(origin))
            git(work, "add", "-A")
            git(work, "commit", "-q", "-m", "two clusters, sharded")
            git(work, "push", "-q", "origin", "HEAD:main")
            replicas = Replicas(base, origin, api.admin_kubeconfig)
            try:
                yield base, origin, work, replicas
            finally:
                replicas.stop()  # the controllers first, then the lab


def test_kill_takeover_cut_off_and_convergence(world):
    base, origin, work, replicas = world
    for name in REPLICAS:
        replicas.start(name)

    # 1. kill -9 the replica applying a cluster, in the middle of its apply (after 2 actions done)
    def applying():
        for name in REPLICAS:
            done = [e for e in replicas.actions(name) if e["msg"] == "action done"]
            for cluster in CLUSTERS:
                if sum(1 for e in done if e["cluster"] == cluster) >= 2:
                    return name, cluster
        return None

    victim, cluster = replicas.wait("applying", applying, 240)
    os.killpg(replicas.procs[victim].pid, signal.SIGKILL)
    killed_at = time.time()
    replicas.procs[victim].wait(timeout=10)
    survivors = [n for n in REPLICAS if n != victim]

    # 2. another replica takes the shard within lease duration + one poll
    def taken():
        for name in survivors:
            for e in replicas.events(name):
                if e["msg"] == "lease acquired" and e.get("lease") == lease_of(cluster) and e["t"] > killed_at:
                    return name, e["t"]
        return None

    heir, taken_at = replicas.wait("taken over", taken, LEASE + POLL + 20)
    takeover = taken_at - killed_at
    assert takeover <= LEASE + POLL + RETRY + 1, takeover  # +1: log and tick granularity on a loaded host

    # 3. the management API freezes while the heir applies: nobody starts an action after renewDeadline
    replicas.wait("the heir applying", lambda: any(e["t"] > taken_at and e["msg"] == "action start"
                                                   and e["cluster"] == cluster for e in replicas.actions(heir)), 120)
    pid = api_server_pid(API_IP)
    os.kill(pid, signal.SIGSTOP)
    stopped_at = time.time()
    try:
        time.sleep(RENEW + 3)
    finally:
        os.kill(pid, signal.SIGCONT)
    resumed_at = time.time()
    late = [(n, e["time"], e["subject"]) for n in survivors for e in replicas.actions(n)
            if e["msg"] == "action start" and stopped_at + RENEW + 0.5 < e["t"] < resumed_at]
    assert not late, late
    lost = [e for n in survivors for e in replicas.events(n) if e["msg"] == "lease lost"
            and e["why"] == f"not renewed within {RENEW}s" and stopped_at < e["t"] < resumed_at + 1]
    assert lost, replicas.tails()
    # noticed at the end of the first renewal round past the deadline (each round waits out a request timeout)
    assert min(e["t"] for e in lost) <= stopped_at + RENEW + 4

    # 4. the clusters converge: the plan against the live lab is empty
    def converged():
        plan = live_plan(base, origin, work)
        return plan.empty and plan.complete

    try:
        replicas.wait("converged", converged, 300)
    except AssertionError:
        raise AssertionError(render_markdown(live_plan(base, origin, work)) + "\n" + replicas.tails()) from None

    # replicas place nodes concurrently on shared hypervisors: no host port is ever given twice
    taken: dict[tuple[str, int], str] = {}
    for node, record in sorted(recorded_state(base, origin).nodes.items()):
        for port in record.ports.values():
            other = taken.setdefault((record.hypervisor, port), node)
            assert other == node, f"{node} and {other} both hold port {port} on {record.hypervisor}"
    raced = sum(1 for n in REPLICAS for e in replicas.events(n) if e["msg"] == "placement raced another replica")

    # 5. no action ran on one cluster from two replicas at once (from each replica's action log)
    spans: dict[str, list[tuple[float, float, str, str]]] = {c: [] for c in CLUSTERS}
    for name in REPLICAS:
        started: dict[str, dict] = {}
        for e in replicas.actions(name):
            if e["msg"] == "action start":
                started[e["cluster"]] = e
            elif e["cluster"] in started:
                begin = started.pop(e["cluster"])
                spans[e["cluster"]].append((begin["t"], e["t"], name, begin["subject"]))
        for c, begin in started.items():  # the victim's action in flight ends with the kill
            spans[c].append((begin["t"], killed_at if name == victim else time.time(), name, begin["subject"]))
    for c, rows in spans.items():
        reach = (0.0, "", "")  # the latest end so far, whose, which action
        for start, end, name, subject in sorted(rows):
            assert name == reach[1] or start >= reach[0], \
                f"{c}: {reach[1]} {reach[2]} until {reach[0]} overlaps {name} {subject} from {start}"
            if end > reach[0]:
                reach = (end, name, subject)
    assert {n for rows in spans.values() for _, _, n, _ in rows} >= {victim, heir}

    # 6. every status commit of every replica (the victim's too) is on the branch
    tip = git(base, "--git-dir", str(origin), "rev-parse", "gitops/status")
    committed = [(n, e["sha"]) for n in REPLICAS for e in replicas.events(n) if e["msg"] == "status committed"]
    assert {n for n, _ in committed} >= {victim, heir}
    for name, sha in committed:
        proc = subprocess.run(["git", "--git-dir", str(origin), "merge-base", "--is-ancestor", sha, tip])
        assert proc.returncode == 0, f"{name}'s status commit {sha} is not on gitops/status"
    print(f"\ntakeover {takeover:.1f}s (lease {LEASE}s, poll {POLL}s); victim {victim} on {cluster}, heir {heir}; "
          f"fenced within {min(e['t'] for e in lost) - stopped_at:.1f}s of the API freezing; "
          f"{len(committed)} status commits; {raced} placement race(s) refused before any action")
