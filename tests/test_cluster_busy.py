"""A cluster whose API servers all answer "not now" at once (a moment without an etcd leader: an election under
load answers 5xx from every API server of the cluster) is asked again once before the plan calls its API
unknown; one that refuses or does not answer is not. The API servers here are a TLS stand-in on loopback that
demands a client certificate: a real kube-apiserver cannot be made to answer 503 on cue. No lab."""
from __future__ import annotations

import http.server
import json
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gitops.observe import clusters
from gitops.observe.clusters import BUSY_RETRY, ClusterReader, observe_clusters
from gitops.observe.types import ClusterTarget
from gitops.pki import create_ca, issue_cert


class _API(http.server.BaseHTTPRequestHandler):
    """Answers each GET with the next of `answers` (status, message), then an empty list."""

    answers: list[tuple[int, str]] = []
    seen: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        _API.seen.append(self.path)
        status, message = _API.answers.pop(0) if _API.answers else (200, "")
        body = json.dumps({"kind": "Status", "message": message} if status != 200 else {"items": []}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def target(tmp_path: Path) -> Iterator[ClusterTarget]:
    """Two API servers of one cluster (both the stand-in), and the admin's credentials."""
    ca = create_ca("cluster-ca")
    serving = issue_cert(ca, "kube-apiserver", ip_addresses=("127.0.0.1",), server=True)
    admin = issue_cert(ca, "admin", organizations=("system:masters",), client=True)
    (tmp_path / "s.crt").write_text(serving.cert_pem)
    (tmp_path / "s.key").write_text(serving.key_pem)
    servers = []
    for _ in range(2):
        httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _API)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(tmp_path / "s.crt"), str(tmp_path / "s.key"))
        context.load_verify_locations(cadata=ca.cert_pem)
        context.verify_mode = ssl.CERT_REQUIRED
        httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
        thread = threading.Thread(target=httpd.serve_forever, daemon=True)
        thread.start()
        servers.append((httpd, thread))
    _API.answers, _API.seen = [], []
    try:
        yield ClusterTarget("team-a", tuple(f"https://127.0.0.1:{h.server_address[1]}" for h, _ in servers),
                            ca.cert_pem, admin.cert_pem, admin.key_pem)
    finally:
        for httpd, thread in servers:
            httpd.shutdown()
            httpd.server_close()
            thread.join()


LEADER_CHANGED = (500, "etcdserver: leader changed")


@pytest.mark.parametrize("reader", ["plan", "controller"])
def test_a_cluster_whose_api_servers_are_all_busy_is_asked_again_once(target: ClusterTarget, reader: str) -> None:
    _API.answers = [LEADER_CHANGED, (503, "the server is currently unable to handle the request")]
    began = time.monotonic()
    if reader == "plan":
        found = observe_clusters([target])
    else:
        kept = ClusterReader(objects_interval=60)
        found = kept.observe([target])
        kept.close()
    observed = found["team-a"]
    assert observed.reachable, observed.error
    assert time.monotonic() - began >= BUSY_RETRY
    assert _API.answers == [] and len(_API.seen) > 2  # both servers busy, then the whole read again


def test_busy_twice_is_unknown_and_names_why(target: ClusterTarget) -> None:
    _API.answers = [LEADER_CHANGED] * 4
    observed = observe_clusters([target])["team-a"]
    assert not observed.reachable and "etcdserver: leader changed" in observed.error
    assert len(_API.seen) == 4  # each server once, then once more: never a third time


def test_a_refusal_is_not_asked_again(target: ClusterTarget, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clusters, "BUSY_RETRY", 30.0)  # (asking again would show as a 30 s wait)
    _API.answers = [(403, "forbidden"), (403, "forbidden")]
    began = time.monotonic()
    observed = observe_clusters([target])["team-a"]
    assert not observed.reachable and "403 forbidden" in observed.error
    assert len(_API.seen) == 2 and time.monotonic() - began < 10
