"""The infra repo as a git source: clone, fetch, check out one commit, verify its signature.

Every reconcile is tied to one commit SHA. The checkout is a detached worktree
that is reset and cleaned for each commit, so what is validated and applied is
exactly what the commit holds.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from gitops.errors import GitopsError
from gitops.gitrepo import GitError, Repo, open_clone

log = logging.getLogger(__name__)


class SourceError(GitopsError):
    pass


class SignatureError(GitopsError):
    """The commit is unsigned or signed by a key that is not allowed."""


@dataclass(frozen=True)
class SignaturePolicy:
    """How commits must be signed. One of the two trust roots is required.

    `allowed_signers`: an ssh allowed-signers file (git's gpg.ssh.allowedSignersFile);
    `gpg_home`: a GnuPG home whose keyring holds the trusted keys.
    """

    allowed_signers: Path | None = None
    gpg_home: Path | None = None


@dataclass(frozen=True)
class Revision:
    sha: str
    path: Path  # checkout of exactly this commit
    subject: str


class GitSource:
    """A local clone of `url` (local path, file://, ssh or https) following `branch`."""

    def __init__(self, url: str, workdir: Path, branch: str = "main",
                 signatures: SignaturePolicy | None = None):
        self.url = url
        self.branch = branch
        self.dir = workdir / "source"
        self.signatures = signatures
        self._repo: Repo | None = None

    @property
    def repo(self) -> Repo:
        if self._repo is None:
            try:
                self._repo = open_clone(self.url, self.dir)
            except GitError as err:
                raise SourceError(f"cannot clone {self.url}: {err.detail}") from None
        return self._repo

    def fetch(self) -> str:
        """Fetch and return the SHA at the tip of the followed branch."""
        tracking = f"refs/remotes/origin/{self.branch}"
        try:
            if not self.repo.fetch_ref("origin", f"refs/heads/{self.branch}", tracking):
                raise SourceError(f"cannot fetch {self.branch} from {self.url}: there is no such branch")
        except GitError as err:
            raise SourceError(f"cannot fetch {self.branch} from {self.url}: {err.detail}") from None
        sha = self.repo.commit_of(tracking)
        if not sha:
            raise SourceError(f"cannot fetch {self.branch} from {self.url}: its tip is not a commit")
        return sha

    def checkout(self, sha: str) -> Revision:
        """Detach the working tree at `sha`, discarding anything else in it."""
        try:
            self.repo.run("checkout", "--quiet", "--force", "--detach", sha)
            self.repo.run("clean", "-ffdxq")
            subject = self.repo.subject(sha)
        except GitError as err:
            raise SourceError(f"cannot check out {sha[:12]}: {err.detail}") from None
        return Revision(sha=sha, path=self.dir, subject=subject)

    def on_branch(self, sha: str) -> bool:
        """Whether `sha` is the fetched tip of the followed branch or one of its ancestors."""
        return self.repo.is_ancestor(sha, f"refs/remotes/origin/{self.branch}")

    def verify(self, sha: str) -> str:
        """Check the commit's signature against the policy; returns git's description of the signer."""
        policy = self.signatures
        if policy is None:
            return ""
        done = self.repo.verify_commit(sha, policy.allowed_signers, policy.gpg_home)
        stderr = done.err
        if not done.ok:
            detail = " ".join(line.strip() for line in stderr.splitlines()
                              if line.strip() and not line.startswith(("tree ", "parent ", "author ", "committer ")))
            if not self.repo.commit_signature(sha):
                raise SignatureError(f"commit {sha[:12]} is not signed")
            raise SignatureError(f"commit {sha[:12]} has no valid signature from an allowed signer: "
                                 f"{detail[-300:] or 'verification failed'}")
        signer = next((line.strip() for line in stderr.splitlines() if "Good" in line), "good signature")
        return signer

