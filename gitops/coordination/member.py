"""One replica's part: which work Leases it holds, renewed in the background, and fencing.

`Member.tick()` is one round of client-go's loop for many Leases: list the gitops
Leases (one request), renew the replica's heartbeat Lease, renew the work Leases it
holds, give up those above its fair share (ceil(work Leases / live replicas), live
replicas counted from unexpired heartbeat Leases; floor(...) while another live replica
holds fewer than that and no Lease is free) unless they are busy, then take free or
expired ones up to that share. `start()` runs it every retryPeriod in a thread.

A hold counts from the moment *before* the request that wrote it, and is fresh for
renewDeadline after that: `fresh(lease)` is what fencing asks before every action.
Another replica can take the Lease only leaseDuration after it saw that write, so a
fresh hold is exclusive as long as leaseDuration - renewDeadline covers the longest
single call the holder has already started.
"""
from __future__ import annotations

import hashlib
import logging
import math
import threading
import time
from collections.abc import Callable

from gitops.coordination.lease import LeaseAPI, LeaseRecord, Observer, Timing, acquire_or_renew, release
from gitops.coordination.shards import REPLICA_PREFIX, fair_share, replica_lease
from gitops.errors import GitopsError

log = logging.getLogger("gitops.coordination")

WORK, REPLICA = "work", "replica"


class Member:
    """`identity` competing for `work` Leases (one `gitops-leader`, or the shard Leases)."""

    def __init__(self, leases: LeaseAPI, identity: str, work: tuple[str, ...], timing: Timing, *,
                 on_change: Callable[[], None] | None = None, clock: Callable[[], float] = time.monotonic):
        self.leases = leases
        self.identity = identity
        self.work = tuple(work)
        self.timing = timing
        self.clock = clock
        self.on_change = on_change or (lambda: None)
        self.heartbeat = replica_lease(identity)
        self.observer = Observer(clock)
        #: work Lease -> monotonic time taken just before the request that last wrote our hold
        self._holds: dict[str, float] = {}
        #: work Leases in use (an apply runs): not given up for fair share, only lost
        self.busy: set[str] = set()
        #: Leases given up for fair share -> when: not taken back for a lease duration (others take them)
        self._released: dict[str, float] = {}
        self.live_replicas = 1
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ what callers ask

    def fresh(self, lease: str) -> bool:
        """Held, and renewed less than renewDeadline ago: safe to start an action for it."""
        with self._lock:
            taken = self._holds.get(lease)
        return taken is not None and self.clock() < taken + self.timing.renew_deadline

    def held(self) -> tuple[str, ...]:
        """The work Leases held fresh, in `work` order."""
        return tuple(w for w in self.work if self.fresh(w))

    def holders(self) -> dict[str, str]:
        """Work Lease -> its holder as last seen ("" when free)."""
        return {w: (self.observer.seen[w].record.holder if w in self.observer.seen else "") for w in self.work}

    # ------------------------------------------------------------------ one round

    def tick(self) -> None:
        before = set(self.held())
        started = self.clock()
        try:
            records = self.leases.list()
        except GitopsError as err:
            log.warning("cannot list leases", extra={"error": str(err)})
            self._expire()
            return
        for record in records.values():
            self.observer.update(record, started)
        for name in set(self.observer.seen) - set(records):
            self.observer.forget(name)
        self._write(records.get(self.heartbeat), self.heartbeat, REPLICA, started)
        replicas = [n for n in self.observer.seen if n.startswith(REPLICA_PREFIX) and self.observer.live(n)]
        self.live_replicas = max(len(replicas), 1)
        share = fair_share(len(self.work), self.live_replicas)
        if self._someone_starves(replicas, started):
            share = len(self.work) // self.live_replicas  # make room: one holding more than the floor gives one up
        for name in [w for w in self.work if w in self._holds]:
            current = records.get(name)
            if current is None or current.holder != self.identity:
                self._drop(name, f"now held by {current.holder!r}" if current is not None else "deleted")
            elif (renewed := self._write(current, name, WORK, started)) is None:
                self._drop(name, "lost a race renewing it")
            else:
                records[name] = renewed  # a release below must carry the new resourceVersion
        held = sorted(self._holds, key=self._preference)
        for name in reversed(held):
            if len(self._holds) <= share:
                break
            if name not in self.busy:
                self._give_up(records.get(name), name, f"fair share is {share} of {len(self.work)} "
                                                       f"with {self.live_replicas} replicas")
        for name in sorted(self.work, key=self._preference):
            if len(self._holds) >= share:
                break
            if (name not in self._holds and self.observer.free(name, self.identity, started)
                    and started >= self._released.get(name, -math.inf) + self.timing.lease_duration):
                if self._write(records.get(name), name, WORK, started) is not None:
                    log.info("lease acquired", extra={"lease": name, "identity": self.identity})
        self._expire()
        if set(self.held()) != before:
            self.on_change()

    def _someone_starves(self, replicas: list[str], now: float) -> bool:
        """A live replica holds fewer than floor(work / live replicas) Leases and none is free to take:
        4 shards over 3 replicas are spread 2/1/1, not 2/2/0."""
        floor = len(self.work) // self.live_replicas
        if floor == 0 or any(self.observer.free(w, "", now) for w in self.work):
            return False
        holders = [self.observer.seen[w].record.holder for w in self.work if w in self.observer.seen]
        alive = {self.observer.seen[r].record.holder for r in replicas}
        return any(holders.count(identity) < floor for identity in alive)

    def _write(self, current: LeaseRecord | None, name: str, role: str, started: float) -> LeaseRecord | None:
        try:
            written = acquire_or_renew(self.leases, current, name, self.identity, self.timing.lease_duration, role)
        except GitopsError as err:
            log.warning("cannot write lease", extra={"lease": name, "error": str(err)})
            return None
        if written is not None:
            self.observer.update(written, started)
            if role == WORK:
                with self._lock:
                    self._holds[name] = started
        return written

    def _drop(self, name: str, why: str) -> None:
        with self._lock:
            self._holds.pop(name, None)
        log.warning("lease lost", extra={"lease": name, "identity": self.identity, "why": why})

    def _give_up(self, current: LeaseRecord | None, name: str, why: str) -> None:
        with self._lock:
            self._holds.pop(name, None)  # fenced from now on, whether the release lands or not
        self._released[name] = self.clock()
        if current is not None:
            try:
                if release(self.leases, current, self.identity) is None:
                    log.info("lease changed before its release; it expires instead", extra={"lease": name})
            except GitopsError as err:
                log.warning("cannot release lease", extra={"lease": name, "error": str(err)})
        log.info("lease released", extra={"lease": name, "identity": self.identity, "why": why})

    def _expire(self) -> None:
        """Holds not renewed within renewDeadline are gone (client-go stops leading)."""
        now = self.clock()
        with self._lock:
            stale = [n for n, t in self._holds.items() if now >= t + self.timing.renew_deadline]
        for name in stale:
            self._drop(name, f"not renewed within {self.timing.renew_deadline:g}s")

    def _preference(self, name: str) -> str:
        """A per-replica order of the work Leases, so replicas starting together try different ones."""
        return hashlib.sha256(f"{self.identity}\0{name}".encode()).hexdigest()

    # ------------------------------------------------------------------ the background loop

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="leases", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:  # noqa: BLE001 -- the renewal thread must not die; fencing covers the gap
                log.exception("lease round failed")
            self._stop.wait(self.timing.retry_period)

    def stop(self, release_leases: bool = True) -> None:
        """Stop renewing; give every hold (and the heartbeat) up so others take over at once."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if not release_leases:
            return
        with self._lock:
            names = list(self._holds)
            self._holds.clear()
        for name in [*names, self.heartbeat]:
            try:
                current = self.leases.get(name)
                if current is not None:
                    release(self.leases, current, self.identity)
            except GitopsError as err:
                log.warning("cannot release lease", extra={"lease": name, "error": str(err)})
