"""Retiring and losing hypervisors (issue #29.3, #29.4) on the real team-a.

A lab of one public and three private containerd hypervisors (the example's two private ones and
hv-private-3), team-a's three members spread over them. A drained hypervisor hands its member over
learner-first (the new member added from another hypervisor as a learner and promoted, its new API
server ready; then the old API server leaves the ingress and the old member is removed) under the
API probe: no request fails. A hypervisor holding two of the
three members dies for good (its pods stopped, its containerd killed); marked lost, the plan says
which field to set; with spec.recovery.forceNewClusterFrom the survivor's etcd is rebuilt with
--force-new-cluster, the two others join again from the one private hypervisor left, and a ConfigMap
written before the loss is still there. team-a's etcd has a 32 MiB quota: filled until etcd refuses
writes (NOSPACE), then emptied and compacted, the plan defragments its members one at a time and
clears the alarm, and writes go through again. Each test brings about what it builds on, so any runs
alone.
"""
from __future__ import annotations

import json
import shutil

import pytest
import yaml
from conftest import running_lab
from test_apply_lab import (
    World,
    assert_converged,
    etcd_members,
    etcdctl,
    kubectl,
    under_probe,
    wait_ready,
    world_gitops,
)

pytestmark = pytest.mark.lab("recovery")

SUBNET = "127.0.34"
MEMBERS = ("team-a-cp-1", "team-a-cp-2", "team-a-cp-3")
QUOTA = 32 << 20  # team-a's spec.etcd.quotaBackendBytes: small, so the upkeep test fills it quickly


class Recovery(World):
    def placed(self) -> dict[str, str]:
        """team-a's members and the hypervisor each is recorded on."""
        nodes = json.loads((self.state / "state.json").read_text())["nodes"]
        return {n: nodes[n]["hypervisor"] for n in MEMBERS}

    def set_hypervisor(self, name: str, **fields: object) -> None:
        path = self.repo / "hypervisors" / f"{name}.yaml"
        doc = yaml.safe_load(path.read_text())
        doc["spec"].update(fields)
        path.write_text(yaml.safe_dump(doc, sort_keys=False))

    def pin(self, node: str, hypervisor: str | None) -> None:
        path = self.repo / "clusters/team-a/nodes.yaml"
        docs = list(yaml.safe_load_all(path.read_text()))
        for doc in docs:
            if doc and doc["metadata"]["name"] == node:
                if hypervisor is None:
                    doc["spec"].pop("hypervisor", None)
                else:
                    doc["spec"]["hypervisor"] = hypervisor
        path.write_text(yaml.safe_dump_all(docs, sort_keys=False))

    def lab_name(self, hypervisor: str) -> str:
        """The lab hypervisor behind the repo's Hypervisor `hypervisor` (by its socket)."""
        socket = yaml.safe_load((self.repo / "hypervisors" / f"{hypervisor}.yaml").read_text())["spec"][
            "localCRIEndpoint"]["criEndpointPath"]
        return next(hv.name for hv in self.lab.hypervisors if hv.socket == socket)


@pytest.fixture(scope="module")
def world():
    with running_lab("gitops-recovery-", hypervisors=4, public=1, subnet=SUBNET) as (base, lab):
        repo = base / "repo"
        world_gitops("lab", "example-repo", "--ingress-nodes", "1", "--dir", str(base / "lab"), str(repo))
        shutil.rmtree(repo / "clusters" / "team-b")  # one cluster is enough here
        assert (repo / "hypervisors" / "hv-private-3.yaml").exists()  # the lab's fourth machine, beyond the example's
        spec = repo / "clusters/team-a/cluster.yaml"
        first, sep, rest = spec.read_text().partition("\n---")
        spec.write_text(first.rstrip("\n") + f"\n  etcd:\n    quotaBackendBytes: {QUOTA}" + sep + rest)
        world = Recovery(base, repo, base / "state", lab)
        world.apply()
        yield world


def test_a_drained_hypervisor_hands_its_member_over_with_no_failed_request(world):
    placed = world.placed()
    node = max(MEMBERS, key=lambda n: (list(placed.values()).count(placed[n]) == 1, n))  # alone on its hypervisor
    source = placed[node]
    world.set_hypervisor(source, drain=True)
    planned = world.plan().stdout
    # learner-first: the new member joins and votes before the old one leaves
    joins = planned.index(f"add etcd member: Node {node} moves from {source}: its new member joins from here, "
                          "as a learner, beside the old one")
    leaves = planned.index(f"remove etcd member: Node {node} moved to ")
    assert joins < planned.index("promote etcd member") < leaves, planned
    applied = under_probe(world, "team-a", "drain", world.apply_stamped)
    assert "Apply complete: " in applied, applied
    assert world.placed()[node] != source
    assert not [n for n, pods in world.sandboxes().items() if any(hv == world.lab_name(source) for hv, _ in pods)]
    assert etcd_members(world, "team-a") == sorted(MEMBERS)
    assert_converged(world)


def test_a_lost_majority_is_rebuilt_from_the_survivor_with_its_data(world):
    from gitops import lab as labmod

    placed = world.placed()
    counts = {hv: list(placed.values()).count(hv) for hv in placed.values()}
    if max(counts.values()) < 2:  # run alone: put two members together first (a move)
        alone = sorted(MEMBERS)[-1]
        target = placed[sorted(MEMBERS)[0]]
        world.pin(alone, target)
        world.apply()
        world.pin(alone, None)
        placed = world.placed()
        counts = {hv: list(placed.values()).count(hv) for hv in placed.values()}
    lost = max(counts, key=lambda hv: counts[hv])
    [survivor] = [n for n in MEMBERS if placed[n] != lost]
    wait_ready(world, "team-a")
    kubectl(world, "team-a", "-n", "default", "create", "configmap", "before-the-loss", "--from-literal=kept=yes")
    labmod.lose_hypervisor(world.dir / "lab", world.lab_name(lost))
    world.set_hypervisor(lost, lost=True)
    waiting = world.plan().stdout
    assert f"set spec.recovery.forceNewClusterFrom on Cluster team-a to one of: {survivor}" in waiting, waiting
    spec = world.repo / "clusters/team-a/cluster.yaml"
    first, sep, rest = spec.read_text().partition("\n---")
    spec.write_text(first.rstrip("\n") + f"\n  recovery:\n    forceNewClusterFrom: {survivor}" + sep + rest)
    planned = world.plan().stdout
    assert f"~ rebuild etcd: spec.recovery.forceNewClusterFrom: {survivor}" in planned, planned
    applied = world.apply().stdout
    assert "Apply complete: " in applied, applied
    wait_ready(world, "team-a")
    assert kubectl(world, "team-a", "-n", "default", "get", "configmap", "before-the-loss",
                   "-o", "jsonpath={.data.kept}").stdout == "yes"
    assert etcd_members(world, "team-a") == sorted(MEMBERS)
    assert lost not in world.placed().values()
    record = json.loads((world.state / "state.json").read_text())["clusters"]["team-a"]
    assert record["recovered"] == survivor and "forcing" not in record
    assert_converged(world)


def test_etcd_out_of_space_is_defragmented_and_its_alarm_cleared(world):
    """Issue #29.5: etcd over its quota raises NOSPACE (writes refused); the plan says so; once the objects are
    deleted and compacted, it defragments each member, the leader last, and clears the alarm."""
    wait_ready(world, "team-a")
    data = ("0123456789abcdef" * 63 + "\n") * 900  # about 900 KiB: a ConfigMap holds at most 1 MiB
    names = [f"fill-{i:03d}" for i in range(2 * QUOTA // len(data))]
    listed = {"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": n, "namespace": "default"}, "data": {"d": data}}
        for n in names]}
    stdin = world.dir / "fill.json"
    stdin.write_text(json.dumps(listed))
    filled = kubectl(world, "team-a", "create", "-f", str(stdin), check=False)  # one by one, until etcd refuses
    made = [n for n in names if f"configmap/{n} created" in filled.stdout]
    assert "database space exceeded" in filled.stderr, (len(made), filled.stderr[-2000:])
    full = world.plan(check=False).stdout
    # the plan says so: a warning while the data in use is near the quota, or, when the API server's periodic
    # compaction (every 5 minutes) already freed enough, the defragmentation and the alarm cleared after it
    # (tests/test_etcd_upkeep.py holds each case still)
    assert "etcd is out of space (NOSPACE alarm on " in full or "clear etcd alarm: NOSPACE alarm on " in full, full
    kubectl(world, "team-a", "-n", "default", "delete", "configmap", *made)
    statuses = json.loads(etcdctl(world, "team-a", "endpoint", "status", "-w", "json").stdout)
    revision = max(int(s["Status"]["header"]["revision"]) for s in statuses)
    compacted = etcdctl(world, "team-a", "compact", str(revision), "--physical")
    assert compacted.returncode == 0, compacted.stderr
    planned = world.plan().stdout
    assert planned.count("~ defragment etcd: ") == 3, planned
    for _ in range(3):  # defragmented, then the alarm cleared (in this plan, or the next once etcd counted again)
        applied = world.apply().stdout
        assert "Apply complete: " in applied, applied
        if "clear etcd alarm" not in world.plan().stdout:
            break
    alarms = etcdctl(world, "team-a", "alarm", "list")
    assert alarms.returncode == 0 and "NOSPACE" not in alarms.stdout, alarms.stdout + alarms.stderr
    wait_ready(world, "team-a")
    kubectl(world, "team-a", "-n", "default", "create", "configmap", "after-the-upkeep", "--from-literal=ok=yes")
    statuses = json.loads(etcdctl(world, "team-a", "endpoint", "status", "-w", "json").stdout)
    assert all(int(s["Status"]["dbSize"]) < QUOTA // 2 for s in statuses), statuses
    assert_converged(world)
