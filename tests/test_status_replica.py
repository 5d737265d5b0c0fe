"""One of several controllers on the status branch: its Shard documents and which files are its to write."""
from __future__ import annotations

import yaml

from gitops.compile.desired import DesiredState
from gitops.coordination.scope import Scope
from gitops.coordination.shards import LEADER, shard_lease, shard_leases, shard_of
from gitops.model.resources import RepoModel
from gitops.state.records import NodeRecord, State
from gitops.status.branch import under
from gitops.status import replica
from gitops.status.replica import Share, WriteAhead
from gitops.status.report import Outcome, Result, shard_documents
from gitops.status.sealed_state import ControllerStateStore, Sealer

SHARDS = 2
CLUSTERS = [f"team-{c}" for c in "abcdefgh"]


def held(index: int) -> Scope:
    return Scope("shards", SHARDS, frozenset({shard_lease(index, SHARDS)}))


def mine_and_theirs() -> tuple[str, str]:
    """A cluster of shard 0 and one of shard 1."""
    by_shard = {shard_of(c, SHARDS): c for c in CLUSTERS}
    return by_shard[0], by_shard[1]


def test_a_shard_document_names_the_holder_and_the_clusters_of_each_lease_held():
    outcome = Outcome(sha="f" * 40, result=Result.APPLIED, actions=3)
    docs = shard_documents(held(1), reversed(CLUSTERS), "replica-b", outcome)
    lease = shard_lease(1, SHARDS)
    assert list(docs) == [f"status/Shard/{lease}.yaml"]
    doc = yaml.safe_load(docs[f"status/Shard/{lease}.yaml"])
    assert doc["kind"] == "ShardStatus" and doc["metadata"] == {"name": lease}
    assert doc["status"] == {"holder": "replica-b", "observedSourceSHA": "f" * 40, "result": "Applied", "actions": 3,
                             "clusters": sorted(c for c in CLUSTERS if shard_of(c, SHARDS) == 1)}


def test_a_replica_writes_its_shards_files_the_state_and_the_global_ones_with_shard_0(tmp_path):
    mine, theirs = mine_and_theirs()
    store = ControllerStateStore(Sealer(None, insecure_plaintext=True), tmp_path / "cache")
    store.state = State(nodes={"n-mine": NodeRecord(mine, "hv"), "n-theirs": NodeRecord(theirs, "hv")})
    model = RepoModel(hypervisors={}, clusters={}, nodes={}, sip_clusters={}, baremetal_hosts={})
    desired = DesiredState(pods={}, clusters={})
    for index, global_files in ((0, True), (1, False)):
        share = Share(store, held(index), f"replica-{index}", frozenset(shard_leases(SHARDS)))
        owns = share.owns(model, desired)
        me, other = (mine, theirs) if index == 0 else (theirs, mine)
        node_me, node_other = ("n-mine", "n-theirs") if index == 0 else ("n-theirs", "n-mine")
        assert owns("state/public.json") and owns(share.store.sealer.path)
        assert owns(f"status/Cluster/{me}.yaml") and not owns(f"status/Cluster/{other}.yaml")
        assert owns(f"kubeconfig/{me}.yaml") and not owns(f"observed/clusters/{other}.json")
        assert owns(f"status/Node/{node_me}.yaml") and not owns(f"status/Node/{node_other}.yaml")
        assert owns("status/source.yaml") is global_files and owns("observed/hypervisors.json") is global_files
        assert owns(f"status/Shard/{shard_lease(index, SHARDS)}.yaml")
        assert not owns(f"status/Shard/{shard_lease(1 - index, SHARDS)}.yaml")
        assert owns("status/Shard/gitops-shard-0-of-1.yaml") is global_files  # a Lease no replica runs now


def test_under_is_a_path_or_inside_one():
    assert under("status", ("status",)) and under("status/Node/a.yaml", ("status/",))
    assert not under("statusx/a", ("status",)) and not under("state/public.json", ("status", "observed"))


def test_a_leader_publishes_what_only_counts_at_most_every_so_often_and_decisions_at_once(tmp_path, monkeypatch):
    """A rolling wave's counts are saved every few seconds: in leader mode each save would be a status
    commit, so a save that only counts is published with the next decision or once PUBLISH_PROGRESS_EVERY
    passed, and held by the replica meanwhile."""
    store = ControllerStateStore(Sealer(None, insecure_plaintext=True), tmp_path / "cache")
    published: list[str] = []
    ahead = WriteAhead(store, Scope("leader", 1, frozenset({LEADER})),
                       lambda: published.append(store.state.nodes["n-1"].hypervisor))

    def on(hypervisor: str) -> State:
        return State(nodes={"n-1": NodeRecord("team-a", hypervisor)})

    ahead.save(on("hv-1"))  # a decision: on the branch before anything runs
    assert published == ["hv-1"]
    ahead.save_progress(on("hv-2"))
    ahead.save_progress(on("hv-3"))
    assert published == ["hv-1"]  # not yet: within PUBLISH_PROGRESS_EVERY of the last publish
    assert ahead.load().nodes["n-1"].hypervisor == "hv-3"  # held by the replica
    ahead.save(on("hv-4"))
    assert published == ["hv-1", "hv-4"]
    ahead.save_progress(on("hv-4"))
    assert published == ["hv-1", "hv-4"]  # nothing new to publish
    monkeypatch.setattr(replica, "PUBLISH_PROGRESS_EVERY", 0.0)
    ahead.save_progress(on("hv-5"))  # due: published
    assert published == ["hv-1", "hv-4", "hv-5"]
