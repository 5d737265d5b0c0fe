"""Who may write the status branch: every status commit is signed with an SSH key (git's own signing,
`gpg.format ssh`) and read back only from a commit signed by a pinned key.

The pinned keys are `spec.status.signers` of gitops.yaml, a list of allowed-signers lines
(`PRINCIPAL KEYTYPE BASE64 [comment]`), reviewed like any change; a controller also trusts the key in
its own workdir (`SIGNING_KEY`), so with no list it trusts only itself. Verification is `git verify-commit`
against that list (`ssh-keygen -Y verify`, namespace "git"), answered once per commit.
"""
from __future__ import annotations

import logging
import os
import re
import subprocess
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from gitops.errors import GitopsError
from gitops.gitrepo import Repo, as_repo

log = logging.getLogger(__name__)

#: the controller's status signing key in its workdir (its public half beside it, `.pub`)
SIGNING_KEY = "status-signing-key"
#: key types an allowed-signers line may name
KEY_TYPES = ("ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521", "ssh-rsa",
             "sk-ssh-ed25519@openssh.com", "sk-ecdsa-sha2-nistp256@openssh.com")
_LINE = re.compile(r"^(?P<principal>[A-Za-z0-9._@+-]{1,128})\s+(?P<type>[a-z0-9@.-]+)\s+(?P<key>[A-Za-z0-9+/]+={0,3})"
                   r"(?:\s+(?P<comment>\S.*))?$")
#: the largest commit object verified (headers, signature and message; a status commit's is about 1 KiB)
MAX_COMMIT_BYTES = 1 << 20
#: where the insecure mode is named in errors and warnings
INSECURE_FLAG = "--insecure-unverified-status"
#: the trailer of a signed status commit's message that numbers it: one more than the newest signed commit it
#: was written on, so a reader that knows one can refuse an older signed commit put back at the tip
GENERATION_TRAILER = "Status-Generation"
_GENERATION = re.compile(rb"^" + GENERATION_TRAILER.encode() + rb": ([0-9]{1,18})$", re.MULTILINE)


class TrustError(GitopsError):
    """A status commit that may not be used, or keys that cannot be read."""


@dataclass(frozen=True)
class Signer:
    principal: str
    key_type: str
    key: str  # base64

    @property
    def public(self) -> str:
        return f"{self.key_type} {self.key}"

    def line(self) -> str:
        return f'{self.principal} namespaces="git" {self.key_type} {self.key}'


def parse_signer(text: str, where: str = "") -> Signer:
    """One allowed-signers line (`PRINCIPAL KEYTYPE BASE64 [comment]`), or a bare public key
    (`KEYTYPE BASE64 [comment]`, its principal the comment or "gitops")."""
    text = text.strip()
    found = _LINE.match(text)
    if found is None or found["type"] not in KEY_TYPES:
        bare = text.split()
        if len(bare) >= 2 and bare[0] in KEY_TYPES and re.fullmatch(r"[A-Za-z0-9+/]+={0,3}", bare[1]):
            principal = re.sub(r"[^A-Za-z0-9._@+-]", "-", bare[2])[:128] if len(bare) > 2 else "gitops"
            return Signer(principal, bare[0], bare[1])
        raise TrustError(f"{where or 'signer'}: not an allowed-signers line (PRINCIPAL KEYTYPE BASE64 [comment], "
                         f"KEYTYPE one of {', '.join(KEY_TYPES[:2])}, ...): {text[:80]!r}")
    return Signer(found["principal"], found["type"], found["key"])


@dataclass(frozen=True)
class Signers:
    """The pinned status signers."""

    signers: tuple[Signer, ...] = ()

    @classmethod
    def parse(cls, lines: Iterable[str], where: str = "") -> "Signers":
        return cls(tuple(parse_signer(line, f"{where}[{i}]" if where else "")
                         for i, line in enumerate(lines) if line.strip() and not line.lstrip().startswith("#")))

    @classmethod
    def from_file(cls, path: Path) -> "Signers":
        """An allowed-signers file or a public key file (`.pub`)."""
        from gitops.safeio import FileRefused, read_text
        try:
            text = read_text(path, 1 << 20)
        except FileRefused as err:
            raise TrustError(f"cannot read status signers: {err}") from None
        return cls.parse(text.splitlines(), str(path))

    def __bool__(self) -> bool:
        return bool(self.signers)

    def plus(self, other: Iterable[Signer]) -> "Signers":
        have = {s.public for s in self.signers}
        return Signers(self.signers + tuple(s for s in other if s.public not in have))

    def allows(self, signer: Signer) -> bool:
        return any(s.public == signer.public for s in self.signers)

    def text(self) -> str:
        """As git's gpg.ssh.allowedSignersFile."""
        return "".join(s.line() + "\n" for s in self.signers)


@dataclass(frozen=True)
class SigningKey:
    """An SSH private key that signs status commits (its public half at `path`.pub, or derived)."""

    path: Path

    @property
    def signer(self) -> Signer:
        pub = Path(f"{self.path}.pub")
        if pub.is_file():
            return parse_signer(pub.read_text())
        done = subprocess.run(["ssh-keygen", "-y", "-f", str(self.path)], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise TrustError(f"cannot read the status signing key {self.path}: {done.stderr.strip()[:200]}")
        return parse_signer(done.stdout)


def ensure_key(path: Path, comment: str) -> SigningKey:
    """The signing key at `path`, made (ed25519, no passphrase, mode 0600) when there is none."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=path.parent, prefix=".keygen-") as scratch:
            made = Path(scratch) / "key"
            done = subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(made)],
                                  capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise TrustError(f"cannot make a status signing key: {done.stderr.strip()[:200]}")
            os.replace(f"{made}.pub", f"{path}.pub")
            os.replace(made, path)  # the private half last: a key without its .pub is derived again
        log.info("status signing key made", extra={"path": str(path)})
    return SigningKey(path)


def generation_of(repo: Repo | Path, sha: str) -> int:
    """The `GENERATION_TRAILER` of commit `sha`'s message (the last one), 0 when it has none (a commit made
    before generations, or no commit): trust it only for a commit a pinned key signed."""
    found = as_repo(repo).read_objects([sha])[0]
    if found is None or found[0] != "commit":
        return 0
    numbers = _GENERATION.findall(found[1].partition(b"\n\n")[2])
    return int(numbers[-1]) if numbers else 0


@dataclass
class Verifier:
    """Answers whether commits of a clone are signed by one of `signers` (each commit asked once).
    `min_generation`: what `require` reads must be at least that generation (`--status-min-generation`)."""

    signers: Signers
    insecure: bool = False  # `--insecure-unverified-status`: every commit passes, with a warning
    min_generation: int = 0
    _answers: dict[str, str | None] = field(default_factory=dict)

    def problem(self, repo: Repo | Path, sha: str) -> str | None:
        """None when `sha` is signed by a pinned key, else why not (one line)."""
        if self.insecure:
            return None
        if sha not in self._answers:
            if len(self._answers) >= 10_000:  # (commits pushed by anyone: kept bounded)
                self._answers.clear()
            self._answers[sha] = self._check(repo, sha)
        return self._answers[sha]

    def require(self, repo: Repo | Path, sha: str, what: str = "status commit", min_generation: int = 0) -> int:
        """Raise `TrustError` unless `sha` is signed by a pinned key and at least generation `min_generation`
        (and `self.min_generation`); its generation."""
        problem = self.problem(repo, sha)
        if problem is not None:
            raise TrustError(f"{what} {sha[:12]} is not trusted: {problem} (the status signers are "
                             f"spec.status.signers of gitops.yaml, or --status-signers; {INSECURE_FLAG} reads it "
                             "unverified)")
        return self.require_generation(repo, sha, what, min_generation)

    def require_generation(self, repo: Repo | Path, sha: str, what: str = "status commit",
                           min_generation: int = 0) -> int:
        """`sha`'s generation; `TrustError` when it is older than `min_generation` or `self.min_generation`."""
        return self.at_least(generation_of(repo, sha), f"{what} {sha[:12]}", min_generation)

    def at_least(self, generation: int, what: str, min_generation: int = 0) -> int:
        """`generation` (of `what`, for the error); `TrustError` when it is older than `min_generation` or
        `self.min_generation`: the one floor every reader of a status branch holds to."""
        floor = max(min_generation, self.min_generation)
        if generation < floor:
            raise TrustError(f"{what} is generation {generation}, older than generation {floor} already "
                             "seen or asked for (--status-min-generation): the branch was put back to an older "
                             "signed commit")
        return generation

    def _check(self, repo: Repo | Path, sha: str) -> str | None:
        if not self.signers:
            return "no status signer is pinned"
        repo = as_repo(repo)
        header = repo.header(sha)
        if header is None or header[0] != "commit":
            return f"no commit {sha[:12]} here"
        size = header[1]
        if size > MAX_COMMIT_BYTES:
            return f"its commit object is {size} bytes, more than a status commit ever holds"
        signature = repo.commit_signature(sha)
        if not signature:
            return "unsigned"
        if signature != "ssh":
            return "signed, but not with an SSH key"
        done = repo.verify_commit(sha, allowed_signers=self.signers.text(), raw=True)
        if done.ok:
            return None
        key = re.search(r"SHA256:[A-Za-z0-9+/=]+", done.err)
        return "signed by a key that is not pinned" + (f" ({key.group(0)})" if key else "")


def trusted_heads(repo: Repo | Path, tip: str, verifier: Verifier, since: str = "") -> tuple[str, ...]:
    """The commits a pinned key signed in `tip`'s history (every parent, no cap) that no other such commit
    descends from, newest first; with `since` (the last commit verified here) only those outside its history,
    and `since` itself unless one of them descends from it. One head is the newest status; several are signed
    commits side by side (a merge put one beside another): reading any one of them alone drops what the others
    wrote, so their trees are merged (`merged_tree`). Each commit's signature is checked once, and only those
    of commits outside the heads found so far."""
    repo = as_repo(repo)
    heads: list[str] = []
    while (head := _first_trusted(repo, tip, verifier, [since, *heads] if since else heads)):
        heads.append(head)  # (the next walk leaves its history out: what is found next is beside it)
    if since and not any(repo.is_ancestor(since, head) for head in heads):
        heads.append(since)
    return tuple(heads)


def _first_trusted(repo: Repo, tip: str, verifier: Verifier, without: list[str]) -> str:
    """The first commit, children before parents, of `tip`'s history outside `without`'s that a pinned key
    signed ("" when none): `git rev-list --topo-order --header` read as it comes, only signed ones verified."""
    with repo.stream("rev-list", "--topo-order", "--header", tip, *(f"^{sha}" for sha in without)) as proc:
        assert proc.stdout is not None
        for raw in _records(proc.stdout):
            sha, _, body = raw.partition(b"\n")
            if b"\ngpgsig " in b"\n" + body.split(b"\n\n", 1)[0] \
                    and verifier.problem(repo, sha.decode()) is None:
                proc.kill()
                return sha.decode()
    return ""


def _records(stream: BinaryIO, chunk: int = 1 << 16) -> Iterator[bytes]:
    """The NUL-separated records of `stream`, each as it completes."""
    pending = b""
    while data := stream.read1(chunk):
        pending += data
        *done, pending = pending.split(b"\0")
        yield from (record for record in done if record)
    if pending:
        yield pending


def merged_tree(repo: Repo | Path, heads: tuple[str, ...]) -> str:
    """The tree to read for `heads` (`trusted_heads`): the one head's, or the heads' trees merged three ways
    (`git merge-tree`), so that no signed commit's content is dropped. Raises `TrustError` naming the paths when
    two heads changed one file differently: then nothing is published until the branch holds one newest."""
    repo = as_repo(repo)
    merged = heads[0]
    for other in heads[1:]:
        done = repo.attempt("merge-tree", "--write-tree", "--name-only", "--no-messages", merged, other)
        if done.status != 0:
            paths = done.text.split("\n")[1:] if done.status == 1 else []
            raise TrustError(f"the status branch holds signed commits side by side ({', '.join(h[:12] for h in heads)}; "
                             "a merge put one beside another) whose changes conflict"
                             + (f" in {', '.join(sorted(set(p for p in paths if p))[:5])}" if paths else
                                f": {done.err.strip()[:200]}")
                             + ": reading either alone would drop the other's records, so nothing is written until "
                             "the branch is reset to the newest of them")
        tree = done.text.split("\n", 1)[0].strip()
        merged = repo.run("commit-tree", "--no-gpg-sign", tree, "-p", merged, "-p", other, "-m", "merged signed status heads",
                          env={"GIT_AUTHOR_NAME": "gitops", "GIT_AUTHOR_EMAIL": "gitops@localhost",
                               "GIT_COMMITTER_NAME": "gitops", "GIT_COMMITTER_EMAIL": "gitops@localhost"}).strip()
    return repo.run("rev-parse", f"{merged}^{{tree}}").strip()


@dataclass
class BranchTrust:
    """How a worktree of the status branch signs what it writes and which commits it reads."""

    verifier: Verifier
    key: SigningKey | None = None  # None: commits unsigned (a reader that never writes)
