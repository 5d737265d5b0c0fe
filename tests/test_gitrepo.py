"""The one git adapter (`gitops/gitrepo.py`) on real git: its reads, its errors, streams, signatures, and its
thread-safety as its docstring states it (any number of threads reading one repo while its one writer
commits)."""
from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import pytest

from gitops.gitrepo import GitError, Repo, init_bare, open_clone
from githttp import GitHTTP, command_lines
from signing import make_key

GIT_ID = {"user.name": "t", "user.email": "t@example.invalid", "commit.gpgsign": "false"}


def _commit(repo: Repo, files: dict[str, str], message: str) -> str:
    for rel, text in files.items():
        path = repo.path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    repo.run("add", "-A")
    repo.run("commit", "-q", "-m", message)
    return repo.commit_of("HEAD")


@pytest.fixture
def repo(tmp_path: Path) -> Repo:
    made = Repo(tmp_path / "r")
    made.path.mkdir()
    made.run("init", "-q", "-b", "main")
    made.configure(GIT_ID)
    return made


def test_reads_answer_what_the_repo_holds_and_missing_objects_are_none(repo: Repo):
    sha = _commit(repo, {"a.txt": "alpha\n", "d/b.txt": "beta\n"}, "first")
    assert repo.commit_of("main") == sha and repo.commit_of("nothing") == ""
    assert repo.subject(sha) == "first"
    assert repo.header(f"{sha}:d")[0] == "tree" and repo.header(f"{sha}:zz") is None
    assert repo.header(f"{sha}:a.txt") == ("blob", 6)
    found = repo.read_objects([f"{sha}:a.txt", f"{sha}:missing", f"{sha}:d/b.txt", f"{sha}:d"])
    assert found[0] == ("blob", b"alpha\n") and found[1] is None and found[2] == ("blob", b"beta\n")
    assert found[3] is not None and found[3][0] == "tree"
    with pytest.raises(ValueError, match="newline"):
        repo.read_objects(["a\nb"])
    tree = repo.tree_of_blobs({"lock.json": b"{}\n"})
    assert repo.read_objects([f"{tree}:lock.json"]) == [("blob", b"{}\n")]


def test_a_failing_command_is_a_git_error_with_what_git_said(repo: Repo):
    with pytest.raises(GitError) as caught:
        repo.run("checkout", "no-such-branch")
    assert caught.value.status != 0 and "no-such-branch" in caught.value.detail
    assert not repo.attempt("rev-parse", "--verify", "nope").ok
    assert not repo.succeeds("merge-base", "--is-ancestor", "HEAD", "HEAD")  # (no commit yet)


def test_a_stream_is_read_as_it_comes_and_killed_when_the_reader_raises(repo: Repo):
    _commit(repo, {f"f{i}.txt": str(i) for i in range(50)}, "many")
    with repo.stream("ls-tree", "-z", "HEAD") as proc:
        listed = proc.stdout.read().split(b"\0")
    assert proc.returncode == 0 and len([e for e in listed if e]) == 50
    with pytest.raises(RuntimeError), repo.stream("cat-file", "--batch-all-objects", "--batch") as proc:
        proc.stdout.read(10)
        raise RuntimeError("reader stops")
    assert proc.returncode is not None  # (killed and reaped: nothing left running)


def test_clones_fetch_refs_and_a_missing_remote_ref_is_false(repo: Repo, tmp_path: Path):
    sha = _commit(repo, {"a.txt": "1\n"}, "one")
    bare = init_bare(tmp_path / "bare.git")
    repo.run("push", "-q", str(bare.path), "main")
    clone = open_clone(str(bare.path), tmp_path / "clone")
    assert clone.commit_of("origin/main") == sha
    assert clone.fetch_ref("origin", "refs/heads/main", "refs/x/main") and clone.ref("refs/x/main") == sha
    assert not clone.fetch_ref("origin", "refs/heads/nope", "refs/x/nope")
    again = open_clone(str(bare.path), tmp_path / "clone")  # opened, not cloned twice
    assert again.path == clone.path and again.run("remote", "get-url", "origin") == str(bare.path)


def test_commit_signatures_are_told_apart_and_verified(repo: Repo, tmp_path: Path):
    key = make_key(tmp_path / "keys", "signer")
    unsigned = _commit(repo, {"a.txt": "1\n"}, "unsigned")
    repo.configure({"gpg.format": "ssh", "user.signingkey": str(key.path)})
    repo.run("commit", "-q", "-S", "--allow-empty", "-m", "signed")
    signed = repo.commit_of("HEAD")
    assert repo.commit_signature(unsigned) == "" and repo.commit_signature(signed) == "ssh"
    assert repo.verify_commit(signed, allowed_signers=key.signer.line() + "\n").ok
    other = make_key(tmp_path / "keys", "other")
    assert not repo.verify_commit(signed, allowed_signers=other.signer.line() + "\n").ok


def test_many_threads_read_one_repo_while_its_writer_commits(repo: Repo):
    """The adapter's thread-safety: 12 threads read the same `Repo` (objects, refs, listings) at once while
    one thread commits; every read answers exactly what the commit it named holds."""
    expected: dict[str, dict[str, bytes]] = {}
    first = _commit(repo, {"n.txt": "0\n", "d/x.txt": "x0\n"}, "c0")
    expected[first] = {"n.txt": b"0\n", "d/x.txt": b"x0\n"}
    lock, errors, stop = threading.Lock(), [], threading.Event()

    def write() -> None:
        for i in range(1, 25):
            files = {"n.txt": f"{i}\n", "d/x.txt": f"x{i}\n"}
            sha = _commit(repo, files, f"c{i}")
            with lock:
                expected[sha] = {k: v.encode() for k, v in files.items()}
        stop.set()

    def read() -> None:
        try:
            while not stop.is_set():
                with lock:
                    shas = list(expected)
                for sha in shas[-3:]:
                    names = [f"{sha}:n.txt", f"{sha}:d/x.txt"]
                    got = repo.read_objects(names)
                    assert [g[1] if g else None for g in got] == [expected[sha]["n.txt"], expected[sha]["d/x.txt"]]
                    assert repo.header(f"{sha}:d")[0] == "tree"
                    assert repo.commit_of(sha) == sha
                    with repo.stream("ls-tree", "-r", "--name-only", sha) as proc:
                        assert proc.stdout.read().split() == [b"d/x.txt", b"n.txt"]
        except BaseException as err:  # noqa: BLE001 - reported by the main thread
            errors.append(err)
            stop.set()

    readers = [threading.Thread(target=read) for _ in range(12)]
    writer = threading.Thread(target=write)
    for t in [*readers, writer]:
        t.start()
    for t in [writer, *readers]:
        t.join(timeout=120)
    assert not errors, errors[0]
    assert len(expected) == 25 and repo.subject("HEAD") == "c24"
    assert subprocess.run(["git", "-C", str(repo.path), "fsck", "--no-progress"], capture_output=True).returncode == 0


def test_the_source_clone_fetches_checks_out_and_verifies_signatures_through_the_adapter(repo: Repo, tmp_path: Path):
    from gitops.source import GitSource, SignatureError, SignaturePolicy, SourceError

    key, other = make_key(tmp_path / "keys", "infra"), make_key(tmp_path / "keys", "stranger")
    allowed = tmp_path / "allowed"
    allowed.write_text(key.signer.line() + "\n")
    unsigned = _commit(repo, {"gitops.yaml": "a: 1\n"}, "unsigned")
    repo.configure({"gpg.format": "ssh", "user.signingkey": str(key.path)})
    repo.run("commit", "-q", "-S", "--allow-empty", "-m", "signed by infra")
    signed = repo.commit_of("HEAD")
    repo.configure({"user.signingkey": str(other.path)})
    repo.run("commit", "-q", "-S", "--allow-empty", "-m", "signed by a stranger")
    stranger = repo.commit_of("HEAD")
    source = GitSource(str(repo.path), tmp_path / "work", "main", SignaturePolicy(allowed_signers=allowed))
    assert source.fetch() == stranger
    revision = source.checkout(signed)
    assert revision.subject == "signed by infra" and (revision.path / "gitops.yaml").read_text() == "a: 1\n"
    assert source.on_branch(unsigned) and not source.on_branch("0" * 40)
    assert "Good" in source.verify(signed)
    with pytest.raises(SignatureError, match="is not signed"):
        source.verify(unsigned)
    with pytest.raises(SignatureError, match="no valid signature from an allowed signer"):
        source.verify(stranger)
    with pytest.raises(SourceError, match="cannot fetch nope"):
        GitSource(str(repo.path), tmp_path / "work2", "nope").fetch()


# ------------------------------------------------------------------ credentials (issue #60.3)

TOKEN = "s3cr3t-t0ken-of-60"


def _served_repo(root: Path) -> str:
    """A bare repo `root/r.git` holding one commit on main; its SHA."""
    work = Repo(root / "work")
    work.path.mkdir(parents=True)
    work.run("init", "-q", "-b", "main")
    work.configure(GIT_ID)
    sha = _commit(work, {"gitops.yaml": "x: 1\n"}, "first")
    init_bare(root / "r.git")
    work.run("push", "-q", str(root / "r.git"), "main")
    return sha


def test_credentials_in_a_url_never_reach_a_command_line_while_a_fetch_hangs(tmp_path: Path):
    """The controller's clone and the UI's mirror fetch a URL with a user and token; while the server holds
    both fetches, no process on the machine has the token on its command line (git passes the URL it fetches
    to its remote helper's)."""
    from gitops.ui.source import StatusSource

    server = GitHTTP(tmp_path, "bob", TOKEN, hang=True)
    url = server.url("r.git", f"bob:{TOKEN}")
    failed: list[Exception] = []

    def run(call) -> None:
        try:
            call()
        except Exception as err:  # (each fails once the server lets go)
            failed.append(err)

    mirror = StatusSource(url, tmp_path / "mirror")
    threads = [threading.Thread(target=run, args=(lambda: open_clone(url, tmp_path / "clone"),)),
               threading.Thread(target=run, args=(lambda: mirror.fetch(force=True),))]
    try:
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 30
        while len(server.requests) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(server.requests) >= 2, server.requests
        fetching = command_lines(f"127.0.0.1:{server.port}")
        # the clone, and the mirror's listing of what it would fetch (what it does first), both on the wire
        assert sum("remote-http" in line for line in fetching) >= 2, fetching
        assert any(" clone " in line for line in fetching) and any(" ls-remote " in line for line in fetching), \
            fetching
        assert command_lines(TOKEN) == []
        assert not any("bob@" in line for line in fetching), fetching
    finally:
        server.stop()
        for thread in threads:
            thread.join(timeout=30)
    assert len(failed) == 2 and all(TOKEN not in str(err) for err in failed), failed


def test_a_url_with_credentials_clones_and_fetches_through_them(tmp_path: Path):
    """The credentials still reach the server (Basic auth over git's smart HTTP), for the first clone, a fetch
    of the clone reopened, and the UI's mirror; the clone's config never holds them; wrong ones fail at once."""
    from gitops.ui.source import StatusSource

    sha = _served_repo(tmp_path / "served")
    server = GitHTTP(tmp_path / "served", "bob", TOKEN)
    try:
        url = server.url("r.git", f"bob:{TOKEN}")
        clone = open_clone(url, tmp_path / "clone")
        assert clone.commit_of("origin/main") == sha
        assert TOKEN not in (clone.path / ".git" / "config").read_text()
        again = open_clone(url, tmp_path / "clone")
        assert again.fetch_ref("origin", "refs/heads/main", "refs/fetched/main") and again.commit_of(
            "refs/fetched/main") == sha
        mirror = StatusSource(url, tmp_path / "mirror")
        mirror.fetch(force=True)
        assert mirror.branch_commit("main") == sha
        with pytest.raises(GitError, match="Authentication failed|could not read"):
            open_clone(server.url("r.git", "bob:wrong"), tmp_path / "refused")
    finally:
        server.stop()
