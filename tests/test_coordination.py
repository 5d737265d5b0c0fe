"""Leases on a real kube-apiserver (tests/kubeapi.py, own loopback IP; no lab lock needed).

Most tests step `Member.tick()` by hand with a settable monotonic clock, so expiry and
takeover are exact and fast; one test runs the background renewal thread on real time.
"""
from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from gitops.coordination.lease import CoordinationError, LeaseAPI, Timing, acquire_or_renew
from gitops.coordination.member import Member
from gitops.coordination.shards import LEADER, fair_share, replica_lease, shard_leases, shard_of
from gitops.kubeapi import KubeAPI
from tests.kubeapi import kube_api_server

pytestmark = pytest.mark.lab("faults")

IP = "127.0.30.1"
TIMING = Timing(lease_duration=4, renew_deadline=3, retry_period=1)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def server():
    with kube_api_server(IP) as api:
        yield api


@pytest.fixture
def leases(server) -> Iterator[LeaseAPI]:
    """A fresh namespace per test, reached through a kubeconfig file as the controller does."""
    namespace = f"t-{uuid.uuid4().hex[:8]}"
    server.ensure_namespace(namespace)
    api = KubeAPI.from_kubeconfig(server.admin_kubeconfig, timeout=3)
    try:
        yield LeaseAPI(api, namespace)
    finally:
        api.close()


def test_shard_of_is_stable_and_documented():
    # sha256("team-a")[:8] big-endian mod n: these values must never change between versions
    assert [shard_of(c, 4) for c in ("team-a", "team-b", "tenant-1")] == [
        int.from_bytes(__import__("hashlib").sha256(c.encode()).digest()[:8], "big") % 4
        for c in ("team-a", "team-b", "tenant-1")]
    assert shard_of("team-a", 4) == 0 and shard_of("team-b", 4) == 2
    assert shard_leases(3) == ("gitops-shard-0-of-3", "gitops-shard-1-of-3", "gitops-shard-2-of-3")
    assert [fair_share(10, n) for n in (0, 1, 3, 4, 10, 11)] == [10, 10, 4, 3, 1, 1]
    assert replica_lease("Host_1/abc") != replica_lease("host-1/abc")
    assert replica_lease("x" * 300).startswith("gitops-replica-") and len(replica_lease("x" * 300)) < 64


def test_timing_is_checked_like_client_go():
    with pytest.raises(CoordinationError, match="greater than renewDeadlineSeconds"):
        Timing(10, 10, 2)
    with pytest.raises(CoordinationError, match="1.2 x retryPeriodSeconds"):
        Timing(15, 2, 2)


def race(fn, identities: tuple[str, ...]) -> None:
    """Run `fn(identity)` for each identity in its own thread at once; wait for all of them."""
    threads = [threading.Thread(target=fn, args=(i,)) for i in identities]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def test_two_holders_race_one_wins_and_the_loser_is_not_an_error(leases):
    results: dict[str, object] = {}
    barrier = threading.Barrier(2)

    def take(identity: str) -> None:
        barrier.wait()
        results[identity] = acquire_or_renew(leases, None, LEADER, identity, 4, "leader")

    race(take, ("a", "b"))
    winners = [i for i, r in results.items() if r is not None]
    assert len(winners) == 1, results
    current = leases.get(LEADER)
    assert current is not None and current.holder == winners[0] and current.transitions == 0
    # both now race to take it over from the same read: one update wins, the other gets a Conflict
    results.clear()
    barrier.reset()

    def take_over(identity: str) -> None:
        barrier.wait()
        results[identity] = acquire_or_renew(leases, current, LEADER, identity, 4, "leader")

    race(take_over, ("c", "d"))
    assert sorted(r is None for r in results.values()) == [False, True], results
    after = leases.get(LEADER)
    assert after.holder in ("c", "d") and after.transitions == 1 and after.acquire_time >= current.acquire_time


def test_leader_expiry_and_takeover(leases):
    clock = Clock()
    a = Member(leases, "replica-a", (LEADER,), TIMING, clock=clock)
    b = Member(leases, "replica-b", (LEADER,), TIMING, clock=clock)
    a.tick()
    b.tick()
    assert a.held() == (LEADER,) and b.held() == ()
    first = leases.get(LEADER)
    assert (first.holder, first.duration, first.transitions) == ("replica-a", 4, 0)
    assert first.acquire_time and first.renew_time

    clock.now += 2  # a renews; b keeps waiting
    a.tick()
    b.tick()
    assert a.held() == (LEADER,) and b.held() == ()
    assert leases.get(LEADER).renew_time > first.renew_time

    clock.now += 3.5  # a died (no more ticks): not renewed within renewDeadline -> fenced, lease not yet expired
    assert not a.fresh(LEADER)
    b.tick()
    assert b.held() == ()
    clock.now += 0.5  # b saw a's last renewal 4 s ago: expired, b takes over
    b.tick()
    assert b.held() == (LEADER,)
    taken = leases.get(LEADER)
    assert (taken.holder, taken.transitions) == ("replica-b", 1) and taken.acquire_time > first.acquire_time
    a.tick()  # a comes back: sees b holding, takes nothing
    assert a.held() == () and leases.get(LEADER).holder == "replica-b"


def test_fair_share_rebalances_with_one_two_three_replicas(leases):
    clock = Clock()
    work = shard_leases(4)
    members = [Member(leases, f"r{i}", work, TIMING, clock=clock) for i in range(3)]

    def rounds(active: list[Member], n: int = 3) -> dict[str, str]:
        for _ in range(n):
            for m in active:
                m.tick()
            clock.now += 1
        return {name: leases.get(name).holder for name in work}

    holders = rounds(members[:1])
    assert set(holders.values()) == {"r0"}
    holders = rounds(members[:2])
    assert sorted(holders.values()) == ["r0", "r0", "r1", "r1"], holders
    holders = rounds(members)
    assert all(holders.values()) and max(list(holders.values()).count(m.identity) for m in members) <= 2
    for m in members:
        assert set(m.held()) == {n for n, h in holders.items() if h == m.identity}
    # one leaves cleanly: the others take its shards at once (released, not waiting for expiry)
    leaving = next(m for m in members if m.held())
    leaving.stop()
    rest = [m for m in members if m is not leaving]
    holders = rounds(rest)
    assert sorted(holders.values()) == sorted([rest[0].identity] * 2 + [rest[1].identity] * 2), holders


def test_a_busy_shard_is_not_given_up_for_fair_share(leases):
    clock = Clock()
    work = shard_leases(2)
    a, b = (Member(leases, i, work, TIMING, clock=clock) for i in ("a", "b"))
    a.tick()
    assert set(a.held()) == set(work)
    a.busy = set(work)
    for _ in range(3):
        b.tick()
        a.tick()
        clock.now += 1
    assert set(a.held()) == set(work) and b.held() == ()
    a.busy = set()
    for _ in range(2):
        a.tick()
        b.tick()
        clock.now += 1
    assert len(a.held()) == 1 and len(b.held()) == 1


class RacingLeases(LeaseAPI):
    """After each list, another writer takes over every work Lease: the renewal that follows conflicts."""

    def list(self):
        records = super().list()
        for record in records.values():
            if record.role == "work":
                acquire_or_renew(LeaseAPI(self.api, self.namespace), record, record.name, "intruder", 4, "work")
        return records


def test_a_conflict_on_renew_loses_the_lease_cleanly(leases, caplog):
    clock = Clock()
    a = Member(leases, "a", (LEADER,), TIMING, clock=clock)
    a.tick()
    assert a.held() == (LEADER,)
    racing = Member(RacingLeases(leases.api, leases.namespace), "a", (LEADER,), TIMING, clock=clock)
    racing._holds = dict(a._holds)
    clock.now += 1
    with caplog.at_level("WARNING", logger="gitops.coordination"):
        racing.tick()  # no exception
    assert racing.held() == () and leases.get(LEADER).holder == "intruder"
    assert any("lease lost" in r.message and r.why == "lost a race renewing it" for r in caplog.records)


def test_a_member_cut_off_from_the_api_is_fenced_within_its_renew_deadline(leases):
    clock = Clock()
    a = Member(leases, "a", (LEADER,), TIMING, clock=clock)
    a.tick()
    assert a.fresh(LEADER)
    dead = KubeAPI("https://127.0.30.1:9", "", timeout=0.5)  # nothing listens there
    a.leases = LeaseAPI(dead, leases.namespace)
    for _ in range(2):
        clock.now += 1
        a.tick()
        assert a.fresh(LEADER)
    clock.now += 1  # 3 s = renewDeadline since the last successful renewal
    a.tick()
    assert not a.fresh(LEADER) and a.held() == ()
    dead.close()


def test_background_renewal_keeps_the_lease_and_stop_releases_it(leases):
    changes = []
    a = Member(leases, "a", shard_leases(2), TIMING, on_change=lambda: changes.append(1))
    b = Member(leases, "b", shard_leases(2), TIMING)
    a.start()
    try:
        deadline = time.monotonic() + 10
        while len(a.held()) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(a.held()) == 2 and changes
        first = leases.get("gitops-shard-0-of-2").renew_time
        time.sleep(TIMING.lease_duration + 1)  # longer than a lease: only renewals keep it
        b.tick()
        assert len(a.held()) == 2 and b.held() == ()
        assert leases.get("gitops-shard-0-of-2").renew_time > first
    finally:
        a.stop()
    assert all(leases.get(n).holder == "" for n in shard_leases(2))
    assert leases.get(replica_lease("a")).holder == ""


def test_four_shards_over_three_replicas_are_spread_two_one_one(leases):
    """ceil(4/3) = 2 would allow 2/2/0; a replica below floor(4/3) = 1 makes one above it give one up."""
    clock = Clock()
    work = shard_leases(4)
    members = [Member(leases, f"s{i}", work, TIMING, clock=clock) for i in range(3)]
    for _ in range(3):
        for m in members[:2]:
            m.tick()
        clock.now += 1
    assert sorted(len(m.held()) for m in members[:2]) == [2, 2]
    for _ in range(4):
        for m in members:
            m.tick()
        clock.now += 1
    assert sorted(len(m.held()) for m in members) == [1, 1, 2]
    for _ in range(6):  # and it stays so
        for m in members:
            m.tick()
        clock.now += 1
    assert sorted(len(m.held()) for m in members) == [1, 1, 2]
    assert {leases.get(n).holder for n in work} == {m.identity for m in members}


def test_an_etcd_wait_ends_when_the_fence_says_so():
    """A health wait is no CRI call in flight: a replica whose Lease went stale stops waiting at once
    (issue #14: nothing runs on a cluster once its shard is another replica's)."""
    import socket
    import time as _time

    from gitops.apply.etcd import EtcdAdmin, EtcdError
    from gitops.pki import create_ca

    with socket.socket() as sock:  # a port nobody listens on: the member never turns healthy
        sock.bind(("127.0.0.1", 0))
        url = f"https://127.0.0.1:{sock.getsockname()[1]}"
    asked = []

    def fence() -> str | None:
        asked.append(1)
        return "shard Lease gitops-shard-1-of-4 is stale" if len(asked) > 2 else None

    with EtcdAdmin(create_ca("fence-test-ca"), [url], fenced=fence) as etcd:
        started = _time.monotonic()
        with pytest.raises(EtcdError, match="fenced while waiting on etcd: shard Lease gitops-shard-1-of-4 is stale"):
            etcd.wait_healthy([url], timeout=60, what="before changing etcd")
    assert len(asked) == 3 and _time.monotonic() - started < 10
