"""The gate before a plan's first API server stop, against a real kube-apiserver: it goes on once another
API server has answered /readyz for `steady` seconds, refuses when none does while the one stopping serves
(it is left running), and goes on at once when nothing serves (there is no service to keep)."""
from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from test_waves_api import state_of

from gitops.apply import containers
from gitops.apply.executor import ApplyError, Connections
from gitops.apply.run import Run
from gitops.plan.actions import Action, Kind
from gitops.plan.payloads import ServingFirst
from gitops.state.store import LocalDirStore

from kubeapi import KubeAPI, kube_api_server
from ports import free_port

pytestmark = pytest.mark.lab("kubeapi")

IP = "127.0.33.2"
STOP = Action(Kind.RECREATE_CONTAINER, "hv-1", "team-x", "team-x-cp-1", component="kube-apiserver")


@pytest.fixture(scope="module")
def kube() -> Iterator[KubeAPI]:
    with kube_api_server(IP) as api:
        yield api


@pytest.fixture()
def run(kube, tmp_path) -> Iterator[Run]:
    store = LocalDirStore(tmp_path / "state")
    store.save(state_of(kube))
    run = Run(store.load(), Connections(cri=lambda name: None, hosts=lambda state: None), store)
    try:
        yield run
    finally:
        run.close()


def closed() -> str:
    return f"https://{IP}:{free_port(IP)}/readyz"


def test_a_serving_peer_lets_the_stop_go_after_it_served_steadily(kube, run):
    started = time.monotonic()
    containers._serving_first(run, STOP, ServingFirst(closed(), (closed(), f"{kube.url}/readyz"), 20, steady=2))
    took = time.monotonic() - started
    assert 2 <= took < 6, took


def test_no_serving_peer_while_this_one_serves_stops_the_run_with_it_left_running(kube, run):
    peer = closed()
    started = time.monotonic()
    with pytest.raises(ApplyError, match=rf"no other API server of cluster team-x served for 2s within 3s "
                                         rf"\({peer.removesuffix('/readyz')}/readyz: .*\); kube-apiserver on "
                                         r"team-x-cp-1 is left running"):
        containers._serving_first(run, STOP, ServingFirst(f"{kube.url}/readyz", (peer,), 3, steady=2))
    assert 3 <= time.monotonic() - started < 8


def test_with_nothing_serving_the_stop_goes_at_once(run):
    started = time.monotonic()
    containers._serving_first(run, STOP, ServingFirst(closed(), (closed(), closed()), 30, steady=3))
    assert time.monotonic() - started < 2
