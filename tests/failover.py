"""Failover of a cluster's virtual IP between two public lab machines (issue #44.2): the world and the
scenarios, each returning its figures; shared by tests/test_failover_lab.py (which asserts on them) and
benchmarks/failover.py (which repeats them and prints them).

The world: two private and two public lab machines (network namespaces on the lab bridge); the example's
team-a reduced to one controlplane node and given a second ingress node, so it gets a virtual IP from the
lab's pool (`gitops lab example-repo` writes it into gitops.yaml). Real keepalived (VRRP, unicast) beside
real haproxy in each ingress pod, real etcd and kube-apiserver. During each scenario the probe
(`gitops.lab.probe.Probe`, 1 s timeout) reads through the virtual IP every 100 ms and a `Writer` creates a
ConfigMap every 200 ms; every ConfigMap answered 201 must be there afterwards.
"""
from __future__ import annotations

import subprocess
import time
from pathlib import Path

from repo_helpers import add_node, team_a_only
from test_apply_lab import World, kubeconfig_file, wait_ready, world_gitops

from gitops import lab as labmod
from gitops.lab import network
from gitops.lab.probe import Probe, Writer
from gitops.state import LocalDirStore

CLUSTER = "team-a"
INGRESS = ("team-a-ingress", "team-a-ingress-2")


class FailoverWorld(World):
    def virtual_ip(self) -> str:
        return LocalDirStore(self.state).load().clusters[CLUSTER].virtual_ip

    def public_machines(self) -> list[network.Machine]:
        return [hv.machine() for hv in self.lab.hypervisors if hv.public]

    def holders(self) -> list[str]:
        """The public machines whose eth0 holds the virtual IP (asked in each one's own namespace)."""
        address = self.virtual_ip()
        out = []
        for m in self.public_machines():
            shown = subprocess.run(["ip", "-n", m.netns, "-o", "addr", "show", "dev", "eth0"], capture_output=True,
                                   text=True).stdout
            if f" {address}/" in shown:
                out.append(m.name)
        return out

    def wait_holder(self, timeout: float = 30, not_: str = "") -> str:
        """The one machine (other than `not_`) that holds the address, once there is exactly one."""
        deadline = time.monotonic() + timeout
        while True:
            held = [h for h in self.holders() if h != not_]
            if len(held) == 1:
                return held[0]
            assert time.monotonic() < deadline, f"holders: {self.holders()}"
            time.sleep(0.05)


def make_world(base: Path, subnet: str) -> FailoverWorld:
    lab = labmod.up(base / "lab", hypervisors=4, public=2, subnet=subnet)
    repo = base / "repo"
    world_gitops("lab", "example-repo", "--ingress-nodes", "1", "--dir", str(base / "lab"), str(repo))
    team_a_only(repo, controlplane=1)
    add_node(repo, CLUSTER, INGRESS[1], "controlplane-ingress")
    world = FailoverWorld(base, repo, base / "state", lab)
    world.apply()
    wait_ready(world, CLUSTER)
    return world


class Under:
    """The probe (1 s timeout: a failover is measured in tenths) and the writer, through the virtual IP."""

    def __init__(self, world: FailoverWorld, name: str):
        kubeconfig = kubeconfig_file(world, CLUSTER).read_text()
        self.probe = Probe(kubeconfig, timeout=1.0)
        self.writer = Writer(kubeconfig, f"failover-{name}-{int(time.time() * 1000)}")
        self.probe.start()
        self.writer.start()

    def stop(self) -> dict[str, object]:
        counts, writes = self.probe.stop(), self.writer.stop()
        return {"requests": counts.requests, "failed_requests": counts.failures, "outage_s": counts.longest_outage,
                "writes_acknowledged": len(writes.acknowledged), "writes_failed": writes.failures,
                "writes_lost": len(self.writer.missing(writes)),
                "errors": list(counts.errors[:10]) + list(writes.errors[:10])}


def power_off_holder(world: FailoverWorld) -> dict[str, object]:
    """The machine holding the virtual IP powered off under the probe: how long until another holds it and the
    API answers through it again; then powered on, and the next apply restores its ingress node (its
    haproxy and keepalived) under the probe too."""
    holder = world.wait_holder()
    under = Under(world, "poweroff")
    figures: dict[str, object] = {"machine": holder}
    try:
        time.sleep(2)
        labmod.power_off(world.lab.dir, holder)
        cut = time.monotonic()
        figures["to"] = world.wait_holder(not_=holder)
        figures["takeover_s"] = round(time.monotonic() - cut, 2)
        time.sleep(5)
    finally:
        figures.update(under.stop())
    labmod.power_on(world.lab.dir, holder)
    under = Under(world, "poweron")
    try:
        started = time.monotonic()
        applied = world.apply().stdout
        figures["restore_apply_s"] = round(time.monotonic() - started, 1)
        time.sleep(3)
    finally:
        back = under.stop()
    figures["restore_output"] = applied
    figures.update({f"restore_{k}": v for k, v in back.items()})
    figures["holders_after"] = world.holders()
    return figures


def partition_holder(world: FailoverWorld) -> dict[str, object]:
    """The machine holding the address cut off from every other (its processes run on): the other takes the
    address within a second, while the cut-off one still holds it too, until its health check fails (its
    haproxy reaches no API server: about 4 s) and it lets the address go. The cut is healed then. Figures: the
    takeover, when the cut-off machine let go, how long after the heal one machine holds the address (seen 10
    times running, each time asked in every ingress machine's namespace), which one, and how many hold it over
    the 3 s after that.

    (Healed before the cut-off machine lets go, VRRP settles the two masters by address, the higher staying,
    and the late health check can then move the address once more: keepalived's log shows both.)"""
    holder = world.wait_holder()
    labmod.partition(world.lab.dir, holder)
    try:
        cut = time.monotonic()
        figures: dict[str, object] = {"machine": holder, "to": world.wait_holder(timeout=10, not_=holder),
                                      "takeover_s": round(time.monotonic() - cut, 2),
                                      "holders_while_cut": world.holders()}
        while holder in world.holders() and time.monotonic() - cut < 20:
            time.sleep(0.1)
        figures["let_go_after_s"] = round(time.monotonic() - cut, 2)
    finally:
        labmod.heal(world.lab.dir, holder)
    healed = time.monotonic()
    streak, settled = 0, None
    while streak < 10 and time.monotonic() - healed < 10:
        if len(world.holders()) == 1:
            settled = settled or time.monotonic()
            streak += 1
        else:
            streak, settled = 0, None
        time.sleep(0.05)
    figures["one_holder_after_s"] = round((settled or time.monotonic()) - healed, 2)
    figures["holder_after_heal"] = world.holders()
    seen = []
    for _ in range(15):  # and it stays one
        seen.append(len(world.holders()))
        time.sleep(0.2)
    figures["holder_counts_after_heal"] = sorted(set(seen))
    return figures


def public(figures: dict[str, object]) -> dict[str, object]:
    """The figures without the long texts (for printing)."""
    return {k: v for k, v in figures.items() if not k.endswith("_output") and not k.endswith("errors")}
