"""People log in to a real kube-apiserver through the OIDC provider (issue #47.2-4): the provider
behind a TLS front (haproxy, as in its pod), the API server with the --oidc-* flags a Cluster's
spec.apiServer.oidc becomes, and kubectl with the kubeconfig `gitops kubeconfig --oidc` writes, whose
exec plugin `gitops oidc-login` logs in with the password grant."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from joserfc import jwt
from joserfc.jwk import RSAKey

from gitops.model.resources import ApiServerOIDC
from gitops.oidc.keys import KeyStore
from gitops.kubeconfig import person_kubeconfig
from gitops.oidc.login import Login, plugin_args
from gitops.oidc.passwords import hash_password
from gitops.compile.sip_services import SERVING_CERT, provider_front_config
from gitops.oidc.provider import make_server
from gitops.pki import create_ca, issue_cert
from gitops.state.records import CertRecord, ClusterRecord

from kubeapi import KubeAPI, kube_api_server
from ports import free_ports

pytestmark = pytest.mark.lab("kubeapi")

FRONT_IP = "127.0.33.3"
API_IP = "127.0.33.2"
PASSWORD = "correct horse battery staple"
GITOPS_BIN = Path(sys.executable).parent
#: what kubectl says while the API server has not loaded the issuer's keys yet
NOT_YET_TRUSTED = ("Unauthorized", "the server doesn't have a resource type")


class Issuer:
    def __init__(self, base: Path):
        self.base = base
        # as in SIP's auth pod: the TLS front on FRONT_IP and the provider on the same port of 127.0.0.1
        port, self.callback_port = free_ports("127.0.0.1", 2)
        self.url = f"https://{FRONT_IP}:{port}"
        self.ca = create_ca("issuer-test-ca")
        serving = issue_cert(self.ca, "issuer", ip_addresses=[FRONT_IP], server=True)
        self.serving_pem = serving.cert_pem
        self.redirect = f"http://127.0.0.1:{self.callback_port}/callback"
        (base / f"{SERVING_CERT}.crt").write_text(serving.cert_pem)  # the key beside it, as the files agent puts it
        (base / f"{SERVING_CERT}.key").write_text(serving.key_pem)
        (base / f"{SERVING_CERT}.key").chmod(0o600)
        (base / "config.json").write_text(json.dumps({
            "issuer": self.url, "tokenTTL": 600,
            "users": [{"username": "alice", "email": "alice@example.com",
                       "passwordHash": hash_password(PASSWORD, rounds=4), "groups": ["tenant-viewers"]}],
            "clients": [{"id": "kubernetes", "grantTypes": ["password", "refresh_token", "authorization_code"],
                         "redirectURIs": [self.redirect], "name": "Tenant <kubectl>"}]}))
        self.keys = base / "keys"
        self.server = make_server(str(base / "config.json"), str(self.keys), f"127.0.0.1:{port}")
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        (base / "haproxy.cfg").write_text(provider_front_config(FRONT_IP, port, str(base)))
        self.haproxy = subprocess.Popen([shutil.which("haproxy") or "haproxy", "-db", "-f", str(base / "haproxy.cfg")],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)

    def stop(self) -> None:
        self.haproxy.terminate()
        self.haproxy.wait(timeout=10)
        self.server.close()
        self.thread.join(timeout=10)


@pytest.fixture(scope="module")
def world() -> Iterator[tuple[Issuer, KubeAPI, ApiServerOIDC, Path]]:
    base = Path(tempfile.mkdtemp(prefix="gitops-oidc-api-"))
    issuer = Issuer(base)
    try:
        oidc = ApiServerOIDC(issuer.url, "kubernetes", ca_bundle=issuer.ca.cert_pem)
        (base / "oidc-ca.crt").write_text(oidc.ca_bundle)
        with kube_api_server(API_IP, extra_args=oidc.flags(str(base / "oidc-ca.crt"))) as kube:
            yield issuer, kube, oidc, base
    finally:
        issuer.stop()
        shutil.rmtree(base, ignore_errors=True)


def status_with(kube: KubeAPI, token: str, path: str = "/api/v1/namespaces/default/pods") -> int:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(kube.url + path, headers={"Authorization": f"Bearer {token}"})
    context = __import__("ssl").create_default_context(cadata=kube.ca.cert_pem)
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as answer:
            return answer.status
    except urllib.error.HTTPError as err:
        return err.code


def login_env(base: Path, password: str = PASSWORD) -> dict[str, str]:
    # HOME: kubectl's discovery cache (~/.kube/cache, by host and port) stays the test's own; another run's, for a
    # server since gone that had the same port, made kubectl say "the server doesn't have a resource type"
    return {**os.environ, "HOME": str(base), "XDG_CACHE_HOME": str(base / "cache"), "GITOPS_OIDC_PASSWORD": password,
            "PATH": f"{GITOPS_BIN}:{os.environ['PATH']}"}


def test_a_person_logs_in_with_kubectl_and_rbac_decides(world):
    issuer, kube, oidc, base = world
    kubeconfig = base / "alice.kubeconfig"
    record = ClusterRecord(authorities={"cluster": CertRecord(kube.ca.cert_pem, "")})
    args = plugin_args(Login(oidc.issuer_url, oidc.client_id, "alice", oidc.ca_bundle))
    kubeconfig.write_text(person_kubeconfig("tenant", record, kube.url, "alice", args))
    env = login_env(base)

    def kubectl(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(kube.kubectl_path), "--kubeconfig", str(kubeconfig), "--request-timeout=20s",
                               *args], capture_output=True, text=True, env=env, timeout=90)

    # the API server fetches the issuer's discovery and keys in the background: a token is 401 until it has (and
    # kubectl, refused part of its discovery, says the server has no such resource type)
    deadline = time.monotonic() + 60
    while any(w in (denied := kubectl("get", "pods", "-n", "default")).stderr for w in NOT_YET_TRUSTED):
        assert time.monotonic() < deadline, denied.stderr
        time.sleep(1)
    assert denied.returncode != 0 and 'User "alice@example.com" cannot list resource "pods"' in denied.stderr, \
        denied.stderr
    # (a Role of its own: `view` is aggregated by a controller-manager, which this API server runs without)
    kube.kubectl("create", "role", "pod-reader", "-n", "default", "--verb=get,list", "--resource=pods")
    kube.kubectl("create", "rolebinding", "tenant-viewers", "-n", "default", "--role=pod-reader",
                 "--group=tenant-viewers")
    try:
        deadline = time.monotonic() + 20  # RBAC's informers take the binding in
        while (allowed := kubectl("get", "pods", "-n", "default", "-o", "name")).returncode != 0:
            assert time.monotonic() < deadline and "Forbidden" in allowed.stderr, allowed.stderr
            time.sleep(0.5)
        cached = list((base / "cache" / "gitops" / "oidc").glob("*.json"))
        assert len(cached) == 1 and cached[0].stat().st_mode & 0o777 == 0o600
        token = json.loads(cached[0].read_text())["id_token"]
        assert status_with(kube, token) == 200
        # the cached token serves the next call without a password
        again = subprocess.run(["gitops", "oidc-login", "--issuer-url", oidc.issuer_url, "--client-id", "kubernetes",
                                "--username", "alice", "--ca-file", str(base / "oidc-ca.crt")],
                               capture_output=True, text=True, env={**login_env(base, "wrong")}, timeout=60)
        assert again.returncode == 0 and json.loads(again.stdout)["status"]["token"] == token, again.stderr
    finally:
        kube.kubectl("delete", "rolebinding", "tenant-viewers", "-n", "default")
        kube.kubectl("delete", "role", "pod-reader", "-n", "default")


def test_a_wrong_password_gets_no_token(world):
    issuer, kube, oidc, base = world
    refused = subprocess.run(["gitops", "oidc-login", "--issuer-url", oidc.issuer_url, "--client-id", "kubernetes",
                              "--username", "alice", "--ca-file", str(base / "oidc-ca.crt")],
                             capture_output=True, text=True, env=login_env(base / "other", "wrong"), timeout=60)
    assert refused.returncode == 1 and "refused the login" in refused.stderr and "'password'" in refused.stderr, \
        refused.stderr
    assert "Traceback" not in refused.stderr and not refused.stdout


def test_tokens_signed_by_another_key_or_expired_are_401(world):
    issuer, kube, oidc, base = world
    store = KeyStore(issuer.keys, 600)
    now = int(time.time())
    claims = {"iss": issuer.url, "aud": "kubernetes", "sub": "alice", "email": "alice@example.com",
              "email_verified": True, "groups": ["nobody"], "iat": now, "exp": now + 300}
    header = {"alg": "RS256", "kid": store.signing.kid}
    good = jwt.encode(header, claims, store.signing)
    assert status_with(kube, good) == 403  # signed by the provider's key: authenticated (alice may not list pods)
    impostor = RSAKey.generate_key(2048, parameters={"kid": store.signing.kid}, private=True)
    assert status_with(kube, jwt.encode(header, claims, impostor)) == 401
    expired = {**claims, "iat": now - 1200, "exp": now - 600}
    assert status_with(kube, jwt.encode(header, expired, store.signing)) == 401
    other_audience = {**claims, "aud": "someone-else"}
    assert status_with(kube, jwt.encode(header, other_audience, store.signing)) == 401


def test_a_person_logs_in_through_the_login_page_in_chromium(world):
    """The code flow with PKCE in a real browser: the login page, a wrong password refused on it, then the
    declared password; the code comes back to the client's redirect URI, and its ID token is one the API
    server accepts (403: authenticated, no RBAC for it)."""
    import base64
    import hashlib
    import http.server
    import secrets
    import ssl
    import urllib.parse
    import urllib.request

    from browser import chromium
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    issuer, kube, oidc, base = world
    came_back: list[str] = []

    class Callback(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 -- http.server's name
            came_back.append(self.path)
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(b"<title>back</title>logged in")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", issuer.callback_port), Callback)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    query = {"response_type": "code", "client_id": "kubernetes", "redirect_uri": issuer.redirect,
             "scope": "openid email groups", "state": secrets.token_hex(8), "nonce": secrets.token_hex(8),
             "code_challenge": challenge, "code_challenge_method": "S256"}
    # Chromium trusts exactly the front's certificate (its public key pinned), nothing else
    spki = x509.load_pem_x509_certificate(issuer.serving_pem.encode()).public_key().public_bytes(
        Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
    pin = base64.b64encode(hashlib.sha256(spki).digest()).decode()
    try:
        with chromium(f"--ignore-certificate-errors-spki-list={pin}") as driver:
            driver.get(f"{issuer.url}/auth?{urllib.parse.urlencode(query)}")
            assert "Tenant &lt;kubectl&gt;" in driver.page_source  # the client's name, escaped
            driver.find_element(By.ID, "username").send_keys("alice")
            driver.find_element(By.ID, "password").send_keys("not the password")
            driver.find_element(By.ID, "login").click()
            WebDriverWait(driver, 20).until(lambda d: d.find_elements(By.ID, "error"))
            assert driver.find_element(By.ID, "error").text == "Wrong username or password." and not came_back
            driver.find_element(By.ID, "password").send_keys(PASSWORD)
            driver.find_element(By.ID, "login").click()
            WebDriverWait(driver, 20).until(lambda d: came_back)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
    back = urllib.parse.parse_qs(urllib.parse.urlsplit(came_back[0]).query)
    assert back["state"] == [query["state"]]
    form = urllib.parse.urlencode({"grant_type": "authorization_code", "code": back["code"][0],
                                   "redirect_uri": issuer.redirect, "client_id": "kubernetes",
                                   "code_verifier": verifier}).encode()
    context = ssl.create_default_context(cadata=issuer.ca.cert_pem)
    with urllib.request.urlopen(urllib.request.Request(f"{issuer.url}/token", form), timeout=10,
                                context=context) as answer:
        token = json.loads(answer.read())["id_token"]
    claims = json.loads(base64.urlsafe_b64decode(token.split(".")[1] + "=="))
    assert (claims["email"], claims["nonce"], claims["aud"]) == ("alice@example.com", query["nonce"], "kubernetes")
    assert status_with(kube, token) == 403  # authenticated as alice@example.com; RBAC grants her nothing here


def test_the_front_answers_429_past_30_password_checks_a_minute_from_one_address(world):
    """The pod's TLS front (haproxy's stick table) limits password checks per client address; another address is
    not limited by it."""
    import http.client
    import ssl

    issuer = world[0]
    host, port = FRONT_IP, int(issuer.url.rsplit(":", 1)[1])
    context = ssl.create_default_context(cadata=issuer.ca.cert_pem)

    def token_request(source: str) -> int:
        conn = http.client.HTTPSConnection(host, port, timeout=20, context=context, source_address=(source, 0))
        try:
            conn.request("POST", "/token", "grant_type=password&username=alice&password=wrong&client_id=kubernetes",
                         {"Content-Type": "application/x-www-form-urlencoded"})
            return conn.getresponse().status
        finally:
            conn.close()

    answers = [token_request("127.0.33.4") for _ in range(32)]  # an address no other test sends from
    assert answers[:30] == [400] * 30 and answers[30:] == [429, 429], answers
    assert token_request("127.0.33.5") == 400
