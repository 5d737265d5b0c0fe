"""Every crash point of a day-2 plan, explored on a real lab (issue #26, item 5).

For a scenario (an edit of the repo that makes a day-2 plan), `run_crash_point` runs
`gitops apply` as a subprocess and SIGKILLs it right after action k is reported done
(`[k/N] ... done`), or while a gated action runs (its etcd health or `/readyz` wait), then runs
`gitops apply` again and checks what must hold after any crash: the plan is empty (after at most
one apply that restarts leader-elected components which exited for their Lease; in a CA rotation,
the phase crashed in is recorded done and the plan holds the next one), the live etcd
member list is the one the state records, every API server and etcd serves the certificate on its
node's disk, a ConfigMap written through the API before is still there, and the API probe through
the ingress (`gitops.lab.probe.Probe`) saw no failure outside the window of an API server the
plans stopped. Pure orchestration over the real lab: the real `gitops` command, containerd, etcd,
kube-apiserver, haproxy, etcdctl and kubectl.

Used by `benchmarks/crash_points.py` (every point of every scenario); `tests/test_apply_lab.py`
kills at a sample of the same points on its own lab.
"""
from __future__ import annotations

import base64
import dataclasses
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml
from conftest import running_lab
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gitops import lab as labmod
from gitops.compile.authorities import authority
from gitops.hostport import host_port
from gitops.lab import kubebin
from gitops.model import versions
from gitops.lab.example import write_example_repo
from gitops.lab.probe import Probe
from gitops.model.validate import load_model
from gitops.pki import issue_cert
from gitops.state import LocalDirStore

GITOPS = str(Path(sys.executable).parent / "gitops")

#: what a plan may still hold after an apply that changed etcd: kube-controller-manager and kube-scheduler
#: exit by design when they cannot renew their Lease within 10 s (a kubelet would restart them; gitops
#: restarts exited containers on its next apply, the controller on its next poll)
LEASE_EXITS = ("~ recreate container kube-controller-manager: container is exited",
               "~ recreate container kube-scheduler: container is exited")

#: a progress line of `gitops apply` (gitops/cli/reconcile.py): `[k/N] ~ subject verb ...: reason ... done (1.2s)`
PROGRESS = re.compile(r"^\[(\d+)/(\d+)\] (\S) (\S+) (.*) \.\.\. (done|FAILED) \((\d+(?:\.\d+)?)s\)$")

#: the plan's wording of a gated action: an etcd health wait or an API server's /readyz wait
GATES = ("one member at a time", "waits until its /readyz", "healthy first",
         "waits until it is healthy")


class CrashPointError(AssertionError):
    """A check of the harness failed (an AssertionError, so pytest reports it as a failed test)."""


# ------------------------------------------------------------------ a lab with the example repo applied

@dataclasses.dataclass
class Workspace:
    """A lab, the example repo wired to it and the state dir `gitops apply` keeps, under `dir`."""

    dir: Path
    repo: Path
    state: Path
    lab: labmod.LabInfo
    #: the directory of the worker joined to the cluster (`_join_worker`), None before
    worker: Path | None = None

    @property
    def set_aside(self) -> Path:
        """The example's other clusters, taken out of the repo (`workspace`)."""
        path = self.dir / "set-aside"
        path.mkdir(exist_ok=True)
        return path

    def gitops(self, *args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess:
        proc = subprocess.run([GITOPS, *args], capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise CrashPointError(f"gitops {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
        return proc

    def apply(self, *extra: str, check: bool = True) -> subprocess.CompletedProcess:
        return self.gitops("apply", str(self.repo), "--state-dir", str(self.state), *extra, check=check)

    def plan(self, *extra: str, check: bool = True) -> subprocess.CompletedProcess:
        return self.gitops("plan", str(self.repo), "--state-dir", str(self.state), *extra, check=check)

    def plan_json(self) -> dict:
        """`gitops plan -o json`: {"summary", "actions": [{kind, cluster, node, component, reason, details, ...}]}."""
        return json.loads(self.plan("-o", "json").stdout)

    def hypervisors(self) -> dict:
        return load_model(self.repo).hypervisors

    def kubeconfig(self, cluster: str, fresh: bool = False) -> Path:
        """The admin kubeconfig `gitops kubeconfig` prints, in a 0600 file; written again when `fresh` or
        missing (a CA rotation publishes a new one)."""
        path = self.dir / f"{cluster}.kubeconfig"
        if fresh or not path.exists():
            text = self.gitops("kubeconfig", str(self.repo), "--state-dir", str(self.state), "--cluster",
                               cluster).stdout
            path.touch(mode=0o600)
            path.write_text(text)
        return path

    def kubectl(self, cluster: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        """The real kubectl through the cluster's ingress, as kubernetes-admin."""
        proc = subprocess.run([str(kubebin.kubectl()), "--kubeconfig", str(self.kubeconfig(cluster)),
                               "--request-timeout=10s", *args], capture_output=True, text=True, timeout=60)
        if check and proc.returncode != 0:
            raise CrashPointError(f"kubectl {' '.join(args)} exited {proc.returncode}: {proc.stdout}{proc.stderr}")
        return proc

    def wait_ready(self, cluster: str, timeout: float = 120) -> None:
        """Until /readyz answers `ok` through the ingress."""
        deadline = time.monotonic() + timeout
        while True:
            proc = self.kubectl(cluster, "get", "--raw", "/readyz", check=False)
            if proc.returncode == 0 and proc.stdout.strip() == "ok":
                return
            if time.monotonic() > deadline:
                raise CrashPointError(f"{cluster} never became ready: {proc.stdout}{proc.stderr}")
            time.sleep(1)

    def etcdctl(self, cluster: str, *args: str) -> subprocess.CompletedProcess:
        """The real etcd client on every member the state records, with a client certificate of the
        cluster's etcd CA."""
        state = LocalDirStore(self.state).load()
        record = state.clusters[cluster]
        ca = authority(record.authorities, "etcd")
        cert = issue_cert(ca, "crash-points", client=True)
        trusted = ca.cert_pem  # during a CA rotation the members may serve a certificate of either etcd CA
        if record.rotation is not None and "etcd" in record.rotation.other:
            trusted += record.rotation.other["etcd"].cert_pem
        tls = self.dir / f"etcd-client-{cluster}"
        tls.mkdir(exist_ok=True)
        for name, text in (("ca.crt", trusted), ("client.crt", cert.cert_pem), ("client.key", cert.key_pem)):
            (tls / name).write_text(text)
        hvs = self.hypervisors()
        endpoints = ",".join(f"https://{host_port(hvs[r.hypervisor].ip_address, r.ports['etcd-client'])}"
                             for _, r in sorted(state.nodes.items())
                             if r.cluster == cluster and "etcd-client" in r.ports)
        etcdctl = str(kubebin.etcd_program("etcdctl", versions.DEFAULT_ETCD))
        return subprocess.run([etcdctl, f"--endpoints={endpoints}", f"--cacert={tls}/ca.crt",
                               f"--cert={tls}/client.crt", f"--key={tls}/client.key", "--dial-timeout=3s", *args],
                              capture_output=True, text=True, env={**os.environ, "ETCDCTL_API": "3"}, timeout=30)

    def edit_docs(self, rel: str, change: Callable[[list[dict]], None]) -> None:
        """Load repo file `rel`'s documents, let `change` edit them, write them back."""
        path = self.repo / rel
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        change(docs)
        path.write_text(yaml.safe_dump_all(docs, sort_keys=False))

    def cluster_spec(self, cluster: str, change: Callable[[dict], None]) -> None:
        """Edit the `spec` of `clusters/CLUSTER/cluster.yaml`."""
        self.edit_docs(f"clusters/{cluster}/cluster.yaml", lambda docs: change(docs[0]["spec"]))

    def controlplane_nodes(self, cluster: str) -> list[str]:
        """The controlplane Node names in `clusters/CLUSTER/nodes.yaml`, in file order."""
        docs = yaml.safe_load_all((self.repo / f"clusters/{cluster}/nodes.yaml").read_text())
        return [d["metadata"]["name"] for d in docs if d and d["spec"]["role"] == "controlplane"]

    def set_controlplane_nodes(self, cluster: str, names: list[str]) -> None:
        """`clusters/CLUSTER/nodes.yaml` holds exactly these controlplane Nodes (and its other Nodes)."""
        def change(docs: list[dict]) -> None:
            others = [d for d in docs if d["spec"]["role"] != "controlplane"]
            docs[:] = [{"apiVersion": "gitops.infra/v1alpha1", "kind": "Node", "metadata": {"name": n},
                        "spec": {"cluster": cluster, "role": "controlplane"}} for n in names] + others
        self.edit_docs(f"clusters/{cluster}/nodes.yaml", change)


def edit(repo: Path, rel: str, old: str, new: str) -> str:
    """Replace `old` (which must be there once) by `new` in repo file `rel`; returns the original text."""
    path = repo / rel
    text = path.read_text()
    if text.count(old) != 1:
        raise CrashPointError(f"{rel}: {old!r} is there {text.count(old)} time(s), not once")
    path.write_text(text.replace(old, new))
    return text


@contextmanager
def workspace(prefix: str, subnet: str, cluster: str = "team-a") -> Iterator[Workspace]:
    """A lab of 3 hypervisors (1 public) on `subnet` in a temp dir (`running_lab(prefix)`), the example repo with
    `cluster` only (3 controlplane nodes + 1 ingress, real binaries) applied, and its API ready through the ingress.
    Afterwards, whatever happens (Ctrl-C included), a joined worker leaves (its kubelet and kube-proxy stop), then
    the lab goes down (its processes, pods, mounts, cgroups) and the dir is deleted."""
    with running_lab(prefix, hypervisors=3, public=1, subnet=subnet,
                     kubernetes_versions=kubebin.KUBERNETES_BUILT[::-1]) as (base, lab):  # every release: the upgrade scenario
        try:
            ws = Workspace(base, base / "repo", base / "state", lab)
            write_example_repo(lab, ws.repo, ingress_nodes=1)
            for other in sorted((ws.repo / "clusters").iterdir()):
                if other.name != cluster:  # kept outside the repo for a scenario that makes clusters of it
                    shutil.move(other, ws.set_aside / other.name)
            shutil.rmtree(ws.repo / "sip")
            ws.edit_docs("gitops.yaml", lambda docs: docs[0]["spec"].update(
                paths=[p for p in docs[0]["spec"]["paths"] if p != "sip"]))
            ws.apply()
            ws.wait_ready(cluster, timeout=180)
            converge(ws)
            yield ws
        finally:
            if (base / "worker").exists():
                try:
                    subprocess.run([GITOPS, "lab", "exec", "--dir", str(base / "lab"), WORKER, "--", GITOPS,
                                    "leave", "--dir", str(base / "worker")], capture_output=True, timeout=180)
                except (OSError, subprocess.SubprocessError):
                    pass  # (the lab goes down anyway: its namespace and its worker's containerd with it)


# ------------------------------------------------------------------ the checks

def plan_changes(text: str) -> list[str]:
    """The action lines (`+`, `~`, `-`) of a rendered plan."""
    return [line.strip() for line in text.splitlines() if line.strip().startswith(("+ ", "~ ", "- "))]


def rotation_phase(ws: Workspace, cluster: str = "team-a") -> int:
    """The CA rotation phase the recorded state is in (1-3; 0: none under way)."""
    record = LocalDirStore(ws.state).load().clusters.get(cluster)
    return record.rotation.number if record is not None and record.rotation is not None else 0


def converge(ws: Workspace, cluster: str = "team-a") -> list[str]:
    """`gitops plan` is empty, after at most one apply that restarts leader-elected components which exited
    for their Lease (`LEASE_EXITS`); returns what that apply healed. Raises `CrashPointError` otherwise.
    While a CA rotation is under way the plan is never empty (each apply runs one phase, the next plan holds
    the next one): then the phase the state records must be the one the plan runs, and nothing else is
    checked here."""
    phase = rotation_phase(ws, cluster)
    if phase:
        plan = ws.plan()
        if f", phase {phase} of 3 runs now" not in plan.stdout:
            raise CrashPointError(f"CA rotation: the state records phase {phase}, the plan says:\n{plan.stdout}")
        return []
    plan = ws.plan("--detailed-exitcode", check=False)
    healed: list[str] = []
    if plan.returncode == 2:
        changes = plan_changes(plan.stdout)
        if not changes or not all(c in LEASE_EXITS for c in changes):
            raise CrashPointError(f"not converged: the plan still holds:\n{plan.stdout}")
        ws.apply()
        healed = changes
        plan = ws.plan("--detailed-exitcode", check=False)
    if plan.returncode != 0:
        raise CrashPointError(f"not converged (plan exit {plan.returncode}):\n{plan.stdout}{plan.stderr}")
    return healed


def etcd_members_match_state(ws: Workspace, cluster: str, timeout: float = 30) -> list[str]:
    """The live etcd members (started, voting, healthy) are the ones the state records; returns them."""
    deadline = time.monotonic() + timeout
    while True:
        recorded = sorted(LocalDirStore(ws.state).load().clusters[cluster].etcd_members)
        listed = ws.etcdctl(cluster, "member", "list", "-w", "json")
        members = json.loads(listed.stdout).get("members", []) if listed.returncode == 0 else []
        live = sorted(m.get("name", "") for m in members)
        learners = sorted(m.get("name", "") for m in members if m.get("isLearner"))
        healthy = ws.etcdctl(cluster, "endpoint", "health")
        if live == recorded and not learners and healthy.returncode == 0:
            return live
        if time.monotonic() > deadline:
            raise CrashPointError(f"etcd members {live} (learners {learners}) are not the recorded {recorded}, "
                                  f"or not healthy: {listed.stderr}{healthy.stdout}{healthy.stderr}")
        time.sleep(1)


def running_containers(ws: Workspace, node: str, component: str) -> set[str]:
    """The ids of the running containers of `component` in `node`'s pod, read over CRI."""
    from gitops.cri.client import CRIClient
    from gitops.pods import MANAGED, MANAGER, NODE

    out = set()
    for hv in ws.lab.hypervisors:
        with CRIClient(hv.local().cri_endpoint()) as client:
            for c in client.list_containers({MANAGED: MANAGER, NODE: node, "gitops.infra/component": component}):
                if c.state.value == "running":
                    out.add(c.id)
    return out


def settle(ws: Workspace) -> None:
    """Apply when the plan is not empty, then `converge`: a lab left anywhere is converged again."""
    if ws.plan("--detailed-exitcode", check=False).returncode != 0:
        ws.apply(check=False)
    converge(ws)


def stale_servers(ws: Workspace, cluster: str) -> list[str]:
    """Each controlplane node's API server and etcd serve the certificate on its node's disk
    (`apiserver.crt`, `etcd-server.crt`): the ones that do not (read over TLS: they still run on an
    older certificate), as `node/file: serves serial X, the file holds Y`."""
    from cryptography import x509

    state = LocalDirStore(ws.state).load()
    ca = authority(state.clusters[cluster].authorities, "etcd")
    client = issue_cert(ca, "crash-points-serials", client=True)
    tls = ws.dir / f"serials-{cluster}"
    tls.mkdir(exist_ok=True)
    (tls / "c.crt").write_text(client.cert_pem)
    (tls / "c.key").write_text(client.key_pem)
    hvs = ws.hypervisors()
    out = []
    for node, record in sorted(state.nodes.items()):
        if record.cluster != cluster or "etcd-client" not in record.ports:
            continue
        ip, files = hvs[record.hypervisor].ip_address, Path(hvs[record.hypervisor].data_dir) / cluster / node / "files"
        for name, port in (("apiserver.crt", record.ports["apiserver"]), ("etcd-server.crt", record.ports["etcd-client"])):
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # the serial is all we read
            context.load_cert_chain(str(tls / "c.crt"), str(tls / "c.key"))  # etcd asks for one
            try:
                with socket.create_connection((ip, port), timeout=5) as raw, context.wrap_socket(raw) as conn:
                    der = conn.getpeercert(binary_form=True)
            except OSError as err:
                out.append(f"{node}/{name}: not served ({err})")
                continue
            served = x509.load_der_x509_certificate(der or b"").serial_number
            on_disk = x509.load_pem_x509_certificate((files / name).read_bytes()).serial_number
            if served != on_disk:
                out.append(f"{node}/{name}: serves serial {served:x}, the file holds {on_disk:x}")
    return out


# ------------------------------------------------------------------ one crash point

@dataclasses.dataclass(frozen=True)
class KillPoint:
    """Where the applier is killed: right after action `after` is reported done, or (`inside`) `delay`
    seconds after action `inside` started (the line of the action before it, or `delay` seconds after
    the process started for the first action); with `until`, once that condition (polled every 0.1 s
    from then on) holds, e.g. the new etcd container runs: the action is inside its health wait."""

    after: int = 0
    inside: int = 0
    delay: float = 0.0
    until: Callable[[], bool] | None = dataclasses.field(default=None, compare=False)
    what: str = ""

    @property
    def label(self) -> str:
        if self.after:
            return f"after {self.after}"
        return f"in {self.inside} " + (f"({self.what})" if self.what else f"+{self.delay:.1f}s")

    @property
    def action(self) -> int:
        return self.after or self.inside

    @property
    def key(self) -> str:
        return point_key(self.label)


def point_key(label: str) -> str:
    """A kill point's label without its measured delay (`in 4 +5.0s` -> `in 4`): the same point in another
    run, whose timings differ."""
    return re.sub(r" \+[0-9.]+s$", "", label)


def is_gated(action: dict) -> bool:
    """The action waits for etcd health or an API server's /readyz (as `gitops plan` says)."""
    return any(gate in detail for detail in action.get("details", ()) for gate in GATES)


#: a cluster a scenario makes anew each cycle is named `NAME-cycleN`; its points match across cycles
CYCLE = re.compile(r"-cycle\d+")


def action_text(action: dict) -> str:
    """`kind subject` of a plan JSON action, e.g. `recreate-container team-a/team-a-cp-1/etcd` (a cycle's
    number left out: `upgrade-cycle*/upgrade-cycle*-cp-1/etcd`)."""
    subject = "/".join(p for p in (action.get("cluster"), action.get("node"), action.get("component")) if p)
    return f"{action['kind']} {CYCLE.sub('-cycle*', subject)}"


@dataclasses.dataclass
class Line:
    """One line `gitops apply` printed and when (time.time()); for a progress line, its index and duration."""

    at: float
    text: str
    index: int = 0
    took: float = 0.0


@dataclasses.dataclass
class Outcome:
    """What one crash point gave (one row of the table)."""

    scenario: str
    variant: str
    point: str
    action: str
    actions: int
    killed: str = ""
    resumed: int = 0
    healed: list[str] = dataclasses.field(default_factory=list)
    probe_requests: int = 0
    probe_failures: int = 0
    failures_outside: list[str] = dataclasses.field(default_factory=list)
    #: the probe's first failures (inside a stopped API server's window, or not): what they were
    probe_errors: list[str] = dataclasses.field(default_factory=list)
    seconds: float = 0.0
    problems: list[str] = dataclasses.field(default_factory=list)
    #: how long each action of the killed run took (index -> s), and when its first action started
    #: (seconds after the process started): where a later kill inside an action is aimed
    timings: dict[int, float] = dataclasses.field(default_factory=dict)
    first_start: float | None = None

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def outcome(self) -> str:
        return "converged" if self.ok else "FAILED: " + "; ".join(p.splitlines()[0] for p in self.problems)

    def row(self) -> dict:
        return {"scenario": self.scenario, "variant": self.variant, "point": self.point, "action": self.action,
                "actions": self.actions, "killed": self.killed, "resumed_actions": self.resumed,
                "healed": self.healed, "probe_requests": self.probe_requests, "probe_failures": self.probe_failures,
                "failures_outside_window": self.failures_outside, "probe_errors": self.probe_errors,
                "seconds": round(self.seconds, 1),
                "outcome": self.outcome, "problems": self.problems}


def _run_apply(ws: Workspace, point: KillPoint | None, lines: list[Line],
               timeout: float = 600) -> tuple[int, bool]:
    """`gitops apply` (stdout and stderr as stamped `lines`), SIGKILLed at `point` (None: never).
    Returns (exit code, killed by us)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([GITOPS, "apply", str(ws.repo), "--state-dir", str(ws.state)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    started = time.time()
    lines.append(Line(started, "(apply started)"))
    previous = threading.Event()  # the line of the action before `point.inside` came (or the process started)
    killed = threading.Event()
    if point is not None and point.inside <= 1:
        previous.set()

    def kill() -> None:
        if proc.poll() is None and not killed.is_set():
            proc.send_signal(signal.SIGKILL)
            killed.set()

    def read() -> None:
        assert proc.stdout is not None
        for text in proc.stdout:
            line = Line(time.time(), text.rstrip("\n"))
            found = PROGRESS.match(line.text)
            if found:
                line.index, line.took = int(found.group(1)), float(found.group(7))
            lines.append(line)
            if point is not None and line.index:
                if point.after and line.index >= point.after:
                    kill()
                if point.inside and line.index == point.inside - 1:
                    previous.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        if point is not None and point.inside:
            while not previous.wait(0.05):
                if proc.poll() is not None:
                    break
            if previous.is_set():
                time.sleep(point.delay)
                while point.until is not None and proc.poll() is None and not point.until():
                    time.sleep(0.1)
                kill()
                if killed.is_set():
                    lines.append(Line(time.time(), "(killed)"))
        code = proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(timeout=10)
    if point is not None and point.after and killed.is_set():
        lines.append(Line(time.time(), "(killed)"))
    return code, killed.is_set()


def _stopped_windows(runs: list[list[Line]], running: dict | None, until: float) -> list[tuple[float, float, str]]:
    """When an API server was stopped by the plans: from the start of the action that stops it (remove or
    recreate its container) to the end of the one that starts it again, across the killed run and the
    rerun (one left stopped by the kill stays in its window until it starts). One that never starts again
    (its node leaves) is in its window until the ingress is replaced without it (the end of the next
    haproxy change after its stop), else until `until`. `running`: the plan action the kill interrupted
    (its stop counts from when it started)."""
    windows: list[tuple[float, float, str]] = []
    stopped: dict[str, float] = {}
    ingress: list[float] = []
    for lines in runs:
        last = lines[0].at if lines else until
        for line in lines:
            if line.text == "(killed)" and running and running.get("component") == "kube-apiserver" \
                    and running["kind"] in ("remove-container", "recreate-container"):
                stopped.setdefault(running["node"], last)
            found = PROGRESS.match(line.text)
            if not found:
                continue
            last = line.at
            subject, verb = found.group(4).split("/"), found.group(5)
            if len(subject) == 3 and subject[2] == "haproxy" and verb.startswith(("create", "recreate")):
                ingress.append(line.at)
            if len(subject) != 3 or subject[2] != "kube-apiserver":
                continue
            node, start = subject[1], line.at - line.took
            if verb.startswith("remove container"):
                stopped.setdefault(node, start)
            elif verb.startswith(("create container", "recreate container")):
                windows.append((stopped.pop(node, start), line.at, node))
    windows += [(since, min((t for t in ingress if t > since), default=until), node)
                for node, since in stopped.items()]
    return windows


def _probe_time(stamp: str, near: float) -> float:
    """A probe error's `HH:MM:SS.mmm` (local time) as time.time(), on the day of `near`."""
    hms, ms = stamp.split(".")
    day = time.localtime(near)
    parsed = time.strptime(f"{day.tm_year}-{day.tm_mon}-{day.tm_mday} {hms}", "%Y-%m-%d %H:%M:%S")
    return time.mktime(parsed) + int(ms) / 1000


def _after_phase(phase: int) -> int:
    """The CA rotation phase the state records once `phase` ran to its end (0: the rotation is over)."""
    return phase + 1 if 0 < phase < 3 else 0


def run_crash_point(ws: Workspace, cluster: str, scenario: str, variant: str, point: KillPoint,
                    marker: str, log: Callable[[str], None] = lambda _: None) -> Outcome:
    """One crash point: the repo already holds the scenario's edit. Plans it, writes a ConfigMap `marker`
    through the ingress, starts the probe, runs `gitops apply` killed at `point`, runs `gitops apply` again,
    and checks convergence, etcd membership against the state, the certificates served, the ConfigMap and
    the probe. Every check that fails is one of the outcome's `problems`."""
    began = time.monotonic()
    plan = ws.plan_json()["actions"]
    index = min(point.action, len(plan)) - 1
    out = Outcome(scenario, variant, point.label, action_text(plan[index]) if plan else "(empty plan)", len(plan))
    if not plan:
        out.problems.append("the scenario's plan is empty: nothing to crash")
        return out
    ws.kubeconfig(cluster, fresh=True)
    ws.wait_ready(cluster)
    ws.kubectl(cluster, "-n", "default", "create", "configmap", marker, f"--from-literal=made={marker}")
    probe = Probe(ws.kubeconfig(cluster).read_text())  # its credentials stay valid through one CA phase
    rotating = variant.startswith("phase ")
    crashed_in = int(variant.split()[1]) if rotating and variant.split()[1].isdigit() else 0  # the phase the
    # rerun finishes (0: none, or not known from the plan: then only convergence is checked)
    probe.start()
    first: list[Line] = []
    second: list[Line] = []
    try:
        code, killed = _run_apply(ws, point, first)
        done = max((line.index for line in first), default=0)
        if not killed:
            out.killed = f"not killed: apply exited {code} after {done} action(s)"
        elif point.inside and done >= point.inside:
            out.killed = f"killed after action {done} (action {point.inside} had finished)"
        else:
            out.killed = f"killed after {done} of {len(plan)} done" + (
                f", inside action {point.inside}" if point.inside else "")
        log(f"    {out.killed}")
        if rotating and rotation_phase(ws, cluster) == _after_phase(crashed_in):
            # the kill came after the phase's last action: the rerun runs the next phase, for which an
            # operator takes the credentials gitops publishes now (the older ones may not outlive it)
            crashed_in = _after_phase(crashed_in)
            probe.use_kubeconfig(ws.kubeconfig(cluster, fresh=True).read_text())
            out.killed += (f"; phase done, the rerun runs phase {crashed_in} (the probe takes its credentials)"
                           if crashed_in else "; the rotation is done (the probe takes the new credentials)")
        code, _ = _run_apply(ws, None, second)
        out.resumed = max((line.index for line in second), default=0)
        if code != 0:
            out.problems.append(f"the rerun exited {code}:\n" + "\n".join(line.text for line in second[-15:]))
        else:
            log(f"    rerun: {out.resumed} action(s)")
            try:
                out.healed = converge(ws, cluster)
            except CrashPointError as err:
                out.problems.append(str(err))
        try:
            ws.kubeconfig(cluster, fresh=True)
            ws.wait_ready(cluster)
            time.sleep(2)  # a restarted API server back behind the ingress (rise 2 x 1 s)
        except CrashPointError as err:
            out.problems.append(str(err))
    finally:
        counts = probe.stop()
    ended = time.time()
    out.probe_requests, out.probe_failures = counts.requests, counts.failures
    out.probe_errors = list(counts.errors[:5])
    if counts.failures:
        log(f"    probe: {counts.failures} of {counts.requests} request(s) failed, first: {counts.errors[:1]}")
    running = plan[done] if killed and done < len(plan) else None
    windows = _stopped_windows([first, second], running, ended)
    for error in counts.errors:
        at = _probe_time(error.split(" ", 1)[0], ended)
        if not any(start <= at <= end for start, end, _ in windows):
            out.failures_outside.append(error)
    if counts.failures > len(counts.errors):
        out.failures_outside.append(f"{counts.failures - len(counts.errors)} more failure(s) not recorded")
    if out.failures_outside:
        out.problems.append(f"{len(out.failures_outside)} probe failure(s) outside a stopped API server's window: "
                            + " | ".join(out.failures_outside[:3]))
    if counts.requests < 10:
        out.problems.append(f"the probe sent only {counts.requests} request(s)")
    try:
        etcd_members_match_state(ws, cluster)
    except CrashPointError as err:
        out.problems.append(str(err))
    if rotating and crashed_in and not out.problems:  # the CA rotation phase the rerun ran went to its end
        now = rotation_phase(ws, cluster)
        if now != _after_phase(crashed_in):
            out.problems.append(f"CA rotation: the rerun ran phase {crashed_in}, the state records phase {now} "
                                "after it")
    stale = stale_servers(ws, cluster)
    if stale:
        out.problems.append("running on an older certificate than the one on disk: " + "; ".join(stale))
    kept = ws.kubectl(cluster, "-n", "default", "get", "configmap", marker, "-o", "jsonpath={.data.made}",
                      check=False)
    if kept.returncode != 0 or kept.stdout != marker:
        out.problems.append(f"ConfigMap {marker} lost: {kept.stdout}{kept.stderr}")
    out.seconds = time.monotonic() - began
    out.timings = {line.index: line.took for line in first if line.index}
    out.first_start = next((line.at - line.took - first[0].at for line in first if line.index == 1), None)
    return out


# ------------------------------------------------------------------ the scenarios

@dataclasses.dataclass(frozen=True)
class Scenario:
    """A day-2 plan made again and again: `prepare(ws, round)` edits the repo so that the next plan is the
    scenario's (each round from where the last one left the lab) and returns its variant (e.g. a CA
    rotation's phase, or the direction of a scaling); `start(ws)` runs once before the first round; `check(ws)`
    after each point."""

    name: str
    prepare: Callable[[Workspace, int], str]
    start: Callable[[Workspace], None] = lambda ws: None
    cluster: str = "team-a"
    #: the cluster of the round just prepared, for a scenario that makes a new one each cycle
    cluster_of: Callable[[Workspace], str] | None = None
    #: what must hold after each point besides the common checks (problems found)
    check: Callable[[Workspace], list[str]] = lambda ws: []


def _renewal(ws: Workspace, round_: int) -> str:
    """Round i: leaves last `400 + i` days and renew `399 + i` days before: every leaf of the round before
    (issued for `399 + i` days) is inside the window, the new ones are not."""
    ws.cluster_spec("team-a", lambda spec: spec["certificates"].update(
        validityDays=400 + round_, renewBeforeDays=399 + round_))
    return ""


def _etcd_alias(ws: Workspace, which: int) -> str:
    return ws.lab.etcd_image().rsplit(":", 1)[0] + f":crash-{which}"


def _etcd_start(ws: Workspace) -> None:
    for which in (0, 1):
        labmod.alias_image(ws.lab.etcd_image(), _etcd_alias(ws, which), ws.lab.dir)


def _etcd_image(ws: Workspace, round_: int) -> str:
    """Round i: etcd's image is one of two references to the same etcd, the other than the round before."""
    ws.cluster_spec("team-a", lambda spec: spec.setdefault("images", {}).update(etcd=_etcd_alias(ws, round_ % 2)))
    return ""


def _next_names(ws: Workspace, count: int) -> list[str]:
    """`count` new controlplane Node names: team-a-cp-N, N above every Node in the repo and the state (a
    name the state forgot, after its Node left, may come back)."""
    known = set(ws.controlplane_nodes("team-a")) | set(LocalDirStore(ws.state).load().nodes)
    top = max((int(n.rsplit("-", 1)[1]) for n in known if re.fullmatch(r"team-a-cp-\d+", n)), default=0)
    return [f"team-a-cp-{top + 1 + i}" for i in range(count)]


def _replace_node(ws: Workspace, round_: int) -> str:
    """Each round the last controlplane Node leaves the repo and a new one joins, in the same commit."""
    names = ws.controlplane_nodes("team-a")
    ws.set_controlplane_nodes("team-a", names[:-1] + _next_names(ws, 1))
    return ""


def _scale(ws: Workspace, round_: int) -> str:
    """3 -> 1 (the first Node stays), then 1 -> 3 with two more Nodes (`_next_names`), and so on."""
    names = ws.controlplane_nodes("team-a")
    if len(names) > 1:
        ws.set_controlplane_nodes("team-a", names[:1])
        return "3->1"
    ws.set_controlplane_nodes("team-a", names + _next_names(ws, 2))
    return "1->3"


def _ca_rotation(ws: Workspace, round_: int) -> str:
    """The next phase of a CA rotation: when none is under way, caGeneration is raised by one."""
    record = LocalDirStore(ws.state).load().clusters["team-a"]
    if record.rotation is None:
        ws.cluster_spec("team-a", lambda spec: spec["certificates"].update(caGeneration=record.ca_generation + 1))
    for action in ws.plan_json()["actions"]:
        found = re.search(r"phase (\d) of 3", action.get("reason", "") + " ".join(action.get("details", ())))
        if found:
            return f"phase {found.group(1)}"
    return "phase ?"


UPGRADE_SOURCE = "team-b"  # the example's cluster each upgrade cycle is made of (set aside by `workspace`)


def upgrade_cluster(ws: Workspace) -> str:
    """The upgrade scenario's cluster of the current cycle (`upgrade-cycleN`, the highest N in the repo)."""
    made = [p.name for p in (ws.repo / "clusters").iterdir() if re.fullmatch(r"upgrade-cycle\d+", p.name)]
    return max(made, key=lambda n: int(n.rsplit("cycle", 1)[1]), default="")


def _upgrade_start(ws: Workspace) -> None:
    """A backup target for the upgrade clusters (an etcd minor change asks for a snapshot first)."""
    ws.edit_docs("gitops.yaml", lambda docs: docs[0]["spec"].setdefault("backup", {}).update(targets=[
        {"name": "local", "repository": str(ws.dir / "backups"), "password": "lab backup password"}]))


def _minor_upgrade(ws: Workspace, round_: int) -> str:
    """One minor forward: a cluster on the oldest release goes to the next, then to the newest (where etcd's
    minor changes too). Minors only go forward, so each cycle makes a new cluster on the oldest release from
    the example's team-b (`upgrade-cycleN`, applied and converged first, the one before removed in the same
    apply) and upgrades that one twice."""
    built = kubebin.KUBERNETES_BUILT
    name = upgrade_cluster(ws)
    running = load_model(ws.repo).clusters[name].kubernetes_version if name else ""
    if not name or "v" + running.removeprefix("v") == built[-1]:
        if name:
            shutil.rmtree(ws.repo / "clusters" / name)
        name = f"upgrade-cycle{int(name.rsplit('cycle', 1)[1]) + 1 if name else 1}"
        target = ws.repo / "clusters" / name
        target.mkdir()
        for source in sorted((ws.set_aside / UPGRADE_SOURCE).iterdir()):
            (target / source.name).write_text(source.read_text().replace(UPGRADE_SOURCE, name))
        ws.cluster_spec(name, lambda spec: spec.update(kubernetesVersion=built[0][1:],
                                                       backup={"target": "local", "keep": 2}))
        ws.apply()
        ws.wait_ready(name, timeout=180)
        converge(ws)
        running = built[0]
    at = built.index("v" + running.removeprefix("v"))
    ws.cluster_spec(name, lambda spec: spec.update(kubernetesVersion=built[at + 1][1:]))
    return f"{built[at]}->{built[at + 1]}"


WORKER = "lab-worker-1"
#: the requests a worker's kubelet makes: its client certificate (renewed with its current one, approved by
#: the controller-manager) and its serving certificate (approved and signed by gitops)
WORKER_SIGNERS = {"client": ("kubernetes.io/kube-apiserver-client-kubelet", ("client auth",)),
                  "serving": ("kubernetes.io/kubelet-serving", ("server auth",))}
USAGE_OF = {"kubernetes.io/kube-apiserver-client-kubelet": ExtendedKeyUsageOID.CLIENT_AUTH,
            "kubernetes.io/kubelet-serving": ExtendedKeyUsageOID.SERVER_AUTH}


def _sign_when_asked(ws: Workspace, kind: str, timeout: float = 120) -> None:
    """Once the plan shows the worker's kubelet asking for its `kind` certificate, apply (gitops signs it)."""
    deadline = time.monotonic() + timeout
    while f"asks for a kubelet {kind} certificate" not in ws.plan().stdout:
        if time.monotonic() > deadline:
            raise CrashPointError(f"{WORKER}'s kubelet asked for no {kind} certificate in {timeout:.0f}s")
        time.sleep(1)
    ws.apply()


def _join_worker(ws: Workspace, cluster: str = "team-a") -> None:
    """lab-worker-1 (its own network namespace and containerd, the real kubelet and kube-proxy)
    joins `cluster` as `tests/test_workers_lab.py` does it: `gitops join` with a bootstrap token, gitops
    signing the kubelet's client certificate, then its serving one; until its Node is Ready."""
    if ws.worker is not None:
        return
    flags = ws.gitops("lab", "worker", "--dir", str(ws.lab.dir)).stdout.split()
    printed = ws.gitops("join-token", "create", str(ws.repo), "--state-dir", str(ws.state), "--cluster", cluster,
                        "--ttl", "4h").stdout.strip().splitlines()[-1].split()
    ws.worker = ws.dir / "worker"
    join = subprocess.Popen([GITOPS, "lab", "exec", "--dir", str(ws.lab.dir), WORKER, "--", GITOPS, *printed[1:],
                             *flags, "--dir", str(ws.worker), "--timeout", "180"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _sign_when_asked(ws, "client")
        said, _ = join.communicate(timeout=200)
        if join.returncode != 0:
            raise CrashPointError(f"gitops join exited {join.returncode}:\n{said}")
    finally:
        if join.poll() is None:
            join.kill()
            join.wait()
    _sign_when_asked(ws, "serving")
    ws.kubectl(cluster, "wait", "--for=condition=Ready", f"node/{WORKER}", "--timeout=120s")


def _node_kubectl(ws: Workspace, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    """kubectl as the worker's kubelet: its kubeconfig and the client certificate the cluster signed it."""
    proc = subprocess.run([str(kubebin.kubectl()), "--kubeconfig", str(ws.worker / "kubelet.kubeconfig"),
                           "--request-timeout=10s", *args], capture_output=True, text=True, timeout=60, input=stdin)
    if proc.returncode != 0:
        raise CrashPointError(f"kubectl (as {WORKER}) {' '.join(args)} exited {proc.returncode}: "
                              f"{proc.stdout}{proc.stderr}")
    return proc


def worker_requests(ws: Workspace, round_: int) -> str:
    """Round i: the worker's kubelet asks for a new client and a new serving certificate, as its certificate
    manager does when it rotates them (a kubelet does so at 70-90% of their life, which no lab can wait
    for: so the requests are made here, with the node's own credentials, a new key each, and the subject,
    names, signer and usages the kubelet sends). Waits until the plan signs both."""
    node_ip = next(f.split("=", 1)[1] for f in ws.gitops("lab", "worker", "--dir", str(ws.lab.dir)).stdout.split()
                   if f.startswith("--node-ip="))
    for kind, (signer, usages) in WORKER_SIGNERS.items():
        key = ec.generate_private_key(ec.SECP256R1())
        builder = x509.CertificateSigningRequestBuilder().subject_name(x509.Name([
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:nodes"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"system:node:{WORKER}")]))
        if kind == "serving":
            builder = builder.add_extension(x509.SubjectAlternativeName([
                x509.DNSName(WORKER), x509.IPAddress(ipaddress.ip_address(node_ip))]), critical=False)
        pem = builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)
        csr = {"apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
               "metadata": {"name": f"crash-{round_ + 1}-{kind}", "labels": {"crash-points": "worker"}},
               "spec": {"request": base64.b64encode(pem).decode(), "signerName": signer,
                        "usages": ["digital signature", "key encipherment", *usages]}}
        _node_kubectl(ws, "create", "-f", "-", stdin=json.dumps(csr))
    deadline = time.monotonic() + 60  # the controller-manager approves the client request first
    while sum(a["kind"] == "sign-certificate-request" for a in ws.plan_json()["actions"]) < len(WORKER_SIGNERS):
        if time.monotonic() > deadline:
            raise CrashPointError(f"round {round_ + 1}: the plan does not sign both requests:\n{ws.plan().stdout}")
        time.sleep(1)
    return ""


def worker_certificates_issued(ws: Workspace) -> list[str]:
    """Problems with the requests `worker_requests` made: each must hold a certificate of the cluster's CA
    for its own key, for the node, with its signer's usage (a serving one approved too)."""
    record = LocalDirStore(ws.state).load().clusters["team-a"]
    issuers = {x509.load_pem_x509_certificate(c.encode()).subject
               for c in (authority(record.authorities, "cluster").cert_pem,
                         *((record.rotation.other["cluster"].cert_pem,)
                           if record.rotation is not None and "cluster" in record.rotation.other else ()))}
    listed = json.loads(ws.kubectl("team-a", "get", "csr", "-l", "crash-points=worker", "-o", "json").stdout)
    out = []
    for item in listed["items"]:
        name, status = item["metadata"]["name"], item.get("status") or {}
        if not status.get("certificate"):
            out.append(f"certificate request {name} holds no certificate")
            continue
        cert = x509.load_pem_x509_certificate(base64.b64decode(status["certificate"]))
        request = x509.load_pem_x509_csr(base64.b64decode(item["spec"]["request"]))
        usage = USAGE_OF[item["spec"]["signerName"]]
        if cert.public_key().public_numbers() != request.public_key().public_numbers():
            out.append(f"{name}: the certificate is not for the requested key")
        if cert.issuer not in issuers:
            out.append(f"{name}: issued by {cert.issuer.rfc4514_string()}, not the cluster CA")
        if cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value != f"system:node:{WORKER}":
            out.append(f"{name}: subject {cert.subject.rfc4514_string()}")
        try:
            usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        except x509.ExtensionNotFound:
            usages = []
        if usage not in usages:
            out.append(f"{name}: no {usage.dotted_string} usage")
        if not any(c.get("type") == "Approved" for c in status.get("conditions", ())):
            out.append(f"{name}: signed but not approved")
    if not listed["items"]:
        out.append("no certificate request of the worker found")
    return out


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("leaf-renewal", _renewal),
    Scenario("etcd-image", _etcd_image, start=_etcd_start),
    Scenario("node-replacement", _replace_node),
    Scenario("ca-rotation", _ca_rotation),
    Scenario("scale-3-1-3", _scale),
    Scenario("worker-certificate-signing", worker_requests, start=_join_worker, check=worker_certificates_issued),
    Scenario("minor-upgrade", _minor_upgrade, start=_upgrade_start, cluster_of=upgrade_cluster),
)}


def kill_points(actions: list[dict], timings: dict[int, float] | None = None,
                first_start: float | None = None) -> list[KillPoint]:
    """After every action, then inside every gated action and every signing (approved, then signed: two
    writes): half its measured duration after it started (`timings`: index -> seconds from a run that went
    through; `first_start`: when action 1 started, from the process start; 1 s when not measured), and for
    a gated container start also once its new container runs (`until`, set by `_aimed` when the point's
    turn comes)."""
    points = [KillPoint(after=k) for k in range(1, len(actions) + 1)]
    for j, action in enumerate(actions, start=1):
        if is_gated(action) or action["kind"] == "sign-certificate-request":
            took = (timings or {}).get(j, 2.0)
            delay = took / 2 + ((first_start or 0.0) if j == 1 else 0.0)
            points.append(KillPoint(inside=j, delay=round(delay, 1)))
            if action["kind"] in ("create-container", "recreate-container") and action.get("component"):
                points.append(KillPoint(inside=j, what=f"its new {action['component']} runs"))
    return points


def _aimed(ws: Workspace, point: KillPoint, actions: list[dict]) -> KillPoint:
    """A point inside a container's start made concrete now: kill once a new container of that component
    runs in that node's pod (the action waits for its health or /readyz then), not after a delay."""
    if not point.what or not point.inside:
        return point
    action = actions[point.inside - 1]
    node, component = action["node"], action["component"]
    before = running_containers(ws, node, component)
    return dataclasses.replace(point, until=lambda: bool(running_containers(ws, node, component) - before))


def explore(ws: Workspace, scenario: Scenario, log: Callable[[str], None] = print,
            max_rounds: int = 300, limit: int | None = None, outcomes: list[Outcome] | None = None,
            stride: int = 1, skip: Collection[tuple[str, str, str]] = ()) -> list[Outcome]:
    """Every crash point of `scenario`'s plan, of each variant (after each action, then inside each gated
    action): one round per point, each from where the round before left the lab; a round whose variant has
    no point left is applied without a crash. `limit`: stop after that many points; `stride`: only every
    stride-th point of each list (a sample spread over the plan); `skip`: (variant, `point_key`, action
    text) of the points already explored (an exploration resumed; the action text ties a point to the
    same action of the same plan). Each outcome is also appended to `outcomes` as it comes
    (kept when interrupted)."""
    scenario.start(ws)
    done: list[Outcome] = []
    outcomes = done if outcomes is None else outcomes
    queue: dict[str, list[KillPoint]] = {}
    inside_queued: set[str] = set()
    measured: dict[str, tuple[dict[int, float], float | None]] = {}
    for round_ in range(max_rounds):
        if limit is not None and len(done) >= limit:
            break
        variant = scenario.prepare(ws, round_)
        actions = ws.plan_json()["actions"]

        def fresh(point: KillPoint) -> bool:
            return (variant, point.key, action_text(actions[point.action - 1])) not in skip

        if variant not in queue:
            afters = [KillPoint(after=k) for k in range(1, len(actions) + 1)][::stride]
            queue[variant] = [p for p in afters if fresh(p)]
            inside_left = any(fresh(p) for p in kill_points(actions)[len(actions):][::stride])
            if afters and afters[-1] not in queue[variant] and inside_left:  # explored before: the last one
                queue[variant].append(afters[-1])  # again, which measures each action's time for inside points
        queue[variant] = [p for p in queue[variant] if p.action <= len(actions)]  # a shorter plan this round
        if not queue[variant] and variant not in inside_queued:
            timings, first_start = measured.get(variant, ({}, None))
            queue[variant] = [p for p in [p for p in kill_points(actions, timings, first_start) if p.inside][::stride]
                              if fresh(p)]
            inside_queued.add(variant)
        if not queue[variant]:
            if inside_queued >= set(queue) and not any(queue.values()):
                break
            log(f"{scenario.name} round {round_ + 1} ({variant}): no point left in it, applied without a crash")
            settle(ws)
            continue
        point = _aimed(ws, queue[variant].pop(0), actions)
        log(f"{scenario.name} round {round_ + 1} ({variant or 'plan'} of {len(actions)} actions): "
            f"kill {point.label}")
        cluster = scenario.cluster_of(ws) if scenario.cluster_of else scenario.cluster
        outcome = run_crash_point(ws, cluster, scenario.name, variant, point,
                                  f"crash-{scenario.name}-{round_ + 1}", log)
        outcome.problems += scenario.check(ws)
        if outcome.timings:  # what each action took, from every run of this plan (a stride skips some)
            timings, first_start = measured.get(variant, ({}, None))
            timings.update(outcome.timings)
            measured[variant] = (timings, first_start if first_start is not None else outcome.first_start)
        done.append(outcome)
        if outcomes is not done:
            outcomes.append(outcome)
        log(f"    {outcome.outcome} ({outcome.seconds:.1f}s)")
        if not outcome.ok and not recover(ws, outcome, log):
            log(f"    could not converge after the failure, stopping {scenario.name}")
            break
    return done


def recover(ws: Workspace, outcome: Outcome, log: Callable[[str], None] = print, applies: int = 2) -> bool:
    """After a failed crash point: up to `applies` more applies (`settle`) until the lab converges, so the
    next round starts from a converged lab; the outcome's problems say whether one did."""
    for attempt in range(1, applies + 1):
        try:
            settle(ws)
        except CrashPointError as err:
            log(f"    further apply {attempt}: not converged: {str(err).splitlines()[0]}")
            continue
        outcome.problems.append(f"(a further apply converged: apply {attempt} after the rerun)")
        return True
    outcome.problems.append(f"(not converged after {applies} further applies either)")
    return False
