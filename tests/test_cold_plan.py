"""The cold pull-request plan (issue #31): clusters whose last converged plan was made from the same inputs
are left out, and what is left is exactly the full plan, action for action.

A real git repo holds the repo on main and a status branch written as the controller writes it (public
state, per-cluster snapshot, `observed/converged/`); each scenario changes the repo, the snapshot or the
clock, then compares `plan_against_status` (what `gitops plan --against-status` runs) with a full plan
of the same inputs.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from repo_helpers import EXAMPLE_REPO
from test_plan_diff import NOW, converged, settle

from gitops.compile import authorities, compile_desired
from gitops.engine import make_plan
from gitops.model.validate import validate_repo
from gitops.observe.types import ObservedHypervisor
from gitops.plan.converged import Converged
from gitops.sip.fileprovider import FileProvider
from gitops.state.sealing import merge, split
from gitops.status.against import plan_against_status
from gitops.status.commit import converged_files
from gitops.status.reader import CONVERGED_DIR, PUBLIC, SOURCE, StatusReader
from gitops.status.snapshot import cluster_path, snapshot_files

REF = "gitops/status"
EXTRA = ("team-c", "team-d", "team-e")
GIT = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t",
       "GIT_COMMITTER_EMAIL": "t@x"}


def git(repo: Path, *args: str, **kw) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env={**GIT, **kw.pop("env", {})}, **kw).stdout.strip()


def write_branch(repo: Path, files: dict[str, bytes], branch: str = REF) -> None:
    """Make `branch` of `repo` one commit holding exactly `files` (the working tree is left alone)."""
    index = repo / ".git" / "status-index"
    index.unlink(missing_ok=True)
    env = {"GIT_INDEX_FILE": str(index)}
    for rel, data in sorted(files.items()):
        sha = subprocess.run(["git", "-C", str(repo), "hash-object", "-w", "--stdin"], input=data, check=True,
                             capture_output=True).stdout.decode().strip()
        git(repo, "update-index", "--add", "--cacheinfo", f"100644,{sha},{rel}", env=env)
    tree = git(repo, "write-tree", env=env)
    commit = git(repo, "commit-tree", tree, "-m", "status")
    git(repo, "update-ref", f"refs/heads/{branch}", commit)


def status_tree(model, config, state, observed, now=NOW) -> dict[str, bytes]:
    """What a status commit holds after a reconcile that planned against `observed`."""
    files = {SOURCE: b"status:\n  result: Applied\n  appliedSHA: " + b"a" * 40 + b"\n",
             PUBLIC: json.dumps(split(state)[0], sort_keys=True).encode(), **snapshot_files(observed)}
    after = make_plan(model, config, state, observed, now=now)
    files.update(converged_files(after, model, config, state, files))
    return files


@dataclasses.dataclass
class World:
    repo: Path
    state: object
    observed: object
    files: dict[str, bytes]

    def load(self):
        result = validate_repo(self.repo)
        assert result.model is not None, result.diagnostics
        return result.model, result.repo.config

    def edit(self, rel: str, old: str, new: str) -> None:
        path = self.repo / rel
        text = path.read_text()
        assert old in text, (rel, old)
        path.write_text(text.replace(old, new, 1))

    def compare(self, now=NOW, ref=REF):
        """The cold plan and the full plan of the working tree against `ref`: equal, or the test fails.
        Returns the cold plan."""
        model, config = self.load()
        cold = plan_against_status(model, config, self.repo, ref, now=now).plan
        reader = StatusReader.at_ref(self.repo, ref)
        full = make_plan(model, config, merge(reader.public_state(), None), reader.observed(), now=now).plan
        assert [a.to_dict() for a in cold.actions] == [a.to_dict() for a in full.actions]
        assert (cold.warnings, cold.unknowns, cold.notes) == (full.warnings, full.unknowns, full.notes)
        assert full.unchanged == ()
        return cold


@pytest.fixture
def world(tmp_path) -> World:
    """The example repo with three more clusters, converged, its status branch written at NOW."""
    repo = tmp_path / "repo"
    shutil.copytree(EXAMPLE_REPO, repo, ignore=shutil.ignore_patterns(".gitops-state"))
    for name in EXTRA:
        (repo / "clusters" / name).mkdir()
        for file in ("cluster.yaml", "nodes.yaml"):
            text = (repo / "clusters" / "team-a" / file).read_text().replace("team-a", name)
            (repo / "clusters" / name / file).write_text(text)
    # the SIPCluster asks for what the inventory has: its hosts are selected and labeled
    sip = (repo / "sip" / "tenant-1.yaml").read_text()
    (repo / "sip" / "tenant-1.yaml").write_text(sip.replace("standby: 1", "standby: 0").replace("active: 2",
                                                                                                "active: 1"))
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "repo")
    w = World(repo, None, None, {})
    model, config = w.load()
    w.state, w.observed = settle(model, config)
    first = make_plan(model, config, w.state, w.observed, now=NOW)
    assert first.sip.changes, "the SIPCluster's hosts are labeled"
    provider = FileProvider.configured(model, config.bare_metal, w.state)
    provider.apply_labels(first.sip.changes)
    provider.record(w.state)
    w.observed = converged(compile_desired(model, w.state, now=NOW, hosts=provider.list_hosts()).desired,
                           w.state, model)
    w.files = status_tree(model, config, w.state, w.observed)
    write_branch(repo, w.files)
    return w


def clusters(model) -> set[str]:
    return set(model.clusters)


def test_a_converged_fleet_plans_nothing_and_reads_no_cluster_snapshot(world):
    model, _ = world.load()
    records = StatusReader.at_ref(world.repo, REF).converged()
    assert set(records) == clusters(model), "every cluster of a converged reconcile is recorded"
    assert all(r.renew_at for r in records.values()), "each checked certificates: a renewal time"
    plan = world.compare()
    assert plan.actions == () and set(plan.unchanged) == clusters(model)


def test_one_cluster_changed_plans_that_cluster_only(world):
    world.edit("clusters/team-c/cluster.yaml", "- api.team-c.example.com", "- api.team-c.example.com\n"
               "      - api2.team-c.example.com")
    plan = world.compare()
    assert {a.cluster for a in plan.actions} == {"team-c"}
    assert set(plan.unchanged) == clusters(world.load()[0]) - {"team-c"}


def test_a_hypervisor_change_plans_every_cluster_placed_there(world):
    model, _ = world.load()
    on = {world.state.nodes[n.name].hypervisor for n in model.nodes_of("team-d")}
    private = sorted(hv for hv in on if not model.hypervisors[hv].public)[0]
    world.edit(f"hypervisors/{private}.yaml", "  public: false", "  public: false\n  cordoned: true")
    touched = {c for c in model.clusters
               if any(world.state.nodes[n.name].hypervisor == private for n in model.nodes_of(c))}
    plan = world.compare()
    assert len(touched) > 1 and not touched & set(plan.unchanged)
    assert set(plan.unchanged) == clusters(model) - touched


def test_a_certificate_entering_its_renewal_window_plans_its_cluster(world):
    model, config = world.load()
    # team-d's certificates were issued 330 days before NOW: 365-day certificates, a 30-day window
    old = converged(compile_desired(model, world.state, now=NOW).desired, world.state, model,
                    now=NOW - dt.timedelta(days=330))
    aged = {n: dataclasses.replace(hv, pods=tuple(
        next(p for p in old.hypervisors[n].pods if p.node == pod.node) if pod.cluster == "team-d" else pod
        for pod in hv.pods)) for n, hv in world.observed.hypervisors.items()}
    observed = dataclasses.replace(world.observed, hypervisors=aged)
    write_branch(world.repo, status_tree(model, config, world.state, observed))
    record = StatusReader.at_ref(world.repo, REF).converged()["team-d"]
    assert dt.datetime.fromisoformat(record.renew_at) == NOW + dt.timedelta(days=5)
    assert world.compare(now=NOW + dt.timedelta(days=4)).actions == ()
    plan = world.compare(now=NOW + dt.timedelta(days=6))
    assert {a.cluster for a in plan.actions} == {"team-d"}
    assert "team-d" not in plan.unchanged and "team-a" in plan.unchanged


def test_a_ca_rotation_phase_plans_its_cluster(world, monkeypatch):
    # the new CAs are random: both plans get the same ones, so that everything else can be compared
    made: dict = {}
    real = authorities.create_ca
    monkeypatch.setattr(authorities, "create_ca", lambda name, **kw: made.get(name) or made.setdefault(
        name, real(name, **kw)))
    world.edit("clusters/team-e/cluster.yaml", "caGeneration: 1", "caGeneration: 2")
    plan = world.compare()
    assert {a.cluster for a in plan.actions} == {"team-e"} and plan.notes
    assert set(plan.unchanged) == clusters(world.load()[0]) - {"team-e"}


def test_a_sip_change_is_planned_with_every_cluster_left_out(world):
    world.edit("sip/tenant-1.yaml", "port: 30443", "port: 30444")
    plan = world.compare()
    assert plan.actions and all(a.cluster not in clusters(world.load()[0]) for a in plan.actions)
    assert set(plan.unchanged) == clusters(world.load()[0])


def test_a_pod_filed_with_another_cluster_brings_its_nodes_cluster_back(world):
    model, config = world.load()
    stray = next(p for p in world.observed.pods() if p.node == "team-c-cp-1")
    stray = dataclasses.replace(stray, sandbox_id="stray", cluster="team-d", created_at=stray.created_at + 1)
    files = dict(world.files)
    pods = [p for p in world.observed.pods() if p.cluster == "team-d"] + [stray]
    files[cluster_path("team-d")] = snapshot_files(dataclasses.replace(world.observed, hypervisors={
        n: ObservedHypervisor(n, True, "", tuple(p for p in pods if p.hypervisor == n))
        for n in world.observed.hypervisors}, clusters={}))[cluster_path("team-d")]
    write_branch(world.repo, files)
    plan = world.compare()
    assert any(a.node == "team-c-cp-1" for a in plan.actions)
    assert not {"team-c", "team-d"} & set(plan.unchanged)


def test_a_cluster_removed_from_the_repo_is_pruned_from_its_snapshot(world):
    shutil.rmtree(world.repo / "clusters" / "team-e")
    plan = world.compare()
    assert {a.cluster for a in plan.actions} == {"team-e"}
    assert set(plan.unchanged) == clusters(world.load()[0])


def test_an_unreachable_hypervisor_is_unknown_and_its_clusters_planned(world):
    model, config = world.load()
    observed = dataclasses.replace(world.observed, hypervisors={
        **world.observed.hypervisors, "hv-private-1": ObservedHypervisor("hv-private-1", False, "timed out")})
    files = {**world.files, **snapshot_files(observed)}
    files = {k: v for k, v in files.items() if not k.startswith(CONVERGED_DIR)} | {
        k: v for k, v in world.files.items() if k.startswith(CONVERGED_DIR)}
    write_branch(world.repo, files)
    plan = world.compare()
    assert plan.unknowns
    placed = {c for c in model.clusters
              if any(world.state.nodes[n.name].hypervisor == "hv-private-1" for n in model.nodes_of(c))}
    assert placed and not placed & set(plan.unchanged)


def test_records_of_an_older_format_or_another_gitops_are_ignored(world):
    files = dict(world.files)
    for rel in [r for r in files if r.startswith(CONVERGED_DIR)]:
        record = Converged.parse(files[rel])
        files[rel] = dataclasses.replace(record, inputs="0" * 64).to_bytes() if "team-a" in rel else b"{}"
    write_branch(world.repo, files)
    assert world.compare().unchanged == ()


def test_a_cluster_warning_records_nothing_a_sip_warning_records_every_cluster(world):
    model, config = world.load()
    quiet = dataclasses.replace(config, prune=dataclasses.replace(config.prune, enabled=False))
    gone = dataclasses.replace(model, clusters={n: c for n, c in model.clusters.items() if n != "team-e"},
                               nodes={n: v for n, v in model.nodes.items() if v.cluster != "team-e"})
    files = status_tree(gone, quiet, world.state, world.observed)  # "pruning is disabled" for team-e's pods
    assert not [rel for rel in files if rel.startswith(CONVERGED_DIR)]
    # a SIPCluster short of hosts warns, but it is planned every time: the clusters are still recorded
    world.edit("sip/tenant-1.yaml", "active: 1", "active: 9")
    model, config = world.load()
    write_branch(world.repo, status_tree(model, config, world.state, world.observed))
    plan = world.compare()
    assert any(w.startswith("SIPCluster tenant-1") for w in plan.warnings)
    assert set(plan.unchanged) == clusters(model)


def test_a_live_fingerprint_moves_with_what_a_plan_reads_not_with_etcd_sizes(world):
    """`gitops plan` with a state dir: a cluster's live fingerprint covers its pods and the facts its etcd
    upkeep decides on; the database sizes that change with every write leave it alone."""
    from gitops.observe.types import EtcdMemberSpace, ObservedEtcd
    from gitops.status.snapshot import live_fingerprints

    members = [EtcdMemberSpace(f"team-a-cp-{i}", f"https://127.0.0.1:{2379 + i}", 40 << 20, 36 << 20)
               for i in (1, 2, 3)]

    def with_etcd(spaces, alarms=()):
        return dataclasses.replace(world.observed, etcd={"team-a": ObservedEtcd(tuple(spaces), tuple(alarms))})

    base = live_fingerprints(with_etcd(members))
    grown = [dataclasses.replace(m, db_size=m.db_size + (1 << 20), db_in_use=m.db_in_use + (1 << 20))
             for m in members]
    assert live_fingerprints(with_etcd(grown)) == base
    fragmented = [dataclasses.replace(members[0], db_in_use=4 << 20), *members[1:]]
    assert live_fingerprints(with_etcd(fragmented))["team-a"] != base["team-a"]
    assert live_fingerprints(with_etcd(members, [("team-a-cp-1", "NOSPACE")]))["team-a"] != base["team-a"]
    assert {c: f for c, f in live_fingerprints(with_etcd(fragmented)).items() if c != "team-a"} == \
        {c: f for c, f in base.items() if c != "team-a"}
    moved = dataclasses.replace(world.observed, hypervisors={
        n: dataclasses.replace(hv, pods=tuple(dataclasses.replace(p, ready=False) if p.node == "team-b-cp-2" else p
                                              for p in hv.pods)) for n, hv in world.observed.hypervisors.items()})
    assert live_fingerprints(moved)["team-b"] != live_fingerprints(world.observed)["team-b"]


_LOADED = """
import json, sys
from gitops.cli import cli
try:  # (its hypervisors are not there: a plan that cannot observe them loads the same modules)
    cli.main(["plan", sys.argv[1], "--state-dir", sys.argv[2], "--out", sys.argv[3]], standalone_mode=False)
except SystemExit:
    pass
import gitops.apply.executor, gitops.controller, gitops.status.against  # apply, the controller, a PR's plan
print(json.dumps(sorted((m, getattr(sys.modules[m], "__file__", None)) for m in list(sys.modules)
                        if m.startswith("gitops."))))
"""


def test_the_code_digest_covers_every_module_a_plan_runs(tmp_path):
    """Records are valid for the code that planned them (`code_digest`); it leaves out the packages a plan never
    runs, so changing the lab, the UI or the worker's join replans nothing: planning, applying and the
    controller import none of them."""
    import sys
    from pathlib import Path as P

    from gitops.plan import converged as conv
    repo = tmp_path / "repo"
    shutil.copytree(EXAMPLE_REPO, repo)
    proc = subprocess.run([sys.executable, "-c", _LOADED, str(repo), str(tmp_path / "state"), str(tmp_path / "p")],
                          capture_output=True, text=True, timeout=300)
    loaded = dict(json.loads(proc.stdout.splitlines()[-1]))
    assert "gitops.plan.converged" in loaded and "gitops.engine" in loaded, proc.stdout + proc.stderr
    assert not [m for m in loaded if m.split(".")[1] in conv.NOT_PLANNING], loaded
    root = P(conv.__file__).resolve().parents[1]
    digested = set(conv.digested_sources(root))
    assert root / "plan/converged.py" in digested and root / "engine.py" in digested
    assert not [p for p in digested if p.relative_to(root).parts[0] in conv.NOT_PLANNING]
    assert {P(f).resolve() for f in loaded.values() if f} - digested == set()


def test_a_fleet_at_two_commits_with_a_halted_rollout_plans_cold_as_in_full(world):
    """Issue #46.4: team-a runs a commit whose rollout halted in its canary wave, the rest the commit before.
    The status branch carries both (each cluster's commit, the rollout); a pull request's cold plan of a
    change to team-c equals the full plan made from the controller's own state, waves and all: a new commit
    rolls again, wave by wave, and the halt of another commit holds nothing of it."""
    from gitops.state.records import HALTED, RolloutRecord, WaveRecord

    config_path = world.repo / "gitops.yaml"
    config_path.write_text(config_path.read_text() + "  rollout:\n    waves:\n      - name: canary\n"
                           "        selector: {matchLabels: {owner: team-a}}\n        soakSeconds: 60\n"
                           "      - name: rest\n        soakSeconds: 60\n")
    halted, before = "a" * 40, "b" * 40
    for name, record in world.state.clusters.items():
        record.commit = halted if name == "team-a" else before
    world.state.rollout = RolloutRecord(halted, [WaveRecord("canary", HALTED, started="2026-11-29T00:00:00Z",
                                                            breach="success ratio 0.9 < 0.999",
                                                            breached_cluster="team-a")])
    model, config = world.load()
    world.files = status_tree(model, config, world.state, world.observed)
    write_branch(world.repo, world.files)
    public = StatusReader.at_ref(world.repo, REF).public_state()
    assert public["rollout"]["waves"][0]["phase"] == HALTED
    assert {n: c["commit"] for n, c in public["clusters"].items()}["team-a"] == halted

    world.edit("clusters/team-c/cluster.yaml", "- api.team-c.example.com", "- api.team-c.example.com\n"
               "      - api2.team-c.example.com")
    model, config = world.load()
    cold = plan_against_status(model, config, world.repo, REF, now=NOW)
    full = make_plan(model, config, world.state, world.observed, now=NOW, source=cold.plan.source).plan
    assert [a.to_dict() for a in cold.plan.actions] == [a.to_dict() for a in full.actions]
    assert cold.plan.warnings == full.warnings
    kinds = [(a.kind.value, a.subject) for a in cold.plan.actions if a.kind.value in ("start-wave", "soak-wave")]
    assert kinds == [("start-wave", "rest"), ("soak-wave", "rest")], kinds
    assert {a.cluster for a in cold.plan.actions if a.cluster} == {"team-c"}
    assert not [w for w in cold.plan.warnings if "halted" in w]
