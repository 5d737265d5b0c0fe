"""A write answered with an error, or not at all, may have been applied (etcd keeps the put that raises
NOSPACE though it answers an error; a member add times out after its commit): on a real etcd over mutual
TLS, each of EtcdAdmin's writes whose answer is lost after etcd applied it counts as done by what etcd
holds then, and is never sent again to another member (where it would fail: "member ID already exist",
"member not found", "can only promote a learner member"). A request that failed before it was sent (a
refused connection) still goes to the next member. Lost answers are made on the client side: the request
reaches etcd and is answered, then the client raises the timeout a slow answer raises."""
from __future__ import annotations

import json
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from children import stop_all
from kubeapi import etcd_binary
from ports import free_ports, wait_listening
from test_backup import work  # noqa: F401  (the `work` fixture)
from test_etcd_upkeep import _key, _post

from gitops.apply.etcd import EtcdAdmin
from gitops.etcdclient import client_context
from gitops.pki import CertKey, create_ca, issue_cert

pytestmark = pytest.mark.lab("etcd")

IP = "127.0.39.1"
#: a peer URL nothing listens on: a learner there never starts, which a membership change does not mind
NOWHERE = "http://127.0.39.9:1"


class Member:
    def __init__(self, proc: subprocess.Popen, client_urls: list[str], peer_url: str):
        self.proc, self.client_urls, self.peer_url = proc, client_urls, peer_url


def start_member(work: Path, ca: CertKey, name: str, initial: str = "", clients: int = 1,
                 peer: int = 0) -> Member:
    """An etcd member on IP listening for clients (mutual TLS) on `clients` URLs (several URLs of one member
    stand for several members answering alike); `initial`: the --initial-cluster of one joining an existing
    cluster (its `peer` port in it)."""
    server = issue_cert(ca, "etcd", ip_addresses=[IP], server=True, client=True)
    for file, pem in (("ca.crt", ca.cert_pem), ("server.crt", server.cert_pem), ("server.key", server.key_pem)):
        (work / file).write_text(pem)
    *client_ports, own_peer = free_ports(IP, clients + 1)
    peer_url = f"http://{IP}:{peer or own_peer}"
    urls = [f"https://{IP}:{port}" for port in client_ports]
    log = open(work / f"{name}.log", "a")
    proc = subprocess.Popen([
        str(etcd_binary()), f"--name={name}", f"--data-dir={work / name}", f"--listen-client-urls={','.join(urls)}",
        f"--advertise-client-urls={urls[0]}", f"--listen-peer-urls={peer_url}",
        f"--initial-advertise-peer-urls={peer_url}", f"--initial-cluster={initial or f'{name}={peer_url}'}",
        f"--initial-cluster-state={'existing' if initial else 'new'}", "--listen-metrics-urls=",
        f"--cert-file={work / 'server.crt'}", f"--key-file={work / 'server.key'}", "--client-cert-auth",
        f"--trusted-ca-file={work / 'ca.crt'}", "--log-level=warn"], stdout=log, stderr=log)
    log.close()
    for port in client_ports:
        wait_listening(IP, port, 30, lambda: f"etcd {name} exited" if proc.poll() is not None else None)
    return Member(proc, urls, peer_url)


@pytest.fixture
def etcd(work: Path) -> Iterator[tuple[CertKey, Member, Path]]:  # noqa: F811
    ca = create_ca("write-answers-test-etcd-ca")
    member = start_member(work, ca, "m1", clients=2)
    try:
        with EtcdAdmin(ca, member.client_urls) as admin:
            admin.wait_healthy(member.client_urls, 30, "test etcd start")
        yield ca, member, work
    finally:
        stop_all([member.proc])


class LoseAnswers:
    """urlopen, but the first `times` requests to `path` (whose body holds `body`) reach etcd and are
    answered, then raise the TimeoutError a slow answer raises (lost after etcd applied the request).
    `sent`: the URLs of every request to `path`."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, path: str, times: int = 1, body: bytes = b""):
        self.path, self.body, self.left, self.sent = path, body, times, []
        self._urlopen = urllib.request.urlopen
        monkeypatch.setattr(urllib.request, "urlopen", self)

    def __call__(self, request, *args, **kwargs):
        url = request.full_url if isinstance(request, urllib.request.Request) else request
        if not url.endswith(self.path):
            return self._urlopen(request, *args, **kwargs)
        self.sent.append(url)
        response = self._urlopen(request, *args, **kwargs)
        if self.left <= 0 or self.body not in (request.data or b""):
            return response
        self.left -= 1
        with response:
            response.read()
        raise TimeoutError("timed out")


def _leads(admin: EtcdAdmin, url: str) -> bool:
    status = admin._post("/v3/maintenance/status", {}, [url], replay=True)
    return str(status.get("leader")) == str(status["header"]["member_id"])


def _holding(admin: EtcdAdmin, peer_url: str) -> list:
    return [m for m in admin.members() if peer_url in m.peer_urls]


def test_an_add_whose_answer_is_lost_counts_as_done_and_is_not_sent_again(etcd, monkeypatch) -> None:
    ca, member, _ = etcd
    refused = f"https://{IP}:{free_ports(IP, 1)[0]}"  # nothing listens: not sent, so the next member is asked
    lost = LoseAnswers(monkeypatch, "/v3/cluster/member/add")
    with EtcdAdmin(ca, [refused, *member.client_urls]) as admin:
        admin.add(NOWHERE, learner=True)
        assert [m.learner for m in _holding(admin, NOWHERE)] == [True]
        # refused (not sent): on to the next, whose answer is lost: not sent again to the one after
        assert lost.sent == [f"{u}/v3/cluster/member/add" for u in (refused, member.client_urls[0])]
        admin.add(NOWHERE, learner=True)  # again: already there, nothing sent
        assert len(lost.sent) == 2 and len(_holding(admin, NOWHERE)) == 1


def test_an_add_refused_as_already_there_after_a_stale_read_is_success(etcd, monkeypatch) -> None:
    """The add of an earlier try was applied after its error answer, and the list read next missed it:
    etcd's own refusal of the second add ("member ID already exist" or "Peer URLs already exists") is
    checked against the member list, which then holds it."""
    ca, member, _ = etcd
    with EtcdAdmin(ca, member.client_urls) as admin:
        before = admin.members()
        code, _ = _post(client_context(ca), member.client_urls[0], "/v3/cluster/member/add",
                        {"peerURLs": [NOWHERE], "isLearner": True})
        assert code == 200
        reads = iter([before])
        real = admin.members
        monkeypatch.setattr(admin, "members", lambda: next(reads, None) or real())
        admin.add(NOWHERE, learner=True)
        assert len(_holding(admin, NOWHERE)) == 1


def test_a_remove_whose_answer_is_lost_counts_as_done_and_is_not_sent_again(etcd, monkeypatch) -> None:
    ca, member, _ = etcd
    with EtcdAdmin(ca, member.client_urls) as admin:
        admin.add(NOWHERE, learner=True)
        lost = LoseAnswers(monkeypatch, "/v3/cluster/member/remove")
        assert admin.remove("", NOWHERE) is True  # it was there when asked
        assert _holding(admin, NOWHERE) == [] and len(lost.sent) == 1
        assert admin.remove("", NOWHERE) is False  # absent from the start: nothing sent
        assert len(lost.sent) == 1


def test_a_nospace_alarm_cleared_without_an_answer_is_asked_again_and_cleared(etcd, monkeypatch) -> None:
    """Clearing an alarm again changes nothing (etcd answers success), so a lost answer goes to the next member."""
    ca, member, _ = etcd
    context = client_context(ca)
    url = member.client_urls[0]
    me = _post(context, url, "/v3/maintenance/status", {})[1]["header"]["member_id"]
    raised = _post(context, url, "/v3/maintenance/alarm", {"action": "ACTIVATE", "memberID": me, "alarm": "NOSPACE"})
    assert raised[0] == 200, raised
    put = {"key": _key("k"), "value": _key("v")}
    code, answer = _post(context, url, "/v3/kv/put", put)
    assert code != 200 and "database space exceeded" in json.dumps(answer), (code, answer)
    lost = LoseAnswers(monkeypatch, "/v3/maintenance/alarm", body=b"DEACTIVATE")
    with EtcdAdmin(ca, member.client_urls) as admin:
        assert admin.disarm("NOSPACE") == 1
    # GET, DEACTIVATE (its answer lost), DEACTIVATE again at the next URL
    assert lost.sent == [f"{u}/v3/maintenance/alarm" for u in (member.client_urls[0], *member.client_urls)]
    monkeypatch.undo()
    assert not _post(context, url, "/v3/maintenance/alarm", {"action": "GET"})[1].get("alarms")
    assert _post(context, url, "/v3/kv/put", put)[0] == 200


def test_a_promotion_and_a_leadership_move_whose_answers_are_lost_count_as_done(etcd, monkeypatch) -> None:
    ca, first, work = etcd
    urls = list(first.client_urls)
    with EtcdAdmin(ca, urls) as admin:
        peer = free_ports(IP, 1)[0]
        joining = f"http://{IP}:{peer}"
        admin.add(joining, learner=True)
        second = start_member(work, ca, "m2", initial=f"m1={first.peer_url},m2={joining}", peer=peer)
        try:
            lost = LoseAnswers(monkeypatch, "/v3/cluster/member/promote")
            with EtcdAdmin(ca, [*urls, *second.client_urls]) as both:
                both.promote(joining, timeout=60)  # retried while the learner catches up; then its answer is lost
                assert [m.learner for m in _holding(both, joining)] == [False]
                assert lost.sent and lost.left == 0
                assert not any(u.startswith(second.client_urls[0]) for u in lost.sent)  # never sent elsewhere
                both.wait_healthy([*urls, *second.client_urls], 60, "after the promotion")
                monkeypatch.undo()
                leading = next(u for u in (urls[0], second.client_urls[0]) if _leads(both, u))
                moved = LoseAnswers(monkeypatch, "/v3/maintenance/transfer-leadership")
                assert both.hand_off_leadership(leading) is True
                assert len(moved.sent) == 1
                assert not _leads(both, leading)
        finally:
            stop_all([second.proc])
