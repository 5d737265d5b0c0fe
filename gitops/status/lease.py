"""The apply lease: only one controller applies at a time.

The lease is a commit holding `lock.json` (holder, expiry) on its own ref of the infra
repo's remote, `refs/gitops/lock`, moved with `--force-with-lease` so that two controllers
racing for it cannot both win. A holder renews it while in use; a crashed holder's lease
simply expires, and a restarted controller with the same holder id takes its own back
(`holder_id`: one per workdir, which `lock_workdir` keeps to one process).

With the status branch's trust, a lease commit is signed with the status key and read only when a
pinned key signed it, as every status commit: a lock anyone else pushed (naming a controller's holder
id or not) is no controller's lease. The last lease of another holder a pinned key signed is
remembered and honoured until it expires, whatever the ref says meanwhile: deleting or replacing it
frees nothing. A holder gives its lease up with a signed lease that has expired.
"""
from __future__ import annotations

import datetime as dt
import fcntl
import json
import logging
import socket
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from gitops.errors import GitopsError
from gitops.gitrepo import GitError, Repo, remove_abandoned_remote_locks
from gitops.safeio import write_atomic
from gitops.status.branch import StatusError
from gitops.status.trust import BranchTrust

log = logging.getLogger(__name__)

LOCK_REF = "refs/gitops/lock"
#: the longest another holder's lease is honoured after this process first saw it unrenewed, whatever expiry
#: it claims (anyone who can push to the remote can write one claiming the year 3000)
LONGEST_HOLD = dt.timedelta(hours=1)
#: the largest lock.json read (gitops writes about 100 bytes)
MAX_LOCK_BYTES = 4096


class Locked(StatusError):
    """Another controller holds the apply lease."""


@dataclass(frozen=True)
class Lease:
    holder: str
    expires: dt.datetime


class ApplyLease:
    """The lease on `LOCK_REF` of `repo`'s `origin` (any local clone of the infra repo)."""

    def __init__(self, repo: Repo, trust: BranchTrust | None = None):
        self.repo = repo
        #: signs the lease commits and verifies the lease read (None: neither, for tests and tools)
        self.trust = trust
        #: lease commit -> when this process first saw it (a lease not renewed since ends LONGEST_HOLD after)
        self._seen: dict[str, dt.datetime] = {}
        #: the last lease of another holder that a pinned key signed (honoured until it expires)
        self._others: Lease | None = None

    def _current(self) -> tuple[str | None, Lease | None]:
        try:
            if not self.repo.fetch_ref("origin", LOCK_REF, LOCK_REF):
                return None, None
        except GitError as err:
            raise StatusError(f"cannot fetch the lock: {err.detail}") from None
        sha = self.repo.ref(LOCK_REF)
        problem = self.trust.verifier.problem(self.repo, sha) if self.trust is not None else None
        if problem is not None:
            log.warning("the apply lock is not signed by a pinned key: it is no controller's lease",
                        extra={"sha": sha, "reason": problem})
            return sha, None
        try:
            kind, size = self.repo.header(f"{sha}:lock.json") or ("missing object", None)
            if kind != "blob" or size is None or size > MAX_LOCK_BYTES:
                raise ValueError(f"lock.json is a {kind} of {size} bytes")
            found = self.repo.read_objects([f"{sha}:lock.json"])[0]
            if found is None:
                raise ValueError("lock.json is gone")
            data = json.loads(found[1])
            expires = dt.datetime.fromisoformat(data["expires"])
            if expires.tzinfo is None:
                raise ValueError("expiry without a time zone")
            return sha, Lease(str(data["holder"]), expires)
        except (GitError, ValueError, TypeError, KeyError, AttributeError) as err:
            log.warning("the apply lock holds no lease gitops wrote: taken as free", extra={"sha": sha,
                                                                                          "error": str(err)[:200]})
            return sha, None

    def acquire(self, holder: str, ttl: dt.timedelta, now: dt.datetime | None = None) -> Lease:
        """Take or renew the apply lease; raises Locked while another holder's lease runs."""
        now = now or dt.datetime.now(dt.timezone.utc)
        old_sha, lease = self._current()
        if lease is not None and old_sha is not None and lease.holder != holder:
            if len(self._seen) >= 1000:  # (locks pushed by anyone: kept bounded)
                self._seen.clear()
            first = self._seen.setdefault(old_sha, now)
            if lease.expires > first + max(ttl, LONGEST_HOLD):
                log.warning("the apply lock claims a longer hold than any controller takes: honoured for "
                            f"{max(ttl, LONGEST_HOLD)} after it was first seen", extra={"holder": lease.holder})
                lease = Lease(lease.holder, first + max(ttl, LONGEST_HOLD))
        if lease is not None and lease.holder != holder:
            self._others = lease if self.trust is not None else None  # (a pinned key signed it)
        elif lease is None and self._others is not None and self._others.expires > now:
            lease = self._others  # (the lock deleted, or replaced by one no pinned key signed: still theirs)
        if lease is not None and lease.holder != holder and lease.expires > now:
            raise Locked(f"another controller ({lease.holder}) holds the apply lock until "
                         f"{lease.expires.isoformat(timespec='seconds')}")
        if lease is not None and lease.holder == holder and lease.expires - now > ttl / 2:
            return lease  # still fresh: no push on quiet polls
        new = Lease(holder, now + ttl)
        self._push(new, old_sha)
        self._others = None
        return new

    def _push(self, lease: Lease, old_sha: str | None) -> None:
        """Put `lease` on the lock ref if it still is `old_sha` (signed when there is a status key); raises
        Locked when another push got there first."""
        body = json.dumps({"holder": lease.holder, "expires": lease.expires.isoformat()}, sort_keys=True) + "\n"
        repo = self.repo
        signed = ["-S"] if self.trust is not None and self.trust.key is not None else []
        try:
            commit = repo.run("commit-tree", *signed, repo.tree_of_blobs({"lock.json": body.encode()}), "-m",
                              f"lock: {lease.holder}")
        except GitError as err:  # (signing with the status key among the causes)
            raise StatusError(f"cannot make the apply lock's commit: {err.detail}") from None
        lease_arg = f"--force-with-lease={LOCK_REF}:{old_sha or ''}"
        try:
            repo.run("push", "origin", lease_arg, f"{commit}:{LOCK_REF}")
        except GitError as err:
            for lock in remove_abandoned_remote_locks(repo.run("remote", "get-url", "origin"), err.said):
                log.warning("abandoned git lock in the remote removed", extra={"path": str(lock)})
            raise Locked(f"lost the race for the apply lock: {err.detail}") from None
        repo.run("update-ref", LOCK_REF, commit)

    def release(self, holder: str) -> None:
        """Give the lease up: a lease of `holder` that has expired (signed like any: a lock deleted frees
        nothing for controllers that saw a lease), if `holder` holds it."""
        old_sha, lease = self._current()
        if lease is None or lease.holder != holder:
            return
        try:
            self._push(Lease(holder, dt.datetime.now(dt.timezone.utc)), old_sha)
        except (Locked, StatusError) as err:
            log.warning("could not release the apply lock: %s", err)


def lock_workdir(workdir: Path) -> IO[str]:
    """One process per workdir (the kernel drops the lock if the process dies); hold the returned file."""
    workdir.mkdir(parents=True, exist_ok=True, mode=0o700)
    handle = open(workdir / ".lock", "a+")  # noqa: SIM115 - held for the controller's lifetime
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise GitopsError(f"another gitops process is using {workdir}") from None
    return handle


def holder_id(workdir: Path) -> str:
    """The apply-lease holder: stable per workdir, so a restarted controller takes its own lease back."""
    path = workdir / "controller-id"
    held = path.read_text().strip() if path.is_file() else ""
    if not held:  # none yet (or an empty one an older build left when killed while writing it)
        held = f"{socket.gethostname()}/{uuid.uuid4().hex[:12]}"
        write_atomic(path, held + "\n", mode=0o644)
    return held
