"""The apply lease: only one controller applies at a time.

The lease is a commit holding `lock.json` (holder, expiry) on its own ref of the infra
repo's remote, `refs/gitops/lock`, moved with `--force-with-lease` so that two controllers
racing for it cannot both win. A holder renews it while in use; a crashed holder's lease
simply expires, and a restarted controller with the same holder id takes its own back.
"""
from __future__ import annotations

import datetime as dt
import json
import logging
import subprocess
from dataclasses import dataclass

import git

from gitops.status.branch import StatusError, git_message

log = logging.getLogger(__name__)

LOCK_REF = "refs/gitops/lock"


class Locked(StatusError):
    """Another controller holds the apply lease."""


@dataclass(frozen=True)
class Lease:
    holder: str
    expires: dt.datetime


class ApplyLease:
    """The lease on `LOCK_REF` of `repo`'s `origin` (any local clone of the infra repo)."""

    def __init__(self, repo: git.Repo):
        self.repo = repo

    def _current(self) -> tuple[str | None, Lease | None]:
        try:
            self.repo.remote("origin").fetch(f"+{LOCK_REF}:{LOCK_REF}")
        except git.GitCommandError as err:
            if "couldn't find remote ref" in str(err).lower():
                return None, None
            raise StatusError(f"cannot fetch the lock: {git_message(err)}") from None
        sha = self.repo.git.rev_parse(LOCK_REF)
        data = json.loads(self.repo.git.show(f"{sha}:lock.json"))
        return sha, Lease(data["holder"], dt.datetime.fromisoformat(data["expires"]))

    def acquire(self, holder: str, ttl: dt.timedelta, now: dt.datetime | None = None) -> Lease:
        """Take or renew the apply lease; raises Locked while another holder's lease runs."""
        now = now or dt.datetime.now(dt.timezone.utc)
        old_sha, lease = self._current()
        if lease is not None and lease.holder != holder and lease.expires > now:
            raise Locked(f"another controller ({lease.holder}) holds the apply lock until "
                         f"{lease.expires.isoformat(timespec='seconds')}")
        if lease is not None and lease.holder == holder and lease.expires - now > ttl / 2:
            return lease  # still fresh: no push on quiet polls
        new = Lease(holder, now + ttl)
        body = json.dumps({"holder": new.holder, "expires": new.expires.isoformat()}, sort_keys=True) + "\n"
        repo = self.repo
        blob = self._git_input(body, "hash-object", "-w", "--stdin")
        tree = self._git_input(f"100644 blob {blob}\tlock.json\n", "mktree")
        commit = repo.git.commit_tree(tree, "-m", f"lock: {holder}")
        lease_arg = f"--force-with-lease={LOCK_REF}:{old_sha or ''}"
        try:
            repo.git.push("origin", lease_arg, f"{commit}:{LOCK_REF}")
        except git.GitCommandError as err:
            raise Locked(f"lost the race for the apply lock: {git_message(err)}") from None
        repo.git.update_ref(LOCK_REF, commit)
        return new

    def release(self, holder: str) -> None:
        old_sha, lease = self._current()
        if lease is None or lease.holder != holder:
            return
        try:
            self.repo.git.push("origin", f"--force-with-lease={LOCK_REF}:{old_sha}", f":{LOCK_REF}")
        except git.GitCommandError as err:
            log.warning("could not release the apply lock: %s", git_message(err))

    def _git_input(self, text: str, *args: str) -> str:
        proc = subprocess.run(["git", *args], cwd=self.repo.working_dir, input=text, capture_output=True, text=True,
                              timeout=60)
        if proc.returncode != 0:
            raise StatusError(f"git {args[0]} failed: {proc.stderr.strip()}")
        return proc.stdout.strip()
