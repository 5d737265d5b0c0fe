"""The one way gitops runs git (I/O): commands, the object fast paths, signatures, clones, and the locks git leaves.

Every git command of the package goes through `Repo` here: the infra repo's source clone, the status branch's
worktree and its notes, the apply lease, the status reader's `cat-file --batch` reads, commit signatures, and
the UI's mirror.

Thread safety: every call runs a `git` process of its own and shares nothing with another call (no persistent
`cat-file` process, no cached state in `Repo`), so any number of threads may use the same `Repo` at once. Git
itself still serializes what writes one clone (its `index.lock`, a ref's lock): gitops gives each clone one
writer (the controller's workdir lock, the UI mirror's lock), and reads need no lock
(`tests/test_gitrepo.py`).

Git never prompts here (`GIT_TERMINAL_PROMPT=0`): credentials come with the URL or a credential helper, and a
command that would ask fails instead of hanging. Credentials in an http(s) URL never reach a command line
(`/proc/PID/cmdline` is anyone's to read, and git hands the URL it fetches to its remote helper's): the URL
is used without them and they reach git through its environment, read by a credential helper
(`without_credentials`). Its messages are in English (`LANGUAGE=C`): callers match
some of them (a push that lost a race).
"""
from __future__ import annotations

import contextlib
import os
import re
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

from gitops.errors import GitopsError

#: what every git process gets on top of this process's environment
_ENV = {"GIT_TERMINAL_PROMPT": "0", "LANGUAGE": "C", "GIT_PAGER": "cat"}


class GitError(GitopsError):
    """A git command that failed: its arguments, exit status, standard error and output (`push --porcelain`
    says on its output why a ref was rejected: `said` holds both)."""

    def __init__(self, args: tuple[str, ...], status: int, stderr: str, stdout: str = ""):
        self.command, self.status, self.stderr, self.stdout = args, status, stderr, stdout
        super().__init__(f"git {' '.join(args[:2])} exited {status}: {self.detail}")

    @property
    def said(self) -> str:
        """Everything git printed: its error, then its output."""
        return f"{self.stderr}\n{self.stdout}"

    @property
    def detail(self) -> str:
        """git's own message on one line (at most 300 characters), or the exit status."""
        text = " ".join(self.stderr.split())
        return text[:300] if text else f"git exited {self.status}"


@dataclass(frozen=True)
class Done:
    """A git command that ran: exit status, standard output (bytes) and error (text)."""

    status: int
    out: bytes
    err: str

    @property
    def ok(self) -> bool:
        return self.status == 0

    @property
    def text(self) -> str:
        """Standard output as text, without its last newline."""
        return self.out.decode(errors="surrogateescape").removesuffix("\n")


def _env(extra: Mapping[str, str] | None) -> dict[str, str]:
    return {**os.environ, **_ENV, **(extra or {})}


#: the credential helper (a shell snippet, on no command line with a secret): the user and password from the
#: environment `without_credentials` makes, for git's `get`
_HELPER = ('!f() { test "$1" = get || exit 0; printf "username=%s\\npassword=%s\\n" "$GITOPS_GIT_USERNAME" '
           '"$GITOPS_GIT_PASSWORD"; }; f')


def without_credentials(url: str) -> tuple[str, dict[str, str]]:
    """An http(s) `url` without its user info (a user name alone may be a token too), and the environment
    that gives them to git: a credential helper of its own (every other one set aside) reading them from
    variables, which only this user and root may read (`/proc/PID/environ`). Any other URL as it is."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url, {}
    if parts.scheme not in ("http", "https") or "@" not in parts.netloc:
        return url, {}
    userinfo, _, host = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    user, password = unquote(user), unquote(password)
    if any(c in user + password for c in "\n\0"):
        raise GitopsError(f"the credentials of {urlunsplit(parts._replace(netloc=host))} hold a newline or a NUL")
    return urlunsplit(parts._replace(netloc=host)), {
        "GIT_CONFIG_COUNT": "2", "GIT_CONFIG_KEY_0": "credential.helper", "GIT_CONFIG_VALUE_0": "",
        "GIT_CONFIG_KEY_1": "credential.helper", "GIT_CONFIG_VALUE_1": _HELPER,
        "GITOPS_GIT_USERNAME": user, "GITOPS_GIT_PASSWORD": password}


class Repo:
    """A git repository on this machine (a clone with a worktree, or bare). `env`: what every git command of
    it gets on top (the credentials of its remote, `without_credentials`)."""

    def __init__(self, path: Path, env: Mapping[str, str] | None = None):
        self.path = Path(path)
        self.env = dict(env or {})

    def __repr__(self) -> str:
        return f"Repo({str(self.path)!r})"

    # ------------------------------------------------------------------ commands

    def attempt(self, *args: str, input: bytes | None = None, env: Mapping[str, str] | None = None,
                timeout: float | None = None, max_file_bytes: int | None = None) -> Done:
        """Run `git ARGS` in the repo and return how it ended (no error raised for a failure). `max_file_bytes`:
        no file git writes may grow past it (the kernel's RLIMIT_FSIZE, through `prlimit`: a pack fetched
        whole, `fetch.unpackLimit=1`, is one file)."""
        limit = ["prlimit", f"--fsize={max_file_bytes}"] if max_file_bytes is not None else []
        try:
            done = subprocess.run([*limit, "git", "-C", str(self.path), *args], input=input, capture_output=True,
                                  env=_env({**self.env, **(env or {})}), timeout=timeout, check=False,
                                  stdin=None if input is not None else subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return Done(124, b"", f"git {args[0]} took longer than {timeout} s")
        return Done(done.returncode, done.stdout, done.stderr.decode(errors="replace"))

    def run(self, *args: str, input: bytes | None = None, env: Mapping[str, str] | None = None,
            timeout: float | None = None) -> str:
        """Standard output of `git ARGS` as text (its last newline removed); `GitError` when it fails."""
        return self._ok(args, input, env, timeout).text

    def run_bytes(self, *args: str, input: bytes | None = None, env: Mapping[str, str] | None = None,
                  timeout: float | None = None) -> bytes:
        """Standard output of `git ARGS` as bytes; `GitError` when it fails."""
        return self._ok(args, input, env, timeout).out

    def _ok(self, args: tuple[str, ...], input: bytes | None, env: Mapping[str, str] | None,
            timeout: float | None) -> Done:
        done = self.attempt(*args, input=input, env=env, timeout=timeout)
        if not done.ok:
            raise GitError(args, done.status, done.err, done.text)
        return done

    def succeeds(self, *args: str) -> bool:
        """Whether `git ARGS` exits 0 (a question git answers with its status)."""
        return self.attempt(*args).ok

    @contextlib.contextmanager
    def stream(self, *args: str, stderr: int | object = subprocess.DEVNULL) -> Iterator[subprocess.Popen]:
        """`git ARGS` running, its standard output a pipe to read as it comes (a listing or an archive too
        large to hold), waited for at the end; killed when the reader raises."""
        with subprocess.Popen(["git", "-C", str(self.path), *args], stdout=subprocess.PIPE, stderr=stderr,
                              stdin=subprocess.DEVNULL, env=_env(self.env)) as proc:
            try:
                yield proc
            except BaseException:
                proc.kill()
                raise

    def configure(self, values: Mapping[str, str]) -> None:
        """Set the repo's own configuration (`git config KEY VALUE` each)."""
        for key, value in values.items():
            self.run("config", key, value)

    # ------------------------------------------------------------------ refs and commits

    def commit_of(self, ref: str) -> str:
        """The commit `ref` names ("" when it names none)."""
        done = self.attempt("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
        return done.text.strip() if done.ok else ""

    def ref(self, ref: str) -> str:
        """The object a ref points at ("" when there is no such ref)."""
        done = self.attempt("rev-parse", "--verify", "--quiet", ref)
        return done.text.strip() if done.ok else ""

    def subject(self, sha: str) -> str:
        return self.run("log", "-1", "--format=%s", sha)

    def is_ancestor(self, older: str, newer: str) -> bool:
        """Whether `older` is `newer` or one of its ancestors."""
        return self.succeeds("merge-base", "--is-ancestor", older, newer)

    def first_parents(self, span: str, limit: int) -> list[str]:
        """The commits of `span` (`tip` or `since..tip`) along first parents, newest first, at most `limit`."""
        done = self.attempt("rev-list", "--first-parent", f"--max-count={limit}", span)
        return done.text.split() if done.ok else []

    def fetch_ref(self, remote: str, ref: str, into: str) -> bool:
        """Fetch `ref` of `remote` into the local ref `into` (forced); False when the remote has no such ref."""
        done = self.attempt("fetch", "--no-tags", remote, f"+{ref}:{into}")
        if done.ok:
            return True
        if "couldn't find remote ref" in done.err.lower():
            return False
        raise GitError(("fetch", remote, ref), done.status, done.err)

    # ------------------------------------------------------------------ objects

    def header(self, name: str) -> tuple[str, int] | None:
        """(type, size in bytes) of the object `name` names, None when there is none: one
        `git cat-file --batch-check`, which reads no content (check a size before reading what someone else
        pushed). Raises GitError when git fails, ValueError for a name holding a newline."""
        if "\n" in name:
            raise ValueError("an object name holds a newline")
        fields = self.run("cat-file", "--batch-check", input=f"{name}\n".encode()).split()
        if len(fields) != 3 or not fields[2].isdigit():
            return None  # "<name> missing" (and such)
        return fields[1], int(fields[2])

    def read_objects(self, names: list[str]) -> list[tuple[str, bytes] | None]:
        """(type, content) of each object `names` name, None for one that is missing, through one
        `git cat-file --batch` given every name at once (a process per object costs more than the objects of a
        large fleet). Raises GitError when git fails, ValueError for a name holding a newline."""
        if not names:
            return []
        if any("\n" in n for n in names):
            raise ValueError("an object name holds a newline")
        data = self.run_bytes("cat-file", "--batch", input="".join(f"{n}\n" for n in names).encode())
        out: list[tuple[str, bytes] | None] = []
        at = 0
        for _ in names:
            end = data.index(b"\n", at)
            header = data[at:end].split()
            at = end + 1
            if len(header) != 3 or header[-1] in (b"missing", b"ambiguous") or not header[2].isdigit():
                out.append(None)  # "<name> missing" (and such): no content follows
                continue
            size = int(header[2])
            out.append((header[1].decode(), data[at:at + size]))
            at += size + 1
        return out

    def store(self, kind: str, data: bytes) -> str:
        """Write an object of `kind` holding `data` into the object database; its id."""
        return self.run("hash-object", "-w", "--stdin", "-t", kind, input=data).strip()

    def tree_of_blobs(self, files: Mapping[str, bytes]) -> str:
        """A tree of plain files (name -> content) written into the object database; its id."""
        entries = "".join(f"100644 blob {self.store('blob', data)}\t{name}\n" for name, data in sorted(files.items()))
        return self.run("mktree", input=entries.encode()).strip()

    # ------------------------------------------------------------------ signatures

    def commit_signature(self, sha: str) -> str:
        """The kind of signature in a commit's header: "ssh", "other" or "" (unsigned; also no such commit)."""
        found = self.read_objects([sha])[0]
        if found is None or found[0] != "commit":
            return ""
        head = found[1].split(b"\n\n", 1)[0]
        if b"\ngpgsig " not in b"\n" + head:
            return ""
        return "ssh" if b"-----BEGIN SSH SIGNATURE-----" in head else "other"

    def verify_commit(self, sha: str, allowed_signers: str | Path | None = None, gpg_home: Path | None = None,
                      raw: bool = False, timeout: float = 60) -> Done:
        """`git verify-commit` of `sha`: against `allowed_signers` (the text of an ssh allowed-signers file,
        or its path) and/or the keyring of `gpg_home`. Its `err` is what git says of the signature (`raw`:
        what the signing tool said, as it said it)."""
        with contextlib.ExitStack() as stack:
            config: list[str] = []
            if isinstance(allowed_signers, str):
                file = stack.enter_context(tempfile.NamedTemporaryFile("w", prefix="gitops-signers-", suffix=".txt"))
                file.write(allowed_signers)
                file.flush()
                config = ["-c", f"gpg.ssh.allowedSignersFile={file.name}"]
            elif allowed_signers is not None:
                config = ["-c", f"gpg.ssh.allowedSignersFile={allowed_signers}"]
            env = {"GNUPGHOME": str(gpg_home)} if gpg_home is not None else None
            return self.attempt(*config, "verify-commit", "--raw" if raw else "-v", sha, env=env, timeout=timeout)


def as_repo(repo: Repo | Path) -> Repo:
    """`repo` as a `Repo` (a path to a clone given where one is asked for)."""
    return repo if isinstance(repo, Repo) else Repo(repo)


# ---------------------------------------------------------------------- clones


def as_url(repo: str) -> str:
    """A repo given as a URL (kept) or as a local path (made absolute: clones live elsewhere)."""
    return str(Path(repo).absolute()) if is_path(repo) else repo


def is_path(repo: str) -> bool:
    """Whether `repo` names a repository on this machine by its path (not a URL, not scp-like `host:path`)."""
    return "://" not in repo and ":" not in repo.split("/")[0]


def open_clone(url: str, directory: Path) -> Repo:
    """The clone of `url` in `directory`: opened (origin re-pointed at `url`) or made without checkout; its
    origin is the URL without credentials, which the returned `Repo` gives git itself. Raises GitError."""
    clean, env = without_credentials(url)
    if (directory / ".git").is_dir():
        repo = Repo(directory, env)
        repo.run("remote", "set-url", "origin", clean)
        return repo
    directory.parent.mkdir(parents=True, exist_ok=True)
    Repo(directory.parent, env).run("clone", "--quiet", "--no-checkout", "--", clean, str(directory))
    return Repo(directory, env)


def init_bare(directory: Path, env: Mapping[str, str] | None = None) -> Repo:
    """A bare repository in `directory`, made if there is none (`env`: as `Repo`'s)."""
    if not (directory / "HEAD").exists():
        directory.mkdir(parents=True, exist_ok=True)
        Repo(directory).run("init", "--quiet", "--bare")
    return Repo(directory, env)


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
