"""etcd leadership hand-off on a real 3-member etcd over mutual TLS (issue #13): a member that leads hands
leadership to the member the plan prefers before it is replaced, and a leader about to be removed hands it
off first, so the cluster is never left without one; a member that no longer runs (a run killed while it
stopped, resumed) leads nothing and is not asked to hand anything off (issue #26)."""
from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from children import stop_all
from kubeapi import etcd_binary
from ports import free_ports

from gitops.apply.etcd import EtcdAdmin
from gitops.pki import create_ca, issue_cert

pytestmark = pytest.mark.lab("kubeapi")

IP = "127.0.32.1"
NAMES = ("m1", "m2", "m3")


@pytest.fixture
def etcd3():
    """Three members (m1..m3) on `IP`: clients over mutual TLS, peers plain (loopback only)."""
    work = Path(tempfile.mkdtemp(prefix="gitops-etcd3-"))
    procs: list[subprocess.Popen] = []
    try:
        ca = create_ca("leadership-test-etcd-ca")
        server = issue_cert(ca, "etcd", ip_addresses=[IP], server=True, client=True)
        for name, pem in (("ca.crt", ca.cert_pem), ("server.crt", server.cert_pem), ("server.key", server.key_pem)):
            (work / name).write_text(pem)
        ports = free_ports(IP, 6)
        clients, peers = ports[:3], ports[3:]
        initial = ",".join(f"{n}=http://{IP}:{p}" for n, p in zip(NAMES, peers))
        for name, client, peer in zip(NAMES, clients, peers):
            log = open(work / f"{name}.log", "w")
            procs.append(subprocess.Popen([
                str(etcd_binary()), f"--name={name}", f"--data-dir={work / name}",
                f"--listen-client-urls=https://{IP}:{client}", f"--advertise-client-urls=https://{IP}:{client}",
                f"--listen-peer-urls=http://{IP}:{peer}", f"--initial-advertise-peer-urls=http://{IP}:{peer}",
                f"--initial-cluster={initial}", "--initial-cluster-state=new", "--listen-metrics-urls=",
                f"--cert-file={work / 'server.crt'}", f"--key-file={work / 'server.key'}", "--client-cert-auth",
                f"--trusted-ca-file={work / 'ca.crt'}", "--log-level=warn"], stdout=log, stderr=log))
            log.close()
        urls = {name: f"https://{IP}:{port}" for name, port in zip(NAMES, clients)}
        with EtcdAdmin(ca, list(urls.values())) as admin:
            admin.wait_healthy(list(urls.values()), 60, "test cluster start")
            yield admin, urls, dict(zip(NAMES, procs))
    finally:
        stop_all(procs)
        shutil.rmtree(work, ignore_errors=True)


def leader(admin: EtcdAdmin) -> str:
    """The leading member's name, once every member agrees on one."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        seen = {str(admin._post("/v3/maintenance/status", {}, [url]).get("leader", "")) for url in admin.client_urls}
        if len(seen) == 1 and "0" not in seen and "" not in seen:
            return next(m.name for m in admin.members() if m.id in seen)
        time.sleep(0.2)
    raise AssertionError("the members never agreed on a leader")


def test_a_leader_hands_off_to_the_preferred_member_and_a_follower_does_nothing(etcd3):
    admin, urls, _ = etcd3
    first = leader(admin)
    target = next(n for n in reversed(NAMES) if n != first)
    other = next(n for n in NAMES if n not in (first, target))
    assert not admin.hand_off_leadership(urls[other], prefer=(urls[first],))  # a follower: nothing moves
    assert leader(admin) == first
    assert admin.hand_off_leadership(urls[first], prefer=("https://192.0.2.1:1", urls[target], urls[other]))
    assert leader(admin) == target


def test_a_leader_about_to_be_removed_hands_off_first_and_the_rest_keep_a_leader(etcd3):
    admin, urls, _ = etcd3
    going = leader(admin)
    staying = [n for n in NAMES if n != going]
    assert not admin.hand_off_from(staying[0])  # not the leader: nothing moves
    assert admin.hand_off_from(going, prefer=(urls[staying[1]],))
    assert leader(admin) == staying[1]
    assert admin.remove(going)
    admin.client_urls = [urls[n] for n in staying]  # ask only the members that stay
    admin.wait_healthy(admin.client_urls, 10, "after removing the old leader")
    assert leader(admin) == staying[1]


def test_a_member_that_no_longer_runs_hands_nothing_off_and_its_peers_keep_a_leader(etcd3):
    """A run killed while an etcd member stopped for its replacement resumes with the same gated recreate:
    the member refuses connections, so it leads nothing; the hand-off says so instead of failing the run."""
    admin, urls, procs = etcd3
    gone = leader(admin)  # the worst case: the member that stopped was leading
    procs[gone].kill()
    procs[gone].wait(10)
    staying = [n for n in NAMES if n != gone]
    admin.client_urls = [urls[n] for n in staying]
    assert not admin.hand_off_leadership(urls[gone], prefer=(urls[staying[0]],))
    admin.wait_healthy(admin.client_urls, 30, "the peers after their leader stopped")
    assert leader(admin) in staying
