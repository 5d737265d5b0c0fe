"""The status branch: a git worktree the controller rewrites and pushes.

Each publish starts from the remote tip, lets the caller write the complete
set of files, and commits only when something differs. A push rejected as
non-fast-forward (another writer got there first) is retried on top of the
new tip with the files written again, so concurrent writers never lose a
commit. A lease on a separate ref (`refs/gitops/lock`) makes sure only one
controller applies at a time; a crashed holder's lease simply expires.
"""
from __future__ import annotations

import datetime as dt
import json
import logging
import shutil
import subprocess
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import git

from gitops.errors import GitopsError
from gitops.gitclone import open_clone

log = logging.getLogger(__name__)

LOCK_REF = "refs/gitops/lock"
AUTHOR = git.Actor("gitops", "gitops@localhost")
PUSH_ATTEMPTS = 8


class StatusError(GitopsError):
    pass


class Locked(StatusError):
    """Another controller holds the apply lease."""


@dataclass(frozen=True)
class Lease:
    holder: str
    expires: dt.datetime


class StatusBranch:
    def __init__(self, url: str, workdir: Path, branch: str = "gitops/status"):
        self.url = url
        self.branch = branch
        self.dir = workdir / "status"
        self._repo: git.Repo | None = None

    # ------------------------------------------------------------------ worktree

    @property
    def repo(self) -> git.Repo:
        if self._repo is None:
            try:
                self._repo = open_clone(self.url, self.dir)
                with self._repo.config_writer() as config:
                    config.set_value("user", "name", AUTHOR.name)
                    config.set_value("user", "email", AUTHOR.email)
                    config.set_value("commit", "gpgsign", "false")
            except (git.GitCommandError, ValueError) as err:
                raise StatusError(f"cannot clone {self.url} for the status branch: {_msg(err)}") from None
        return self._repo

    def _remote_tip(self) -> str | None:
        try:
            self.repo.remote("origin").fetch(f"+refs/heads/{self.branch}:refs/remotes/origin/{self.branch}")
        except git.GitCommandError as err:
            if "couldn't find remote ref" in str(err).lower():
                return None
            raise StatusError(f"cannot fetch {self.branch}: {_msg(err)}") from None
        return self.repo.commit(f"refs/remotes/origin/{self.branch}").hexsha

    def sync(self) -> str | None:
        """Reset the worktree to the remote tip (an empty orphan branch if there is none)."""
        tip = self._remote_tip()
        repo = self.repo
        if tip is None:
            repo.git.checkout("--force", "--orphan", f"gitops-local-{uuid.uuid4().hex[:6]}")
            repo.git.rm("-rfq", "--cached", "--ignore-unmatch", ".")
            for entry in self.dir.iterdir():
                if entry.name != ".git":
                    shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
        else:
            repo.git.checkout("--force", "-B", self.branch, tip)
            repo.git.clean("-ffdxq")
        return tip

    def read(self, rel: str) -> bytes | None:
        path = self.dir / rel
        return path.read_bytes() if path.is_file() else None

    def write_tree(self, files: dict[str, bytes], managed: tuple[str, ...]) -> None:
        """Make the files under the `managed` prefixes exactly `files` (others are left alone)."""
        for prefix in managed:
            root = self.dir / prefix
            if root.is_file():
                root.unlink()
            elif root.is_dir():
                for path in sorted(root.rglob("*"), reverse=True):
                    rel = path.relative_to(self.dir).as_posix()
                    if path.is_file() and rel not in files:
                        path.unlink()
                    elif path.is_dir() and not any(path.iterdir()):
                        path.rmdir()
        for rel, data in sorted(files.items()):
            path = self.dir / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            if not path.is_file() or path.read_bytes() != data:
                path.write_bytes(data)

    def publish(self, write: Callable[["StatusBranch"], None], message: str) -> str | None:
        """Write, commit if anything changed, push; returns the new commit SHA or None."""
        for attempt in range(1, PUSH_ATTEMPTS + 1):
            tip = self.sync()
            write(self)
            repo = self.repo
            repo.git.add("-A")
            if tip is not None and not repo.is_dirty(index=True, working_tree=False, untracked_files=False):
                return None
            if tip is None and not repo.git.status("--porcelain"):
                return None
            repo.git.commit("-q", "-m", message, "--no-verify")
            sha = repo.head.commit.hexsha
            try:
                repo.git.push("origin", f"HEAD:refs/heads/{self.branch}")
                log.info("status committed", extra={"sha": sha, "branch": self.branch})
                return sha
            except git.GitCommandError as err:
                text = str(err)
                if "non-fast-forward" in text or "fetch first" in text or "rejected" in text:
                    log.info("status push raced another writer; retrying", extra={"attempt": attempt})
                    continue
                raise StatusError(f"cannot push {self.branch}: {_msg(err)}") from None
        raise StatusError(f"cannot push {self.branch}: still racing other writers after {PUSH_ATTEMPTS} attempts")

    # ------------------------------------------------------------------ lease

    def _lease(self) -> tuple[str | None, Lease | None]:
        try:
            self.repo.remote("origin").fetch(f"+{LOCK_REF}:{LOCK_REF}")
        except git.GitCommandError as err:
            if "couldn't find remote ref" in str(err).lower():
                return None, None
            raise StatusError(f"cannot fetch the lock: {_msg(err)}") from None
        sha = self.repo.git.rev_parse(LOCK_REF)
        data = json.loads(self.repo.git.show(f"{sha}:lock.json"))
        return sha, Lease(data["holder"], dt.datetime.fromisoformat(data["expires"]))

    def acquire(self, holder: str, ttl: dt.timedelta, now: dt.datetime | None = None) -> Lease:
        """Take or renew the apply lease; raises Locked while another holder's lease runs."""
        now = now or dt.datetime.now(dt.timezone.utc)
        old_sha, lease = self._lease()
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
            raise Locked(f"lost the race for the apply lock: {_msg(err)}") from None
        repo.git.update_ref(LOCK_REF, commit)
        return new

    def _git_input(self, text: str, *args: str) -> str:
        proc = subprocess.run(["git", *args], cwd=self.dir, input=text, capture_output=True, text=True, timeout=60)
        if proc.returncode != 0:
            raise StatusError(f"git {args[0]} failed: {proc.stderr.strip()}")
        return proc.stdout.strip()

    def release(self, holder: str) -> None:
        old_sha, lease = self._lease()
        if lease is None or lease.holder != holder:
            return
        try:
            self.repo.git.push("origin", f"--force-with-lease={LOCK_REF}:{old_sha}", f":{LOCK_REF}")
        except git.GitCommandError as err:
            log.warning("could not release the apply lock: %s", _msg(err))


def _msg(err: Exception) -> str:
    text = getattr(err, "stderr", None) or str(err)
    return " ".join(str(text).replace("stderr:", "").split())[:300]
