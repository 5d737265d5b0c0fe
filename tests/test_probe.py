"""The API probe (`gitops.lab.probe`) against a real TLS server on loopback that demands a client
certificate: it counts requests, failures and outages, and switches kubeconfig mid-run. No lab."""
from __future__ import annotations

import http.server
import ssl
import threading
import time
from pathlib import Path

import pytest

from gitops.kubeconfig import admin_credentials
from gitops.lab.probe import Probe, target
from gitops.pki import create_ca, issue_cert
from gitops.state.records import CertRecord, ClusterRecord
from gitops.kubeconfig import admin_kubeconfig


class _Readyz(http.server.BaseHTTPRequestHandler):
    """Answers every GET with `answer` (the probe reads /api/v1/namespaces/default by default)."""

    answer = (200, b'{"kind":"Namespace"}')
    seen: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        cert = self.connection.getpeercert()  # type: ignore[attr-defined]
        _Readyz.seen.append(dict(x[0] for x in cert["subject"])["commonName"])
        status, body = _Readyz.answer
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:
        pass


def _kubeconfig(ca, cn: str, port: int, signer=None) -> str:
    """An admin kubeconfig trusting `ca` for the server, its client certificate from `signer` (or `ca`)."""
    admin = issue_cert(signer or ca, cn, organizations=("system:masters",), client=True)
    record = ClusterRecord(authorities={"cluster": CertRecord(ca.cert_pem, ca.key_pem)},
                           admin=CertRecord(admin.cert_pem, admin.key_pem))
    return admin_kubeconfig("c", record, f"https://127.0.0.1:{port}")


@pytest.fixture
def server(tmp_path: Path):
    """A TLS server on 127.0.0.1 trusting clients of two CAs (as during a CA rotation)."""
    old, new = create_ca("old-ca"), create_ca("new-ca")
    serving = issue_cert(old, "apiserver", ip_addresses=("127.0.0.1",), server=True)
    (tmp_path / "s.crt").write_text(serving.cert_pem)
    (tmp_path / "s.key").write_text(serving.key_pem)
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Readyz)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(tmp_path / "s.crt"), str(tmp_path / "s.key"))
    context.load_verify_locations(cadata=old.cert_pem + new.cert_pem)
    context.verify_mode = ssl.CERT_REQUIRED
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    _Readyz.answer, _Readyz.seen = (200, b'{"kind":"Namespace"}'), []
    try:
        yield httpd.server_address[1], old, new
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def _until(check, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_counts_requests_failures_and_outages(server):
    port, old, _ = server
    probe = Probe(_kubeconfig(old, "admin-1", port), interval=0.02)
    with probe:
        _until(lambda: probe.requests >= 5)
        assert probe.failures == 0
        _Readyz.answer = (500, b'{"kind":"Status","message":"etcdserver: leader changed"}')
        _until(lambda: probe.outages >= 2)
        _Readyz.answer = (200, b'{"kind":"Namespace"}')
        sent = probe.requests
        _until(lambda: probe.requests >= sent + 2)  # a request in flight may still see the 500
        failed = probe.failures
        _until(lambda: probe.requests >= failed + 20)
    counts = probe.stop()
    assert counts.failures == failed >= 2 and counts.outages >= 2  # none once it answers ok again
    assert counts.failures <= counts.requests and counts.seconds > 0
    assert "500 etcdserver: leader changed; retry: 500 etcdserver: leader changed" in counts.errors[0]
    assert not probe.is_alive()


def test_an_unreachable_api_fails_every_request(server):
    _, old, _ = server
    probe = Probe(_kubeconfig(old, "admin-1", 1), interval=0.02, timeout=1)  # nobody listens on port 1
    with probe:
        _until(lambda: probe.requests >= 3)
    counts = probe.counts()
    assert counts.failures == counts.requests == counts.outages >= 3
    assert "ConnectionRefusedError" in counts.errors[0]


def test_switching_kubeconfig_mid_run(server):
    port, old, new = server
    probe = Probe(_kubeconfig(old, "admin-old", port), interval=0.02)
    with probe:
        _until(lambda: "admin-old" in _Readyz.seen)
        probe.use_kubeconfig(_kubeconfig(old, "admin-new", port, signer=new))
        _until(lambda: _Readyz.seen[-1] == "admin-new")
    assert probe.failures == 0
    assert set(_Readyz.seen) == {"admin-old", "admin-new"}
    assert _Readyz.seen.index("admin-new") > _Readyz.seen.index("admin-old")


def test_a_kubeconfig_without_embedded_credentials_is_refused():
    with pytest.raises(ValueError, match="not a kubeconfig with embedded admin credentials"):
        target("apiVersion: v1\nkind: Config\nclusters: []\n")
    with pytest.raises(ValueError, match="not a kubeconfig"):
        admin_credentials(": not yaml [")


def test_readyz_must_say_ok_and_its_failed_checks_are_named(server):
    port, old, _ = server
    _Readyz.answer = (500, b"[+]ping ok\n[-]shutdown failed: reason withheld\n[+]log ok\n")
    probe = Probe(_kubeconfig(old, "admin-1", port), interval=0.02, path="/readyz")
    with probe:
        _until(lambda: probe.failures >= 1)
    assert probe.counts().errors[0].endswith("500 [-]shutdown failed: reason withheld; retry: 500 [-]shutdown "
                                              "failed: reason withheld")


def test_the_admin_tls_of_a_kubeconfig_presents_its_certificate_only_when_asked(server):
    """`gitops.lab.probe.admin_tls`, the one kubeconfig-to-TLS helper (the probe, tests and benchmarks use it):
    the server is verified with the kubeconfig's CA; a server demanding a client certificate gets the admin's,
    and refuses the context made without one."""
    import http.client

    from gitops.lab.probe import admin_tls

    port, old, _ = server
    host, got_port, context = admin_tls(_kubeconfig(old, "admin-tls", port))
    assert (host, got_port) == ("127.0.0.1", port)
    conn = http.client.HTTPSConnection(host, port, context=context, timeout=5)
    conn.request("GET", "/readyz")
    assert conn.getresponse().status == 200 and _Readyz.seen[-1] == "admin-tls"
    conn.close()
    _, _, anonymous = admin_tls(_kubeconfig(old, "admin-tls", port), with_credentials=False)
    with pytest.raises((ssl.SSLError, ConnectionError, http.client.HTTPException)):
        bare = http.client.HTTPSConnection(host, port, context=anonymous, timeout=5)
        bare.request("GET", "/readyz")
        bare.getresponse()
    with pytest.raises(ValueError, match="is not https://host:port"):
        admin_tls(_kubeconfig(old, "admin-tls", port).replace("https://", "http://"))
