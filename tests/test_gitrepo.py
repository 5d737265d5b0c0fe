"""The one git adapter (`gitops/gitrepo.py`) on real git: its reads, its errors, streams, signatures, and its
thread-safety as its docstring states it (any number of threads reading one repo while its one writer
commits)."""
from __future__ import annotations

import subprocess
import threading
from pathlib import Path

import pytest

from gitops.gitrepo import GitError, Repo, init_bare, open_clone
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
