"""The status branch as untrusted input (issue #42.1-3), on real bare git repos with real SSH signatures
(`ssh-keygen -Y` through git's own signing): status commits are signed by the controller and read back only
from a commit a pinned key signed; whatever someone else pushes there (unsigned, or signed by a key nobody
pinned, or history rolled back) is set aside and written over, and changes nothing the controller does; no
file outside the controller's workdir is ever written or read through a link pushed to the branch."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gitops.errors import GitopsError
from gitops.safeio import FileRefused
from gitops.status.branch import StatusBranch, StatusError
from gitops.status.reader import StatusReader
from gitops.status.trust import Signers, TrustError, Verifier, parse_signer
from signing import commit_unsigned, make_key, trust

GITOPS = str(Path(sys.executable).parent / "gitops")
GIT_ID = ["-c", "user.name=Infra Team", "-c", "user.email=infra@example.com", "-c", "commit.gpgsign=false"]
BRANCH = "gitops/status"
BAD_NODE = "apiVersion: gitops.infra/v1alpha1\nkind: Node\nmetadata:\n  name: lost\nspec:\n  role: controlplan\n"


def git(cwd: Path, *args: str, check: bool = True) -> str:
    done = subprocess.run(["git", *GIT_ID, *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 or not check, f"git {' '.join(args)}: {done.stderr}"
    return done.stdout.strip()


@pytest.fixture
def origin(tmp_path: Path) -> str:
    bare = tmp_path / "origin.git"
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(bare)], check=True)
    return str(bare)


def files(mapping: dict[str, bytes]):
    return lambda branch: branch.write_tree(mapping, ("status", "state", "backups"))


# ------------------------------------------------------------------ signers and verification

def test_signer_lines_are_parsed_or_refused_with_a_reason():
    line = "ctl-a ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGkmdSOmEMGJ6n1t1xKqGkpTqgqpNfdx7HzWXRJZs6pN a comment"
    signer = parse_signer(line)
    assert (signer.principal, signer.key_type) == ("ctl-a", "ssh-ed25519")
    assert parse_signer("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGkmdSOmEMGJ6n1t1xKqGkpTqgqpNfdx7HzWXRJZs6pN x@y").principal \
        == "x@y"
    with pytest.raises(TrustError, match=r"spec.status.signers\[1\]: not an allowed-signers line"):
        Signers.parse([line, "ctl-b ssh-dss AAAA"], "spec.status.signers")


def test_commits_are_verified_against_the_pinned_keys_only(origin: str, tmp_path: Path):
    mine, other = make_key(tmp_path / "keys", "ctl"), make_key(tmp_path / "keys", "other")
    branch = StatusBranch(origin, tmp_path / "a", BRANCH, trust(mine))
    signed = branch.publish(files({"status/x.yaml": b"x: 1\n"}), "signed")
    assert signed is not None
    repo = Path(branch.dir)
    assert Verifier(Signers((mine.signer,))).problem(repo, signed) is None
    assert Verifier(Signers((other.signer,))).problem(repo, signed).startswith("signed by a key that is not pinned")
    assert Verifier(Signers()).problem(repo, signed) == "no status signer is pinned"
    unsigned = commit_unsigned(origin, BRANCH, {"status/x.yaml": "x: 2\n"}, work=tmp_path / "w")
    git(repo, "fetch", "-q", "origin", BRANCH)
    assert Verifier(Signers((mine.signer,))).problem(repo, unsigned) == "unsigned"
    # git itself agrees: the controller's commit verifies with ssh-keygen against an allowed-signers file
    allowed = tmp_path / "allowed"
    allowed.write_text(Signers((mine.signer,)).text())
    assert subprocess.run(["git", "-C", str(repo), "-c", f"gpg.ssh.allowedSignersFile={allowed}", "verify-commit",
                           signed], capture_output=True).returncode == 0


# ------------------------------------------------------------------ the branch sets aside what it cannot trust

@pytest.mark.parametrize("how", ["unsigned", "foreign-key", "rolled-back"])
def test_an_untrusted_tip_is_set_aside_and_written_over(origin: str, tmp_path: Path, how: str):
    mine = make_key(tmp_path / "keys", "ctl")
    branch = StatusBranch(origin, tmp_path / "a", BRANCH, trust(mine))
    first = branch.publish(files({"status/source.yaml": b"applied: good-1\n"}), "one")
    second = branch.publish(files({"status/source.yaml": b"applied: good-2\n",
                                   "state/public.json": b'{"generation": 2}\n'}), "two")
    attacker = tmp_path / "attacker"
    if how == "unsigned":
        bad = commit_unsigned(origin, BRANCH, {"status/source.yaml": "applied: evil\n",
                                               "state/public.json": '{"generation": 99}\n',
                                               "status/extra.yaml": "planted: 1\n"}, work=attacker)
    elif how == "foreign-key":
        stranger = make_key(tmp_path / "keys", "stranger")
        bad = StatusBranch(origin, attacker, BRANCH, trust(stranger)).publish(
            files({"status/source.yaml": b"applied: evil\n", "state/public.json": b'{"generation": 99}\n'}), "evil")
    else:  # the branch forced back to the first (genuinely signed) commit
        subprocess.run(["git", "--git-dir", origin, "update-ref", f"refs/heads/{BRANCH}", first], check=True)
        bad = first
    tip = branch.sync()
    assert tip == bad and branch.untrusted is not None and branch.untrusted[0] == bad
    reason = branch.untrusted[1]
    assert {"unsigned": "unsigned", "foreign-key": "signed by a key that is not pinned",
            "rolled-back": "does not descend from"}[how] in reason, reason
    # what is read is the last trusted commit's tree, never the tip's
    assert branch.read("status/source.yaml") == b"applied: good-2\n"
    assert branch.read("state/public.json") == b'{"generation": 2}\n' and branch.read("status/extra.yaml") is None
    # the next commit puts it back on top of the tip (a fast-forward: others' history stays)
    third = branch.publish(files({"status/source.yaml": b"applied: good-3\n",
                                  "state/public.json": b'{"generation": 2}\n'}), "three")
    assert third is not None and branch.untrusted is not None
    shown = git(tmp_path, "--git-dir", origin, "show", f"{BRANCH}:status/source.yaml")
    assert shown == "applied: good-3"
    assert git(tmp_path, "--git-dir", origin, "show", f"{BRANCH}:state/public.json") == '{"generation": 2}'
    assert git(tmp_path, "--git-dir", origin, "ls-tree", "--name-only", "-r", BRANCH).split() == [
        "state/public.json", "status/source.yaml"]
    assert git(tmp_path, "--git-dir", origin, "rev-parse", f"{BRANCH}^") == bad
    branch.sync()
    assert branch.untrusted is None
    assert second  # (the trusted commit read while the tip was set aside)


def test_another_pinned_writer_is_trusted(origin: str, tmp_path: Path):
    """Several replicas: each signs with its own key, each pins both."""
    a_key, b_key = make_key(tmp_path / "keys", "a"), make_key(tmp_path / "keys", "b")
    a = StatusBranch(origin, tmp_path / "a", BRANCH, trust(a_key, b_key))
    b = StatusBranch(origin, tmp_path / "b", BRANCH, trust(b_key, a_key))
    a.publish(files({"status/a.yaml": b"a\n"}), "a")
    b.publish(lambda br: br.write_tree({"status/b.yaml": b"b\n"}, ("status/b.yaml",)), "b")
    a.sync()
    assert a.untrusted is None and a.read("status/b.yaml") == b"b\n"


# ------------------------------------------------------------------ nothing written or read through a link

WRITTEN = ["status/source.yaml", "status/Cluster/c1.yaml", "backups/c1.yaml", "status/Shard/shard-0.yaml",
           "state/public.json"]


@pytest.mark.parametrize("rel", WRITTEN)
@pytest.mark.parametrize("link", ["file", "directory"])
def test_no_writer_writes_through_a_link_in_the_worktree(origin: str, tmp_path: Path, rel: str, link: str):
    """Each status-branch writer (status documents, the refusal's source, backup records, shard records, the
    state) with a link in its file's place or in its folder's: refused naming it, nothing written outside."""
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "victim"
    victim.write_text("untouched\n")
    branch = StatusBranch(origin, tmp_path / "a", BRANCH)  # no trust: the worktree itself is the last line
    branch.publish(files({"status/keep.yaml": b"k\n"}), "first")
    branch.sync()
    if link == "file":
        place = branch.dir / rel
        place.parent.mkdir(parents=True, exist_ok=True)
        place.symlink_to(victim)
    else:
        folder = branch.dir / rel.split("/")[0]
        if folder.exists():
            subprocess.run(["rm", "-rf", str(folder)], check=True)
        folder.symlink_to(outside)
    with pytest.raises(StatusError, match="symlink") as refused:
        branch.write_tree({rel: b"written\n"}, ("status", "state", "backups"))
    assert (rel if link == "file" else rel.split("/")[0]) in str(refused.value)
    assert victim.read_text() == "untouched\n" and sorted(os.listdir(outside)) == ["victim"]


@pytest.mark.parametrize("rel", WRITTEN)
@pytest.mark.parametrize("link", ["file", "directory"])
def test_no_reader_reads_through_a_link(origin: str, tmp_path: Path, rel: str, link: str):
    """The worktree reader (the controller, `state pull`) and the ref reader (`plan --against-status`,
    `gitops status`, the UI): a link pushed where a file or a folder is read is refused, never followed."""
    secret = tmp_path / "secret.json"
    secret.write_text('{"generation": 7, "key": "SECRET"}\n')
    target = str(secret) if link == "file" else str(tmp_path)
    pushed = {rel: "->" + target} if link == "file" else {rel.split("/")[0]: "->" + target}
    sha = commit_unsigned(origin, BRANCH, {"other/keep.yaml": "k\n", **pushed}, work=tmp_path / "w")
    clone = tmp_path / "w"
    ref_reader = StatusReader.at_ref(clone, sha)
    worktree = tmp_path / "wt"
    subprocess.run(["git", "clone", "-q", "-c", "core.symlinks=true", "-b", BRANCH, origin, str(worktree)], check=True)
    in_dir = StatusReader.in_dir(worktree)
    for reader in (ref_reader, in_dir):
        try:
            got = reader.read(rel)
        except FileRefused as err:
            assert "link" in str(err) or "not a folder" in str(err), err
            continue
        assert got is None, (reader.where, got)  # under a folder link: not there, and nothing read through it
    folder, _, name = rel.rpartition("/")
    for reader in (ref_reader, in_dir):
        try:
            assert name not in reader._names(folder)
        except FileRefused:
            pass


def test_a_pushed_link_never_reaches_the_controllers_worktree(origin: str, tmp_path: Path):
    """With trust, an unsigned commit's links are never checked out; without, they are plain files (git's
    core.symlinks=false), and a write through them is refused."""
    outside = tmp_path / "outside"
    outside.mkdir()
    mine = make_key(tmp_path / "keys", "ctl")
    branch = StatusBranch(origin, tmp_path / "a", BRANCH, trust(mine))
    branch.publish(files({"status/source.yaml": b"ok\n"}), "first")
    commit_unsigned(origin, BRANCH, {"status/source.yaml": f"->{outside}/source.yaml", "backups": f"->{outside}"},
                    work=tmp_path / "w")
    branch.publish(files({"status/source.yaml": b"refused\n", "backups/c1.yaml": b"b\n"}), "refusal")
    assert os.listdir(outside) == []
    assert not any(p.is_symlink() for p in branch.dir.rglob("*"))
    modes = git(tmp_path, "--git-dir", origin, "ls-tree", "-r", BRANCH)
    assert "120000" not in modes, modes
    plain = StatusBranch(origin, tmp_path / "b", BRANCH)
    commit_unsigned(origin, BRANCH, {"status/source.yaml": f"->{outside}/source.yaml"}, work=tmp_path / "w2")
    plain.sync()
    assert not (plain.dir / "status" / "source.yaml").is_symlink()
    assert os.listdir(outside) == []


# ------------------------------------------------------------------ the controller, end to end (no lab)

def _repo(tmp_path: Path) -> tuple[Path, Path]:
    origin, work = tmp_path / "origin.git", tmp_path / "work"
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(origin)], check=True)
    work.mkdir()
    git(work, "init", "-q", "-b", "main")
    git(work, "remote", "add", "origin", str(origin))
    return origin, work


def _push(work: Path, message: str, key: Path | None = None, branch: str = "main") -> str:
    git(work, "add", "-A")
    sign = ["-c", "gpg.format=ssh", "-c", f"user.signingkey={key}", "commit", "-S"] if key else ["commit"]
    git(work, *sign, "-q", "--allow-empty", "-m", message)
    git(work, "push", "-q", "origin", f"HEAD:{branch}")
    return git(work, "rev-parse", "HEAD")


def _reconcile(origin: Path, workdir: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([GITOPS, "reconcile", "--repo", str(origin), "--workdir", str(workdir),
                           "--insecure-plaintext-secrets", "--log-format", "text", *extra],
                          capture_output=True, text=True, timeout=120)


def _source(origin: Path) -> dict:
    return yaml.safe_load(git(origin, "show", f"{BRANCH}:status/source.yaml"))["status"]


def _forge_status(origin: Path, tmp_path: Path, name: str, change: dict[str, str]) -> str:
    return commit_unsigned(str(origin), BRANCH, change, work=tmp_path / name)


def test_a_forged_applied_sha_never_makes_an_unsigned_commit_apply(tmp_path: Path):
    """Issue #42.1: with --allowed-signers, a status branch naming an unsigned commit as the one in force
    changes nothing: the forged status commit is set aside (reported), the signed commit stays in force."""
    origin, work = _repo(tmp_path)
    infra = make_key(tmp_path / "keys", "infra")
    allowed = tmp_path / "allowed_signers"
    allowed.write_text(f"infra@example.com {infra.signer.public}\n")
    (work / "README.md").write_text("signed\n")
    good = _push(work, "signed", infra.path)
    workdir = tmp_path / "controller"
    assert _reconcile(origin, workdir, "--allowed-signers", str(allowed)).returncode == 0
    assert _source(origin)["appliedSHA"] == good
    (work / "README.md").write_text("unsigned\n")
    evil = _push(work, "unsigned, never to apply")
    before = yaml.safe_load(git(origin, "show", f"{BRANCH}:status/source.yaml"))
    before["status"]["appliedSHA"] = evil
    _forge_status(origin, tmp_path, "forger", {"status/source.yaml": yaml.safe_dump(before)})
    refused = _reconcile(origin, workdir, "--allowed-signers", str(allowed))
    assert refused.returncode == 1 and refused.stdout.startswith("Refused: "), refused.stdout + refused.stderr
    source = _source(origin)
    assert source["appliedSHA"] == good and source["lastSeenSHA"] == evil, source
    assert source["errors"] == [f"commit {evil[:12]} is not signed"]
    trusted = next(c for c in source["conditions"] if c["type"] == "StatusBranchTrusted")
    assert trusted["status"] == "False" and "unsigned" in trusted["message"], trusted
    assert "status branch tip not trusted" in refused.stderr
    # and a forged commit in force signed by nobody pinned is no better than an unsigned one
    stranger = make_key(tmp_path / "keys", "stranger")
    forged = StatusBranch(str(origin), tmp_path / "forger2", BRANCH, trust(stranger))
    doc = yaml.safe_load(git(origin, "show", f"{BRANCH}:status/source.yaml"))
    doc["status"]["appliedSHA"] = evil
    forged.publish(lambda b: b.write_tree({"status/source.yaml": yaml.safe_dump(doc).encode()},
                                          ("status/source.yaml",)), "forged")
    _reconcile(origin, workdir, "--allowed-signers", str(allowed))
    assert _source(origin)["appliedSHA"] == good


def test_the_commit_in_force_must_pass_the_policy_and_be_on_the_branch(tmp_path: Path):
    """Issue #42.2: the commit in force is verified like the tip: one no longer signed as the policy asks,
    or not on the followed branch, is not applied, and the reason is recorded."""
    origin, work = _repo(tmp_path)
    (work / "README.md").write_text("one\n")
    unsigned = _push(work, "applied before signatures were required")
    workdir = tmp_path / "controller"
    assert _reconcile(origin, workdir).returncode == 0
    infra = make_key(tmp_path / "keys", "infra")
    allowed = tmp_path / "allowed_signers"
    allowed.write_text(f"infra@example.com {infra.signer.public}\n")
    (work / "README.md").write_text("two\n")
    tip = _push(work, "also unsigned")
    refused = _reconcile(origin, workdir, "--allowed-signers", str(allowed))
    assert refused.returncode == 1
    source = _source(origin)
    assert source["lastSeenSHA"] == tip and any(
        f"the commit in force {unsigned[:12]} is not applied: commit {unsigned[:12]} is not signed" in e
        for e in source["errors"]), source["errors"]
    assert "stays in force" not in refused.stdout
    # a commit in force that is not on the followed branch (named by a status branch read unverified)
    (work / "README.md").write_text("elsewhere\n")
    elsewhere = _push(work, "on another branch", branch="other")
    doc = yaml.safe_load(git(origin, "show", f"{BRANCH}:status/source.yaml"))
    doc["status"]["appliedSHA"] = elsewhere
    _forge_status(origin, tmp_path, "forger", {"status/source.yaml": yaml.safe_dump(doc)})
    git(work, "checkout", "-q", "-B", "main", tip)
    (work / "node.yaml").write_text(BAD_NODE)
    _push(work, "refused")
    off = _reconcile(origin, workdir, "--insecure-unverified-status")
    assert off.returncode == 1
    errors = _source(origin)["errors"]
    assert any(f"{elsewhere[:12]} is not applied: it is not on the followed branch main" in e for e in errors), errors


def test_a_swapped_state_generation_is_never_adopted(tmp_path: Path):
    """Issue #42.3: a state generation pushed by someone else (their own CA keys, a higher generation) is
    never restored: the controller keeps its own, and writes it back over the forgery."""
    origin, work = _repo(tmp_path)
    (work / "README.md").write_text("x\n")
    _push(work, "nothing to apply")
    workdir = tmp_path / "controller"
    assert _reconcile(origin, workdir).returncode == 0
    forged_public = {"generation": 99, "clusters": {"team-a": {"authorities": {"cluster": {"cert": "EVIL-CA"}}}}}
    forged_secrets = {"clusters": {"team-a": {"authorities": {"cluster": {"key": "EVIL-KEY"}}}}}
    _forge_status(origin, tmp_path, "forger", {"state/public.json": json.dumps(forged_public),
                                              "state/secrets.INSECURE-PLAINTEXT.json": json.dumps(forged_secrets)})
    done = _reconcile(origin, workdir)
    assert done.returncode == 0, done.stdout + done.stderr
    for path in workdir.rglob("*"):
        if path.is_file() and ".git" not in path.parts:
            assert b"EVIL" not in path.read_bytes(), path
    tree = git(origin, "ls-tree", "-r", "--name-only", BRANCH).split()
    for rel in tree:
        assert "EVIL" not in git(origin, "show", f"{BRANCH}:{rel}"), rel
    assert "gitops_status_untrusted" not in done.stdout  # (the metric is served by watch; counted here)


def test_readers_verify_the_status_commit(tmp_path: Path):
    """`gitops status` and `gitops plan --against-status` read only a status commit a pinned key signed:
    spec.status.signers or --status-signers; none pinned is an error; --insecure-unverified-status reads it
    with a warning."""
    origin, work = _repo(tmp_path)
    (work / "README.md").write_text("x\n")
    _push(work, "nothing to apply")
    workdir = tmp_path / "controller"
    assert _reconcile(origin, workdir).returncode == 0
    pub = workdir / "status-signing-key.pub"
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(origin), str(clone))

    def status(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([GITOPS, "status", "--repo", str(clone), "-o", "json", *extra], capture_output=True,
                              text=True, timeout=60)

    unpinned = status()
    assert unpinned.returncode == 1 and "no status signer is pinned" in unpinned.stderr
    assert status("--status-signers", str(pub)).returncode == 0
    line = subprocess.run([GITOPS, "status-key", "--workdir", str(workdir), "--principal", "ctl"],
                          capture_output=True, text=True, check=True).stdout.strip()
    assert line.startswith("ctl ssh-ed25519 ")
    (work / "gitops.yaml").write_text("apiVersion: gitops.infra/v1alpha1\nkind: GitopsConfig\nspec:\n  status:\n"
                                      f"    signers:\n      - {line}\n")
    _push(work, "pin the controller's key")
    assert _reconcile(origin, workdir).returncode == 0
    git(clone, "pull", "-q")
    assert status().returncode == 0
    planned = subprocess.run([GITOPS, "plan", str(clone), "--against-status", f"origin/{BRANCH}",
                              "--detailed-exitcode"], capture_output=True, text=True, timeout=60)
    assert planned.returncode == 0, planned.stdout + planned.stderr
    _forge_status(origin, tmp_path, "forger", {"status/source.yaml": "status: {result: Applied}\n"})
    git(clone, "fetch", "-q")
    forged = status()
    assert forged.returncode == 1 and "is not trusted: unsigned" in forged.stderr, forged.stderr
    planned = subprocess.run([GITOPS, "plan", str(clone), "--against-status", f"origin/{BRANCH}"],
                             capture_output=True, text=True, timeout=60)
    assert planned.returncode == 1 and "is not trusted: unsigned" in planned.stderr
    loud = status("--insecure-unverified-status")
    assert loud.returncode == 0 and "WITHOUT verifying" in loud.stderr


def test_a_bad_signers_list_is_refused_at_validation(tmp_path: Path):
    (tmp_path / "gitops.yaml").write_text("apiVersion: gitops.infra/v1alpha1\nkind: GitopsConfig\nspec:\n"
                                          "  status:\n    signers:\n      - not a key\n")
    done = subprocess.run([GITOPS, "validate", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "gitops.yaml" in done.stdout + done.stderr
    assert "signers" in done.stdout + done.stderr
    with pytest.raises(GitopsError):
        Signers.parse(["not a key"])


def test_a_forged_apply_lock_holds_no_longer_than_any_controller_would(origin: str, tmp_path: Path):
    """The apply lease's ref is on the same remote: a lock claiming the year 3000 is honoured for at most
    LONGEST_HOLD after it was first seen unrenewed, and one that is not gitops's JSON holds nothing."""
    import datetime as dt

    from gitops.status.lease import LONGEST_HOLD, ApplyLease, Locked

    clone = tmp_path / "forger"
    subprocess.run(["git", "init", "-q", str(clone)], check=True)

    def forge(body: str) -> None:
        (clone / "lock.json").write_text(body)
        git(clone, "add", "lock.json")
        git(clone, "commit", "-q", "-m", "lock")
        git(clone, "push", "-q", "--force", origin, "HEAD:refs/gitops/lock")

    forge(json.dumps({"holder": "intruder", "expires": "3000-01-01T00:00:00+00:00"}))
    lease = ApplyLease(StatusBranch(origin, tmp_path / "a").repo)
    ttl, now = dt.timedelta(minutes=10), dt.datetime.now(dt.timezone.utc)
    with pytest.raises(Locked, match="intruder"):
        lease.acquire("ctl", ttl, now)
    taken = lease.acquire("ctl", ttl, now + LONGEST_HOLD + dt.timedelta(seconds=1))
    assert taken.holder == "ctl"
    forge("not json at all")
    assert lease.acquire("ctl", ttl).holder == "ctl"


def test_a_deleted_status_branch_is_written_back_from_the_last_trusted_commit(origin: str, tmp_path: Path):
    mine = make_key(tmp_path / "keys", "ctl")
    branch = StatusBranch(origin, tmp_path / "a", BRANCH, trust(mine))
    branch.publish(files({"status/source.yaml": b"applied: good\n", "state/public.json": b'{"generation": 3}\n'}),
                   "one")
    subprocess.run(["git", "--git-dir", origin, "update-ref", "-d", f"refs/heads/{BRANCH}"], check=True)
    assert branch.sync() is None and branch.untrusted is not None and "the branch is gone" in branch.untrusted[1]
    assert branch.read("state/public.json") == b'{"generation": 3}\n'
    branch.publish(files({"status/source.yaml": b"applied: again\n", "state/public.json": b'{"generation": 3}\n'}),
                   "two")
    assert git(tmp_path, "--git-dir", origin, "show", f"{BRANCH}:state/public.json") == '{"generation": 3}'
    branch.sync()
    assert branch.untrusted is None


def test_an_older_signed_commit_merged_in_after_a_rollback_is_never_read_as_newer(origin: str, tmp_path: Path):
    """Review finding: after a rollback is written over, a merge of an older signed commit beside the
    controller's own must not pass as the newest trusted one (nor move the last verified commit back)."""
    mine = make_key(tmp_path / "keys", "ctl")
    branch = StatusBranch(origin, tmp_path / "a", BRANCH, trust(mine))
    s1 = branch.publish(files({"status/source.yaml": b"applied: a1\n"}), "s1")
    s2 = branch.publish(files({"status/source.yaml": b"applied: a2\n"}), "s2")
    branch.publish(files({"status/source.yaml": b"applied: a3\n"}), "s3")
    subprocess.run(["git", "--git-dir", origin, "update-ref", f"refs/heads/{BRANCH}", s1], check=True)
    c4 = branch.publish(files({"status/source.yaml": b"applied: a3\n", "status/x.yaml": b"4\n"}), "c4")
    assert branch.untrusted is not None and "does not descend" in branch.untrusted[1]
    # the commit after the rollback descends from the last verified one again
    assert git(tmp_path, "--git-dir", origin, "merge-base", "--is-ancestor", s2, c4) == ""
    tree = git(tmp_path, "--git-dir", origin, "rev-parse", f"{s2}^{{tree}}")
    forged = git(tmp_path, "--git-dir", origin, "commit-tree", tree, "-p", s2, "-p", c4, "-m", "merge")
    subprocess.run(["git", "--git-dir", origin, "update-ref", f"refs/heads/{BRANCH}", forged], check=True)
    branch.sync()
    assert branch.untrusted is not None and branch.read("status/source.yaml") == b"applied: a3\n"


def _merge(origin: str, tmp_path: Path, parents: list[str], tree_of: str) -> str:
    """An unsigned merge of `parents` holding `tree_of`'s tree, pushed as the branch's tip (anyone with push)."""
    tree = git(tmp_path, "--git-dir", origin, "rev-parse", f"{tree_of}^{{tree}}")
    forged = git(tmp_path, "--git-dir", origin, "commit-tree", tree,
                 *(arg for p in parents for arg in ("-p", p)), "-m", "merge")
    subprocess.run(["git", "--git-dir", origin, "update-ref", f"refs/heads/{BRANCH}", forged], check=True)
    return forged


def test_an_unsigned_merge_never_rolls_back_another_signers_commit(origin: str, tmp_path: Path):
    """Issue #60.1: a merge whose first parent is the tip replica A last verified and whose second is replica B's
    newer signed commit made A read its old tree and publish over B's records, which B then trusted."""
    a_key, b_key = make_key(tmp_path / "keys", "a"), make_key(tmp_path / "keys", "b")
    a = StatusBranch(origin, tmp_path / "a", BRANCH, trust(a_key, b_key))
    b = StatusBranch(origin, tmp_path / "b", BRANCH, trust(b_key, a_key))
    only_a = lambda content: lambda br: br.write_tree({"status/a.yaml": content}, ("status/a.yaml",))  # noqa: E731
    only_b = lambda content: lambda br: br.write_tree({"status/b.yaml": content}, ("status/b.yaml",))  # noqa: E731
    seen_by_a = a.publish(only_a(b"a1\n"), "a1")
    b.publish(only_b(b"b1\n"), "b1")
    a.sync()
    assert a.read("status/b.yaml") == b"b1\n"
    seen_by_a = a.publish(only_a(b"a2\n"), "a2")
    newer = b.publish(only_b(b"b2\n"), "b2")  # A has not seen it yet
    forged = _merge(origin, tmp_path, [seen_by_a, newer], tree_of=seen_by_a)
    assert a.sync() == forged and a.untrusted is not None and a.untrusted[0] == forged
    assert a.read("status/b.yaml") == b"b2\n", "A read a tree older than B's signed commit in the tip's history"
    a.publish(only_a(b"a3\n"), "a3")
    b.sync()
    assert b.untrusted is None and b.read("status/b.yaml") == b"b2\n" and b.read("status/a.yaml") == b"a3\n"


def test_signed_commits_side_by_side_are_read_merged_or_nothing_is_written(origin: str, tmp_path: Path):
    """Two signed commits neither of which descends from the other (the branch rolled back, another writer wrote
    on the old tip, a merge put them together): both trees are read, merged three ways; when they changed one
    file differently nothing is published, and the error says why."""
    a_key, b_key = make_key(tmp_path / "keys", "a"), make_key(tmp_path / "keys", "b")
    a = StatusBranch(origin, tmp_path / "a", BRANCH, trust(a_key, b_key))
    b = StatusBranch(origin, tmp_path / "b", BRANCH, trust(b_key, a_key))
    base = a.publish(files({"status/source.yaml": b"applied: 1\n"}), "base")
    b.sync()
    mine = a.publish(lambda br: br.write_tree({"status/a.yaml": b"a\n"}, ("status/a.yaml",)), "a")
    subprocess.run(["git", "--git-dir", origin, "update-ref", f"refs/heads/{BRANCH}", base], check=True)
    theirs = b.publish(lambda br: br.write_tree({"status/b.yaml": b"b\n"}, ("status/b.yaml",)), "b")
    forged = _merge(origin, tmp_path, [theirs, mine], tree_of=base)
    c = StatusBranch(origin, tmp_path / "c", BRANCH, trust(a_key, b_key))  # a reader that never saw either
    assert c.sync() == forged and c.untrusted is not None and "side by side" in c.untrusted[1]
    assert (c.read("status/a.yaml"), c.read("status/b.yaml")) == (b"a\n", b"b\n")
    # both changed the same file: no tree holds both, so nothing is written over either
    clash = a.publish(files({"status/source.yaml": b"applied: a\n"}), "a2")
    subprocess.run(["git", "--git-dir", origin, "update-ref", f"refs/heads/{BRANCH}", theirs], check=True)
    b.sync()
    other = b.publish(files({"status/source.yaml": b"applied: b\n"}), "b2")
    _merge(origin, tmp_path, [other, clash], tree_of=base)
    with pytest.raises(StatusError, match=r"signed commits side by side .* conflict in status/source.yaml"):
        a.publish(files({"status/source.yaml": b"applied: a3\n"}), "a3")
    assert git(tmp_path, "--git-dir", origin, "log", "-1", "--format=%s", BRANCH) == "merge"


def test_an_apply_lock_no_pinned_key_signed_is_no_controllers_lease(origin: str, tmp_path: Path):
    """Issue #60.5: a lock pushed by someone else naming controller A's holder id made A apply beside B, who
    held the lease. Lease commits are signed and read only when a pinned key signed them; the last lease of
    another holder that one did is honoured until it expires, whatever the ref says meanwhile (deleted,
    replaced); a holder gives its lease up with a signed lease that has expired."""
    import datetime as dt

    from gitops.status.lease import ApplyLease, Locked

    a_key, b_key = make_key(tmp_path / "keys", "a"), make_key(tmp_path / "keys", "b")
    a_branch = StatusBranch(origin, tmp_path / "a", BRANCH, trust(a_key, b_key))
    b_branch = StatusBranch(origin, tmp_path / "b", BRANCH, trust(b_key, a_key))
    a, b = ApplyLease(a_branch.repo, a_branch.trust), ApplyLease(b_branch.repo, b_branch.trust)
    ttl = dt.timedelta(minutes=10)
    b.acquire("ctl-b", ttl)
    with pytest.raises(Locked, match="ctl-b"):
        a.acquire("ctl-a", ttl)
    forger = tmp_path / "forger"
    subprocess.run(["git", "init", "-q", str(forger)], check=True)
    later = (dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1)).isoformat()
    for body in (json.dumps({"holder": "ctl-a", "expires": later}), None):  # A named, then the lock deleted
        if body is None:
            git(tmp_path, "--git-dir", origin, "update-ref", "-d", "refs/gitops/lock")
        else:
            (forger / "lock.json").write_text(body)
            git(forger, "add", "lock.json")
            git(forger, "commit", "-q", "-m", "lock")
            git(forger, "push", "-q", "--force", origin, "HEAD:refs/gitops/lock")
        with pytest.raises(Locked, match="ctl-b"):  # B's lease still holds for A, which saw it
            a.acquire("ctl-a", ttl)
    # B renews (the lock is gone: it takes its own back), then gives it up: A takes it at once, signed by A
    b.acquire("ctl-b", ttl, dt.datetime.now(dt.timezone.utc) + ttl)
    b.release("ctl-b")
    assert a.acquire("ctl-a", ttl).holder == "ctl-a"
    lock = git(tmp_path, "--git-dir", origin, "rev-parse", "refs/gitops/lock")
    assert a.trust.verifier.problem(a_branch.repo, lock) is None
    # a controller that never saw a signed lease takes a forged one as free (and signs its own over it)
    (forger / "lock.json").write_text(json.dumps({"holder": "ctl-c", "expires": later}))
    git(forger, "commit", "-qam", "lock again")
    git(forger, "push", "-q", "--force", origin, "HEAD:refs/gitops/lock")
    c_branch = StatusBranch(origin, tmp_path / "c", BRANCH, trust(make_key(tmp_path / "keys", "c"), a_key, b_key))
    assert ApplyLease(c_branch.repo, c_branch.trust).acquire("ctl-c", ttl).holder == "ctl-c"
    taken = git(tmp_path, "--git-dir", origin, "rev-parse", "refs/gitops/lock")
    assert taken != git(forger, "rev-parse", "HEAD") and c_branch.trust.verifier.problem(c_branch.repo, taken) is None


def test_signed_commits_carry_a_generation_and_readers_that_know_one_refuse_older(origin: str, tmp_path: Path):
    """Issue #60.5: each status commit a controller signs is one generation more than what it was written on;
    a reader given --status-min-generation (a tree reader, or a worktree as `state pull` reads) refuses an
    older signed commit put back at the tip, and the controller that wrote the newer one writes over it."""
    from gitops.status.trust import BranchTrust, generation_of

    mine = make_key(tmp_path / "keys", "ctl")
    branch = StatusBranch(origin, tmp_path / "a", BRANCH, trust(mine))
    c1 = branch.publish(files({"status/source.yaml": b"applied: 1\n"}), "one")
    c2 = branch.publish(files({"status/source.yaml": b"applied: 2\n"}), "two")
    assert [generation_of(Path(origin), c) for c in (c1, c2)] == [1, 2]
    assert "Status-Generation: 2" in git(tmp_path, "--git-dir", origin, "log", "-1", "--format=%B", c2)
    subprocess.run(["git", "--git-dir", origin, "update-ref", f"refs/heads/{BRANCH}", c1], check=True)
    knowing = Verifier(Signers((mine.signer,)), min_generation=2)
    with pytest.raises(TrustError, match="is generation 1, older than generation 2"):
        StatusReader.at_ref(Path(origin), BRANCH, knowing)
    assert StatusReader.at_ref(Path(origin), BRANCH, Verifier(Signers((mine.signer,)))).read(
        "status/source.yaml") == b"applied: 1\n"  # (one that knows none reads it)
    with pytest.raises(StatusError, match="generation 1, older than generation 2"):
        StatusBranch(origin, tmp_path / "b", BRANCH, BranchTrust(knowing)).sync()
    c3 = branch.publish(files({"status/source.yaml": b"applied: 3\n"}), "three")
    assert generation_of(Path(origin), c3) == 3
    assert StatusReader.at_ref(Path(origin), BRANCH, knowing).read("status/source.yaml") == b"applied: 3\n"


def test_the_first_signed_commit_on_a_branch_written_before_signing_keeps_its_backup_records(origin: str,
                                                                                            tmp_path: Path):
    """Issue #60.5: a status branch written before signing is all unsigned; its first signed commit dropped
    what the controller does not write from its own state, such as backups/ records. They are kept as they
    were; what the controller writes (status, state) is never read from the unsigned tree."""
    commit_unsigned(origin, BRANCH, {"status/source.yaml": "applied: old\n", "state/public.json": '{"generation": 7}\n',
                                     "backups/team-a.yaml": "status:\n  snapshots: 3\n", "backups/team-b.yaml": "x\n"},
                    work=tmp_path / "old-controller")
    branch = StatusBranch(origin, tmp_path / "a", BRANCH, trust(make_key(tmp_path / "keys", "ctl")))
    branch.sync()
    assert branch.untrusted is not None and branch.read("state/public.json") is None
    assert branch.read("status/source.yaml") is None and branch.read("backups/team-a.yaml") == b"status:\n  snapshots: 3\n"
    first = branch.publish(lambda b: b.write_tree({"status/source.yaml": b"applied: new\n",
                                                   "state/public.json": b'{"generation": 1}\n'}, ("status", "state")),
                           "first signed")  # (as the controller writes: backups/ is not its to rewrite)
    assert first is not None
    assert git(tmp_path, "--git-dir", origin, "ls-tree", "-r", "--name-only", first).split() == [
        "backups/team-a.yaml", "backups/team-b.yaml", "state/public.json", "status/source.yaml"]
    assert git(tmp_path, "--git-dir", origin, "show", f"{first}:state/public.json") == '{"generation": 1}'
