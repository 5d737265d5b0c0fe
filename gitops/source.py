"""The infra repo as a git source: clone, fetch, check out one commit, verify its signature.

Every reconcile is tied to one commit SHA. The checkout is a detached worktree
that is reset and cleaned for each commit, so what is validated and applied is
exactly what the commit holds.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import git

from gitops.errors import GitopsError
from gitops.gitclone import open_clone

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
        self._repo: git.Repo | None = None

    @property
    def repo(self) -> git.Repo:
        if self._repo is None:
            try:
                self._repo = open_clone(self.url, self.dir)
            except (git.GitCommandError, ValueError) as err:
                raise SourceError(f"cannot clone {self.url}: {_git_message(err)}") from None
        return self._repo

    def fetch(self) -> str:
        """Fetch and return the SHA at the tip of the followed branch."""
        try:
            self.repo.remote("origin").fetch(f"+refs/heads/{self.branch}:refs/remotes/origin/{self.branch}",
                                             prune=False)
            return self.repo.commit(f"refs/remotes/origin/{self.branch}").hexsha
        except (git.GitCommandError, git.BadName, ValueError) as err:
            raise SourceError(f"cannot fetch {self.branch} from {self.url}: {_git_message(err)}") from None

    def checkout(self, sha: str) -> Revision:
        """Detach the working tree at `sha`, discarding anything else in it."""
        try:
            self.repo.git.checkout("--force", "--detach", sha)
            self.repo.git.clean("-ffdxq")
            commit = self.repo.commit(sha)
        except git.GitCommandError as err:
            raise SourceError(f"cannot check out {sha[:12]}: {_git_message(err)}") from None
        return Revision(sha=sha, path=self.dir, subject=str(commit.summary))

    def on_branch(self, sha: str) -> bool:
        """Whether `sha` is the fetched tip of the followed branch or one of its ancestors."""
        status, _, _ = self.repo.git.execute(
            ["git", "merge-base", "--is-ancestor", sha, f"refs/remotes/origin/{self.branch}"],
            with_extended_output=True, with_exceptions=False)
        return status == 0

    def verify(self, sha: str) -> str:
        """Check the commit's signature against the policy; returns git's description of the signer."""
        policy = self.signatures
        if policy is None:
            return ""
        argv = ["git"]
        env = {}
        if policy.allowed_signers is not None:
            argv += ["-c", f"gpg.ssh.allowedSignersFile={policy.allowed_signers}"]
        if policy.gpg_home is not None:
            env["GNUPGHOME"] = str(policy.gpg_home)
        argv += ["verify-commit", "-v", sha]
        status, _, stderr = self.repo.git.execute(argv, with_extended_output=True, with_exceptions=False, env=env,
                                                  kill_after_timeout=60)
        if status != 0:
            detail = " ".join(line.strip() for line in stderr.splitlines()
                              if line.strip() and not line.startswith(("tree ", "parent ", "author ", "committer ")))
            if not self.repo.commit(sha).gpgsig:
                raise SignatureError(f"commit {sha[:12]} is not signed")
            raise SignatureError(f"commit {sha[:12]} has no valid signature from an allowed signer: "
                                 f"{detail[-300:] or 'verification failed'}")
        signer = next((line.strip() for line in stderr.splitlines() if "Good" in line), "good signature")
        return signer


def _git_message(err: Exception) -> str:
    if isinstance(err, git.GitCommandError):
        text = (err.stderr or str(err)).strip()
        return " ".join(text.replace("stderr:", "").split())[:300]
    return str(err)
