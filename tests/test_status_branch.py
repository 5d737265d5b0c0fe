"""The status branch on a real bare git repo: commits only on change, racing writers, the apply
lease, and age sealing that the standard `age` tool opens."""
from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import subprocess
from pathlib import Path

import pytest

from gitops.errors import GitopsError
from gitops.observe.types import ObservedCluster, ObservedState
from gitops.secrets import decrypt, encrypt
from gitops.state import CertRecord, ClusterRecord, NodeRecord, State
from gitops.status.branch import NOTES_REF, Note, StatusBranch
from gitops.status.lease import ApplyLease, Locked, holder_id
from gitops.status.reader import DEFAULT_BRANCH, MANAGED, OBSERVED, SOURCE, SourceStatus, StatusReader
from gitops.status.sealed_state import PUBLIC, SEALED, ControllerStateStore, Sealer, merge, split
from gitops.status.snapshot import HYPERVISORS, cluster_path, snapshot_files

TTL = dt.timedelta(minutes=10)


@pytest.fixture
def origin(tmp_path: Path) -> str:
    bare = tmp_path / "origin.git"
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(bare)], check=True)
    work = tmp_path / "seed"
    subprocess.run(["git", "clone", "-q", str(bare), str(work)], check=True, capture_output=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@x", "commit", "-q", "--allow-empty", "-m", "init"],
                   cwd=work, check=True)
    subprocess.run(["git", "push", "-q", "origin", "HEAD:main"], cwd=work, check=True)
    return str(bare)


def files(tree: dict[str, bytes]):
    return lambda branch: branch.write_tree(tree, ("status",))


def log(origin: str) -> list[str]:
    out = subprocess.run(["git", "--git-dir", origin, "log", "--format=%s", "gitops/status"], capture_output=True,
                         text=True, check=True).stdout
    return out.splitlines()


def test_commit_only_when_something_changed(origin, tmp_path):
    branch = StatusBranch(origin, tmp_path / "a")
    assert branch.publish(files({"status/x.yaml": b"x: 1\n"}), "first") is not None
    assert branch.publish(files({"status/x.yaml": b"x: 1\n"}), "same again") is None
    assert branch.publish(files({"status/x.yaml": b"x: 2\n"}), "second") is not None
    assert log(origin) == ["second", "first"]


def test_racing_writers_lose_nothing(origin, tmp_path):
    a, b = StatusBranch(origin, tmp_path / "a"), StatusBranch(origin, tmp_path / "b")
    a.publish(files({"status/a.yaml": b"1\n"}), "a1")
    b.sync()  # b is now at a1
    a.publish(files({"status/a.yaml": b"2\n"}), "a2")  # a moves the tip; b's push will be rejected
    assert b.publish(files({"status/a.yaml": b"2\n", "status/b.yaml": b"1\n"}), "b1") is not None
    assert log(origin) == ["b1", "a2", "a1"]


def test_the_holder_id_is_kept_and_an_empty_one_made_again(tmp_path):
    """A restarted controller takes its own lease back (same id); a `controller-id` an older build left empty
    when killed while writing it is made again, never the holder ``""``."""
    first = holder_id(tmp_path)
    assert first and holder_id(tmp_path) == first == (tmp_path / "controller-id").read_text().strip()
    (tmp_path / "controller-id").write_text("")
    again = holder_id(tmp_path)
    assert again and again != first and holder_id(tmp_path) == again


def test_apply_lease(origin, tmp_path):
    a, b = ApplyLease(StatusBranch(origin, tmp_path / "a").repo), ApplyLease(StatusBranch(origin, tmp_path / "b").repo)
    now = dt.datetime.now(dt.timezone.utc)
    a.acquire("A", TTL, now)
    with pytest.raises(Locked, match="another controller \\(A\\) holds the apply lock"):
        b.acquire("B", TTL, now)
    assert a.acquire("A", TTL, now).holder == "A"  # renewal by its holder
    assert b.acquire("B", TTL, now + TTL + dt.timedelta(seconds=1)).holder == "B"  # A crashed: the lease expired
    b.release("B")
    assert a.acquire("A", TTL, now + TTL * 2).holder == "A"


def test_one_reader_for_the_worktree_and_for_a_ref(origin, tmp_path):
    source = (b"kind: SourceStatus\nstatus:\n  appliedSHA: abc\n  lastSeenSHA: def\n  result: Refused\n"
              b"  errors: ['x.yaml:1: wrong']\n")
    tree = {SOURCE: source, "status/Cluster/c.yaml": b"metadata: {name: c}\nstatus: {phase: Ready}\n"}
    branch = StatusBranch(origin, tmp_path / "a")
    assert branch.branch == DEFAULT_BRANCH
    branch.publish(files(tree), "first")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", origin, str(clone)], check=True)
    at_ref = StatusReader.for_clone(clone)
    assert at_ref.ref == f"origin/{DEFAULT_BRANCH}"
    for reader in (branch.reader, at_ref):
        assert reader.source() == SourceStatus("Refused", "def", "abc", ("x.yaml:1: wrong",), reader.source().status)
        assert reader.applied_sha() == "abc" and reader.documents("Cluster")["c"]["status"] == {"phase": "Ready"}
        assert reader.read("observed.yaml") is None and reader.documents("Node") == {}
        with pytest.raises(Exception, match="cannot read observed.yaml at "):
            reader.require("observed.yaml")
    for raw in (None, b"", b": : not yaml", b"status: null\n", b"- a list\n"):
        assert SourceStatus.parse(raw).applied_sha == ""


def test_sealed_state_keeps_private_keys_off_the_public_file(tmp_path):
    identity = subprocess.run(["age-keygen"], capture_output=True, text=True, check=True).stdout
    state = State(clusters={"c": ClusterRecord(authorities={"etcd": CertRecord("CERT", "SECRET-KEY")},
                                               admin=CertRecord("ADMIN-CERT", "ADMIN-KEY"))},
                  nodes={"n": NodeRecord("c", "hv", {"etcd-client": 30000})})
    public, secrets = split(state)
    assert "SECRET-KEY" not in str(public) and "ADMIN-KEY" not in str(public)
    assert merge(public, secrets) == state
    store = ControllerStateStore(Sealer(identity), tmp_path / "cache")
    store.save(state)
    out = store.files({})
    again = store.files(out)
    assert again[SEALED] == out[SEALED]  # unchanged secrets reuse their ciphertext: no spurious commit
    key = tmp_path / "key"
    key.write_text(identity)
    opened = subprocess.run(["age", "-d", "-i", str(key)], input=out[SEALED], capture_output=True, check=True)
    assert b"SECRET-KEY" in opened.stdout and b"SECRET-KEY" not in out[PUBLIC]
    fresh = ControllerStateStore(Sealer(identity), tmp_path / "cache")
    assert fresh.restore(lambda rel: None) == "local cache" and fresh.load() == state
    with pytest.raises(Exception, match="needs an age identity"):
        Sealer(None)


def test_armored_age_round_trip_with_the_age_tool(tmp_path):
    identity = subprocess.run(["age-keygen"], capture_output=True, text=True, check=True)
    recipient = identity.stderr.split("Public key:")[1].strip()
    (tmp_path / "key").write_text(identity.stdout)
    for size in (0, 1, 47, 48, 49, 4096):
        data = bytes(range(256)) * (size // 256) + bytes(range(size % 256))
        armored = encrypt(data, [recipient])
        assert subprocess.run(["age", "-d", "-i", str(tmp_path / "key")], input=armored.encode(),
                              capture_output=True, check=True).stdout == data
    from gitops.secrets import load_identity

    assert decrypt(armored, load_identity(identity.stdout)) == data


def _snapshot():
    """A small converged fleet's snapshot (the example repo) and one with a cluster's container restarted."""
    from test_plan_diff import settle

    from repo_helpers import EXAMPLE_REPO
    from gitops.model.validate import validate_repo

    model = validate_repo(EXAMPLE_REPO).model
    _, observed = settle(dataclasses.replace(model, sip_clusters={}))
    hv, pod = next((hv, p) for hv in observed.hypervisors.values() for p in hv.pods if p.cluster == "team-a")
    restarted = dataclasses.replace(pod, containers=tuple(dataclasses.replace(c, id=c.id + "-2", created_at=99)
                                                          for c in pod.containers))
    apis = {"team-a": ObservedCluster("team-a", True, objects={"configmaps/kube-system/x": "h1"}),
            "Not A File Name": ObservedCluster("Not A File Name", False, "unreachable")}
    observed = dataclasses.replace(observed, clusters=apis)
    moved = dataclasses.replace(observed, hypervisors={**observed.hypervisors, hv.name: dataclasses.replace(
        hv, pods=tuple(restarted if p is pod else p for p in hv.pods))})
    return observed, moved


def test_observed_snapshot_is_stored_per_cluster_and_read_back(origin, tmp_path):
    observed, moved = _snapshot()
    written = snapshot_files(observed)
    assert sorted(written) == [cluster_path("team-a"), cluster_path("team-b"), HYPERVISORS]
    assert all(data.count(b"\n") == 1 for data in written.values())  # compact: one line each
    branch = StatusBranch(origin, tmp_path / "a")
    legacy = {OBSERVED: b"hypervisors: {}\n"}
    branch.publish(lambda b: b.write_tree(legacy, MANAGED), "the older single-file form")
    assert branch.reader.observed() == ObservedState({})
    branch.publish(lambda b: b.write_tree(written, MANAGED), "per cluster")
    assert not (branch.dir / OBSERVED).exists()  # the older form is removed once the new one is written
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", origin, str(clone)], check=True)
    for reader in (branch.reader, StatusReader.for_clone(clone)):
        assert reader.observed() == observed
    # a restarted container in team-a: the commit rewrites team-a's file only
    changed = snapshot_files(moved)
    branch.publish(lambda b: b.write_tree(changed, MANAGED), "team-a restarted")
    names = subprocess.run(["git", "--git-dir", origin, "diff", "--name-only", "gitops/status~1", "gitops/status"],
                           capture_output=True, text=True, check=True).stdout.split()
    assert names == [cluster_path("team-a")]
    assert StatusReader.at_ref(Path(origin), "gitops/status").observed() == moved


def test_a_snapshot_without_observations_is_an_error(origin, tmp_path):
    branch = StatusBranch(origin, tmp_path / "a")
    branch.publish(files({"status/x.yaml": b"x: 1\n"}), "first")
    with pytest.raises(GitopsError, match="no observed snapshot"):
        branch.reader.observed()


def test_write_tree_touches_only_what_changed(origin, tmp_path):
    branch = StatusBranch(origin, tmp_path / "a")
    keep = {"other/keep.txt": b"not managed\n"}
    first = {"status/a/x.yaml": b"1\n", "status/b.yaml": b"2\n", "observed.yaml": b"old\n"}
    branch.publish(lambda b: b.write_tree({**keep, **first}, ("other", "status", "observed.yaml")), "first")
    unchanged = (branch.dir / "status/b.yaml").stat().st_mtime_ns
    second = {"status/b.yaml": b"2\n", "observed/clusters/c.json": b"{}\n"}
    assert branch.publish(lambda b: b.write_tree(second, MANAGED), "second") is not None
    assert not (branch.dir / "status/a").exists() and not (branch.dir / OBSERVED).exists()
    assert (branch.dir / "other/keep.txt").read_bytes() == b"not managed\n"
    assert (branch.dir / "status/b.yaml").stat().st_mtime_ns == unchanged  # same content: not written again
    assert branch.publish(lambda b: b.write_tree(second, MANAGED), "same") is None
    other = StatusBranch(origin, tmp_path / "b")
    other.publish(lambda b: b.write_tree({"status/b.yaml": b"3\n"}, ("status",)), "another writer")
    branch.publish(lambda b: b.write_tree(second, MANAGED), "back")  # starts from the other writer's tip
    shown = subprocess.run(["git", "--git-dir", origin, "show", "gitops/status:status/b.yaml"], capture_output=True,
                           check=True).stdout
    assert shown == b"2\n" and log(origin)[:2] == ["back", "another writer"]


def _hook(origin: str, body: str) -> Path:
    """A pre-receive hook on `origin` running `body` (sh; each pushed ref arrives on stdin as 'old new ref')."""
    hook = Path(origin) / "hooks" / "pre-receive"
    hook.write_text("#!/bin/sh\n" + body)
    hook.chmod(0o755)
    return hook


def _notes(origin: str) -> str:
    return subprocess.run(["git", "--git-dir", origin, "log", "--notes=gitops", "--format=%H%n%N--", "main"],
                          capture_output=True, text=True, check=True).stdout


def test_a_commits_note_goes_in_the_same_push_as_its_status_commit(origin, tmp_path):
    """Issue #26 (nothing lost): the outcome note and the status commit recording it land together or not at
    all; a second writer's note is kept beside the first's."""
    pushes = tmp_path / "pushes"
    _hook(origin, f"cut -d' ' -f3 | sort | tr '\\n' ' ' >> {pushes}; echo >> {pushes}\n")
    main = subprocess.run(["git", "--git-dir", origin, "rev-parse", "main"], capture_output=True, text=True,
                          check=True).stdout.strip()
    a = StatusBranch(origin, tmp_path / "a")
    sha = a.publish(files({"status/x.yaml": b"x: 1\n"}), "applied", Note(main, "main", "gitops: Applied: 0 action(s)"))
    assert pushes.read_text().splitlines() == [f"refs/heads/{DEFAULT_BRANCH} {NOTES_REF} "]
    assert f"{main}\ngitops: Applied: 0 action(s)\nstatus commit {sha}\n" in _notes(origin)
    # a later outcome of the same commit, from another writer: the note is replaced, in one push again
    b = StatusBranch(origin, tmp_path / "b")
    again = b.publish(files({"status/x.yaml": b"x: 2\n"}), "again", Note(main, "main", "gitops: Failed: 1 action(s)"))
    assert pushes.read_text().splitlines()[-1] == f"refs/heads/{DEFAULT_BRANCH} {NOTES_REF} "
    assert f"{main}\ngitops: Failed: 1 action(s)\nstatus commit {again}\n" in _notes(origin)
    # nothing changed: no commit, and so no note
    assert b.publish(files({"status/x.yaml": b"x: 2\n"}), "same", Note(main, "main", "other")) is None
    assert len(pushes.read_text().splitlines()) == 2


def test_a_remote_that_refuses_notes_still_gets_the_status_commit(origin, tmp_path, caplog):
    _hook(origin, f"if grep -q ' {NOTES_REF}$'; then echo no notes here >&2; exit 1; fi\n")
    main = subprocess.run(["git", "--git-dir", origin, "rev-parse", "main"], capture_output=True, text=True,
                          check=True).stdout.strip()
    sha = StatusBranch(origin, tmp_path / "a").publish(files({"status/x.yaml": b"x: 1\n"}), "applied",
                                                       Note(main, "main", "gitops: Applied: 0 action(s)"))
    assert sha is not None and log(origin) == ["applied"]
    assert subprocess.run(["git", "--git-dir", origin, "rev-parse", "--verify", "-q", NOTES_REF],
                          capture_output=True).returncode == 1
    assert "commit note refused by the remote" in caplog.text


def test_a_note_whose_push_raced_another_writer_in_the_remote_lands_on_the_retry(origin, tmp_path, caplog):
    """Another writer's push lands while ours is in the remote's pre-receive hook: git refuses both of our refs
    (`cannot lock ref`, `atomic transaction failed`); that is a race, retried with the note, not a refusal."""
    caplog.set_level(logging.INFO, logger="gitops.status.branch")
    main = subprocess.run(["git", "--git-dir", origin, "rev-parse", "main"], capture_output=True, text=True,
                          check=True).stdout.strip()
    StatusBranch(origin, tmp_path / "b").publish(files({"status/x.yaml": b"1\n"}), "b1")
    other = tmp_path / "other"
    subprocess.run(["git", "clone", "-q", "-b", DEFAULT_BRANCH, origin, str(other)], check=True, capture_output=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@x", "commit", "-q", "--allow-empty", "-m",
                    "other writer"], cwd=other, check=True)
    marker = tmp_path / "marker"
    marker.touch()
    _hook(origin, f"cat >/dev/null\nif [ -e {marker} ]; then rm {marker}; env -i PATH=\"$PATH\" "
                  f"git -C {other} push -q origin HEAD:refs/heads/{DEFAULT_BRANCH} >&2; fi\n")
    sha = StatusBranch(origin, tmp_path / "a").publish(files({"status/y.yaml": b"2\n"}), "a1",
                                                       Note(main, "main", "gitops: Applied: 0 action(s)"))
    assert log(origin) == ["a1", "other writer", "b1"]
    assert f"{main}\ngitops: Applied: 0 action(s)\nstatus commit {sha}\n" in _notes(origin)
    assert "raced another writer" in caplog.text and "refused" not in caplog.text


def test_a_remote_without_atomic_pushes_gets_the_commit_then_its_note(origin, tmp_path):
    subprocess.run(["git", "--git-dir", origin, "config", "receive.advertiseAtomic", "false"], check=True)
    main = subprocess.run(["git", "--git-dir", origin, "rev-parse", "main"], capture_output=True, text=True,
                          check=True).stdout.strip()
    branch = StatusBranch(origin, tmp_path / "a")
    assert branch.publish(files({"status/x.yaml": b"1\n"}), "first") is not None
    sha = branch.publish(files({"status/x.yaml": b"2\n"}), "second", Note(main, "main", "gitops: Applied"))
    assert log(origin) == ["second", "first"]
    assert f"{main}\ngitops: Applied\nstatus commit {sha}\n" in _notes(origin)
