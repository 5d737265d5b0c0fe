"""`gitops state push` / `pull` (#26) on a real bare git repo with the real age sealing: a state dir goes to the
status branch sealed to the controller's identity and comes back identical; a different state at either end is
never overwritten without --force; the controller restores the pushed generation."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gitops.state import CertRecord, ClusterRecord, LocalDirStore, NodeRecord, State
from gitops.status.branch import StatusBranch
from gitops.status.reader import PUBLIC, SEALED
from gitops.status.sealed_state import ControllerStateStore, Sealer
from signing import commit_unsigned, make_key, trust

GITOPS = str(Path(sys.executable).parent / "gitops")


@pytest.fixture
def origin(tmp_path: Path) -> str:
    bare = tmp_path / "origin.git"
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(bare)], check=True)
    return str(bare)


@pytest.fixture
def signer(tmp_path: Path) -> list[str]:
    """A person's SSH key that signs their push, pinned with --status-signers."""
    key = make_key(tmp_path / "keys", "operator")
    return ["--signing-key", str(key.path), "--status-signers", f"{key.path}.pub"]


@pytest.fixture
def identity(tmp_path: Path) -> Path:
    key = tmp_path / "controller.key"
    key.write_text(subprocess.run(["age-keygen"], capture_output=True, text=True, check=True).stdout)
    return key


def _state(cluster: str = "team-a", key: str = "CA-KEY") -> State:
    return State(clusters={cluster: ClusterRecord(authorities={"cluster": CertRecord("CA-CERT", key)},
                                                  admin=CertRecord("ADMIN-CERT", "ADMIN-KEY"))},
                 nodes={f"{cluster}-cp-1": NodeRecord(cluster, "hv-1", {"etcd-client": 30000})})


def _gitops(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([GITOPS, *args], capture_output=True, text=True, timeout=60)
    assert "Traceback" not in done.stderr, done.stderr
    if check:
        assert done.returncode == 0, done.stdout + done.stderr
    return done


def test_push_then_pull_round_trips_sealed(origin, identity, signer, tmp_path):
    LocalDirStore(tmp_path / "mine").save(_state())
    common = ["--repo", origin, "--identity", str(identity)]
    pinned = signer[2:]
    out = _gitops("state", "push", *common, *signer, "--state-dir", str(tmp_path / "mine")).stdout
    assert "as generation 1" in out and "1 cluster(s), 1 node(s)" in out
    # on the branch: the keys only in the age file, never in the public one
    public = subprocess.run(["git", "--git-dir", origin, "show", f"gitops/status:{PUBLIC}"], capture_output=True,
                            check=True).stdout
    sealed = subprocess.run(["git", "--git-dir", origin, "show", f"gitops/status:{SEALED}"], capture_output=True,
                            check=True).stdout
    assert b"CA-KEY" not in public and b"CA-KEY" not in sealed and json.loads(public)["generation"] == 1
    # pushing the same state again makes no commit
    assert "nothing pushed" in _gitops("state", "push", *common, *signer, "--state-dir",
                                       str(tmp_path / "mine")).stdout
    _gitops("state", "pull", *common, *pinned, "--state-dir", str(tmp_path / "theirs"))
    assert LocalDirStore(tmp_path / "theirs").load() == _state()
    # the commit is signed with the operator's key: git itself verifies it
    allowed = tmp_path / "allowed"
    allowed.write_text("operator " + (tmp_path / "keys" / "operator.pub").read_text())
    assert subprocess.run(["git", "--git-dir", origin, "-c", f"gpg.ssh.allowedSignersFile={allowed}",
                           "verify-commit", "gitops/status"], capture_output=True).returncode == 0
    # the controller restores what was pushed (the newest generation wins over its empty cache)
    operator = make_key(tmp_path / "keys", "operator")
    branch = StatusBranch(origin, tmp_path / "ctl", trust=trust(make_key(tmp_path / "keys", "ctl"), operator))
    branch.sync()
    store = ControllerStateStore(Sealer(identity.read_text()), tmp_path / "ctl" / "state-cache")
    assert store.restore(branch.read) == "status branch" and store.load() == _state() and store.generation == 1


def test_a_different_state_is_not_overwritten_without_force(origin, identity, signer, tmp_path):
    common = ["--repo", origin, "--identity", str(identity), *signer]
    LocalDirStore(tmp_path / "a").save(_state())
    LocalDirStore(tmp_path / "b").save(_state(key="ANOTHER-KEY"))
    _gitops("state", "push", *common, "--state-dir", str(tmp_path / "a"))
    refused = _gitops("state", "push", *common, "--state-dir", str(tmp_path / "b"), check=False)
    assert refused.returncode == 1 and "already holds another state (generation 1, clusters team-a)" in refused.stderr
    assert "generation 2" in _gitops("state", "push", *common, "--state-dir", str(tmp_path / "b"), "--force").stdout
    # pulling over a different local state is refused too; the local one stays as it was
    refused = _gitops("state", "pull", *common[:4], *signer[2:], "--state-dir", str(tmp_path / "a"), check=False)
    assert refused.returncode == 1 and "already holds another state" in refused.stderr
    assert LocalDirStore(tmp_path / "a").load() == _state()


def test_nothing_to_pull_or_push_is_one_line(origin, identity, signer, tmp_path):
    common = ["--repo", origin, "--identity", str(identity)]
    empty = _gitops("state", "push", *common, *signer, "--state-dir", str(tmp_path / "none"), check=False)
    assert empty.returncode == 1 and "holds no recorded state" in empty.stderr
    missing = _gitops("state", "pull", *common, *signer[2:], "--state-dir", str(tmp_path / "none"), check=False)
    assert missing.returncode == 1 and "holds no state" in missing.stderr
    wrong = tmp_path / "other.key"
    wrong.write_text(subprocess.run(["age-keygen"], capture_output=True, text=True, check=True).stdout)
    LocalDirStore(tmp_path / "a").save(_state())
    _gitops("state", "push", *common, *signer, "--state-dir", str(tmp_path / "a"))
    other = _gitops("state", "pull", "--repo", origin, "--identity", str(wrong), *signer[2:], "--state-dir",
                    str(tmp_path / "c"), check=False)
    assert other.returncode == 1 and len(other.stderr.strip().splitlines()) == 1, other.stderr


def test_push_and_pull_trust_only_pinned_keys(origin, identity, signer, tmp_path):
    """A push signed by a key nobody pinned is refused (pushed with --force and a warning); a pull reads only
    a commit a pinned key signed, never an unsigned tip someone pushed over it, and none at all without a pin."""
    common = ["--repo", origin, "--identity", str(identity)]
    LocalDirStore(tmp_path / "a").save(_state())
    stranger = make_key(tmp_path / "keys", "stranger")
    foreign = ["--signing-key", str(stranger.path), *signer[2:]]
    refused = _gitops("state", "push", *common, *foreign, "--state-dir", str(tmp_path / "a"), check=False)
    assert refused.returncode == 1 and "is not a pinned status signer" in refused.stderr
    forced = _gitops("state", "push", *common, *foreign, "--state-dir", str(tmp_path / "a"), "--force")
    assert "WARNING" in forced.stderr and "not a pinned status signer" in forced.stderr
    # the tip is the stranger's: a pull pinned to the operator finds no commit it may read
    none = _gitops("state", "pull", *common, *signer[2:], "--state-dir", str(tmp_path / "x"), check=False)
    assert none.returncode == 1 and "holds no state" in none.stderr and "not trusted" in none.stderr
    _gitops("state", "push", *common, *signer, "--state-dir", str(tmp_path / "a"))
    # an unsigned commit swaps the public state: the pull reads the operator's commit under it
    commit_unsigned(origin, "gitops/status", {PUBLIC: '{"generation": 99, "clusters": {}}'}, work=tmp_path / "w")
    pulled = _gitops("state", "pull", *common, *signer[2:], "--state-dir", str(tmp_path / "b"))
    assert "unsigned" in pulled.stderr and LocalDirStore(tmp_path / "b").load() == _state()
    unpinned = _gitops("state", "pull", *common, "--state-dir", str(tmp_path / "c"), check=False)
    assert unpinned.returncode == 1 and "no status signer is pinned" in unpinned.stderr
    loud = _gitops("state", "pull", *common, "--insecure-unverified-status", "--state-dir", str(tmp_path / "d"),
                   check=False)
    assert "WITHOUT verifying" in loud.stderr
