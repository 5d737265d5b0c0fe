"""The status branch: a git worktree the controller rewrites and pushes.

Each publish starts from the remote tip, lets the caller write the complete
set of files, and commits only when something differs. A push rejected as
non-fast-forward (another writer got there first: several controllers, each
writing only its shards' files) is retried on top of the new tip with the files
written again, at most PUSH_ATTEMPTS times with a randomized backoff that grows
with the attempt and with what an attempt costs (up to PUSH_BACKOFF_MAX), so
concurrent writers never lose a commit. A commit's outcome note (`NOTES_REF`) goes in the same atomic push as the
status commit that records it: both land or neither does. The apply lease (one
controller applies at a time) is `lease.py`; the branch's name and layout, and
reading it back, are `reader.py`.
"""
from __future__ import annotations

import dataclasses
import hashlib
import logging
import random
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from gitops.errors import GitopsError
from gitops.gitrepo import GitError, Repo, open_clone, remove_abandoned_remote_locks
from gitops.safeio import FileRefused, read_text, remove_under, write_atomic, write_under
from gitops.status.reader import DEFAULT_BRANCH, MANAGED, StatusReader
from gitops.status.trust import GENERATION_TRAILER, BranchTrust, TrustError, generation_of, merged_tree, trusted_heads

log = logging.getLogger(__name__)

#: the status commits' author and committer (name, email)
AUTHOR = ("gitops", "gitops@localhost")
#: pushes that lose the race to another writer, at most, before a publish gives up: several replicas each
#: committing every few seconds on a loaded host made a writer lose 8 in a row (its apply failed with it)
PUSH_ATTEMPTS = 30
#: the longest pause between two attempts, seconds
PUSH_BACKOFF_MAX = 5.0
#: what git says of a push that lost a race with another writer (client side, or in the remote's transaction)
RACES = ("non-fast-forward", "fetch first", "stale info", "cannot lock ref", "failed to update ref", "failed to lock",
         "atomic transaction failed",
         "incorrect old value")
#: each applied or refused commit's outcome, as a git note (`git log --notes=gitops`)
NOTES_REF = "refs/notes/gitops"
#: In a controller's workdir: the statusBranch of the commit in force, for reporting a refused commit there.
IN_FORCE_BRANCH = "status-branch"
#: in the worktree's clone: the last status commit verified there, per branch (history must descend from it)
TRUSTED_REFS = "refs/gitops/trusted"


class StatusError(GitopsError):
    pass


@dataclasses.dataclass(frozen=True)
class Note:
    """The outcome of the infra repo's `commit` (on `source_branch`) as its git note in `NOTES_REF`
    (`git log --notes=gitops`); `publish` ends the text with the status commit that recorded it."""
    commit: str
    source_branch: str
    text: str


class StatusBranch:
    def __init__(self, url: str, workdir: Path, branch: str = DEFAULT_BRANCH, trust: BranchTrust | None = None):
        self.url = url
        self.branch = branch
        self.dir = workdir / "status"
        #: signs every commit and reads only commits signed by a pinned key (None: neither, for tests and tools)
        self.trust = trust
        #: the last `sync` found the tip not trusted: (tip, why); its tree was set aside for the last trusted one
        self.untrusted: tuple[str, str] | None = None
        self._repo: Repo | None = None
        self._pushed: str | None = None  # the commit this worktree holds exactly, as last pushed by it
        #: the last sync found history rolled back: the next commit has this one (verified) as a parent too,
        #: so the branch descends from it again (and no older commit can pass as newer)
        self._keep: str = ""
        #: the generation of what the last sync read (the newest signed commit, or several merged): the next
        #: commit is one more
        self.generation = 0

    # ------------------------------------------------------------------ worktree

    @property
    def repo(self) -> Repo:
        if self._repo is None:
            try:
                repo = open_clone(self.url, self.dir)
                key = self.trust.key if self.trust is not None else None
                config = {"user.name": AUTHOR[0], "user.email": AUTHOR[1],
                          "commit.gpgsign": "true" if key is not None else "false",
                          # a link pushed to the branch is checked out as a plain file holding its text, never
                          # as a link: nothing written into the worktree can land outside it
                          "core.symlinks": "false",
                          "core.untrackedCache": "true"}  # `add -A` over thousands of files
                if key is not None:  # git's own SSH signing (ssh-keygen -Y sign, namespace "git")
                    config.update({"gpg.format": "ssh", "user.signingkey": str(key.path.absolute())})
                repo.configure(config)
                self._repo = repo
            except GitError as err:
                raise StatusError(f"cannot clone {self.url} for the status branch: {err.detail}") from None
        return self._repo

    def _remote_tip(self) -> str | None:
        tracking = f"refs/remotes/origin/{self.branch}"
        try:
            if not self.repo.fetch_ref("origin", f"refs/heads/{self.branch}", tracking):
                return None
        except GitError as err:
            raise StatusError(f"cannot fetch {self.branch}: {err.detail}") from None
        return self.repo.commit_of(tracking) or None

    def sync(self) -> str | None:
        """Reset the worktree to the remote tip (an empty orphan branch if there is none). With `trust`, a
        tip not signed by a pinned key (or one whose history does not descend from the last commit verified
        here) is recorded in `untrusted`, and the worktree holds the tree of the newest trusted commit on
        top of it: what is read is only ever what a pinned key signed, and the next commit puts it back."""
        tip = self._remote_tip()
        repo = self.repo
        self.untrusted, self._keep = None, ""
        known = self._known() if tip is None and self.trust is not None else ""
        if tip is None:
            self.generation = generation_of(repo, known) if known else 0
        if tip is None and known:  # deleted by someone: the history last verified here goes on from there
            self.untrusted = ("", f"the branch is gone; {known[:12]}, the last status commit verified here, "
                                  "is read instead")
            log.warning("status branch deleted: the last trusted status is written back",
                        extra={"branch": self.branch, "reading": known})
            repo.run("checkout", "--quiet", "--force", "-B", self.branch, known)
            repo.run("clean", "-ffdxq")
        elif tip is None:
            repo.run("checkout", "--quiet", "--force", "--orphan", f"gitops-local-{uuid.uuid4().hex[:6]}")
            repo.run("rm", "-rfq", "--cached", "--ignore-unmatch", ".")
            for entry in self.dir.iterdir():
                if entry.name != ".git":
                    shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
        elif tip != self._pushed:  # else the worktree already is the tip
            base = self._trusted_base(tip) if self.trust is not None else tip
            if self.trust is None:
                self.generation = generation_of(repo, tip)
            if base == tip:
                repo.run("checkout", "--quiet", "--force", "-B", self.branch, tip)
            else:  # the tip's tree is never checked out: the branch points at it, the worktree is the base's
                repo.run("update-ref", f"refs/heads/{self.branch}", tip)
                repo.run("symbolic-ref", "HEAD", f"refs/heads/{self.branch}")
                if base:
                    repo.run("read-tree", "--reset", "-u", base)
                else:
                    self._carry_unmanaged(tip)
            repo.run("clean", "-ffdxq")
        self._pushed = None  # the caller writes now
        return tip

    def _trusted_base(self, tip: str) -> str:
        """`tip` when a pinned key signed it and it descends from the last commit verified here, else what to
        read instead, the tip noted in `untrusted`: the newest trusted commit of its history (every parent), or
        the trees of several merged when signed commits stand side by side (a tree id), "" when there is none.
        What is published on top never holds a tree older than a signed commit in its own history."""
        assert self.trust is not None
        repo, ref = self.repo, f"{TRUSTED_REFS}/{self.branch}"
        known = self._known()
        if known and not repo.is_ancestor(known, tip):
            self.untrusted = (tip, f"its history does not descend from {known[:12]}, the last status commit "
                                   "verified here (rewritten or rolled back)")
            self._keep = known
        elif (problem := self.trust.verifier.problem(repo, tip)) is None:
            self.generation = self._at_least(tip, generation_of(repo, tip))
            repo.run("update-ref", ref, tip)
            return tip
        else:
            self.untrusted = (tip, problem)
        heads = trusted_heads(repo, tip, self.trust.verifier, since=known)
        self.generation = self._at_least(tip, max((generation_of(repo, h) for h in heads), default=0))
        try:
            base = merged_tree(repo, heads) if len(heads) > 1 else (heads[0] if heads else "")
        except TrustError as err:
            raise StatusError(f"{self.branch}: {err}") from None
        if len(heads) > 1:
            self.untrusted = (tip, f"{self.untrusted[1]}; signed commits stand side by side in its history "
                                   f"({', '.join(h[:12] for h in heads)}): their trees are read merged")
        elif base:
            repo.run("update-ref", ref, base)
        if self.untrusted is not None:
            log.warning("status branch tip not trusted: it is set aside", extra={
                "sha": tip, "reason": self.untrusted[1], "reading": base or "(nothing)", "branch": self.branch})
        return base

    def _carry_unmanaged(self, tip: str) -> None:
        """No commit of `tip`'s history is signed (a branch written before signing): the worktree holds the
        tip's files outside what the controller writes from its own state (`MANAGED`: status, observed,
        kubeconfigs, state), such as `backups/` records, so the first signed commit keeps them as they were
        (logged: they were never signed); what the controller writes starts empty."""
        repo = self.repo
        repo.run("read-tree", "--reset", "-u", tip)
        repo.run("rm", "-r", "-q", "--cached", "--ignore-unmatch", "--", *MANAGED)
        carried = self.tracked()
        if carried:
            log.warning("the status branch was never signed: its files outside what the controller writes are "
                        "kept as they are in its first signed commit", extra={"branch": self.branch, "tip": tip,
                                                                            "paths": carried[:20]})

    def _at_least(self, tip: str, generation: int) -> int:
        """`generation` (the newest signed one under `tip`), held to the verifier's floor: `StatusError`."""
        assert self.trust is not None
        try:
            return self.trust.verifier.at_least(generation, f"the newest signed status commit under {tip[:12]}")
        except TrustError as err:
            raise StatusError(f"{self.branch}: {err}") from None

    def _known(self) -> str:
        """The last status commit verified in this worktree's clone ("" when none)."""
        return self.repo.ref(f"{TRUSTED_REFS}/{self.branch}")

    def read(self, rel: str) -> bytes | None:
        return self.reader.read(rel)

    @property
    def reader(self) -> StatusReader:
        """What the worktree (as of the last `sync`) says."""
        return StatusReader.in_dir(self.dir)

    def write_tree(self, files: dict[str, bytes], managed: tuple[str, ...]) -> None:
        """Make the files under the `managed` prefixes exactly `files` (others are left alone).

        Called after `sync`, when the worktree is the tip: the index's blob ids say which files already
        hold their content, so only what changed is written (or removed) and nothing is read back. Nothing
        is written or removed through a link: a link or a non-regular entry on the way is a `StatusError`
        naming it."""
        tracked = self._tracked()
        try:
            gone = [rel for rel in tracked if rel not in files and under(rel, managed)]
            for rel in gone:
                remove_under(self.dir, rel)
            for folder in sorted({str(Path(rel).parent) for rel in gone}, key=len, reverse=True):
                _remove_empty(self.dir, folder)
            for rel, data in sorted(files.items()):
                if tracked.get(rel) != blob_id(data):
                    path = self.dir / rel
                    if path.is_dir() and not path.is_symlink():
                        shutil.rmtree(path)
                    write_under(self.dir, rel, data)
        except FileRefused as err:
            raise StatusError(f"the status branch's worktree {self.dir}: {err}; nothing was written through it")\
                from None

    def tracked(self) -> list[str]:
        """Every file of the worktree's index (as of the last `sync`), sorted."""
        return sorted(self._tracked())

    def tracked_under(self, folder: str) -> list[str]:
        """The files of `tracked` under `folder`; none when there is no worktree yet."""
        if not (self.dir / ".git").exists():
            return []
        return [rel for rel in self.tracked() if rel.startswith(folder + "/")]

    def _tracked(self) -> dict[str, str]:
        """path -> blob id of every file in the index."""
        out = {}
        for entry in self.repo.run("ls-files", "-s", "-z").split("\0"):
            if entry:
                meta, rel = entry.split("\t", 1)
                out[rel] = meta.split()[1]
        return out

    def publish(self, write: Callable[["StatusBranch"], None], message: str, note: Note | None = None) -> str | None:
        """Write, commit if anything changed, push; returns the new commit SHA or None. `note`: pushed with
        the commit, atomically; a note that cannot be made, or a push with it that the remote refuses for
        another reason than a race (a hook, a permission), is logged and the commit pushed alone."""
        attempt, with_note = 1, note
        while True:
            started = time.monotonic()
            tip = self.sync()
            write(self)
            repo = self.repo
            repo.run("add", "-A")
            if tip is not None and repo.succeeds("diff", "--cached", "--quiet"):
                self._pushed = tip  # nothing to commit: the worktree is the tip
                return None
            if tip is None and not repo.run("status", "--porcelain"):
                return None
            stamped = f"{message}\n\n{GENERATION_TRAILER}: {self.generation + 1}"
            try:
                repo.run("commit", "-q", "-m", stamped, "--no-verify")
                if self._keep and tip is not None:  # rolled back: the commit descends from what was verified too
                    signed = ["-S"] if self.trust is not None and self.trust.key is not None else []
                    merged = repo.run("commit-tree", repo.run("rev-parse", "HEAD^{tree}"), "-p", tip, "-p",
                                      self._keep, *signed, "-m", stamped)
                    repo.run("reset", "--soft", merged)
            except GitError as err:  # (signing with the status key among the causes)
                raise StatusError(f"cannot commit to {self.branch}: {err.detail}") from None
            sha = repo.commit_of("HEAD")
            refspecs = [f"HEAD:refs/heads/{self.branch}"]
            if with_note is not None and self._add_note(with_note, sha):
                refspecs.append(f"{NOTES_REF}:{NOTES_REF}")
            try:
                self._push(refspecs)
            except GitError as err:
                for lock in remove_abandoned_remote_locks(self.url, err.said):
                    log.warning("abandoned git lock in the remote removed", extra={"path": str(lock)})
                if any(race in err.said for race in RACES):
                    if attempt == PUSH_ATTEMPTS:
                        raise StatusError(f"cannot push {self.branch}: still racing other writers after "
                                          f"{PUSH_ATTEMPTS} attempts") from None
                    log.log(logging.WARNING if attempt >= 8 else logging.INFO,
                            "status push raced another writer; retrying", extra={"attempt": attempt})
                    # writers racing again at once take turns: back off by up to `attempt` times what an
                    # attempt took (a big tree's attempt takes seconds; retrying at once would race again)
                    time.sleep(random.uniform(0, min(PUSH_BACKOFF_MAX, attempt * (time.monotonic() - started))))
                    attempt += 1
                    continue
                if len(refspecs) > 1:  # refused, not raced: perhaps for the note; neither ref moved
                    log.info("status push with its note refused; trying the status commit alone",
                             extra={"error": err.detail})
                    with_note = None
                    continue
                raise StatusError(f"cannot push {self.branch}: {err.detail}") from None
            self._pushed, self.generation = sha, self.generation + 1
            if self.trust is not None and self.trust.key is not None:  # signed here: what the next sync reads
                repo.run("update-ref", f"{TRUSTED_REFS}/{self.branch}", sha)
            log.info("status committed", extra={"sha": sha, "branch": self.branch})
            if note is not None and with_note is None:
                log.warning("commit note refused by the remote", extra={"sha": note.commit})
            return sha

    def _push(self, refspecs: list[str]) -> None:
        """Push `refspecs` to origin, several at once atomically (a remote without atomic pushes gets the
        first, then the others, the old way; their failure is logged). Raises git's error."""
        repo = self.repo
        try:
            repo.run("push", "--porcelain", *(["--atomic"] if len(refspecs) > 1 else []), "origin", *refspecs)
        except GitError as err:
            if len(refspecs) < 2 or "does not support --atomic" not in err.said:
                raise
            log.warning("the remote takes no atomic push: the note goes after the status commit")
            repo.run("push", "--porcelain", "origin", refspecs[0])
            try:
                repo.run("push", "--porcelain", "origin", *refspecs[1:])
            except GitError as late:
                log.warning("commit note not pushed", extra={"error": late.detail})

    def _add_note(self, note: Note, status_commit: str) -> bool:
        """`note` added locally on top of the remote's notes (fetched now: a push that raced another
        writer's note is made again on top of it); False, logged, when it cannot be made."""
        repo = self.repo
        try:
            repo.run("fetch", "origin", f"+refs/heads/{note.source_branch}:refs/remotes/origin/{note.source_branch}")
            if repo.run("ls-remote", "origin", NOTES_REF).strip():
                repo.run("fetch", "origin", f"+{NOTES_REF}:{NOTES_REF}")
            else:
                repo.run("update-ref", "-d", NOTES_REF)  # none there: start from nothing
            repo.run("notes", f"--ref={NOTES_REF}", "add", "-f", "-m", f"{note.text}\nstatus commit {status_commit}",
                     note.commit)
            return True
        except GitError as err:
            log.warning("commit note not written", extra={"sha": note.commit, "error": err.detail})
            return False


def in_force_branch(workdir: Path) -> str:
    """The statusBranch of the commit in force (the last one applied), as recorded in the workdir."""
    path = workdir / IN_FORCE_BRANCH
    recorded = path.read_text().strip() if path.is_file() else ""
    return recorded or DEFAULT_BRANCH


def record_in_force_branch(workdir: Path, name: str) -> None:
    """Record `name` as the statusBranch of the commit in force (atomically; untouched when it already is)."""
    path = workdir / IN_FORCE_BRANCH
    if path.is_file() and path.read_text().strip() == name:
        return
    write_atomic(path, name + "\n", mode=0o644)


#: In a controller's workdir: spec.status.signers of the commit in force (a refused commit's are not used).
IN_FORCE_SIGNERS = "status-signers"


def in_force_signers(workdir: Path) -> tuple[str, ...]:
    """spec.status.signers of the commit in force, as recorded in the workdir (none when not recorded)."""
    try:
        text = read_text(workdir / IN_FORCE_SIGNERS, 1 << 20)
    except FileRefused:
        return ()
    return tuple(line for line in text.splitlines() if line.strip())


def record_in_force_signers(workdir: Path, signers: tuple[str, ...]) -> None:
    """Record `signers` as spec.status.signers of the commit in force (untouched when they already are)."""
    if in_force_signers(workdir) == signers and (workdir / IN_FORCE_SIGNERS).exists():
        return
    write_atomic(workdir / IN_FORCE_SIGNERS, "".join(line + "\n" for line in signers), mode=0o644)


def blob_id(data: bytes) -> str:
    """The id git gives a blob of `data`."""
    digest = hashlib.sha1(b"blob %d\0" % len(data), usedforsecurity=False)
    digest.update(data)
    return digest.hexdigest()


def under(rel: str, prefixes: tuple[str, ...]) -> bool:
    """Whether the path `rel` is one of `prefixes` or lies inside one of them."""
    return any(rel == p or rel.startswith(p.rstrip("/") + "/") for p in prefixes)


def _remove_empty(root: Path, folder: str) -> None:
    """Remove `folder` (relative to `root`) and its parents while they are empty."""
    path = root / folder
    while path != root and path.is_dir() and not path.is_symlink() and not any(path.iterdir()):
        path.rmdir()
        path = path.parent

