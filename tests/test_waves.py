"""Fleet rollouts in waves (issue #46), the pure parts: gitops.yaml's spec.rollout, the plan's waves and gates,
a rollout resumed or halted as the recorded state says. The lab test (test_waves_lab.py) runs them on real
clusters."""
from __future__ import annotations

import dataclasses
import io
import json
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from rich.console import Console
from test_plan_diff import NOW, settle

from gitops.engine import make_plan
from gitops.model.config import Rollout, Wave
from gitops.model.validate import validate_repo
from gitops.plan.actions import Kind, Plan
from gitops.plan.payloads import WaveGate
from gitops.plan.render import render_markdown, render_text
from gitops.plan.waves import steps
from gitops.state.records import HALTED, ROLLING, SOAKED, RolloutRecord, State, WaveRecord

EXAMPLE = Path(__file__).resolve().parents[1] / "gitops" / "example_repo"
WAVES = """  rollout:
    waves:
      - name: canary
        selector: {matchLabels: {owner: team-a}}
        soakSeconds: 120
      - name: rest
        soakSeconds: 60
    slo:
      minSuccessRatio: 0.99
"""


def repo_with(tmp_path: Path, rollout: str) -> Path:
    root = tmp_path / "repo"
    shutil.copytree(EXAMPLE, root)
    with open(root / "gitops.yaml", "a") as f:
        f.write(rollout)
    return root


@pytest.fixture(scope="module")
def waved(tmp_path_factory):
    """The example repo (without its SIPCluster) with two waves: team-a the canary, then the rest."""
    result = validate_repo(repo_with(tmp_path_factory.mktemp("waves"), WAVES))
    assert result.ok, result.diagnostics
    return result.model.__class__(**{**vars(result.model), "sip_clusters": {}}), result.repo.config


def test_gitops_yaml_declares_waves_and_an_slo(waved):
    _, config = waved
    assert config.rollout == Rollout((Wave("canary", {"matchLabels": {"owner": "team-a"}}, 120, 1),
                                      Wave("rest", None, 60, 1)), 0.99)


@pytest.mark.parametrize("rollout, errors", [
    ("  rollout:\n    waves:\n      - name: a\n        selector: {matchLabels: {owner: team-a}}\n",
     ["clusters/team-b/cluster.yaml:6: Cluster/team-b: metadata.labels: Cluster team-b is in no wave of gitops.yaml "
      "spec.rollout.waves (a): end them with a wave without selector, or label the cluster"]),
    ("  rollout:\n    waves:\n      - name: a\n      - name: a\n",
     ["spec.rollout.waves[1].name: wave 'a' is named twice",
      "spec.rollout.waves[1]: wave 'a' comes after wave 'a', which has no selector"]),
    ("  rollout:\n    waves:\n      - name: a\n        soakSeconds: -1\n", ["soakSeconds"]),
    ("  rollout:\n    waves:\n      - name: a\n        selector: {}\n      - name: b\n",
     ["spec.rollout.waves[1]: wave 'b' comes after wave 'a', which has no selector (or an empty one)"]),
    ("  rollout:\n    waves:\n      - name: a\n    slo: {minSuccessRatio: 1.5}\n", ["minSuccessRatio"]),
    ("  rollout:\n    waves: [{name: a}]\n  coordination: {mode: shards, shards: 2, kubeconfig: /k}\n",
     ["waves need one controller to roll the whole fleet: not with spec.coordination.mode shards"]),
])
def test_a_rollout_that_cannot_hold_every_cluster_is_refused_naming_file_line_and_field(tmp_path, rollout, errors):
    result = validate_repo(repo_with(tmp_path, rollout))
    text = "\n".join(str(d) for d in result.diagnostics)
    assert not result.ok
    for error in errors:
        assert error in text, text


def test_the_plan_rolls_the_canary_wave_then_soaks_it_before_the_rest(waved):
    model, config = waved
    plan = make_plan(model, config, State(), _nothing(model), now=NOW, source="c0ffee").plan
    kinds = [(a.kind, a.cluster or a.component) for a in plan.actions]
    starts = [i for i, (k, _) in enumerate(kinds) if k == Kind.START_WAVE]
    soaks = [i for i, (k, _) in enumerate(kinds) if k == Kind.SOAK_WAVE]
    team_a = [i for i, (_, c) in enumerate(kinds) if c == "team-a"]
    team_b = [i for i, (_, c) in enumerate(kinds) if c == "team-b"]
    assert len(starts) == len(soaks) == 2
    assert starts[0] < min(team_a) and max(team_a) < soaks[0] < starts[1] < min(team_b) and max(team_b) < soaks[1]
    canary = plan.actions[soaks[0]].payload
    assert isinstance(canary, WaveGate)
    assert (canary.wave, canary.commit, canary.soak_seconds, canary.min_success_ratio) == ("canary", "c0ffee", 120,
                                                                                         0.99)
    assert [c.cluster for c in canary.clusters] == ["team-a"]
    watched = canary.clusters[0]
    assert len(watched.api_servers) == 3 and len(watched.etcd_members) == 3 and watched.server.startswith("https://")
    assert not watched.serving  # a new cluster: its API does not answer yet, watched from the soak's start
    # a saved plan is the whole rollout
    again = Plan.from_dict(json.loads(json.dumps(plan.to_dict())))
    assert again == plan and [a.payload for a in again.actions] == [a.payload for a in plan.actions]
    text = _text(plan)
    assert "Rollout" in text and "Wave canary:" in text and "start wave canary: wave 1 of 2: team-a" in text
    assert "soak wave rest: 60s, then the next wave" in text
    assert "#### Rollout" in render_markdown(plan)


def test_without_waves_a_plan_is_as_before(waved):
    model, config = waved
    plain = dataclasses.replace(config, rollout=Rollout())
    plan = make_plan(model, plain, State(), _nothing(model), now=NOW).plan
    assert not any(a.kind in (Kind.START_WAVE, Kind.SOAK_WAVE) for a in plan.actions)
    assert all("wave" not in a and "batch" not in a for a in plan.to_dict()["actions"])
    # phase by phase across the clusters, as before waves
    first_b = next(i for i, a in enumerate(plan.actions) if a.cluster == "team-b")
    last_a = max(i for i, a in enumerate(plan.actions) if a.cluster == "team-a")
    assert first_b < last_a


def test_max_concurrent_rolls_clusters_of_a_wave_together(waved):
    model, config = waved
    together = dataclasses.replace(config, rollout=Rollout((Wave("all", None, 10, 2),)))
    plan = make_plan(model, together, State(), _nothing(model), now=NOW).plan
    assert {a.batch for a in plan.actions if a.cluster} == {0}
    assert "wave 1 of 1: team-a, team-b; applied 2 at a time, the clusters of a batch at once: team-a + team-b" in _text(
        plan)
    serial = dataclasses.replace(config, rollout=Rollout((Wave("all", None, 10, 1),)))
    plan = make_plan(model, serial, State(), _nothing(model), now=NOW).plan
    assert {(a.cluster, a.batch) for a in plan.actions if a.cluster} == {("team-a", 0), ("team-b", 1)}
    assert plan.actions[-1].kind == Kind.SOAK_WAVE and plan.actions[-1].batch == 1


def test_a_batch_of_several_clusters_is_one_step_with_a_lane_per_cluster(waved):
    """maxConcurrent 2: apply runs team-a's and team-b's actions at once, each cluster's in plan order; the wave's
    start before them and its soak after, alone. maxConcurrent 1: every action a step of its own."""
    model, config = waved
    together = dataclasses.replace(config, rollout=Rollout((Wave("all", None, 10, 2),)))
    plan = make_plan(model, together, State(), _nothing(model), now=NOW).plan
    ran = steps(plan.actions)
    assert ran[0] == [(0,)] and plan.actions[0].kind == Kind.START_WAVE
    assert ran[-1] == [(len(plan.actions) - 1,)] and plan.actions[-1].kind == Kind.SOAK_WAVE
    batch = [step for step in ran if len(step) > 1]
    assert len(batch) == 1 and len(batch[0]) == 2, ran
    lanes = {plan.actions[lane[0]].cluster: lane for lane in batch[0]}
    assert set(lanes) == {"team-a", "team-b"}
    for cluster, lane in lanes.items():
        assert list(lane) == sorted(lane) and {plan.actions[i].cluster for i in lane} == {cluster}
    assert sorted(i for step in ran for lane in step for i in lane) == list(range(len(plan.actions)))
    serial = dataclasses.replace(config, rollout=Rollout((Wave("all", None, 10, 1),)))
    plan = make_plan(model, serial, State(), _nothing(model), now=NOW).plan
    assert steps(plan.actions) == [[(i,)] for i in range(len(plan.actions))]


def _lanes_plan(clusters: tuple[str, ...], each: int) -> Plan:
    """`each` actions of every cluster, all in wave 1's batch 0, in the plan's order (phase by phase)."""
    from gitops.plan.actions import Action
    from gitops.plan.payloads import RotationStep

    return Plan(tuple(Action(Kind.ADVANCE_CA_ROTATION, "", c, "", str(n), wave=1, payload=RotationStep(c, 1, str(n)))
                      for n in range(each) for c in clusters), source="c0ffee")


def test_the_clusters_of_a_batch_apply_at_once_and_a_failure_stops_the_others_after_their_action(tmp_path,
                                                                                               monkeypatch):
    """The executor's lanes (the handler replaced: what runs is the lanes, not the actions). Each cluster's first
    action waits for the other's to start, so a serial run would time out; team-a's second action fails, and
    team-b ends after the action it has in flight, its last one not run. The apply record says which did what."""
    import datetime as dt
    import time

    import yaml

    from gitops.apply import handlers
    from gitops.apply.executor import ApplyError, Connections, execute
    from gitops.state.records import ClusterRecord
    from gitops.state.store import LocalDirStore
    from gitops.status.report import apply_document

    plan = _lanes_plan(("team-a", "team-b"), 3)
    meet = threading.Barrier(2, timeout=10)
    second_b = threading.Event()
    threads: dict[str, set[str]] = {}

    def handler(run, action, p):
        threads.setdefault(action.cluster, set()).add(threading.current_thread().name)
        if p.phase == "0":
            meet.wait()  # both clusters' first actions run at the same time
        elif p.phase == "1" and action.cluster == "team-a":
            assert second_b.wait(10)
            raise ApplyError("the second step of team-a breaks")
        elif p.phase == "1":
            second_b.set()
            time.sleep(0.5)  # in flight while team-a fails: it ends, and team-b stops there
        with run.recording():  # (saved by one thread at a time)
            pass

    monkeypatch.setitem(handlers.HANDLERS, Kind.ADVANCE_CA_ROTATION, handler)
    store = LocalDirStore(tmp_path)
    state = State(clusters={"team-a": ClusterRecord(commit="old"), "team-b": ClusterRecord(commit="old")})
    store.save(state)
    with pytest.raises(ApplyError) as failed:
        execute(plan, state, Connections(cri=lambda name: None, hosts=lambda s: None), store)
    err = failed.value
    subject = {i: (a.cluster, a.component) for i, a in enumerate(plan.actions)}
    assert sorted(subject[i] for i in err.done) == [("team-a", "0"), ("team-b", "0"), ("team-b", "1")]
    assert [subject[i] for i in err.failed] == [("team-a", "1")]
    assert "team-a/1" in str(err) and "the second step of team-a breaks" in str(err)
    assert threads["team-a"].isdisjoint(threads["team-b"]), threads  # a thread per cluster
    saved = store.load()
    assert (saved.clusters["team-a"].commit, saved.clusters["team-b"].commit) == ("c0ffee", "c0ffee")
    record = yaml.safe_load(apply_document("c0ffee", plan, err.done, err.failed, str(err), False, None, [],
                                           dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)))["status"]
    results = {(a["subject"], a["result"]) for a in record["actions"]}
    assert results == {("team-a/0", "Done"), ("team-b/0", "Done"), ("team-a/1", "Failed"), ("team-b/1", "Done"),
                       ("team-a/2", "NotRun"), ("team-b/2", "NotRun")}
    assert record["summary"]["executed"] == 3
    first = {a["subject"]: a["startedSeconds"] for a in record["actions"] if a["result"] != "NotRun"}
    assert abs(first["team-a/0"] - first["team-b/0"]) < 1.0


def test_a_rollout_stopped_during_a_soak_soaks_that_wave_again_and_no_other(waved):
    model, config = waved
    state, observed = settle(model, config)
    assert make_plan(model, config, state, observed, now=NOW, source="c0ffee").plan.empty
    state.rollout = RolloutRecord("c0ffee", [WaveRecord("canary", SOAKED), WaveRecord("rest", ROLLING)])
    for record in state.clusters.values():
        record.commit = "c0ffee"  # the rollout reached both
    plan = make_plan(model, config, state, observed, now=NOW, source="c0ffee").plan
    assert [(a.kind, a.component) for a in plan.actions] == [(Kind.SOAK_WAVE, "rest")]
    assert plan.actions[0].reason.startswith("resumed:")
    assert [c.cluster for c in plan.actions[0].payload.clusters] == ["team-b"]
    # another commit's record says nothing of this one
    assert make_plan(model, config, state, observed, now=NOW, source="beef").plan.empty


def test_a_repair_of_the_commit_a_cluster_runs_is_not_soaked_and_cannot_halt_it(waved):
    """A component restarted on a cluster that already runs the commit: ordered by wave, no start, no soak; a
    cluster the commit has not reached yet is rolled and soaked."""
    model, config = waved
    state, observed = settle(model, config)
    changed = dataclasses.replace(model, clusters={
        n: dataclasses.replace(c, api_server_args=(("v", "2"),)) for n, c in model.clusters.items()})
    state.clusters["team-a"].commit = "c0ffee"
    plan = make_plan(changed, config, state, observed, now=NOW, source="c0ffee").plan
    gates = [(a.kind, a.component) for a in plan.actions if a.kind in (Kind.START_WAVE, Kind.SOAK_WAVE)]
    assert gates == [(Kind.START_WAVE, "rest"), (Kind.SOAK_WAVE, "rest")]
    assert {a.cluster for a in plan.actions if a.wave == 1} == {"team-a"}  # still in its wave, first
    # a plan with no source commit (a directory) keeps no record: every changed cluster is soaked
    plan = make_plan(changed, config, state, observed, now=NOW).plan
    assert [a.component for a in plan.actions if a.kind == Kind.SOAK_WAVE] == ["canary", "rest"]


def test_a_halted_rollout_plans_nothing_of_the_waves_after_the_halt(waved):
    model, config = waved
    state, observed = settle(model, config)
    changed = dataclasses.replace(model, clusters={
        n: dataclasses.replace(c, api_server_args=(("v", "2"),)) for n, c in model.clusters.items()})
    state.rollout = RolloutRecord("bad", [WaveRecord("canary", HALTED, breach="success ratio 0.5 < 0.99",
                                                     breached_cluster="team-a")])
    plan = make_plan(changed, config, state, observed, now=NOW, source="bad").plan
    assert plan.actions and {a.cluster for a in plan.actions if a.cluster} == {"team-a"}
    assert any("halted at wave canary (cluster team-a: success ratio 0.5 < 0.99)" in w and "team-b left as they are"
               in w for w in plan.warnings), plan.warnings


def _nothing(model):
    from test_plan_diff import nothing_observed
    return nothing_observed(model)


def _text(plan: Plan) -> str:
    out = io.StringIO()
    render_text(plan, Console(file=out, width=400))
    return out.getvalue()


def test_apply_records_the_commit_each_cluster_runs_from_its_first_action(tmp_path):
    """A fleet may run two commits (a rollout in progress or halted): each cluster's record says which one its
    last applied plan came from, saved even when the action then fails."""
    from gitops.apply.executor import ApplyError, Connections, execute
    from gitops.plan.actions import Action
    from gitops.plan.payloads import LabelHost
    from gitops.state.records import ClusterRecord
    from gitops.state.store import LocalDirStore

    store = LocalDirStore(tmp_path)
    state = State(clusters={"team-a": ClusterRecord(commit="old"), "team-b": ClusterRecord(commit="old")})
    store.save(state)
    wrong = Action(Kind.ADVANCE_CA_ROTATION, "", "team-a", "", payload=LabelHost("host-1", (), ()))
    with pytest.raises(ApplyError):
        execute(Plan((wrong,), source="c0ffee"), state, Connections(cri=lambda name: None, hosts=lambda s: None),
                store)
    saved = store.load()
    assert (saved.clusters["team-a"].commit, saved.clusters["team-b"].commit) == ("c0ffee", "old")
    assert "commit" not in repr(saved.clusters["team-a"])  # nothing a cluster is compiled from


def test_the_ui_and_gitops_status_show_a_rollout_and_its_halt():
    """status/rollout.yaml as `gitops status` and the UI's fleet page show it (a halt with its reason; text from
    the status branch is shown, never interpreted)."""
    from gitops.cli.controller import rollout_table
    from gitops.status.report import rollout_document
    from gitops.ui.views import load_record, rollout_view

    record = RolloutRecord("bad0c0ffee00", [
        WaveRecord("canary", HALTED, "t0", "t1", {"team-a": {"requests": 244, "failed": 81, "success_ratio": 0.668,
                                                            "workers_ready_before": 2, "workers_ready_min": 1}},
                   "success ratio 0.6680 < 0.999 <script>", "team-a")])
    status = load_record(rollout_document(record))
    assert status["phase"] == "Halted" and status["halted"]["cluster"] == "team-a"
    view = rollout_view(status)
    assert view.halted == "wave canary, cluster team-a: success ratio 0.6680 < 0.999 <script>"
    assert [(r.wave, r.phase, r.cluster, r.probed, r.failed, r.success, r.workers) for r in view.rows] == [
        ("canary", "Halted", "team-a", "244", "81", "0.668", "2 -> 1")]
    out = io.StringIO()
    Console(file=out, width=200).print(rollout_table(status))
    assert "rollout of bad0c0ffee00: Halted at wave canary (cluster team-a" in out.getvalue()
    assert "244" in out.getvalue() and "2 -> 1" in out.getvalue()
    assert rollout_view(load_record(b"status: [not, a, mapping]")) is None and rollout_view({}) is None


class _KeepAlive(BaseHTTPRequestHandler):
    """HTTP/1.1 with keep-alive; records the client port of each request (one port = one connection)."""

    protocol_version = "HTTP/1.1"
    ports: list[int] = []

    def do_GET(self) -> None:  # noqa: N802 -- http.server's name
        type(self).ports.append(self.client_address[1])
        body = b'{"kind":"ConfigMap"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize("fresh", [False, True])
def test_the_wave_probe_opens_a_connection_per_request_so_a_closed_idle_one_is_no_failure(fresh: bool) -> None:
    """A restarting API server closes its idle kept-alive connections; the probe counts what a new client sees."""
    from gitops.kubeapi import KubeAPI

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _KeepAlive)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    _KeepAlive.ports = []
    try:
        with KubeAPI(f"http://127.0.0.1:{httpd.server_address[1]}", "", fresh_connections=fresh) as api:
            for _ in range(3):
                assert api.get("/api/v1/namespaces/gitops-rollout/configmaps/sentinel") == {"kind": "ConfigMap"}
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()
    assert len(set(_KeepAlive.ports)) == (3 if fresh else 1)
