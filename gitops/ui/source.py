"""Where the UI reads from: a mirror of the repo (its status branch, its other branches) kept in a private
bare clone, fetched again at most every `refresh` seconds (I/O).

The repo and its status branch are untrusted input: a branch is named by a plain branch name only, its size is
checked (`git ls-tree -r -l`) before any of it is archived, the archive streams to disk, and a link out of its
files is refused. No message holds the URL's credentials (`gitops.redact`)."""
from __future__ import annotations

import contextlib
import re
import subprocess
import tarfile
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from gitops.errors import GitopsError
from gitops.gitrepo import init_bare, without_credentials
from gitops.model.config import CONFIG_FILE, DEFAULT_STATUS_BRANCH
from gitops.model.yamlload import MAX_FILE_BYTES, YamlError, load_yaml_documents
from gitops.printable import printable, shorten
from gitops.redact import redact
from gitops.status.reader import APPLY, SOURCE, StatusReader
from gitops.status.trust import INSECURE_FLAG, Signers, TrustError, Verifier
from gitops.ui.guard import BadRequest, NotFound, Refused
from gitops.units import human_size

#: what a fetch brings: the branches (the status branch among them), a clone's remote-tracking branches, notes
_NAMESPACES = ("refs/heads/", "refs/remotes/origin/", "refs/notes/")
#: a fetch brings at most this many refs of those ...
MAX_MIRROR_REFS = 5_000
#: ... and at most this many bytes (the pack it receives)
MAX_MIRROR_BYTES = 512 * 2**20

#: a branch /plan checks out: at most this many bytes of files (the sum of its blobs' sizes) ...
MAX_BRANCH_BYTES = 64 * 2**20
#: ... and this many files
MAX_BRANCH_FILES = 50_000
#: the largest status record (status/apply.yaml, status/source.yaml) the applies pages read (as the repo's files)
MAX_RECORD_BYTES = MAX_FILE_BYTES
#: `git check-ref-format`'s forbidden characters (controls, space, ~ ^ : ? * [ \), and DEL
_BAD_CHARS = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]")
_COMMIT_LIKE = re.compile(r"[0-9a-fA-F]{7,64}")


@dataclass(frozen=True)
class LogEntry:
    """One commit of the status branch: its id, time (unix), subject, and whether it wrote status/apply.yaml
    (an apply's record), not only carried it along."""

    sha: str
    time: int
    subject: str
    applied_here: bool


def branch_name_problem(name: str) -> str:
    """Why `name` is not a plain branch name ("" when it is one): `git check-ref-format --branch`'s rules, and
    no `refs/...`, no `HEAD`, nothing a commit id could be taken for, at most 255 bytes."""
    if not name:
        return "it is empty"
    if len(name.encode("utf-8", "surrogatepass")) > 255:
        return "it is longer than 255 bytes"
    if _BAD_CHARS.search(name):
        return "it holds a space, a control character or one of ~ ^ : ? * [ \\"
    if name.startswith(("-", "/")) or name.endswith(("/", ".")) or "//" in name or ".." in name:
        return "it starts with - or /, ends with / or ., or holds // or .."
    if "@{" in name or name == "@" or name == "HEAD":
        return "@, @{ and HEAD name revisions, not branches"
    if any(part.startswith(".") or part.endswith(".lock") for part in name.split("/")):
        return "a part of it starts with . or ends with .lock"
    if name.startswith("refs/"):
        return "give the branch's name, not a ref (refs/...)"
    if _COMMIT_LIKE.fullmatch(name):
        return "it looks like a commit id; give a branch name"
    return ""


def check_branch_name(name: str) -> None:
    """`BadRequest` unless `name` is a plain branch name."""
    problem = branch_name_problem(name)
    if problem:
        raise BadRequest(f"'{printable(shorten(name, 80))}' is not a branch name: {problem}")


class StatusSource:
    """A private bare mirror of `url` (a URL or a local clone), fetched when a page asks and the last fetch is
    older than `refresh` seconds. `branch`: the repo's main branch (its gitops.yaml names the status
    branch, unless `status_branch` is given). `max_branch_bytes`, `max_branch_files`: what a branch checked
    out for a plan may hold. `max_refs`, `max_fetch_bytes`: what one fetch may bring (refs listed before
    anything is fetched; the pack's size held by the kernel while it comes), refused past them."""

    def __init__(self, url: str, cache: Path, branch: str = "main", status_branch: str = "", refresh: float = 5.0,
                 max_branch_bytes: int = MAX_BRANCH_BYTES, max_branch_files: int = MAX_BRANCH_FILES,
                 signers: Signers = Signers(), insecure: bool = False, max_refs: int = MAX_MIRROR_REFS,
                 max_fetch_bytes: int = MAX_MIRROR_BYTES, min_generation: int = 0):
        self.url, self.cache, self.branch, self.refresh = url, cache, branch, refresh
        #: status commits are read only when signed by one of these or of spec.status.signers on `branch`
        self.signers, self.insecure = signers, insecure
        self._verifiers: dict[tuple[str, ...], Verifier] = {}
        #: the URL as messages show it: without its credentials
        self.shown = redact(url)
        self.max_branch_bytes, self.max_branch_files = max_branch_bytes, max_branch_files
        #: what one fetch may bring: refs, and bytes of the pack
        self.max_refs, self.max_fetch_bytes = max_refs, max_fetch_bytes
        #: the oldest generation the status branch's tip may have: the given one, raised to each tip read (a
        #: tip put back to an older signed commit is refused, as a cache of what was seen)
        self.min_generation = min_generation
        self._floor_lock = threading.Lock()
        self._status_branch = status_branch
        self._fetched = -1e9
        #: one fetch at a time (reads need no lock: each is a git process of its own, `gitops.gitrepo`)
        self._lock = threading.Lock()
        #: fetched without the URL's credentials on a command line (`without_credentials`)
        self._fetch_url, credentials = without_credentials(url)
        self.repo = init_bare(cache, credentials)

    # ------------------------------------------------------------------ fetching

    def fetch(self, force: bool = False) -> None:
        """Bring the mirror up to date (at most once per `refresh` seconds unless `force`)."""
        with self._lock:
            if not force and time.monotonic() - self._fetched < self.refresh:
                return
            wanted = self._remote_refs()
            if wanted:
                refspecs = "".join(f"+{ref}:{ref}\n" for ref in sorted(wanted))
                done = self.repo.attempt("-c", "fetch.unpackLimit=1", "fetch", "--quiet", "--no-tags", "--stdin",
                                         self._fetch_url, input=refspecs.encode(),
                                         max_file_bytes=self.max_fetch_bytes)
                if not done.ok:
                    if self._drop_partial_packs() >= self.max_fetch_bytes:
                        raise GitopsError(f"cannot fetch {self.shown}: it sends more than "
                                          f"{human_size(self.max_fetch_bytes)} at once (--mirror-max-mib); "
                                          "nothing was kept")
                    why = done.err.strip() or f"git fetch exited {done.status}"
                    raise GitopsError(f"cannot fetch {self.shown}: {redact(why)}")
            gone = [ref for ref in self.repo.run("for-each-ref", "--format=%(refname)", *_NAMESPACES).split()
                    if ref not in wanted]
            if gone:  # (what --prune does for the refs the remote no longer has)
                self.repo.run("update-ref", "--stdin", input="".join(f"delete {ref}\n" for ref in gone).encode())
            self._fetched = time.monotonic()

    def _remote_refs(self) -> set[str]:
        """The refs of the remote a fetch brings (`_NAMESPACES`), read as `git ls-remote` lists them; more than
        `max_refs` is refused before anything is fetched."""
        wanted: set[str] = set()
        with self.repo.stream("ls-remote", "--refs", self._fetch_url, *(f"{n}*" for n in _NAMESPACES),
                              stderr=subprocess.PIPE) as proc:
            assert proc.stdout is not None and proc.stderr is not None
            for line in proc.stdout:
                ref = line.decode(errors="replace").rstrip("\n").partition("\t")[2]
                if ref.startswith(_NAMESPACES) and not ref.endswith("/HEAD"):
                    wanted.add(ref)
                    if len(wanted) > self.max_refs:
                        proc.kill()
                        raise GitopsError(f"cannot fetch {self.shown}: it has more than {self.max_refs} branches "
                                          "and notes refs (--mirror-max-refs); nothing was fetched")
            why = proc.stderr.read(4096).decode(errors="replace").strip()
        if proc.returncode != 0:
            raise GitopsError(f"cannot fetch {self.shown}: {redact(why) or f'git ls-remote exited {proc.returncode}'}")
        return wanted

    def _drop_partial_packs(self) -> int:
        """Remove the packs a failed fetch left behind; the size of the largest (at the limit: stopped there)."""
        largest = 0
        for path in (self.repo.path / "objects" / "pack").glob("tmp_pack_*"):
            largest = max(largest, path.stat().st_size)
            path.unlink(missing_ok=True)
        return largest

    def resolve(self, name: str) -> str | None:
        """The full ref of a branch name in the mirror (its own branch, else a clone's remote-tracking one)."""
        for ref in (f"refs/heads/{name}", f"refs/remotes/origin/{name}"):
            if self.repo.ref(ref):
                return ref
        return None

    def commit_of(self, ref: str) -> str:
        return self.repo.commit_of(ref)

    def branch_commit(self, name: str) -> str:
        """The commit branch `name` is at (`BadRequest` for a name that is no plain branch name, `NotFound`
        when there is no such branch)."""
        check_branch_name(name)
        ref = self.resolve(name)
        if ref is None:
            raise NotFound(f"no branch {printable(name)!r} in {self.shown}")
        return self.commit_of(ref)

    def branches(self) -> list[str]:
        """The repo's branch names (the status branch left out)."""
        out = set()
        names = self.repo.run("for-each-ref", "--format=%(refname)", "refs/heads", "refs/remotes/origin").split()
        for line in names:
            name = line.removeprefix("refs/heads/").removeprefix("refs/remotes/origin/")
            if name != "HEAD" and name != self.status_branch:
                out.add(name)
        return sorted(out)

    def _spec(self) -> dict:
        """The spec of gitops.yaml on the main branch, as is ({} when none or unreadable)."""
        ref = self.resolve(self.branch)
        if ref is None:
            return {}
        name = f"{ref}:{CONFIG_FILE}"
        header = self.repo.header(name)  # (its size first: the branch is anyone's with push access)
        if header is None or header[0] != "blob" or header[1] > MAX_FILE_BYTES:
            return {}
        found = self.repo.read_objects([name])[0]
        if found is None:
            return {}
        try:
            docs = load_yaml_documents(found[1])
        except (ValueError, YamlError):
            return {}
        spec = docs[0].data.get("spec") if docs and isinstance(docs[0].data, dict) else None
        return spec if isinstance(spec, dict) else {}

    @property
    def status_branch(self) -> str:
        if self._status_branch:
            return self._status_branch
        found = self._spec().get("statusBranch")
        return found if isinstance(found, str) and found and not branch_name_problem(found) else DEFAULT_STATUS_BRANCH

    def verifier(self) -> Verifier:
        """Who may have signed a status commit the UI reads: spec.status.signers on the main branch (as it is
        now) and the signers the UI was given; `TrustError` when there are none (unless insecure)."""
        if self.insecure:
            return Verifier(Signers(), insecure=True)
        status = self._spec().get("status")
        listed = status.get("signers") if isinstance(status, dict) else None
        lines = tuple(str(s) for s in listed) if isinstance(listed, list) else ()
        if lines not in self._verifiers:
            try:
                pinned = Signers.parse(lines, f"spec.status.signers of {self.branch}")
            except TrustError:
                pinned = Signers()  # (validation says why; the UI's own signers still hold)
            self._verifiers = {lines: Verifier(pinned.plus(self.signers.signers))}
        verifier = self._verifiers[lines]
        if not verifier.signers:
            raise TrustError("no status signer is pinned: list the controllers' keys in spec.status.signers of "
                             f"gitops.yaml on {self.branch}, or start the UI with --status-signers FILE "
                             f"({INSECURE_FLAG} shows the branch unverified)")
        return verifier

    def verify(self, commit: str) -> None:
        """`TrustError` unless the status commit `commit` is signed by a pinned key."""
        self.verifier().require(self.repo, commit)

    def verify_tip(self, commit: str, what: str = "status commit") -> None:
        """`verify`, and `commit` (the status branch's tip) no older than any tip read before (or than
        `min_generation`): its generation becomes the least the next may have."""
        generation = self.verifier().require(self.repo, commit, what, self.min_generation)
        with self._floor_lock:
            self.min_generation = max(self.min_generation, generation)

    # ------------------------------------------------------------------ reading

    def status_ref(self) -> str:
        ref = self.resolve(self.status_branch)
        if ref is None:
            raise GitopsError(f"no status branch {self.status_branch!r} in {self.shown} yet: has a controller "
                              "(or `gitops state push`) written it?")
        return ref

    def reader(self, at: str = "") -> StatusReader:
        """The status tree at the status branch's tip (or at commit `at` of it). Every read of the status
        branch's documents goes through here (the one place a reader is made)."""
        self.fetch()
        if at:
            return StatusReader.at_ref(self.repo, at, self.verifier())
        ref = self.status_ref()
        tip = self.commit_of(ref)
        self.verify_tip(tip, f"status commit of {ref}")
        return StatusReader.at_ref(self.repo, tip, self.verifier())

    def log(self, limit: int = 50) -> list[LogEntry]:
        """The status branch's newest `limit` commits, newest first (two `git log`s, no record read)."""
        self.fetch()
        ref = self.status_ref()
        self.verify_tip(self.commit_of(ref))  # an untrusted tip: the history it shows is someone else's choice
        lines = self.repo.run("log", "--first-parent", f"-n{limit}", "--format=%H%x00%ct%x00%s", ref).splitlines()
        changed = set(self.repo.run("log", "--first-parent", f"-n{limit}", "--format=%H", ref, "--", APPLY).split())
        out = []
        verifier = self.verifier()
        for line in lines:
            sha, stamp, subject = line.split("\x00", 2)
            if verifier.problem(self.repo, sha) is None:  # a commit nobody pinned signed is not shown
                out.append(LogEntry(sha, int(stamp), subject, sha in changed))
        return out

    def records(self, commit: str, with_apply: bool = True) -> tuple[bytes | None, bytes | None]:
        """status/source.yaml and (when `with_apply`) status/apply.yaml as they were at `commit`; None where
        there is none. `Refused` for one over `MAX_RECORD_BYTES`."""
        return self._blob(commit, SOURCE), self._blob(commit, APPLY) if with_apply else None

    def last_apply_time(self) -> int | None:
        """When the newest status commit that wrote an apply's record was made (unix time), if any."""
        self.fetch()
        ref = self.status_ref()
        stamp = self.repo.run("log", "--first-parent", "-n1", "--format=%ct", ref, "--", APPLY).strip()
        return int(stamp) if stamp else None

    def _blob(self, commit: str, rel: str) -> bytes | None:
        name = f"{commit}:{rel}"
        header = self.repo.header(name)
        if header is None or header[0] != "blob":
            return None
        size = header[1]
        if size > MAX_RECORD_BYTES:
            raise Refused(f"{rel} of status commit {commit[:12]} is {human_size(size)}, over the "
                          f"{human_size(MAX_RECORD_BYTES)} the UI reads of a record; not shown")
        found = self.repo.read_objects([name])[0]
        return found[1] if found is not None else None

    # ------------------------------------------------------------------ a branch's files

    def check_size(self, commit: str, name: str) -> None:
        """`Refused` when the tree of `commit` holds more than `max_branch_files` files or
        `max_branch_bytes` bytes of them (`git ls-tree -r -l`, read as it streams: stops at the limit)."""
        files = total = 0
        with self.repo.stream("ls-tree", "-r", "-l", "-z", "--full-tree", commit) as proc:
            out = proc.stdout
            assert out is not None
            rest = b""
            for chunk in iter(lambda: out.read(1 << 16), b""):
                *entries, rest = (rest + chunk).split(b"\0")
                for entry in entries:
                    fields = entry.partition(b"\t")[0].split()
                    files += 1
                    total += int(fields[3]) if len(fields) == 4 and fields[3].isdigit() else 0
                    if files > self.max_branch_files or total > self.max_branch_bytes:
                        raise Refused(self._too_large(name, files > self.max_branch_files))
        if proc.returncode != 0:
            raise GitopsError(f"cannot list branch {printable(name)!r} (commit {commit[:12]}) of {self.shown}")

    def _too_large(self, name: str, files: bool) -> str:
        what = f"more than {self.max_branch_files:,} files" if files else \
            f"more than {human_size(self.max_branch_bytes)} of files"
        return (f"branch {printable(name)!r} holds {what}, over the UI's limit for a plan "
                f"({human_size(self.max_branch_bytes)} in {self.max_branch_files:,} files at most; "
                "`gitops ui --plan-max-mib`): plan it with `gitops plan CLONE --against-status` instead")

    @contextlib.contextmanager
    def checkout(self, commit: str, name: str) -> Iterator[Path]:
        """The files of `commit` (branch `name`) in a temporary directory, removed after: its size checked
        first, then `git archive` streamed into it (never held in memory). A link out of the files is
        `Refused`."""
        self.check_size(commit, name)
        with tempfile.TemporaryDirectory(prefix="gitops-ui-") as tmp:
            self._extract(commit, name, Path(tmp))
            yield Path(tmp)

    def _extract(self, commit: str, name: str, into: Path) -> None:
        spent = 0

        def admit(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
            nonlocal spent
            try:
                member = tarfile.data_filter(member, dest)
            except tarfile.FilterError as err:
                link = f" (a link to {printable(member.linkname)!r})" if member.issym() or member.islnk() else ""
                raise Refused(f"branch {printable(name)!r}: {printable(member.name)!r}{link} leads out of the "
                              f"branch's files ({err.__class__.__name__}); refusing to plan it: a link must stay "
                              "inside the repo") from None
            spent += member.size  # (the sizes were checked already: this holds if the archive differs)
            if spent > self.max_branch_bytes:
                raise Refused(self._too_large(name, False))
            return member

        problem = ""
        with tempfile.TemporaryFile() as errors:
            with self.repo.stream("archive", "--format=tar", commit, stderr=errors) as proc:
                try:
                    with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
                        tar.extractall(into, filter=admit)
                    assert proc.stdout is not None
                    while proc.stdout.read(1 << 16):  # the archive's padding after its last member
                        pass
                except tarfile.TarError as err:
                    problem = str(err)
                    proc.kill()
            errors.seek(0)
            failed = errors.read().decode(errors="replace").strip()
        if problem or proc.returncode != 0:
            raise GitopsError(f"cannot archive branch {printable(name)!r} (commit {commit[:12]}) of {self.shown}: "
                              f"{redact(failed) or problem or f'git archive exited {proc.returncode}'}")
