"""The GitOps loop end to end: a real bare git repo, `gitops reconcile`/`watch`, a real lab.

Real: git (bare origin, pushes, ssh commit signatures), containerd, etcd, haproxy,
the standard `age` tool decrypting the kubeconfig artifact, the real kube-apiserver,
controller-manager and scheduler behind the haproxy ingress, and the `gitops`
command. The tests share one lab and one origin; each first brings about what it builds on
(`Loop.converged`, `Loop.with_cluster`), so any one runs alone (`pytest -k NAME`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from conftest import running_lab

from gitops.lab import kubebin
from gitops.apply.waves import PROBE_EVERY
from gitops.cri.client import CRIClient
from gitops.lab.probe import admin_tls
from gitops.pods import MANAGED, MANAGER, NODE

pytestmark = pytest.mark.lab("workers")

GITOPS = str(Path(sys.executable).parent / "gitops")
GIT_ID = ["-c", "user.name=Infra Team", "-c", "user.email=infra@example.com"]


@dataclasses.dataclass
class Loop:
    base: Path
    origin: Path
    work: Path
    lab: object
    user_key: Path
    controller_key: Path

    @property
    def example_team_b(self) -> Path:
        """The example's team-b as `gitops lab example-repo --ingress-nodes 1` wrote it for this lab."""
        return self.base / "example-team-b"

    @property
    def workdir(self) -> Path:
        return self.base / "controller"

    def git(self, *args: str, cwd: Path | None = None, check_ok: bool = False) -> str:
        """`check_ok`: exit code 1 with no output is fine (git grep finding nothing)."""
        proc = subprocess.run(["git", *GIT_ID, *args], cwd=cwd or self.work, capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 0 or (check_ok and proc.returncode == 1 and not proc.stderr), \
            f"git {' '.join(args)}: {proc.stderr}"
        return proc.stdout.strip()

    def push(self, message: str, *extra: str) -> str:
        self.git("add", "-A")
        self.git("commit", "-q", *extra, "-m", message)
        self.git("push", "-q", "origin", "HEAD:main")
        return self.git("rev-parse", "HEAD")

    def reconcile(self, *extra: str, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run([GITOPS, "reconcile", "--repo", str(self.origin), "--workdir", str(self.workdir),
                               "--identity", str(self.controller_key), *extra],
                              capture_output=True, text=True, timeout=300)
        if check:
            assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc

    def reconcile_killed(self, when: Callable[[str], bool], after: float = 0.0) -> None:
        """`gitops reconcile`, SIGKILLed `after` seconds once it logs a line `when` takes."""
        proc = subprocess.Popen([GITOPS, "reconcile", "--repo", str(self.origin), "--workdir", str(self.workdir),
                                 "--identity", str(self.controller_key)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        assert proc.stderr is not None
        for line in proc.stderr:
            if when(line):
                time.sleep(after)
                proc.send_signal(signal.SIGKILL)
                break
        proc.wait(timeout=60)
        assert proc.returncode == -signal.SIGKILL

    def converged(self) -> None:
        """Whatever is pushed is applied and reported (a no-op poll when it already is)."""
        self.reconcile()

    def with_cluster(self, name: str) -> None:
        """Cluster `name` (team-b: the example repo's; team-c: team-a's copy) is pushed and applied."""
        target = self.work / "clusters" / name
        if not target.exists():
            if name == "team-b":
                shutil.copytree(self.example_team_b, target)
            else:
                shutil.copytree(self.work / "clusters/team-a", target)
                for path in target.iterdir():
                    path.write_text(path.read_text().replace("team-a", name))
            self.push(f"add {name}")
        self.converged()

    def status_file(self, rel: str) -> str:
        return self.git("--git-dir", str(self.origin), "show", f"gitops/status:{rel}", cwd=self.base)

    def status_log(self) -> list[str]:
        out = self.git("--git-dir", str(self.origin), "log", "--format=%s", "gitops/status", cwd=self.base)
        return out.splitlines()

    def source(self) -> dict:
        return yaml.safe_load(self.status_file("status/source.yaml"))["status"]

    def sandboxes(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for hv in self.lab.hypervisors:
            with CRIClient(hv.local().cri_endpoint()) as client:
                for s in client.list_sandboxes({MANAGED: MANAGER}):
                    out.setdefault(s.labels[NODE], []).append(s.id)
        return out

    def containers(self) -> list[tuple[str, int]]:
        out = []
        for hv in self.lab.hypervisors:
            with CRIClient(hv.local().cri_endpoint()) as client:
                out += [(c.id, c.created_at) for c in client.list_containers({MANAGED: MANAGER})]
        return sorted(out)


def keygen(path: Path) -> str:
    proc = subprocess.run(["age-keygen", "-o", str(path)], capture_output=True, text=True, check=True)
    return proc.stderr.split("Public key:")[1].strip()


@pytest.fixture(scope="module")
def loop():
    with running_lab("gitops-loop-", hypervisors=3, public=1, remote=True, subnet="127.0.24") as (base, lab):
        work = base / "work"
        user_key, controller_key = base / "user.key", base / "controller.key"
        recipient = keygen(user_key)
        # the hypervisors' mTLS client keys go to git encrypted to the controller's identity
        subprocess.run([GITOPS, "lab", "example-repo", "--ingress-nodes", "1", "--dir", str(base / "lab"), str(work),
                        "--encrypt-to", keygen(controller_key)], check=True, capture_output=True)
        config = work / "gitops.yaml"
        text = config.read_text()
        start = text.index("  kubeconfigRecipients:")
        end = text.index("  prune:")
        config.write_text(text[:start] + f"  kubeconfigRecipients:\n    - {recipient}\n" + text[end:])
        # added by a later commit: as `lab example-repo` wrote it (one ingress node, on the lab's one public machine)
        shutil.move(work / "clusters" / "team-b", base / "example-team-b")
        origin = base / "origin.git"
        subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(origin)], check=True)
        world = Loop(base, origin, work, lab, user_key, controller_key)
        world.git("init", "-q", "-b", "main")
        world.git("remote", "add", "origin", str(origin))
        world.push("team-a only")
        (base / "team-b").mkdir()
        yield world


def decrypt_kubeconfig(loop: Loop, cluster: str) -> dict:
    armored = loop.status_file(f"kubeconfig/{cluster}.yaml")
    assert armored.startswith("-----BEGIN AGE ENCRYPTED FILE-----")
    proc = subprocess.run(["age", "-d", "-i", str(loop.user_key)], input=armored.encode(), capture_output=True)
    assert proc.returncode == 0, proc.stderr
    return yaml.safe_load(proc.stdout)


def get_version(loop: Loop, kubeconfig: dict) -> bytes:
    host, port, context = admin_tls(yaml.safe_dump(kubeconfig))
    deadline = time.monotonic() + 120  # a real API server starting, then passing the ingress's /readyz check
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPSConnection(host, int(port), context=context, timeout=5)
            conn.request("GET", "/version")
            response = conn.getresponse()
            if response.status == 200:
                return response.read()
        except (OSError, http.client.HTTPException):
            pass
        time.sleep(0.5)
    raise AssertionError("the API did not answer through the ingress")


def test_first_commit_is_applied_and_reported(loop):
    result = loop.reconcile()
    assert result.stdout.startswith("Applied: ")
    sha = loop.git("rev-parse", "HEAD")
    assert loop.source()["appliedSHA"] == sha
    cluster = yaml.safe_load(loop.status_file("status/Cluster/team-a.yaml"))["status"]
    assert cluster["phase"] == "Ready" and cluster["observedSourceSHA"] == sha
    assert sorted(loop.sandboxes()) == ["team-a-cp-1", "team-a-cp-2", "team-a-cp-3", "team-a-ingress",
                                        "tenant-1-jump", "tenant-1-lb"]
    sip = yaml.safe_load(loop.status_file("status/SIPCluster/tenant-1.yaml"))["status"]
    assert sip["phase"] == "Ready"
    assert sip["hosts"]["ControlPlane"] == {"active": ["metal3/r01-node-01"], "standby": ["metal3/r02-node-01"]}
    labels = json.loads(loop.status_file("state/public.json"))["sip_labels"]  # the file provider's labels
    assert labels["metal3/r01-node-01"]["sip.airshipit.org/cluster-name"] == "tenant-1"
    # the plan the controller executed, action by action: all done, in one pass, nothing left over
    record = yaml.safe_load(loop.status_file("status/apply.yaml"))["status"]
    assert record["sha"] == sha and record["result"] == "Applied"
    assert record["summary"]["executed"] == record["summary"]["planned"] == len(record["actions"]) > 20
    assert [a["index"] for a in record["actions"]] == list(range(1, len(record["actions"]) + 1))
    assert {a["result"] for a in record["actions"]} == {"Done"}
    assert any(a["kind"] == "label-host" and a["subject"] == "tenant-1/metal3/r01-node-01"
               for a in record["actions"])
    assert "followUp" not in record, record.get("followUp")
    assert f'"actions": {record["summary"]["executed"]}' in result.stderr
    # the controller's private keys are sealed: nothing PEM-private in the clear on the branch
    files = loop.git("--git-dir", str(loop.origin), "ls-tree", "-r", "--name-only", "gitops/status", cwd=loop.base)
    for rel in files.splitlines():
        assert "PRIVATE KEY" not in loop.status_file(rel), rel


def test_pushing_a_cluster_gets_it_ready_with_an_encrypted_kubeconfig(loop):
    shutil.copytree(loop.example_team_b, loop.work / "clusters/team-b")
    sha = loop.push("add team-b")
    loop.reconcile()
    cluster = yaml.safe_load(loop.status_file("status/Cluster/team-b.yaml"))["status"]
    assert cluster["phase"] == "Ready", cluster
    assert cluster["observedSourceSHA"] == sha
    kubeconfig = decrypt_kubeconfig(loop, "team-b")
    assert kubeconfig["clusters"][0]["cluster"]["server"] == cluster["endpoints"]["api"]
    assert json.loads(get_version(loop, kubeconfig))["gitVersion"] == kubebin.KUBERNETES_BUILT[-2]  # team-b's


def test_no_change_poll_makes_no_cri_write_and_no_commit(loop):
    loop.converged()
    commits, containers, sandboxes = loop.status_log(), loop.containers(), loop.sandboxes()
    result = loop.reconcile()
    assert '"actions": 0' in result.stderr and '"status_commit": ""' in result.stderr
    assert loop.status_log() == commits
    assert loop.containers() == containers and loop.sandboxes() == sandboxes


def test_bad_commit_is_refused_and_running_clusters_are_untouched(loop):
    loop.converged()
    before = loop.sandboxes()
    good = loop.source()["appliedSHA"]
    nodes = loop.work / "clusters/team-a/nodes.yaml"
    nodes.write_text(nodes.read_text().replace("role: controlplane\n", "role: controlplan\n", 1))
    bad = loop.push("typo")
    result = loop.reconcile(check=False)
    assert result.returncode == 1 and result.stdout.startswith("Refused: ")
    source = loop.source()
    assert source["result"] == "Refused" and source["lastSeenSHA"] == bad and source["appliedSHA"] == good
    assert any(e.startswith("clusters/team-a/nodes.yaml:10: Node/team-a-cp-1: spec.role: must be one of")
               for e in source["errors"]), source["errors"]
    assert loop.sandboxes() == before
    # the refusal's own commit, then (only if the live state moved since the last commit: an etcd leader
    # elected again on a loaded machine) the report of the commit in force, with nothing applied
    log = loop.status_log()
    assert log[0] == f"refuse {bad[:12]}: 1 error(s)" or (
        log[0] == f"refused {good[:12]}: 0 action(s)" and log[1] == f"refuse {bad[:12]}: 1 error(s)"), log[:3]
    nodes.write_text(nodes.read_text().replace("role: controlplan\n", "role: controlplane\n", 1))
    loop.push("fix the typo")
    loop.reconcile()
    assert loop.source()["result"] == "Applied"


def test_removing_a_node_is_applied_and_history_shows_each_outcome(loop):
    loop.with_cluster("team-b")
    applied = sum(s.startswith("applied ") for s in loop.status_log())
    nodes = loop.work / "clusters/team-a/nodes.yaml"
    nodes.write_text(nodes.read_text().replace("role: controlplane\n", "role: controlplan\n", 1))
    loop.push("typo")
    loop.reconcile(check=False)
    nodes.write_text(nodes.read_text().replace("role: controlplan\n", "role: controlplane\n", 1))
    docs = [d for d in yaml.safe_load_all((loop.work / "clusters/team-b/nodes.yaml").read_text())
            if d and d["metadata"]["name"] != "team-b-cp-3"]
    (loop.work / "clusters/team-b/nodes.yaml").write_text(yaml.safe_dump_all(docs, sort_keys=False))
    sha = loop.push("remove team-b-cp-3")
    loop.reconcile()
    assert "team-b-cp-3" not in loop.sandboxes()
    assert loop.status_log()[0].startswith(f"applied {sha[:12]}: ")
    history = loop.status_log()
    assert history[1].startswith("refuse ")  # the typo, refused, then its fix and the removal, applied
    assert sum(s.startswith("applied ") for s in history) == applied + 1


def test_killed_mid_reconcile_then_restarted_converges(loop):
    loop.converged()
    assert not (loop.work / "clusters/team-c").exists()
    shutil.copytree(loop.work / "clusters/team-a", loop.work / "clusters/team-c")
    for path in (loop.work / "clusters/team-c").iterdir():
        path.write_text(path.read_text().replace("team-a", "team-c"))
    sha = loop.push("add team-c")
    commits = loop.status_log()
    loop.reconcile_killed(lambda line: '"action done"' in line and "team-c-cp-2" in line and "create-pod" in line)
    assert loop.status_log() == commits  # killed before publishing anything
    loop.reconcile()
    pods = loop.sandboxes()
    assert all(len(ids) == 1 for ids in pods.values()), pods
    assert {"team-c-cp-1", "team-c-cp-2", "team-c-cp-3", "team-c-ingress"} <= set(pods)
    new = loop.status_log()[: len(loop.status_log()) - len(commits)]
    assert new == [next(s for s in new if s.startswith(f"applied {sha[:12]}"))]  # exactly one commit
    assert yaml.safe_load(loop.status_file("status/Cluster/team-c.yaml"))["status"]["phase"] == "Ready"


def test_pull_request_plan_against_the_status_branch(loop):
    loop.with_cluster("team-c")
    pr = loop.base / "pr"
    subprocess.run(["git", "clone", "-q", str(loop.origin), str(pr)], check=True)
    subprocess.run(["git", "fetch", "-q", "origin", "gitops/status:refs/remotes/origin/gitops/status"], cwd=pr,
                   check=True)
    # the PR checkout cannot reach any hypervisor: break every endpoint
    for path in (pr / "hypervisors").iterdir():
        text = path.read_text()
        path.write_text(text.replace("containerd.sock", "nowhere.sock").replace(":10250", ":1"))
    pinned = ["--status-signers", str(loop.workdir / "status-signing-key.pub")]  # the controller's own key
    unchanged = subprocess.run([GITOPS, "plan", str(pr), "--against-status", "origin/gitops/status", *pinned,
                                "--detailed-exitcode"], capture_output=True, text=True)
    assert unchanged.returncode == 0, unchanged.stdout + unchanged.stderr
    # the controller recorded each converged cluster: the cold plan compiles none of them (issue #31)
    recorded = subprocess.run(["git", "ls-tree", "--name-only", "origin/gitops/status:observed/converged"], cwd=pr,
                              capture_output=True, text=True, check=True).stdout.split()
    clusters = sorted(p.name for p in (pr / "clusters").iterdir())
    assert recorded == [f"{c}.json" for c in clusters], recorded
    assert f"{len(clusters)} cluster(s) not planned again" in unchanged.stdout, unchanged.stdout
    docs = [d for d in yaml.safe_load_all((pr / "clusters/team-c/nodes.yaml").read_text())
            if d and d["metadata"]["name"] != "team-c-cp-1"]
    (pr / "clusters/team-c/nodes.yaml").write_text(yaml.safe_dump_all(docs, sort_keys=False))
    changed = subprocess.run([GITOPS, "plan", str(pr), "--against-status", "origin/gitops/status", *pinned,
                              "--format", "markdown", "--detailed-exitcode"], capture_output=True, text=True)
    assert changed.returncode == 2, changed.stdout + changed.stderr
    assert "- team-c-cp-1 on " in changed.stdout and "remove pod: Node team-c-cp-1 left the repo" in changed.stdout
    assert f"{len(clusters) - 1} cluster(s) not planned again" in changed.stdout, changed.stdout
    status = subprocess.run([GITOPS, "status", "--repo", str(pr), "-o", "json", *pinned], capture_output=True,
                            text=True)
    data = json.loads(status.stdout)
    assert data["clusters"]["team-c"]["phase"] == "Ready"


def test_signed_commits_are_required_when_configured(loop):
    loop.converged()
    key = loop.base / "signing"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "infra", "-f", str(key)], check=True)
    signers = loop.base / "allowed_signers"
    signers.write_text(f"infra@example.com {(key.with_suffix('.pub')).read_text()}")
    (loop.work / "README.md").write_text("signed from now on\n")
    unsigned = loop.push("unsigned change")
    refused = loop.reconcile("--allowed-signers", str(signers), check=False)
    assert refused.returncode == 1
    # the commit in force was applied before signatures were required: it fails the policy too (issue #42.2),
    # so nothing is applied until a signed commit arrives
    in_force = loop.source()["appliedSHA"]
    assert loop.source()["errors"] == [f"commit {unsigned[:12]} is not signed",
                                       f"the commit in force {in_force[:12]} is not applied: commit "
                                       f"{in_force[:12]} is not signed"]
    (loop.work / "README.md").write_text("signed\n")
    signed = _signed_push(loop, key)
    loop.reconcile("--allowed-signers", str(signers))
    assert loop.source()["appliedSHA"] == signed


def _signed_push(loop: Loop, key: Path) -> str:
    loop.git("add", "-A")
    loop.git("-c", "gpg.format=ssh", "-c", f"user.signingkey={key}", "commit", "-q", "-S", "-m", "signed change")
    loop.git("push", "-q", "origin", "HEAD:main")
    return loop.git("rev-parse", "HEAD")


def start_watch(loop: Loop, *extra: str) -> tuple[subprocess.Popen, int]:
    """`gitops watch` polling every second, its /metrics and /healthz on a free loopback port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([GITOPS, "watch", "--repo", str(loop.origin), "--workdir", str(loop.workdir),
                             "--identity", str(loop.controller_key), "--interval", "1s",
                             "--metrics-address", f"127.0.0.1:{port}", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, port


def scrape_until(port: int, needle: str, timeout: float = 60) -> str:
    """/metrics once it holds `needle` (else as last read, after `timeout` seconds)."""
    deadline, metrics = time.monotonic() + timeout, ""
    while time.monotonic() < deadline and needle not in metrics:
        time.sleep(0.5)
        try:
            metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
        except OSError:
            continue
    return metrics


def test_watch_serves_health_and_metrics_and_stops_on_sigterm(loop):
    proc, port = start_watch(loop)
    try:
        metrics = scrape_until(port, 'gitops_reconcile_total{result="applied"}')
        assert 'gitops_reconcile_total{result="applied"}' in metrics
        assert "gitops_reconcile_duration_seconds_bucket" in metrics
        health = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2).read())
        assert health["ok"] is True
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-2000:]
    assert "finishing the current action" in err and "controller stopped" in err


def test_watch_reconciles_a_local_working_copy_as_soon_as_a_commit_lands(loop):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    def reconciles() -> float:
        try:
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
        except OSError:
            return 0.0
        return sum(float(line.split()[-1]) for line in text.splitlines()
                   if line.startswith("gitops_reconcile_total{"))

    proc = subprocess.Popen([GITOPS, "watch", "--repo", str(loop.work), "--workdir", str(loop.workdir),
                             "--identity", str(loop.controller_key), "--interval", "10m",
                             "--metrics-address", f"127.0.0.1:{port}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    counts = []
    try:
        deadline = time.monotonic() + 60
        while reconciles() < 1 and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(3)  # settled: the watch reacts to nothing of its own (status commits, its lease)
        counts.append(reconciles())
        (loop.work / "README.md").write_text("edited locally\n")
        loop.git("add", "README.md")  # (tracked already when an earlier test committed one)
        loop.git("commit", "-qm", "local edit")  # no push: the working copy itself is the source
        deadline = time.monotonic() + 30  # far sooner than the 10 minute interval
        while reconciles() < counts[0] + 1 and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(3)
        counts.append(reconciles())
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert counts == [1, 2], (counts, err[-4000:])
    assert "local commit detected" in err


def test_no_decrypted_private_key_leaves_memory(loop):
    """The lab's mTLS client key is in git only age-encrypted; after the controller applied with it,
    neither the key nor any `PRIVATE KEY` block is on the status branch, in the controller's
    workdir (outside its git objects), in its output, or in the plan a user sees."""
    key = (loop.lab.dir / "pki" / "client.key").read_text()
    marker = key.splitlines()[1]  # the first line of the key's base64
    committed = loop.git("grep", "-l", "PRIVATE KEY", check_ok=True)
    assert committed == "", committed
    assert "BEGIN AGE ENCRYPTED FILE" in (loop.work / "hypervisors" / "hv-private-2.yaml").read_text()
    outputs = [loop.reconcile().stdout + loop.reconcile().stderr]
    plan = subprocess.run([GITOPS, "plan", str(loop.work), "--state-dir", str(loop.base / "plan-state"),
                           "--identity", str(loop.controller_key), "-o", "json"],
                          capture_output=True, text=True, timeout=300)
    outputs.append(plan.stdout + plan.stderr)
    files = loop.git("--git-dir", str(loop.origin), "ls-tree", "-r", "--name-only", "gitops/status", cwd=loop.base)
    branch = [loop.status_file(rel) for rel in files.splitlines()]
    workdir = [p.read_text(errors="replace") for p in loop.workdir.rglob("*")
               if p.is_file() and ".git" not in p.relative_to(loop.workdir).parts]
    for text in outputs + branch:
        assert "PRIVATE KEY" not in text and marker not in text
    for text in workdir:
        assert marker not in text  # (the controller's own state holds the clusters' CA keys, by design)
    shutil.rmtree(loop.base / "plan-state", ignore_errors=True)
    # without the identity, nothing is observed or applied, and the field is named
    refused = subprocess.run([GITOPS, "plan", str(loop.work), "--state-dir", str(loop.base / "plan-state")],
                             capture_output=True, text=True, timeout=120, env={**os.environ, "GITOPS_IDENTITY": ""})
    assert refused.returncode == 1
    assert "hypervisors/hv-private-2.yaml:" in refused.stderr and "no identity to decrypt it" in refused.stderr
    shutil.rmtree(loop.base / "plan-state", ignore_errors=True)


def test_the_controller_backs_up_etcd_on_schedule_and_reports_it(loop):
    """Issue #29.1 on the real team-a: a Cluster opting in to spec.backup gets a snapshot from
    the controller (restic, a local target, the password age-encrypted to the controller), recorded on
    the status branch, shown by `gitops status`, listed by `gitops backup list`; a poll inside the
    interval takes none; `gitops backup create` with the pulled state takes one now. (Its /metrics
    gauges: tests/test_backup.py.)"""
    from gitops.secrets import encrypt
    loop.reconcile()  # team-a in force, whatever ran before
    controller_recipient = subprocess.run(["age-keygen", "-y", str(loop.controller_key)], capture_output=True,
                                          text=True, check=True).stdout.strip()
    password = encrypt(b"lab backup password", [controller_recipient])
    target = loop.base / "backups"
    config = loop.work / "gitops.yaml"
    config.write_text(config.read_text() + "  backup:\n    targets:\n      - name: local\n"
                      f"        repository: {target}\n        password: |\n"
                      + "".join(f"          {ln}\n" for ln in password.splitlines()))
    cluster = loop.work / "clusters" / "team-a" / "cluster.yaml"
    first, sep, rest = cluster.read_text().partition("\n---")
    cluster.write_text(first.rstrip("\n") + "\n  backup:\n    target: local\n    intervalMinutes: 60\n    keep: 2"
                       + sep + rest)
    loop.push("team-a: etcd backups")
    loop.reconcile()
    doc = yaml.safe_load(loop.status_file("backups/team-a.yaml"))
    last = doc["status"]["lastSnapshot"]
    assert doc["status"]["conditions"][0]["type"] == "BackedUp" and doc["status"]["conditions"][0]["status"] == "True"
    assert last["target"] == "local" and last["revision"] > 0 and last["bytes"] > 0
    assert last["member"].startswith("team-a-cp-")
    assert loop.status_log()[0] == "backup: 1 snapshot(s)"
    loop.reconcile()  # inside the interval: no snapshot, no commit
    assert yaml.safe_load(loop.status_file("backups/team-a.yaml"))["status"]["lastSnapshot"] == last
    pinned = ["--status-signers", str(loop.workdir / "status-signing-key.pub")]  # the controller's own key
    status = subprocess.run([GITOPS, "status", "--repo", str(loop.origin), "--ref", "gitops/status", *pinned],
                            capture_output=True, text=True, timeout=60)
    assert status.returncode == 0, status.stderr
    assert "LAST BACKUP" in status.stdout and last["id"][:8] in status.stdout, status.stdout
    state_dir = loop.base / "pulled-state"
    try:
        subprocess.run([GITOPS, "state", "pull", "--repo", str(loop.origin), "--state-dir", str(state_dir),
                        "--identity", str(loop.controller_key), *pinned], check=True, capture_output=True, timeout=120)
        made = subprocess.run([GITOPS, "backup", "create", str(loop.work), "--cluster", "team-a",
                               "--state-dir", str(state_dir), "--identity", str(loop.controller_key)],
                              capture_output=True, text=True, timeout=300)
        assert made.returncode == 0, made.stderr
        listed = subprocess.run([GITOPS, "backup", "list", str(loop.work), "--cluster", "team-a", "--json",
                                 "--identity", str(loop.controller_key)], capture_output=True, text=True, timeout=120)
        assert listed.returncode == 0, listed.stderr
        assert [s["id"] for s in json.loads(listed.stdout)] == [last["id"], made.stdout.strip()]
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)


def test_the_ui_in_chromium_shows_the_fleet_a_cluster_the_applies_and_a_branch_plan(loop):
    """Issue #30: `gitops watch --ui` beside /metrics, driven in Debian's headless Chromium: the fleet lists
    team-a and team-b Ready, team-a's page shows its 3 etcd members, the applies page leads to the last
    apply's actions, and the plan page shows a change made on a branch. Screenshots of the fleet and a
    cluster page go to $GITOPS_UI_SCREENSHOTS when set (docs/assets/ holds the site's)."""
    from browser import chromium
    from selenium.webdriver.common.by import By

    loop.with_cluster("team-b")
    # a pull request's branch, made in a clone of its own: team-b without its last controlplane node
    pr = loop.base / "ui-pr"
    shutil.rmtree(pr, ignore_errors=True)
    loop.git("clone", "-q", str(loop.origin), str(pr), cwd=loop.base)
    nodes = pr / "clusters/team-b/nodes.yaml"
    docs = [d for d in yaml.safe_load_all(nodes.read_text()) if d]
    victim = max(d["metadata"]["name"] for d in docs if d["spec"]["role"] == "controlplane")
    nodes.write_text(yaml.safe_dump_all([d for d in docs if d["metadata"]["name"] != victim], sort_keys=False))
    loop.git("commit", "-q", "-am", f"team-b: without {victim}", cwd=pr)
    loop.git("push", "-q", "-f", "origin", "HEAD:ui-drop-node", cwd=pr)
    shots = Path(os.environ.get("GITOPS_UI_SCREENSHOTS") or loop.base / "screenshots")
    shots.mkdir(parents=True, exist_ok=True)
    proc, port = start_watch(loop, "--ui")
    base = f"http://127.0.0.1:{port}"
    try:
        assert 'gitops_reconcile_total{result="applied"}' in scrape_until(port, 'result="applied"')
        with chromium() as driver:
            driver.get(base + "/")
            phases = {row.get_attribute("data-cluster"): row.find_element(By.CSS_SELECTOR, ".phase").text
                      for row in driver.find_elements(By.CSS_SELECTOR, "#clusters tbody tr")}
            assert phases.get("team-a") == "Ready" and phases.get("team-b") == "Ready", phases
            driver.save_screenshot(str(shots / "ui-fleet.png"))

            driver.find_element(By.LINK_TEXT, "team-a").click()
            assert driver.current_url == base + "/clusters/team-a"
            members = driver.find_element(By.ID, "etcd-members").text
            assert members.startswith("3:") and "(leader)" in members, members
            assert len(driver.find_elements(By.CSS_SELECTOR, "table.nodes td.running")) >= 12  # 3 nodes x 4
            driver.save_screenshot(str(shots / "ui-cluster.png"))

            driver.get(base + "/applies")
            rows = driver.find_elements(By.CSS_SELECTOR, "#applies tbody tr")
            done = [r for r in rows if r.get_attribute("data-kind") == "Applied"
                    and not r.find_element(By.CSS_SELECTOR, "td:nth-child(4)").text.startswith("0")]
            assert done, [r.text for r in rows]
            done[0].find_element(By.CSS_SELECTOR, "td:last-child a").click()
            results = [td.text for td in driver.find_elements(By.CSS_SELECTOR, "#actions tbody tr td:nth-child(5)")]
            assert results and set(results) == {"Done"}, results

            driver.get(base + "/plan")
            field = driver.find_element(By.NAME, "ref")
            field.send_keys("ui-drop-node")
            field.submit()
            headline = driver.find_element(By.ID, "headline").text
            assert headline.startswith("Plan: ") and "to remove" in headline, headline
            removed = [e.text for e in driver.find_elements(By.CSS_SELECTOR, "#plan .line.remove")]
            assert any(f"remove pod: Node {victim} left the repo" in t for t in removed), removed
            driver.save_screenshot(str(shots / "ui-plan.png"))
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-2000:]


def test_an_exited_scheduler_is_started_again_within_5_seconds_not_at_the_next_poll(loop):
    """issue #44.4: `gitops watch` polling every 10 minutes; team-a's kube-scheduler on one node is stopped as a
    lost Lease or a crash stops it; the exit watch sees it within a second and wakes the loop, whose plan
    recreates it: a new scheduler runs within 5 s. The exit is counted in /metrics."""
    from gitops.cri.types import ContainerState
    from gitops.pods import COMPONENT

    loop.converged()
    proc, port = start_watch(loop, "--interval", "10m", "--exit-watch", "1s")
    try:
        scrape_until(port, 'gitops_reconcile_total{result="applied"}')
        time.sleep(2)  # the first reconcile's status commit written: the loop waits now
        victim = None
        for hv in loop.lab.hypervisors:
            with CRIClient(hv.local().cri_endpoint()) as client:
                running = client.list_containers({MANAGED: MANAGER, COMPONENT: "kube-scheduler"},
                                                 state=ContainerState.RUNNING)
                if running:
                    victim = (hv, running[0])
                    break
        assert victim is not None
        hv, old = victim
        with CRIClient(hv.local().cri_endpoint()) as client:
            client.stop_container(old.id, timeout=0)
            stopped = time.monotonic()
            new = None
            while time.monotonic() - stopped < 30:
                new = [c for c in client.list_containers({MANAGED: MANAGER, COMPONENT: "kube-scheduler",
                                                          NODE: old.labels[NODE]}, state=ContainerState.RUNNING)
                       if c.id != old.id]
                if new:
                    break
                time.sleep(0.2)
            took = time.monotonic() - stopped
        print(f"exited kube-scheduler of {old.labels[NODE]} running again after {took:.1f} s")
        assert new, "not restarted within 30 s"
        assert took <= 5.0, took
        line = (f'gitops_component_exits_total{{cluster="team-a",component="kube-scheduler",'
                f'node="{old.labels[NODE]}"}} 1.0')
        assert line in scrape_until(port, line)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    assert "waking the loop: a component exited" in err, err[-3000:]


# ---------------------------------------------------------------------------------- rollouts in waves (#46)

WAVES = """  rollout:
    waves:
      - name: canary
        selector: {matchLabels: {owner: team-a}}
        soakSeconds: 5
      - name: rest
        soakSeconds: 5
    slo:
      minSuccessRatio: 0.999
"""


def with_waves(loop: Loop) -> None:
    """Both clusters run, and gitops.yaml rolls team-a (the canary) before team-b."""
    loop.with_cluster("team-b")
    config = loop.work / "gitops.yaml"
    if "rollout:" not in config.read_text():
        config.write_text(config.read_text() + WAVES)
        loop.push("roll out in waves: team-a first")
    loop.converged()


def api_server_args(loop: Loop, args: dict[str, str]) -> None:
    """Both clusters' kube-apiservers get exactly `args` as spec.apiServer.extraArgs."""
    for name in ("team-a", "team-b"):
        path = loop.work / "clusters" / name / "cluster.yaml"
        doc = yaml.safe_load(path.read_text())
        if args:
            doc["spec"]["apiServer"]["extraArgs"] = dict(args)
        else:
            doc["spec"]["apiServer"].pop("extraArgs", None)
        path.write_text(yaml.safe_dump(doc, sort_keys=False))


def cluster_request(loop: Loop, cluster: str, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    """One request to the cluster's API through its ingress, as its admin (the status branch's kubeconfig)."""
    host, port, context = admin_tls(yaml.safe_dump(decrypt_kubeconfig(loop, cluster)))
    conn = http.client.HTTPSConnection(host, int(port), context=context, timeout=10)
    try:
        conn.request(method, path, json.dumps(body) if body is not None else None,
                     {"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"{}")
    finally:
        conn.close()


def cluster_containers(loop: Loop, cluster: str) -> list[tuple[str, int]]:
    """(id, created) of every container gitops runs for `cluster`."""
    out = []
    for hv in loop.lab.hypervisors:
        with CRIClient(hv.local().cri_endpoint()) as client:
            out += [(c.id, c.created_at) for c in client.list_containers({MANAGED: MANAGER})
                    if c.labels.get(NODE, "").startswith(f"{cluster}-")]
    return sorted(out)


def running(loop: Loop, cluster: str) -> str:
    """The commit the cluster runs, as the status branch says."""
    return yaml.safe_load(loop.status_file(f"status/Cluster/{cluster}.yaml"))["status"]["runningSHA"]


def rollout_status(loop: Loop) -> dict:
    return yaml.safe_load(loop.status_file("status/rollout.yaml"))["status"]


def test_a_change_that_breaks_clients_halts_at_the_canary_which_is_put_back_with_its_objects(loop):
    """issue #46: kube-apiserver --etcd-prefix changed: /readyz passes, objects are gone from the API's answers.
    The canary wave halts, team-b is never touched, and the next reconcile puts team-a back."""
    with_waves(loop)
    good = loop.source()["appliedSHA"]
    kept = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "kept"}, "data": {"written": "before"}}
    status, _ = cluster_request(loop, "team-a", "POST", "/api/v1/namespaces/default/configmaps", kept)
    assert status in (201, 409), status
    team_b = cluster_containers(loop, "team-b")
    api_server_args(loop, {"etcd-prefix": "/elsewhere"})
    bad = loop.push("every API server reads another etcd prefix")
    result = loop.reconcile(check=False)
    assert result.returncode == 1 and result.stdout.startswith("Halted: "), result.stdout + result.stderr[-2000:]
    source = loop.source()
    assert (source["result"], source["lastSeenSHA"], source["appliedSHA"]) == ("Halted", bad, good)
    rollout = rollout_status(loop)
    assert (rollout["commit"], rollout["phase"]) == (bad, "Halted")
    assert (rollout["halted"]["wave"], rollout["halted"]["cluster"]) == ("canary", "team-a")
    assert "success ratio" in rollout["halted"]["reason"], rollout
    figures = rollout["waves"][0]["clusters"]["team-a"]
    print("halted:", figures)
    assert figures["failed"] > 0 and figures["requests"] > figures["failed"]
    assert [w["name"] for w in rollout["waves"]] == ["canary"]  # the rest never started
    assert cluster_containers(loop, "team-b") == team_b
    assert running(loop, "team-a") == bad and running(loop, "team-b") not in ("", bad)  # a fleet at two commits
    record = yaml.safe_load(loop.status_file("status/apply.yaml"))["status"]
    assert record["sha"] == bad
    failed = [(a["kind"], a["subject"]) for a in record["actions"] if a["result"] == "Failed"]
    assert failed == [("soak-wave", "canary")], failed
    assert all(a["result"] == "NotRun" for a in record["actions"] if a["subject"].startswith("team-b"))
    # the next reconcile holds the halted commit like a refused one and puts back the commit in force, with no
    # failed request of its own (the API servers roll back one at a time; `default` is there under either prefix)
    from gitops.lab.probe import Probe

    with Probe(yaml.safe_dump(decrypt_kubeconfig(loop, "team-a")), interval=0.1) as probe:
        result = loop.reconcile(check=False)
    print(f"put back: {probe.requests} requests, {probe.failures} failed", *probe.errors[:3])
    assert probe.requests > 20 and probe.failures == 0, probe.errors[:5]
    assert result.stdout.startswith("Refused: "), result.stdout
    source = loop.source()
    assert (source["result"], source["lastSeenSHA"], source["appliedSHA"]) == ("Refused", bad, good)
    assert any("rollout halted at wave canary: cluster team-a" in e for e in source["errors"]), source
    record = yaml.safe_load(loop.status_file("status/apply.yaml"))["status"]
    assert record["sha"] == good and record["result"] == "Applied", record
    assert {a["subject"].split("/")[0] for a in record["actions"]} == {"team-a"}
    assert not any(a["kind"] in ("start-wave", "soak-wave") for a in record["actions"])  # a retreat is not soaked
    status, found = cluster_request(loop, "team-a", "GET", "/api/v1/namespaces/default/configmaps/kept")
    assert status == 200 and found["data"] == {"written": "before"}
    assert running(loop, "team-a") == good
    assert cluster_containers(loop, "team-b") == team_b
    # held until a new commit: a revert rolls out again (nothing to do: it is the commit in force)
    api_server_args(loop, {})
    loop.push("revert: back to the shared etcd prefix")
    loop.reconcile()
    assert loop.source()["result"] == "Applied"
    assert cluster_containers(loop, "team-b") == team_b


def test_a_good_change_rolls_through_both_waves_and_a_controller_killed_in_the_soak_resumes(loop):
    """issue #46: a harmless flag rolls team-a, soaks, then team-b, soaks. The controller killed during the
    canary's soak resumes there: the canary is soaked again, then the rest rolls."""
    with_waves(loop)
    api_server_args(loop, {"default-watch-cache-size": "101"})
    sha = loop.push("a bigger watch cache")
    began = time.monotonic()
    loop.reconcile_killed(lambda line: '"action start"' in line and '"soak-wave"' in line and '"canary"' in line,
                          after=1)
    result = loop.reconcile()
    assert result.stdout.startswith("Applied: ")
    record = yaml.safe_load(loop.status_file("status/apply.yaml"))["status"]
    kinds = [(a["kind"], a["subject"]) for a in record["actions"]]
    # resumed where it was killed: the canary soaked again before team-b is touched. (Its API servers rolled
    # before the kill; a controller-manager or scheduler that lost its leader lease meanwhile and exited is
    # restarted first, and the wave then starts again, as any wave with actions)
    canary = kinds.index(("soak-wave", "canary"))
    assert kinds[0] in (("soak-wave", "canary"), ("start-wave", "canary")), kinds
    assert {s.split("/")[0] for _, s in kinds[1:canary]} <= {"team-a"}
    assert not any(s.endswith("/kube-apiserver") for _, s in kinds[:canary]), kinds  # not rolled again
    assert kinds[canary + 1] == ("start-wave", "rest") and kinds[-1] == ("soak-wave", "rest"), kinds
    assert {s.split("/")[0] for _, s in kinds[canary + 2:-1]} == {"team-b"}
    assert (running(loop, "team-a"), running(loop, "team-b")) == (sha, sha)
    rollout = rollout_status(loop)
    assert (rollout["commit"], rollout["phase"]) == (sha, "Soaked")
    assert [(w["name"], w["phase"]) for w in rollout["waves"]] == [("canary", "Soaked"), ("rest", "Soaked")]
    for wave in rollout["waves"]:
        took = dt.datetime.fromisoformat(wave["ended"]) - dt.datetime.fromisoformat(wave["started"])
        for cluster, figures in wave["clusters"].items():
            print(f"wave {wave['name']} ({took.total_seconds():.0f}s): {cluster}: {figures}")
            assert figures["failed"] == 0 and figures["success_ratio"] == 1.0, figures
    print(f"rolled both waves in {time.monotonic() - began:.0f}s")


TOGETHER = """  rollout:
    waves:
      - name: all
        soakSeconds: 5
        maxConcurrent: 2
    slo:
      minSuccessRatio: 0.999
"""


def rollout_config(loop: Loop, rollout: str, message: str) -> None:
    """gitops.yaml's spec.rollout replaced by `rollout` (pushed and applied: a rollout alone changes nothing)."""
    config = loop.work / "gitops.yaml"
    text = config.read_text()
    config.write_text(text[:text.index("  rollout:")] + rollout)
    loop.push(message)
    loop.converged()


@contextlib.contextmanager
def all_at_once(loop: Loop) -> Iterator[None]:
    """Both clusters in one wave of maxConcurrent 2 (TOGETHER) while the block runs; the canary's waves after."""
    with_waves(loop)
    rollout_config(loop, TOGETHER, "one wave: both clusters at once")
    try:
        yield
    finally:
        rollout_config(loop, WAVES, "roll out in waves again: team-a first")


def another_watch_cache(loop: Loop, size: str) -> None:
    """Both clusters' API servers get --default-watch-cache-size `size`, or no extra flag if they run it already:
    a harmless change every API server rolls for."""
    current = yaml.safe_load((loop.work / "clusters" / "team-a" / "cluster.yaml").read_text())["spec"]["apiServer"]
    args = {"default-watch-cache-size": size}
    api_server_args(loop, {} if current.get("extraArgs") == args else args)


def controlplanes(loop: Loop, cluster: str) -> int:
    """How many control-plane Nodes the repo declares for `cluster`."""
    docs = yaml.safe_load_all((loop.work / "clusters" / cluster / "nodes.yaml").read_text())
    return sum(1 for d in docs if d and d["spec"]["role"] == "controlplane")


def test_a_wave_with_max_concurrent_applies_its_clusters_at_once(loop):
    """issue #46: one wave of maxConcurrent 2: team-a's and team-b's API servers roll at the same time (each
    cluster's one at a time, in its order), and no probe request through either ingress fails."""
    with all_at_once(loop):
        another_watch_cache(loop, "102")
        sha = loop.push("another watch cache size, both clusters in one batch")
        began = time.monotonic()
        result = loop.reconcile()
        took = time.monotonic() - began
        assert result.stdout.startswith("Applied: "), result.stdout
        record = yaml.safe_load(loop.status_file("status/apply.yaml"))["status"]
        assert all(a["result"] == "Done" for a in record["actions"]), record["actions"]
        spans: dict[str, list[tuple[float, float]]] = {}
        for a in record["actions"]:
            if a["kind"] == "recreate-container" and a["subject"].endswith("/kube-apiserver"):
                spans.setdefault(a["subject"].split("/")[0], []).append(
                    (a["startedSeconds"], round(a["startedSeconds"] + a["seconds"], 3)))
        a_, b_ = (spans["team-a"], spans["team-b"])
        # (an earlier test of the module leaves team-b two control-plane nodes: each cluster rolls what it has)
        assert (len(a_), len(b_)) == (controlplanes(loop, "team-a"), controlplanes(loop, "team-b")), spans
        for one in (a_, b_):  # within a cluster, one API server after another
            assert all(end <= start + 0.002 for (_, end), (start, _) in zip(one, one[1:])), one
        # the two clusters' rolls overlap in time: each started before the other ended
        assert a_[0][0] < b_[-1][1] and b_[0][0] < a_[-1][1], spans
        alone = sum(one[-1][1] - one[0][0] for one in (a_, b_))
        together = max(a_[-1][1], b_[-1][1]) - min(a_[0][0], b_[0][0])
        print(f"both clusters' API servers rolled in {together:.0f}s (each alone: {alone:.0f}s in all); "
              f"reconcile {took:.0f}s")
        assert together < alone
        rollout = rollout_status(loop)
        assert (rollout["commit"], rollout["phase"]) == (sha, "Soaked")
        [wave] = rollout["waves"]
        assert wave["name"] == "all" and set(wave["clusters"]) == {"team-a", "team-b"}
        for cluster, figures in wave["clusters"].items():
            print(f"wave all: {cluster}: {figures}")
            assert figures["failed"] == 0 and figures["requests"] > 20, figures
        assert (running(loop, "team-a"), running(loop, "team-b")) == (sha, sha)


def test_a_controller_killed_while_a_batch_applies_at_once_resumes_both_clusters(loop):
    """issue #46: SIGKILL while team-a's and team-b's API servers roll at once (team-a's first one done). The next
    reconcile plans what each cluster has left, applies it at once again and soaks the wave; no probe request of
    the wave fails (its SLO would halt it), and both clusters run the commit with their objects."""
    with all_at_once(loop):
        kept = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "kept-at-once"}, "data": {"a": "b"}}
        for cluster in ("team-a", "team-b"):
            status, _ = cluster_request(loop, cluster, "POST", "/api/v1/namespaces/default/configmaps", kept)
            assert status in (201, 409), status
        another_watch_cache(loop, "103")
        sha = loop.push("another watch cache size, killed on the way")
        loop.reconcile_killed(lambda line: '"action done"' in line and '"recreate-container"' in line
                              and "team-a-cp-" in line and "kube-apiserver" in line, after=1)
        assert running(loop, "team-a") != sha  # killed before publishing anything
        result = loop.reconcile()
        assert result.stdout.startswith("Applied: "), result.stdout
        record = yaml.safe_load(loop.status_file("status/apply.yaml"))["status"]
        assert record["sha"] == sha and all(a["result"] == "Done" for a in record["actions"]), record["actions"]
        # (one in flight at the kill may be gone: then it is created, not recreated)
        rolled = {c: [a for a in record["actions"] if a["kind"] in ("recreate-container", "create-container")
                      and a["subject"].startswith(f"{c}/") and a["subject"].endswith("/kube-apiserver")]
                  for c in ("team-a", "team-b")}
        print("resumed:", {c: len(rows) for c, rows in rolled.items()})
        # what each had left: team-a all but its first; team-b (rolling beside it) at least its last
        assert len(rolled["team-a"]) == controlplanes(loop, "team-a") - 1, rolled
        assert 1 <= len(rolled["team-b"]) <= controlplanes(loop, "team-b"), rolled
        (a_first, a_last), (b_first, b_last) = ((rows[0], rows[-1]) for rows in rolled.values())
        assert a_first["startedSeconds"] < b_last["startedSeconds"] + b_last["seconds"]
        assert b_first["startedSeconds"] < a_last["startedSeconds"] + a_last["seconds"]
        rollout = rollout_status(loop)
        assert (rollout["commit"], rollout["phase"]) == (sha, "Soaked")
        # the probe paces itself (a request every PROBE_EVERY at most): more than the resumed run could make means
        # the killed run's counts were kept
        gates = {a["kind"]: a for a in record["actions"] if a["kind"] in ("start-wave", "soak-wave")}
        resumed = gates["soak-wave"]["startedSeconds"] + gates["soak-wave"]["seconds"] - gates["start-wave"][
            "startedSeconds"]
        for cluster, figures in rollout["waves"][0]["clusters"].items():
            print(f"wave all, killed and resumed ({resumed:.0f}s): {cluster}: {figures}")
            assert figures["failed"] == 0, figures
            assert figures["requests"] > resumed / PROBE_EVERY + 2, (resumed, figures)
        for cluster in ("team-a", "team-b"):
            assert running(loop, cluster) == sha
            status, found = cluster_request(loop, cluster, "GET", "/api/v1/namespaces/default/configmaps/kept-at-once")
            assert status == 200 and found["data"] == {"a": "b"}
