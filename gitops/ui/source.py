"""Where the UI reads from: a mirror of the repo (its status branch, its other branches) kept in a private
bare clone, fetched again at most every `refresh` seconds (I/O)."""
from __future__ import annotations

import contextlib
import io
import tarfile
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import git

from gitops.errors import GitopsError
from gitops.model.config import CONFIG_FILE, DEFAULT_STATUS_BRANCH
from gitops.model.yamlload import YamlError, load_yaml_documents
from gitops.status.reader import APPLY, SOURCE, StatusReader

#: what a fetch brings: the branches (the status branch among them), a clone's remote-tracking branches, notes
_REFSPECS = ("+refs/heads/*:refs/heads/*", "+refs/remotes/origin/*:refs/remotes/origin/*",
             "+refs/notes/*:refs/notes/*")


@dataclass(frozen=True)
class StatusCommit:
    """One commit of the status branch: its id, time (unix), subject, and its two records as they were."""

    sha: str
    time: int
    subject: str
    source: bytes | None
    apply: bytes | None
    #: whether this commit wrote status/apply.yaml (an apply's record), not only carried it along
    applied_here: bool


class StatusSource:
    """A private bare mirror of `url` (a URL or a local clone), fetched when a page asks and the last fetch is
    older than `refresh` seconds. `branch`: the repo's main branch (its gitops.yaml names the status
    branch, unless `status_branch` is given)."""

    def __init__(self, url: str, cache: Path, branch: str = "main", status_branch: str = "", refresh: float = 5.0):
        self.url, self.cache, self.branch, self.refresh = url, cache, branch, refresh
        self._status_branch = status_branch
        self._fetched = -1e9
        #: one page at a time talks to the mirror: GitPython's `cat-file --batch` process is not thread-safe
        self._lock = threading.RLock()
        if not (cache / "HEAD").exists():
            git.Repo.init(cache, bare=True)
        self.repo = git.Repo(cache)

    # ------------------------------------------------------------------ fetching

    def fetch(self, force: bool = False) -> None:
        """Bring the mirror up to date (at most once per `refresh` seconds unless `force`)."""
        with self._lock:
            if not force and time.monotonic() - self._fetched < self.refresh:
                return
            try:
                self.repo.git.fetch("--quiet", "--prune", "--no-tags", self.url, *_REFSPECS)
            except git.GitCommandError as err:
                raise GitopsError(f"cannot fetch {self.url}: {(err.stderr or str(err)).strip()}") from None
            self._fetched = time.monotonic()

    def resolve(self, name: str) -> str | None:
        """The full ref of a branch name in the mirror (its own branch, else a clone's remote-tracking one)."""
        with self._lock:
            for ref in (f"refs/heads/{name}", f"refs/remotes/origin/{name}"):
                try:
                    self.repo.git.rev_parse("--verify", "--quiet", ref)
                    return ref
                except git.GitCommandError:
                    continue
        return None

    def commit_of(self, ref: str) -> str:
        with self._lock:
            return self.repo.git.rev_parse(ref)

    def branches(self) -> list[str]:
        """The repo's branch names (the status branch left out)."""
        out = set()
        with self._lock:
            names = self.repo.git.for_each_ref("--format=%(refname)", "refs/heads", "refs/remotes/origin").split()
        for line in names:
            name = line.removeprefix("refs/heads/").removeprefix("refs/remotes/origin/")
            if name != "HEAD" and name != self.status_branch:
                out.add(name)
        return sorted(out)

    @property
    def status_branch(self) -> str:
        if self._status_branch:
            return self._status_branch
        ref = self.resolve(self.branch)
        name = DEFAULT_STATUS_BRANCH
        if ref is not None:
            try:
                with self._lock:
                    _sha, _kind, _size, data = self.repo.git.get_object_data(f"{ref}:{CONFIG_FILE}")
                docs = load_yaml_documents(data)
                spec = docs[0].data.get("spec") if docs and isinstance(docs[0].data, dict) else None
                found = spec.get("statusBranch") if isinstance(spec, dict) else None
                name = found if isinstance(found, str) and found else name
            except (ValueError, YamlError):
                pass
        return name

    # ------------------------------------------------------------------ reading

    def status_ref(self) -> str:
        ref = self.resolve(self.status_branch)
        if ref is None:
            raise GitopsError(f"no status branch {self.status_branch!r} in {self.url} yet: has a controller "
                              "(or `gitops state push`) written it?")
        return ref

    def reader(self, at: str = "") -> StatusReader:
        """The status tree at the status branch's tip (or at commit `at` of it)."""
        self.fetch()
        return StatusReader.at_ref(self.cache, at or self.status_ref())

    def history(self, limit: int = 50) -> list[StatusCommit]:
        """The status branch's newest `limit` commits, newest first, each with its records as they were."""
        self.fetch()
        ref = self.status_ref()
        out = []
        with self._lock:
            lines = self.repo.git.log("--first-parent", f"-n{limit}", "--format=%H%x00%ct%x00%s", ref).splitlines()
            changed = set(self.repo.git.log("--first-parent", f"-n{limit}", "--format=%H", ref, "--", APPLY).split())
            for line in lines:
                sha, stamp, subject = line.split("\x00", 2)
                out.append(StatusCommit(sha, int(stamp), subject, self._blob(sha, SOURCE), self._blob(sha, APPLY),
                                        sha in changed))
        return out

    def last_apply_time(self) -> int | None:
        """When the newest status commit that wrote an apply's record was made (unix time), if any."""
        self.fetch()
        ref = self.status_ref()
        with self._lock:
            stamp = self.repo.git.log("--first-parent", "-n1", "--format=%ct", ref, "--", APPLY).strip()
        return int(stamp) if stamp else None

    def _blob(self, commit: str, rel: str) -> bytes | None:
        try:
            _sha, kind, _size, data = self.repo.git.get_object_data(f"{commit}:{rel}")
        except ValueError:
            return None
        return data if kind == b"blob" else None

    @contextlib.contextmanager
    def checkout(self, branch: str) -> Iterator[tuple[Path, str]]:
        """The files of `branch` in a temporary directory (removed after), with the commit they are of."""
        self.fetch()
        ref = self.resolve(branch)
        if ref is None:
            raise GitopsError(f"no branch {branch!r} in {self.url}")
        sha = self.commit_of(ref)
        with tempfile.TemporaryDirectory(prefix="gitops-ui-") as tmp:
            archive = io.BytesIO()
            with self._lock:
                self.repo.archive(archive, sha, format="tar")
            archive.seek(0)
            with tarfile.open(fileobj=archive) as tar:
                tar.extractall(tmp, filter="data")
            yield Path(tmp), sha
