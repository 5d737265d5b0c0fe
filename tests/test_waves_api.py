"""A rollout wave watched and judged against a real kube-apiserver (issue #46): `start-wave` writes the
sentinel and probes, `soak-wave` soaks, then records the wave as soaked, or halts on a breach (the sentinel gone,
fewer Ready workers, an API server not ready), each with its figures in the recorded state."""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gitops.apply import waves
from gitops.apply.executor import ApplyError, Connections, execute
from gitops.plan.actions import Action, Kind, Plan
from gitops.plan.payloads import WaveCluster, WaveGate
from gitops.state.records import HALTED, SOAKED, CertRecord, ClusterRecord, State
from gitops.state.store import LocalDirStore

from kubeapi import KubeAPI, kube_api_server
from ports import free_port

pytestmark = pytest.mark.lab("kubeapi")

SENTINEL = f"/api/v1/namespaces/{waves.NAMESPACE}/configmaps/{waves.SENTINEL}"


@pytest.fixture(scope="module")
def kube() -> Iterator[KubeAPI]:
    with kube_api_server("127.0.33.1") as api:
        yield api


def state_of(kube: KubeAPI) -> State:
    record = ClusterRecord(authorities={"cluster": CertRecord(kube.ca.cert_pem, kube.ca.key_pem)},
                           admin=CertRecord(kube.admin.cert_pem, kube.admin.key_pem))
    return State(clusters={"team-x": record})


def gate(kube: KubeAPI, soak: int, api_servers: tuple[str, ...] = (), commit: str = "c0ffee") -> WaveGate:
    return WaveGate("canary", commit, (WaveCluster("team-x", kube.url, api_servers or (kube.url,), ()),), soak, 0.999)


def run_wave(kube: KubeAPI, tmp_path: Path, payload: WaveGate, during=None) -> tuple[State, Exception | None]:
    """Execute the wave's start and soak as a plan (with `during` run in a thread once the soak began)."""
    plan = Plan((Action(Kind.START_WAVE, "", "", "", "canary", wave=1, payload=payload),
                 Action(Kind.SOAK_WAVE, "", "", "", "canary", wave=1, payload=payload)))
    store = LocalDirStore(tmp_path / "state")
    store.save(state_of(kube))
    helper = threading.Thread(target=during) if during else None
    failure = None

    def progress(index: int, total: int, action: Action, status: str) -> None:
        if helper is not None and action.kind == Kind.SOAK_WAVE and status == "start":
            helper.start()

    try:
        execute(plan, store.load(), Connections(cri=lambda name: None, hosts=lambda state: None), store,
                progress=progress)
    except ApplyError as err:
        failure = err
    finally:
        if helper is not None and helper.is_alive():
            helper.join()
    return store.load(), failure


def put_node(kube: KubeAPI, name: str, ready: bool) -> None:
    if kube.request("GET", f"/api/v1/nodes/{name}", ok=(200, 404))[0] == 404:
        kube.request("POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    _, node = kube.request("GET", f"/api/v1/nodes/{name}")
    node["status"] = {"conditions": [{"type": "Ready", "status": "True" if ready else "False", "reason": "Test",
                                      "lastHeartbeatTime": "2026-11-29T00:00:00Z",
                                      "lastTransitionTime": "2026-11-29T00:00:00Z"}]}
    kube.request("PUT", f"/api/v1/nodes/{name}/status", node)


def test_a_healthy_wave_soaks_and_records_its_figures(kube, tmp_path):
    put_node(kube, "worker-1", True)
    state, failure = run_wave(kube, tmp_path, gate(kube, 3))
    assert failure is None
    wave = state.rollout.wave("canary")
    assert (state.rollout.commit, wave.phase) == ("c0ffee", SOAKED)
    figures = wave.figures["team-x"]
    assert figures["requests"] >= 8 and figures["failed"] == 0 and figures["success_ratio"] == 1.0, figures
    assert figures["workers_ready_before"] == figures["workers_ready_min"] == 1
    _, sentinel = kube.request("GET", SENTINEL)
    assert sentinel["data"] == {"commit": "c0ffee", "wave": "canary"}


def test_objects_gone_from_the_api_halt_the_wave_naming_the_cluster_and_the_ratio(kube, tmp_path):
    def gone() -> None:
        time.sleep(0.5)
        kube.request("DELETE", SENTINEL)

    state, failure = run_wave(kube, tmp_path, gate(kube, 3, commit="bad"), during=gone)
    assert failure is not None and failure.halted is not None
    wave_name, cluster, breach = failure.halted
    assert (wave_name, cluster) == ("canary", "team-x")
    assert "success ratio" in breach and "< 0.999" in breach and "is gone" in breach, breach
    wave = state.rollout.wave("canary")
    assert (state.rollout.commit, wave.phase, wave.breached_cluster) == ("bad", HALTED, "team-x")
    assert wave.figures["team-x"]["failed"] > 0


def test_workers_going_not_ready_halt_the_wave_within_three_checks(kube, tmp_path):
    put_node(kube, "worker-1", True)

    def not_ready() -> None:
        put_node(kube, "worker-1", False)

    began = time.monotonic()
    try:
        state, failure = run_wave(kube, tmp_path, gate(kube, 60), during=not_ready)
    finally:
        put_node(kube, "worker-1", True)
    assert failure is not None and failure.halted is not None
    assert "0 Ready workers, fewer than the 1 at the wave's start, 3 checks in a row" in failure.halted[2]
    assert time.monotonic() - began < 30  # halted at once, not at the end of the 60 s soak
    assert state.rollout.halted.name == "canary"


def test_an_api_server_not_ready_halts_the_wave(kube, tmp_path):
    closed = f"https://127.0.33.1:{free_port('127.0.33.1')}"
    state, failure = run_wave(kube, tmp_path, gate(kube, 30, api_servers=(kube.url, closed)))
    assert failure is not None and failure.halted is not None
    assert f"the API server at {closed} is not ready" in failure.halted[2]


def test_a_cluster_that_cannot_be_watched_once_its_wave_ran_halts_the_wave(kube, tmp_path):
    """Its API answered at plan time no longer answers through its ingress at the soak: a breach, not a failure
    to retry (the wave's changes are made)."""
    closed = f"https://127.0.33.1:{free_port('127.0.33.1')}"
    payload = WaveGate("canary", "c0ffee", (WaveCluster("team-x", closed, (), (), serving=False),), 2, 0.999)
    state, failure = run_wave(kube, tmp_path, payload)
    assert failure is not None and failure.halted is not None
    assert failure.halted[1] == "team-x" and f"its API cannot be watched through {closed}" in failure.halted[2]
    assert state.rollout.halted.breached_cluster == "team-x"


def test_a_check_failing_at_the_end_of_a_short_soak_is_watched_until_it_breaches(kube, tmp_path):
    """soakSeconds 0: an API server down is not let through because the soak ended before three checks."""
    closed = f"https://127.0.33.1:{free_port('127.0.33.1')}"
    state, failure = run_wave(kube, tmp_path, gate(kube, 0, api_servers=(kube.url, closed)))
    assert failure is not None and failure.halted is not None
    assert f"the API server at {closed} is not ready" in failure.halted[2] and "3 checks in a row" in failure.halted[2]


def test_what_the_probe_counted_while_the_wave_rolled_survives_a_run_that_stopped(kube, tmp_path, monkeypatch):
    """The probe's counts are saved while the wave's clusters roll (here: the start, then the counts kept, as the
    executor keeps them after each action), so a run that ends there (a controller killed) loses none of them:
    the next run starts and soaks the wave again, and its ratio counts from the wave's first start."""
    from gitops.apply.run import Run

    monkeypatch.setattr(waves, "COUNTS_EVERY", 0.5)
    put_node(kube, "worker-1", True)
    payload = gate(kube, 2)
    store = LocalDirStore(tmp_path / "state")
    store.save(state_of(kube))
    connections = Connections(cri=lambda name: None, hosts=lambda state: None)
    first = Run(store.load(), connections, store)
    start = Action(Kind.START_WAVE, "", "", "", "canary", wave=1, payload=payload)
    try:
        waves.start_wave(first, start, payload)
        time.sleep(3)  # the wave's clusters rolling
        waves.keep_counts(first)
    finally:
        first.close()  # stopped there: what the probe counted after the last save is lost, as in a kill
    kept = store.load().rollout.wave("canary").figures["team-x"]
    assert kept["requests"] >= 8 and kept["failed"] == 0, kept
    plan = Plan((start, Action(Kind.SOAK_WAVE, "", "", "", "canary", wave=1, payload=payload)))
    execute(plan, store.load(), connections, store)
    wave = store.load().rollout.wave("canary")
    assert wave.phase == SOAKED
    # the soak alone (2 s, a request every 0.25 s) makes at most 9: the ratio counts the first run's too
    assert wave.figures["team-x"]["requests"] >= kept["requests"] + 4, (kept, wave.figures)
