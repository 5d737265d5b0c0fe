"""Quiet polls without containerd: node files read again only when a pod's listing changed or the drift
interval passed, and a poll whose commit and live state are unchanged compiles, plans and commits nothing."""
from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest

import gitops.controller as controller_module
import gitops.engine as engine_module
from gitops.controller import Controller, ControllerConfig
from gitops.cri.types import Container, ContainerState, Sandbox, SandboxState
from gitops.model.config import RepoConfig
from gitops.model.schemas import schema
from gitops.observe.hypervisors import observe_hypervisor
from gitops.observe.types import ObservedContainer, ObservedHypervisor, ObservedPod, ObservedState
from gitops.pods import AGENT, COMPONENT, MANAGED, MANAGER, NODE, SPEC_HASH, NodeFiles
from gitops.status.poll import NodeFilesCache, live_fingerprint

GIT_ID = ["-c", "user.name=Infra Team", "-c", "user.email=infra@example.com"]
FILES = NodeFiles({"ca.crt": "abc"}, {"etcd-server": "PEM"}, ("etcd-server",), {})


def pod(container_id: str = "c1", state: str = "running", files: NodeFiles | None = FILES) -> ObservedPod:
    return ObservedPod("s1", "n1", "c", "controlplane", "hv", True, "h", 1,
                       (ObservedContainer(container_id, "etcd", state, "e", 2),), files)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_node_files_are_reused_until_the_listing_changes_or_the_interval_passes():
    clock = Clock()
    cache = NodeFilesCache(300, clock)
    assert cache.reuse(pod()) is None  # never read
    cache.remember(ObservedState({"hv": ObservedHypervisor("hv", True, "", (pod(),))}))
    assert cache.reuse(pod(files=None)) is FILES
    assert cache.reuse(pod(container_id="c2", files=None)) is None  # a new container
    assert cache.reuse(pod(state="exited", files=None)) is None
    clock.now += 299
    again = pod(files=cache.reuse(pod(files=None)))
    cache.remember(ObservedState({"hv": ObservedHypervisor("hv", True, "", (again,))}))  # keeps the read time
    clock.now += 1
    assert cache.reuse(pod(files=None)) is None  # drift check due
    assert NodeFilesCache(0, clock).reuse(pod()) is None
    cache.forget()
    clock.now -= 100
    assert cache.reuse(pod(files=None)) is None


def test_the_live_fingerprint_covers_containers_and_files():
    base = ObservedState({"hv": ObservedHypervisor("hv", True, "", (pod(),))})
    same = ObservedState({"hv": ObservedHypervisor("hv", True, "", (pod(files=dataclasses.replace(FILES)),))})
    assert live_fingerprint(base) == live_fingerprint(same)
    for other in (pod(container_id="c2"), pod(state="exited"), pod(files=None),
                  pod(files=dataclasses.replace(FILES, digests={"ca.crt": "abd"}))):
        assert live_fingerprint(ObservedState({"hv": ObservedHypervisor("hv", True, "", (other,))})) \
            != live_fingerprint(base)
    assert live_fingerprint(ObservedState({"hv": ObservedHypervisor("hv", False, "down")})) != live_fingerprint(base)


class FakeCRI:
    """Lists one managed pod with a running files agent; counts ExecSyncs (node file reads)."""

    name = "hv"

    def __init__(self) -> None:
        self.execs = 0

    def list_sandboxes(self, selector):
        return [Sandbox("s1", "n1", "c", "u", 0, SandboxState.READY, 1, {MANAGED: MANAGER, NODE: "n1"})]

    def list_containers(self, selector):
        return [Container("a1", "s1", AGENT, 0, "agent", "agent", ContainerState.RUNNING, 2,
                          {COMPONENT: AGENT, SPEC_HASH: "x"})]

    def exec_sync(self, container_id, cmd, timeout):
        self.execs += 1
        return 0, b"file ca.crt abc\n", b""


def test_observation_reads_node_files_only_when_not_reusable():
    client = FakeCRI()
    first = observe_hypervisor(client)
    assert client.execs == 1 and first.pods[0].files == NodeFiles({"ca.crt": "abc"}, {}, (), {})
    cache = NodeFilesCache(300)
    cache.remember(ObservedState({"hv": first}))
    again = observe_hypervisor(client, reuse=cache.reuse)
    assert client.execs == 1 and again.pods[0].files is first.pods[0].files
    observe_hypervisor(client, reuse=lambda p: None)
    assert client.execs == 2


def test_the_drift_interval_is_a_repo_setting():
    assert RepoConfig().node_files_interval == 300
    assert RepoConfig.from_spec({"drift": {"nodeFilesIntervalSeconds": 60}}).node_files_interval == 60
    prop = schema("GitopsConfig")["properties"]["spec"]["properties"]["drift"]["properties"]
    assert prop["nodeFilesIntervalSeconds"]["default"] == 300


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *GIT_ID, *args], cwd=cwd, capture_output=True, text=True, check=True).stdout


@pytest.fixture
def world(tmp_path: Path, monkeypatch):
    """A repo with nothing to place, a controller, and counters on what a poll does."""
    origin, work = tmp_path / "origin.git", tmp_path / "work"
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(origin)], check=True)
    work.mkdir()
    git(work, "init", "-q", "-b", "main")
    git(work, "remote", "add", "origin", str(origin))
    (work / "gitops.yaml").write_text("apiVersion: gitops.infra/v1alpha1\nkind: GitopsConfig\nspec:\n"
                                      "  drift:\n    nodeFilesIntervalSeconds: 600\n")
    git(work, "add", "-A")
    git(work, "commit", "-q", "-m", "first")
    git(work, "push", "-q", "origin", "HEAD:main")
    live = {"state": ObservedState({})}
    calls = {"observe": 0, "validate": 0, "plan": 0}

    def observe_all(model, config, state=None, reuse=None, clusters=None, etcd=None):
        calls["observe"] += 1
        return live["state"]

    def counted(name, fn):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(controller_module, "observe_all", observe_all)
    monkeypatch.setattr(controller_module, "validate_repo", counted("validate", controller_module.validate_repo))
    monkeypatch.setattr(engine_module, "make_plan", counted("plan", engine_module.make_plan))
    ctl = Controller(ControllerConfig(repo=str(origin), workdir=tmp_path / "ctl", insecure_plaintext_secrets=True))
    yield ctl, origin, work, live, calls
    ctl.release()


def status_commits(origin: Path) -> int:
    return len(git(origin, "log", "--format=%H", "gitops/status").split())


def test_a_poll_with_the_same_commit_and_live_state_does_nothing_more(world):
    ctl, origin, work, live, calls = world
    first = ctl.reconcile_once()
    assert first.result.value == "Applied" and calls == {"observe": 1, "validate": 1, "plan": 1}
    assert ctl.files.interval == 600  # from gitops.yaml
    commits = status_commits(origin)
    for _ in range(3):
        quiet = ctl.reconcile_once()
        assert quiet.result.value == "Applied" and quiet.actions == 0 and quiet.applied_sha == first.applied_sha
    assert calls == {"observe": 4, "validate": 1, "plan": 1} and status_commits(origin) == commits
    # the live state moved: a full reconcile with this poll's observation, then quiet again
    live["state"] = ObservedState({"hv-new": ObservedHypervisor("hv-new", True)})
    ctl.reconcile_once()
    assert calls == {"observe": 5, "validate": 2, "plan": 2}
    ctl.reconcile_once()
    assert calls == {"observe": 6, "validate": 2, "plan": 2}
    # a new commit: a full reconcile
    (work / "README.md").write_text("docs\n")
    git(work, "add", "-A")
    git(work, "commit", "-q", "-m", "docs")
    git(work, "push", "-q", "origin", "HEAD:main")
    assert ctl.reconcile_once().applied_sha != first.applied_sha
    # the quiet poll's observation, made while fetching, is dropped: the new commit's model is observed
    assert calls == {"observe": 8, "validate": 3, "plan": 3}


def test_an_incomplete_plan_keeps_every_poll_complete(world):
    ctl, origin, work, live, calls = world
    live["state"] = ObservedState({"hv": ObservedHypervisor("hv", False, "CRI down")})
    ctl.reconcile_once()
    ctl.reconcile_once()
    assert calls["validate"] == 2 and calls["plan"] == 2


def test_the_controller_remembers_another_holders_lease_across_polls(world, tmp_path):
    """One apply lease per status branch for the controller's life: another replica's signed lease it saw
    still holds when the lock is deleted (a fresh lease per poll forgot it, and took the lock)."""
    import datetime as dt

    from gitops.status.branch import StatusBranch
    from gitops.status.lease import LOCK_REF, ApplyLease, Locked
    from signing import trust

    ctl, origin, work, live, calls = world
    ctl.reconcile_once()
    other = StatusBranch(str(origin), tmp_path / "other", "gitops/status", trust(ctl.signing_key))
    ApplyLease(other.repo, other.trust).acquire("replica-b", dt.timedelta(minutes=10),
                                                dt.datetime.now(dt.timezone.utc) + dt.timedelta(minutes=10))
    live["state"] = ObservedState({"hv-new": ObservedHypervisor("hv-new", True)})  # (a full reconcile: applies)
    with pytest.raises(Locked, match="replica-b"):
        ctl.reconcile_once()
    git(origin, "update-ref", "-d", LOCK_REF)
    live["state"] = ObservedState({})
    with pytest.raises(Locked, match="replica-b"):
        ctl.reconcile_once()
    assert not git(origin, "for-each-ref", LOCK_REF)  # (not taken)
