"""A cluster's API survives the loss of a public hypervisor (issue #44.1, #44.2, #44.5): two ingress nodes on
two public lab machines behind a virtual IP that keepalived (VRRP) moves between them.

The world and the scenarios are `failover.py`'s (shared with benchmarks/failover.py): each public machine in
turn holds the address and is powered off under the probe (the API answers through the address again within
3 s, no acknowledged write lost), powered on (the next apply restores its ingress node with no failed
request); then the holder is partitioned and healed (afterwards exactly one machine holds the address, seen
from every ingress machine).
"""
from __future__ import annotations

import pytest
import yaml
from failover import CLUSTER, INGRESS, FailoverWorld, make_world, partition_holder, power_off_holder, public
from faults import lab_world
from test_apply_lab import kubeconfig_file

from gitops.state import LocalDirStore

pytestmark = pytest.mark.lab("failover")

SUBNET = "127.0.46"


@pytest.fixture(scope="module")
def world():
    yield from lab_world("gitops-failover-", SUBNET, make_world)


def test_each_public_machine_in_turn_dies_and_the_api_answers_through_the_virtual_ip(world: FailoverWorld) -> None:
    address = world.virtual_ip()
    assert address.startswith("10.249.46.2"), address  # the lab's pool, 10.249.46.200-249
    server = yaml.safe_load(kubeconfig_file(world, CLUSTER).read_text())["clusters"][0]["cluster"]["server"]
    assert server == f"https://{address}:6443"
    records = LocalDirStore(world.state).load().nodes
    assert {records[n].hypervisor for n in INGRESS} == {"hv-public-1", "hv-public-2"}
    died = []
    for _ in range(2):
        figures = power_off_holder(world)
        print("power off the holder:", public(figures), *figures["errors"], *figures["restore_errors"],
              sep="\n  ")
        died.append(figures["machine"])
        assert figures["outage_s"] <= 3.0, figures
        assert (figures["writes_lost"], figures["restore_writes_lost"]) == (0, 0), figures
        assert figures["writes_acknowledged"] > 10, figures
        # powered on again: its haproxy and keepalived come back with no failed request, and the address
        # stays where it went (nopreempt)
        assert "keepalived" in figures["restore_output"], figures["restore_output"]
        assert (figures["restore_failed_requests"], figures["restore_writes_failed"]) == (0, 0), figures
        assert figures["holders_after"] == [figures["to"]], figures
        assert world.plan("--detailed-exitcode", check=False).returncode == 0
    assert sorted(died) == sorted(m.name for m in world.public_machines())  # each one in turn


def test_after_a_partition_heals_exactly_one_machine_holds_the_virtual_ip(world: FailoverWorld) -> None:
    figures = partition_holder(world)
    print("partition the holder:", figures)
    assert figures["takeover_s"] <= 3.0, figures
    assert figures["let_go_after_s"] <= 10.0, figures  # the cut-off machine's health check
    # the address stays where it went: the machine that comes back is a backup
    assert figures["one_holder_after_s"] <= 1.0 and figures["holder_after_heal"] == [figures["to"]], figures
    assert figures["holder_counts_after_heal"] == [1], figures
