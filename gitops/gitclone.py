"""A local clone of a remote, reused across runs."""
from __future__ import annotations

import re
import time
from pathlib import Path

import git


def as_url(repo: str) -> str:
    """A repo given as a URL (kept) or as a local path (made absolute: clones live elsewhere)."""
    return str(Path(repo).absolute()) if is_path(repo) else repo


def is_path(repo: str) -> bool:
    """Whether `repo` names a repository on this machine by its path (not a URL, not scp-like `host:path`)."""
    return "://" not in repo and ":" not in repo.split("/")[0]


def open_clone(url: str, directory: Path) -> git.Repo:
    """The clone of `url` in `directory`: opened (origin re-pointed at `url`) or made without checkout.

    Raises git.GitCommandError or ValueError; callers turn them into their own errors.
    """
    if (directory / ".git").is_dir():
        repo = git.Repo(directory)
        repo.remote("origin").set_url(url)
        return repo
    directory.parent.mkdir(parents=True, exist_ok=True)
    return git.Repo.clone_from(url, directory, no_checkout=True)


def clear_stale_locks(workdir: Path) -> list[Path]:
    """Remove the lock files git left in the clones under `workdir` (`<clone>/.git/**/*.lock`): the index's,
    HEAD's, a ref's. Git never removes them itself, so a process killed in the middle of a commit, a fetch
    or a push stops every later git command in that clone. Only for the workdir's one process
    (`status.lease.lock_workdir` held), before it runs git: no lock there can be anyone else's. Returns
    what was removed."""
    removed = []
    for dot_git in sorted(workdir.glob("*/.git")):
        if dot_git.is_dir() and not dot_git.is_symlink():
            for lock in sorted(dot_git.rglob("*.lock")):
                if lock.is_file() and not lock.is_symlink():
                    lock.unlink()
                    removed.append(lock)
    return removed


#: how git names a lock it could not take ("Unable to create '<path>.lock': File exists")
_LOCK_HELD = re.compile(r"Unable to create '([^']+\.lock)': File exists")
#: a lock in a remote older than this is abandoned: git holds a ref's lock for milliseconds and waits
#: `core.filesRefLockTimeout` (100 ms by default) for another's
ABANDONED_LOCK_AGE = 30.0


def remove_abandoned_remote_locks(url: str, message: str, age: float | None = None) -> list[Path]:
    """The ref locks of a remote on this machine (`url` a path) that git's `message` says it could not take
    and that are older than `age` seconds, removed: a push killed in the middle of updating the remote (its
    receive-pack runs as the pusher's child on a local remote, and dies with it) leaves one, and every
    later push to that ref fails. A remote reached over the network keeps its own locks: nothing is done."""
    if not is_path(url):
        return []
    remote = Path(url).resolve()
    age = ABANDONED_LOCK_AGE if age is None else age
    removed = []
    for raw in _LOCK_HELD.findall(message):
        lock = Path(raw).resolve()
        if not lock.is_relative_to(remote) or lock.is_symlink() or not lock.is_file():
            continue
        if time.time() - lock.stat().st_mtime > age:
            lock.unlink(missing_ok=True)
            removed.append(lock)
    return removed
