"""Several writers of one status branch, and what one replica owns (no API server, no lab)."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from gitops.apply.executor import Connections, execute
from gitops.coordination.scope import Scope, file_owner
from gitops.coordination.shards import shard_lease, shard_of
from gitops.plan.actions import Action, Kind, Plan
from gitops.plan.payloads import LabelHost
from gitops.state.records import CertRecord, ClusterRecord, NodeRecord, State
from gitops.state.store import LocalDirStore
from gitops.status import branch as branch_module
from gitops.status.branch import StatusBranch, StatusError


@pytest.fixture
def origin(tmp_path: Path) -> str:
    bare = tmp_path / "origin.git"
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(bare)], check=True)
    return str(bare)


def commits(origin: str) -> list[str]:
    return subprocess.run(["git", "--git-dir", origin, "log", "--format=%s", "gitops/status"], capture_output=True,
                          text=True, check=True).stdout.splitlines()


def tree(origin: str) -> dict[str, str]:
    names = subprocess.run(["git", "--git-dir", origin, "ls-tree", "-r", "--name-only", "gitops/status"],
                           capture_output=True, text=True, check=True).stdout.split()
    return {n: subprocess.run(["git", "--git-dir", origin, "show", f"gitops/status:{n}"], capture_output=True,
                              text=True, check=True).stdout for n in names}


def test_a_push_rejected_in_a_real_race_is_redone_on_the_new_tip(origin, tmp_path):
    """b syncs, a pushes while b writes, b's push is rejected (non-fast-forward): b writes again on a's
    commit. Each writes only its own files, so both survive."""
    a, b = StatusBranch(origin, tmp_path / "a"), StatusBranch(origin, tmp_path / "b")
    a.publish(lambda s: s.write_tree({"status/Shard/a.yaml": b"1\n"}, ("status/Shard/a.yaml",)), "a1")
    calls = []

    def write_b(s: StatusBranch) -> None:
        calls.append(s.tracked())
        if len(calls) == 1:  # a commits between b's sync and b's push
            a.publish(lambda t: t.write_tree({"status/Shard/a.yaml": b"2\n"}, ("status/Shard/a.yaml",)), "a2")
        s.write_tree({"status/Shard/b.yaml": b"1\n"}, ("status/Shard/b.yaml",))

    assert b.publish(write_b, "b1") is not None
    assert len(calls) == 2 and calls[0] == ["status/Shard/a.yaml"]
    assert commits(origin) == ["b1", "a2", "a1"]
    assert tree(origin) == {"status/Shard/a.yaml": "2\n", "status/Shard/b.yaml": "1\n"}


def test_retries_are_bounded(origin, tmp_path, monkeypatch):
    monkeypatch.setattr(branch_module, "PUSH_ATTEMPTS", 3)
    a, b = StatusBranch(origin, tmp_path / "a"), StatusBranch(origin, tmp_path / "b")
    rounds = []

    def always_overtaken(s: StatusBranch) -> None:
        rounds.append(1)
        a.publish(lambda t: t.write_tree({"status/a.yaml": f"{len(rounds)}\n".encode()}, ("status/a.yaml",)),
                  f"a{len(rounds)}")
        s.write_tree({"status/b.yaml": b"1\n"}, ("status/b.yaml",))

    with pytest.raises(StatusError, match="still racing other writers after 3 attempts"):
        b.publish(always_overtaken, "b")
    assert len(rounds) == 3 and commits(origin) == ["a3", "a2", "a1"]


SCOPE = Scope("shards", 4, frozenset({shard_lease(shard_of("team-a", 4), 4)}), frozenset({"tenant-1", "sip-tenant-1"}))


def test_scope_owns_its_shards_and_shard_0_owns_what_is_global():
    assert shard_of("team-a", 4) != shard_of("team-b", 4)
    assert SCOPE.owns("team-a") and not SCOPE.owns("team-b")
    assert SCOPE.lease_of("") == SCOPE.lease_of("tenant-1") == SCOPE.lease_of("sip-tenant-1") == "gitops-shard-0-of-4"
    assert SCOPE.owns_global == (shard_of("team-a", 4) == 0)
    leader = Scope("leader", 1, frozenset({"gitops-leader"}))
    assert leader.owns("anything") and leader.owns_global
    nodes = {"a-1": "team-a"}.get
    assert [file_owner(p, nodes) for p in ("observed/clusters/team-b.json", "status/Cluster/team-a.yaml",
                                           "status/Node/a-1.yaml", "status/Node/gone.yaml", "kubeconfig/team-b.yaml",
                                           "status/source.yaml", "observed/hypervisors.json")] == [
        "team-b", "team-a", "team-a", None, "team-b", None, None]


def test_merged_state_takes_our_records_for_our_clusters_and_theirs_for_the_rest():
    theirs = State(clusters={"team-a": ClusterRecord(admin=CertRecord("old-a")), "team-b": ClusterRecord(
        admin=CertRecord("b"))}, nodes={"b-1": NodeRecord("team-b", "hv1", {"etcd": 1})},
        sip_labels={"ns/h1": {"x": "1"}})
    mine = State(clusters={"team-a": ClusterRecord(admin=CertRecord("new-a")),
                           "team-b": ClusterRecord(admin=CertRecord("my-guess-b"))},
                 nodes={"a-1": NodeRecord("team-a", "hv1", {"etcd": 2}), "b-1": NodeRecord("team-b", "hv2")},
                 sip_labels={})
    merged = SCOPE.merge(theirs, mine)
    assert merged.clusters["team-a"].admin.cert_pem == "new-a" and merged.clusters["team-b"].admin.cert_pem == "b"
    assert merged.nodes["a-1"].ports == {"etcd": 2} and merged.nodes["b-1"].hypervisor == "hv1"
    assert merged.sip_labels == (mine.sip_labels if SCOPE.owns_global else theirs.sip_labels)
    gone = SCOPE.merge(theirs, State())  # team-a left the repo and we own it: its records go
    assert "team-a" not in gone.clusters and "team-b" in gone.clusters


def test_the_fence_stops_the_run_before_an_action(tmp_path):
    """Asked before every action: a refusal stops the run there; nothing after it starts."""
    actions = tuple(Action(Kind.LABEL_HOST, "", "team-b", f"ns/h{i}", payload=LabelHost(f"ns/h{i}"))
                    for i in range(3))
    asked = []

    def fence(action: Action) -> str | None:
        asked.append(action.node)
        return "Lease gitops-shard-2-of-4 is no longer held fresh"

    outcome = execute(Plan(actions=actions), State(), Connections(cri=None, hosts=None), LocalDirStore(tmp_path),
                      fence=fence)
    assert outcome.stopped and outcome.fenced.startswith("Lease gitops-shard-2-of-4") and not outcome.executed
    assert asked == ["ns/h0"]


def test_a_replica_plans_with_its_clusters_records_and_every_node():
    state = State(clusters={"team-a": ClusterRecord(), "team-b": ClusterRecord()},
                  nodes={"a-1": NodeRecord("team-a", "hv1", {"etcd": 1}), "b-1": NodeRecord("team-b", "hv1", {"etcd": 2})},
                  sip_labels={"ns/h1": {"x": "1"}})
    narrow = SCOPE.narrow_state(state)
    assert set(narrow.clusters) == {"team-a"} and set(narrow.nodes) == {"a-1", "b-1"}
    assert SCOPE.merge(state, narrow).to_dict() == state.to_dict()  # nothing of the others is lost


def test_a_node_placed_on_ports_another_replica_published_first_is_refused():
    """Two replicas plan at once from the same branch: both give their new node hv1's lowest free
    ports. The one whose write-ahead publish comes second sees the other's record and must refuse."""
    theirs = State(nodes={"b-1": NodeRecord("team-b", "hv1", {"etcd-client": 30000, "apiserver": 30002})})
    mine = State(nodes={"a-1": NodeRecord("team-a", "hv1", {"apiserver": 30002, "etcd-client": 30001}),
                        "b-1": NodeRecord("team-b", "hv1", {"etcd-client": 30000, "apiserver": 30002})})
    assert SCOPE.clashes(theirs, mine) == ["a-1 on hv1: port 30002 (apiserver) is b-1's"]
    mine.nodes["a-1"].hypervisor = "hv2"
    assert SCOPE.clashes(theirs, mine) == []  # another hypervisor's ports are its own
    mine.nodes["a-1"] = NodeRecord("team-a", "hv1", {"apiserver": 30002})
    theirs.nodes["a-1"] = NodeRecord("team-a", "hv1", {"apiserver": 30002})
    assert SCOPE.clashes(theirs, mine) == []  # ours was on the branch first: the later writer had to avoid it


def test_a_lock_left_in_the_remote_by_a_killed_push_is_removed_once_abandoned(origin, tmp_path, monkeypatch,
                                                                               caplog):
    """A push killed while the remote's receive-pack held the branch's ref lock (a local remote: the
    receive-pack is the pusher's child and dies with it) leaves `<ref>.lock` there, and git never removes it.
    A young lock may be a live push's: left alone, the push retried. An abandoned one is removed."""
    a = StatusBranch(origin, tmp_path / "a")
    a.publish(lambda s: s.write_tree({"status/a.yaml": b"1\n"}, ("status/a.yaml",)), "a1")
    tip = subprocess.run(["git", "rev-parse", f"refs/heads/{a.branch}"], cwd=origin, capture_output=True,
                         text=True, check=True).stdout.strip()
    holder = subprocess.Popen(["git", "update-ref", "--stdin"], cwd=origin, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    holder.stdin.write(f"start\nupdate refs/heads/{a.branch} {tip}\nprepare\n")
    holder.stdin.flush()
    assert holder.stdout.readline() == "start: ok\n" and holder.stdout.readline() == "prepare: ok\n"
    holder.kill()  # SIGKILL, in the middle of the transaction
    holder.wait()
    holder.stdin.close()
    lock = Path(origin) / "refs" / "heads" / f"{a.branch}.lock"
    assert lock.is_file()

    monkeypatch.setattr(branch_module, "PUSH_ATTEMPTS", 2)
    with pytest.raises(StatusError, match="still racing other writers after 2 attempts"):
        a.publish(lambda s: s.write_tree({"status/a.yaml": b"2\n"}, ("status/a.yaml",)), "a2")
    assert lock.is_file()  # young: perhaps a push running now

    old = lock.stat().st_mtime - 3600
    os.utime(lock, (old, old))
    with caplog.at_level("WARNING", logger="gitops.status.branch"):
        assert a.publish(lambda s: s.write_tree({"status/a.yaml": b"2\n"}, ("status/a.yaml",)), "a2") is not None
    assert not lock.exists()
    assert commits(origin)[0] == "a2"
    assert any(r.getMessage() == "abandoned git lock in the remote removed" for r in caplog.records)
