"""Network faults on a lab of machines of their own (issue #43.4): the world and the scenarios, each
returning its figures; shared by tests/test_faults_lab.py (which asserts on them) and
benchmarks/faults.py (which prints them).

The world: one public and three private lab hypervisors, every one reached over its mTLS front (so a
partition cuts gitops off from it too, as on real machines), the example's team-a with its three
members pinned one per private hypervisor, the ingress on the public one. During each scenario the
API probe (`gitops.lab.probe.Probe`) reads through the ingress every 100 ms and a `Writer` creates a
ConfigMap every 200 ms; every ConfigMap answered 201 must be there afterwards.
"""
from __future__ import annotations

import datetime as dt
import http.client
import json
import re
import shutil
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml
from conftest import running_lab
from test_apply_lab import World, etcd_client_files, etcd_leader, etcdctl, kubeconfig_file, wait_ready, world_gitops

from gitops import lab as labmod
from gitops.lab.probe import Probe, Writer
from gitops.state import LocalDirStore

CLUSTER = "team-a"
MEMBERS = ("team-a-cp-1", "team-a-cp-2", "team-a-cp-3")
PRIVATE = ("hv-private-1", "hv-private-2", "hv-private-3")


class FaultWorld(World):
    def placed(self) -> dict[str, str]:
        """team-a's members and the repo hypervisor each is recorded on."""
        nodes = LocalDirStore(self.state).load().nodes
        return {n: nodes[n].hypervisor for n in MEMBERS}

    def lab_name(self, hypervisor: str) -> str:
        """The lab machine behind the repo's Hypervisor `hypervisor` (by its address)."""
        ip = self.hypervisors()[hypervisor].ip_address
        return next(hv.name for hv in self.lab.hypervisors if hv.ip == ip)

    def endpoints(self, nodes: tuple[str, ...] | list[str]) -> dict[str, str]:
        """node -> `https://ip:port` of its etcd client endpoint."""
        records, hvs = LocalDirStore(self.state).load().nodes, self.hypervisors()
        return {n: f"https://{hvs[records[n].hypervisor].ip_address}:{records[n].ports['etcd-client']}"
                for n in nodes}

    def election_log(self, nodes: list[str], since: str) -> list[str]:
        """What the etcd members of `nodes` logged of elections from `since` (an ISO time prefix) on: raft's
        pre-candidate, candidate, vote and leader lines, `node time message`, in time order."""
        records, hvs = LocalDirStore(self.state).load().nodes, self.hypervisors()
        lines = []
        for node in nodes:
            logs = Path(hvs[records[node].hypervisor].data_dir) / CLUSTER / node / "logs"
            for path in sorted(logs.glob("etcd*.log")):
                for raw in path.read_text(errors="replace").splitlines():
                    found = re.search(r'"ts":"([^"]+)".*?"msg":"([^"]+)"', raw)
                    if found and found[1] >= since and "ReadIndex" not in found[2] and re.search(
                            r"candidate|MsgPreVote|MsgVote|leader|election|term|took too long|slow|stream|peer|dropped",
                            found[2]):
                        lines.append(f"{found[1][11:23]} {node} {found[2][:140]}")
        return sorted(lines, key=lambda line: line[:12])

    def etcd_tls(self) -> ssl.SSLContext:
        tls = etcd_client_files(self, CLUSTER, "fault-watch", "etcd-watch")
        context = ssl.create_default_context(cafile=str(tls / "ca.crt"))
        context.load_cert_chain(str(tls / "client.crt"), str(tls / "client.key"))
        return context


#: each machine's tmpfs for its node data: a member's WAL (64 MiB segments) and database fit many times over
DATA_TMPFS_MIB = 1024


def make_world(base: Path, subnet: str) -> FaultWorld:
    """The lab (4 machines, mTLS fronts), the example repo reduced to team-a on it, applied.

    Each machine's node data (etcd's WAL and database) is on a tmpfs of its own (`--data-tmpfs`), the
    dedicated disk etcd asks for. On the host's one disk, shared with the rest of the suite, an election
    that takes etcd about a second took 4-10 s: a survivor stepped raft on time (it granted every
    pre-vote within a millisecond) but what it sent the other survivor was held for 7 s and then
    delivered at once, as when etcd's raft loop waits on its disk before a follower's messages go out."""
    lab = labmod.up(base / "lab", hypervisors=4, public=1, remote=True, subnet=subnet,
                    data_tmpfs_mib=DATA_TMPFS_MIB)
    repo = base / "repo"
    world_gitops("lab", "example-repo", "--ingress-nodes", "1", "--dir", str(base / "lab"), str(repo))
    shutil.rmtree(repo / "clusters" / "team-b")
    names = {"hv-public-1": lab.hypervisors[0], **dict(zip(PRIVATE, lab.hypervisors[1:]))}
    for name, hv in names.items():  # every one over its mTLS front: a partition cuts gitops off too
        doc = labmod.hypervisor_document(labmod.LabHypervisor(**{**hv.__dict__, "name": name}))
        (repo / "hypervisors" / f"{name}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    nodes = repo / "clusters/team-a/nodes.yaml"
    docs = list(yaml.safe_load_all(nodes.read_text()))
    for doc in docs:
        if doc and doc["metadata"]["name"] in MEMBERS:
            doc["spec"]["hypervisor"] = PRIVATE[MEMBERS.index(doc["metadata"]["name"])]
    nodes.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    world = FaultWorld(base, repo, base / "state", lab)
    world.apply()
    return world


def member_ids(world: FaultWorld, nodes: tuple[str, ...] | list[str] = MEMBERS) -> dict[str, str]:
    """name -> member ID, as the members at `nodes` list them (any of them answers)."""
    endpoints = ",".join(world.endpoints(nodes).values())
    proc = etcdctl(world, CLUSTER, f"--endpoints={endpoints}", "member", "list", "-w", "json")
    assert proc.returncode == 0, proc.stderr
    return {m.get("name", ""): f"{int(m['ID']):x}" for m in json.loads(proc.stdout)["members"]}


class LeaderWatch(threading.Thread):
    """Every 100 ms, the leader each of `endpoints` names (its `/v3/maintenance/status`), or None when it did
    not answer: `(monotonic time, {endpoint: leader ID or None})` samples."""

    def __init__(self, endpoints: list[str], context: ssl.SSLContext):
        super().__init__(daemon=True, name="etcd-leader-watch")
        self.endpoints, self.context = endpoints, context
        self.samples: list[tuple[float, dict[str, int | None]]] = []
        self._stopping = threading.Event()

    def _leader(self, endpoint: str) -> int | None:
        host, port = endpoint.removeprefix("https://").rsplit(":", 1)
        conn = http.client.HTTPSConnection(host, int(port), context=self.context, timeout=0.5)
        try:
            conn.request("POST", "/v3/maintenance/status", "{}", {"Content-Type": "application/json"})
            response = conn.getresponse()
            return int(json.loads(response.read()).get("leader", 0)) if response.status == 200 else None
        except (OSError, http.client.HTTPException, ValueError):
            return None
        finally:
            conn.close()

    def run(self) -> None:
        while not self._stopping.wait(0.1):
            self.samples.append((time.monotonic(), {e: self._leader(e) for e in self.endpoints}))

    def stop(self) -> None:
        self._stopping.set()
        self.join(timeout=10)

    def timeline(self, since: float, until: float) -> list[str]:
        """The samples from just before `since` to `until` as `+seconds leader,leader` lines (- for no answer)."""
        return [f"{at - since:+.2f} " + ",".join("-" if v is None else format(v, "x")[-4:] for v in seen.values())
                for at, seen in self.samples if since - 0.3 <= at <= until]

    def new_leader_at(self, since: float, old: int) -> float | None:
        """When every endpoint first agreed on a leader other than `old` after `since`."""
        for at, seen in self.samples:
            if at >= since and len(set(seen.values())) == 1 and None not in seen.values() \
                    and next(iter(seen.values())) not in (0, old):
                return at
        return None


@dataclass
class Under:
    """A probe and a writer through the cluster's ingress, started together."""

    probe: Probe
    writer: Writer
    acknowledged: tuple[str, ...] = ()

    @classmethod
    def start(cls, world: FaultWorld, name: str) -> Under:
        kubeconfig = kubeconfig_file(world, CLUSTER).read_text()
        under = cls(Probe(kubeconfig), Writer(kubeconfig, f"fault-{name}-{int(time.time())}"))
        under.probe.start()
        under.writer.start()
        return under

    def stop(self) -> dict[str, object]:
        counts, writes = self.probe.stop(), self.writer.stop()
        self.acknowledged = writes.acknowledged
        missing = self.writer.missing(writes)
        return {"requests": counts.requests, "failed_requests": counts.failures, "outages": counts.outages,
                "writes_acknowledged": len(writes.acknowledged), "writes_failed": writes.failures,
                "writes_lost": len(missing), "lost": missing[:10],
                "errors": list(counts.errors[:10]) + list(writes.errors[:10]),
                "failure_stamps": [e.split()[0] for e in counts.errors + writes.errors],
                "failures_unstamped": counts.failures + writes.failures - len(counts.errors) - len(writes.errors),
                "request_timeout_s": max(self.probe.timeout, self.writer.timeout)}


def wait_members_healthy(world: FaultWorld, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while True:
        proc = etcdctl(world, CLUSTER, "endpoint", "health")
        if proc.returncode == 0:
            return
        assert time.monotonic() < deadline, proc.stdout + proc.stderr
        time.sleep(1)


def partition_member(world: FaultWorld, leader: bool) -> dict[str, object]:
    """Partition the machine of one member (the etcd leader's, or a follower's) from everything while the probe
    and the writer run; plan and apply while it is cut off; heal; apply until converged."""
    wait_ready(world, CLUSTER)
    wait_members_healthy(world)
    before = member_ids(world)
    old_leader = etcd_leader(world, CLUSTER)
    node = old_leader if leader else sorted(n for n in MEMBERS if n != old_leader)[0]
    hypervisor = world.placed()[node]
    machine = world.lab_name(hypervisor)
    survivors = [n for n in MEMBERS if n != node]
    watch = LeaderWatch(list(world.endpoints(survivors).values()), world.etcd_tls())
    watch.start()
    under = Under.start(world, "leader" if leader else "member")
    figures: dict[str, object] = {"node": node, "hypervisor": hypervisor, "machine": machine}
    try:
        time.sleep(2)
        asked = time.monotonic()
        figures["cut_at"] = time.strftime("%H:%M:%S")
        labmod.partition(world.lab.dir, machine)
        # the cut holds from its last rule on, which returns last: the election is timed from here, not from
        # when the rules were asked for (under a busy machine the nsenter/iptables runs take their time)
        cut = time.monotonic()
        figures["cut_took_s"] = round(cut - asked, 2)
        cut_utc = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=2)
        time.sleep(6)  # the ingress's health check takes its API server out; a new leader if it led
        planned = world.plan("--detailed-exitcode", check=False)
        figures["plan_exit"] = planned.returncode
        figures["plan_unknown"] = f"Unknown: hypervisor {hypervisor} is unreachable" in planned.stdout
        applied = world.gitops("apply", str(world.repo), "--state-dir", str(world.state), check=False,
                               timeout=600)
        figures["apply_exit"] = applied.returncode
        figures["apply_names_it"] = f"hypervisor {hypervisor} is unreachable" in applied.stderr
        figures["apply_output"] = applied.stdout[-3000:] + applied.stderr[-2000:]
        figures["members_while_cut"] = sorted(member_ids(world, survivors))
        labmod.heal(world.lab.dir, machine)
        healed = time.monotonic()
        figures["healed_at"] = time.strftime("%H:%M:%S")
        wait_members_healthy(world)
        wait_ready(world, CLUSTER)
        time.sleep(3)
    finally:
        labmod.heal(world.lab.dir, machine)
        watch.stop()
        figures.update(under.stop())
    at = watch.new_leader_at(cut, int(before[old_leader], 16))
    figures["leaderless_s"] = round(at - cut, 2) if leader and at is not None else None
    figures["elected_before_heal"] = at is not None and at < healed
    wall = time.time() - time.monotonic()
    figures["election_wall"] = (wall + cut, wall + (at if at is not None else healed))
    if leader:  # what the survivors said and logged meanwhile (each sample: the leader each names)
        figures["leader_samples"] = watch.timeline(cut, (at or cut + 10) + 0.5)
        until = (cut_utc + dt.timedelta(seconds=3 + (at or cut + 10) - cut)).strftime("%Y-%m-%dT%H:%M:%S.%f")
        figures["election_log"] = [line for line in world.election_log(survivors, cut_utc.strftime(
            "%Y-%m-%dT%H:%M:%S")) if line[:12] <= until[11:23]][:120]
    figures["partition_s"] = round(healed - cut, 1)
    converge(world)
    figures["members_replaced"] = sorted(set(before.items()) ^ set(member_ids(world).items()))
    return figures


def failures_outside_election(figures: dict[str, object]) -> list[str]:
    """The probe's and the writer's failures that the election does not explain: each is stamped when it was
    recorded, which is at most a request and its retry (each `request_timeout_s`) after it was sent, so one
    sent while the survivors had no leader (from the cut to the first sample naming a new one) is stamped
    before that leader's time plus twice the timeout and a second of slack. Stamps are `HH:MM:SS[.mmm]`
    local time; an unstamped failure (past the probe's error list) is never explained."""
    start, end = figures["election_wall"]  # type: ignore[misc]
    end += 2 * float(figures["request_timeout_s"]) + 1.0  # type: ignore[arg-type]
    day = 86400

    def of_day(t: float) -> float:
        local = time.localtime(t)
        return local.tm_hour * 3600 + local.tm_min * 60 + local.tm_sec + t % 1

    first, span = of_day(float(start)) - 1.0, float(end) - float(start) + 1.0  # the writer's stamps are whole seconds
    outside = []
    for stamp in figures["failure_stamps"]:  # type: ignore[union-attr]
        h, m, sec = stamp.split(":")
        if (int(h) * 3600 + int(m) * 60 + float(sec) - first) % day > span:
            outside.append(stamp)
    return outside + ["(unstamped)"] * int(figures["failures_unstamped"])  # type: ignore[arg-type]


def converge(world: FaultWorld, rounds: int = 3) -> list[str]:
    """Apply until the plan is empty (at most `rounds` applies); the apply outputs."""
    outputs = []
    for _ in range(rounds):
        if world.plan("--detailed-exitcode", check=False).returncode == 0:
            return outputs
        outputs.append(world.apply().stdout)
    planned = world.plan("--detailed-exitcode", check=False)
    assert planned.returncode == 0, "\n".join(outputs) + planned.stdout + planned.stderr
    return outputs


def power_cycle(world: FaultWorld) -> dict[str, object]:
    """Power off the machine of a follower member, apply (incomplete: it is unreachable), write meanwhile;
    power it on; the next apply brings its node back from the recorded state and its member rejoins with its
    data (the same member ID, nothing added or removed)."""
    wait_ready(world, CLUSTER)
    wait_members_healthy(world)
    before = member_ids(world)
    old_leader = etcd_leader(world, CLUSTER)
    node = sorted(n for n in MEMBERS if n != old_leader)[-1]
    hypervisor = world.placed()[node]
    machine = world.lab_name(hypervisor)
    under = Under.start(world, "power")
    figures: dict[str, object] = {"node": node, "hypervisor": hypervisor, "machine": machine}
    try:
        time.sleep(2)
        labmod.power_off(world.lab.dir, machine)
        off = time.monotonic()
        time.sleep(4)
        applied = world.gitops("apply", str(world.repo), "--state-dir", str(world.state), check=False, timeout=600)
        figures["apply_while_off_exit"] = applied.returncode
        figures["apply_while_off_names_it"] = f"hypervisor {hypervisor} is unreachable" in applied.stderr
        labmod.power_on(world.lab.dir, machine)
        figures["off_s"] = round(time.monotonic() - off, 1)
        started = time.monotonic()
        back = world.gitops("apply", str(world.repo), "--state-dir", str(world.state), check=False, timeout=600)
        figures["apply_back_exit"] = back.returncode
        figures["apply_back_s"] = round(time.monotonic() - started, 1)
        figures["apply_back_output"] = back.stdout[-4000:] + back.stderr[-2000:]
        figures["member_changes_planned"] = [line.strip() for line in back.stdout.splitlines()
                                             if "etcd member" in line]
        wait_members_healthy(world)
        wait_ready(world, CLUSTER)
        time.sleep(3)
    finally:
        if not any(p.alive() for p in labmod.info(world.lab.dir).processes if p.hypervisor == machine):
            labmod.power_on(world.lab.dir, machine)
        figures.update(under.stop())
    converge(world)
    figures["members_replaced"] = sorted(set(before.items()) ^ set(member_ids(world).items()))
    # its member has the data: a serializable read at that member alone sees the last acknowledged write
    endpoint = world.endpoints([node])[node]
    keys = etcdctl(world, CLUSTER, f"--endpoints={endpoint}", "get", "--prefix", "/registry/configmaps/default/",
                   "--keys-only", "--consistency=s")
    assert keys.returncode == 0, keys.stderr
    there = {line.rsplit("/", 1)[-1] for line in keys.stdout.split()}
    figures["writes_missing_on_member"] = len([n for n in under.acknowledged if n not in there])
    return figures


def public(figures: dict[str, object]) -> dict[str, object]:
    """The figures without the long texts (for printing)."""
    return {k: v for k, v in figures.items() if not k.endswith("_output") and k != "errors"}


def lab_world(prefix: str, subnet: str, make: Callable[[Path, str], World]) -> Iterator[World]:
    """A module fixture's body: the world `make` builds in a fresh temp dir on `subnet`, yielded; then the lab
    down, the dir removed, and none of the subnet's namespaces left on the host."""
    try:
        with running_lab(prefix) as (base, _):
            yield make(base, subnet)
    finally:
        assert lab_leftovers(subnet) == []


def lab_leftovers(subnet: str) -> list[str]:
    """This subnet's namespaces still on the host."""
    third = subnet.split(".")[2]
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(f"gitops-0-{third}-")]
