"""Changing a live cluster's ingress under load (issue #44.3), on real haproxy, keepalived (VRRP), etcd and
kube-apiserver in the lab's machines (network namespaces on the lab bridge).

team-a starts with two controlplane nodes (its API servers roll one at a time when the virtual IP joins their
serving certificate: a single one would leave the API away while it restarts) and one ingress node. In order,
each under the probe (a fresh TLS connection and a read every 100 ms, `gitops.lab.probe`) and a writer (a
ConfigMap every 200 ms, every acknowledged one there afterwards), through the endpoint the clients use at that
moment:

1. a second ingress node: the plan says the endpoint moves to the virtual IP; the old address (the first
   ingress node's) answers all along and after; the virtual IP answers once applied;
2. the ingress node that does not hold the address moves to a third public hypervisor: the holder's
   keepalived configuration (its unicast peer) changes and is reloaded in place, so the address stays where
   it is, and afterwards exactly one machine holds it (a keepalived still speaking to the old peer would
   leave the new one a master too);
3. a third controlplane node: both ingress nodes' haproxy configurations change (a new backend), each
   haproxy replaced beside itself.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml
from failover import FailoverWorld
from faults import lab_world
from repo_helpers import add_node, team_a_only
from test_apply_lab import assert_converged, kubeconfig_file, wait_ready, world_gitops

from gitops import lab as labmod
from gitops.cri.client import CRIClient
from gitops.lab.probe import Probe, Writer
from gitops.pods import MANAGED, MANAGER, NODE
from gitops.state import LocalDirStore

pytestmark = pytest.mark.lab("ingress")

SUBNET = "127.0.48"
CLUSTER = "team-a"
FIRST, SECOND = "team-a-ingress", "team-a-ingress-2"


class IngressWorld(FailoverWorld):
    def machine_at(self, ip: str) -> str:
        """The public lab machine (`lab-hv-N`) at `ip`."""
        return next(m.name for m in self.public_machines() if m.ip == ip)

    def machine_of(self, node: str) -> str:
        """The lab machine of the hypervisor `node` is placed on."""
        return self.machine_at(self.hypervisors()[self.hypervisors_of(node)].ip_address)

    def hypervisors_of(self, node: str) -> str:
        return LocalDirStore(self.state).load().nodes[node].hypervisor

    def container_id(self, node: str, component: str) -> str:
        """The running `component` container of `node`'s pod, read over CRI."""
        machine = next(hv for hv in self.lab.hypervisors if hv.name == self.machine_of(node))
        with CRIClient(machine.local().cri_endpoint()) as client:
            return next(c.id for c in client.list_containers({MANAGED: MANAGER, NODE: node})
                        if c.name == component and c.state.value == "running")

    def add_node(self, name: str, role: str, hypervisor: str = "") -> None:
        add_node(self.repo, CLUSTER, name, role, hypervisor)


def make_world(base: Path, subnet: str) -> IngressWorld:
    lab = labmod.up(base / "lab", hypervisors=5, public=3, subnet=subnet)
    repo = base / "repo"
    world_gitops("lab", "example-repo", "--ingress-nodes", "1", "--dir", str(base / "lab"), str(repo))
    team_a_only(repo, controlplane=2)
    world = IngressWorld(base, repo, base / "state", lab)
    world.apply()
    wait_ready(world, CLUSTER)
    return world


@pytest.fixture(scope="module")
def world():
    yield from lab_world("gitops-ingress-", SUBNET, make_world)


def under_load(world: IngressWorld, kubeconfig: str, name: str, change) -> str:
    """`change()` (an apply) while the probe and the writer go through `kubeconfig`'s server: no request
    failed, every acknowledged write there. Returns the apply's output."""
    probe, writer = Probe(kubeconfig), Writer(kubeconfig, f"ingress-{name}")
    probe.start()
    writer.start()
    try:
        time.sleep(1)
        output = change()
        time.sleep(3)
    finally:
        counts, writes = probe.stop(), writer.stop()
    print(f"{name}: {counts.requests} requests, {counts.failures} failed; {len(writes.acknowledged)} writes, "
          f"{writes.failures} failed")
    assert counts.requests > 20 and len(writes.acknowledged) > 10, (counts, writes)
    assert (counts.failures, counts.outages, writes.failures) == (0, 0, 0), (counts.errors, writes.errors, output)
    assert writer.missing(writes) == []
    return output


def test_a_second_ingress_node_moves_the_endpoint_to_a_virtual_ip_and_the_old_address_keeps_answering(world):
    old = kubeconfig_file(world, CLUSTER).read_text()
    old_server = yaml.safe_load(old)["clusters"][0]["cluster"]["server"]
    assert world.virtual_ip() == ""
    world.add_node(SECOND, "controlplane-ingress")
    plan = world.plan().stdout
    assert f"Cluster {CLUSTER}'s API endpoint moves from {old_server} to https://10.249.48.2" in plan, plan
    under_load(world, old, "second", lambda: world.apply().stdout)
    address = world.virtual_ip()
    assert address.startswith("10.249.48.2"), address
    new = kubeconfig_file(world, CLUSTER).read_text()
    assert yaml.safe_load(new)["clusters"][0]["cluster"]["server"] == f"https://{address}:6443"
    assert world.machine_of(FIRST) != world.machine_of(SECOND)
    world.wait_holder()
    # both endpoints answer: the old one for the clients the plan named, the new one for everyone else
    under_load(world, old, "old-after", lambda: "")
    under_load(world, new, "vip-after", lambda: "")
    assert_converged(world)  # (a controller-manager or scheduler that lost its Lease in the roll aside)


def test_moving_the_ingress_node_that_does_not_hold_the_address_reloads_the_holder_in_place(world):
    holder = world.wait_holder()
    staying, moving = (FIRST, SECOND) if world.machine_of(FIRST) == holder else (SECOND, FIRST)
    keepalived = world.container_id(staying, "keepalived")
    used = {world.machine_of(n) for n in (FIRST, SECOND)}
    third = next(hv for hv in world.hypervisors().values() if hv.public and world.machine_at(hv.ip_address) not in used)
    world.add_node(moving, "controlplane-ingress", hypervisor=third.name)
    plan = json.loads(world.plan("-o", "json").stdout)
    steps = [(a["kind"], a["node"], a["component"], a["hypervisor"]) for a in plan["actions"]]
    reload = ("reload-container", staying, "keepalived", world.hypervisors_of(staying))
    assert reload in steps, steps
    assert ("recreate-container", staying, "keepalived", reload[3]) not in steps  # reloaded in place only
    assert steps.index(reload) < steps.index(("create-container", moving, "keepalived", third.name)), steps
    vip = kubeconfig_file(world, CLUSTER).read_text()
    output = under_load(world, vip, "move", lambda: world.apply().stdout)
    assert "reload container" in output
    assert world.machine_of(moving) == world.machine_at(third.ip_address)
    assert world.container_id(staying, "keepalived") == keepalived  # reloaded, not replaced
    assert world.holders() == [holder]
    for _ in range(20):  # and no one else takes it: the holder speaks to its new peer
        time.sleep(0.25)
        assert world.holders() == [holder]
    assert_converged(world)  # (a controller-manager or scheduler that lost its Lease in the roll aside)


def test_a_new_controlplane_node_changes_every_haproxy_configuration_with_no_failed_request(world):
    haproxies = {n: world.container_id(n, "haproxy") for n in (FIRST, SECOND)}
    world.add_node("team-a-cp-3", "controlplane")
    plan = world.plan().stdout
    assert "file haproxy.cfg: content changed" in plan, plan
    vip = kubeconfig_file(world, CLUSTER).read_text()
    under_load(world, vip, "backend", lambda: world.apply().stdout)
    assert all(world.container_id(n, "haproxy") != old for n, old in haproxies.items())
    assert len(world.holders()) == 1
    assert_converged(world)  # (a controller-manager or scheduler that lost its Lease in the roll aside)
