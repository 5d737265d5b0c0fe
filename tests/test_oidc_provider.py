"""The OpenID Connect provider of SIP's `services.auth` (issue #47), served by waitress over real HTTP: its
flows, and what it refuses. (Its TLS front and the API server that trusts it: tests/test_oidc_api.py.)"""
from __future__ import annotations

import base64
import hashlib
import json
import secrets
import threading
import time
from urllib.parse import parse_qs, urlsplit

import pytest
from pathlib import Path
import requests
from joserfc import jwt
from joserfc.errors import BadSignatureError
from joserfc.jwk import KeySet, RSAKey

from gitops.oidc.keys import KeyStore
from gitops.oidc.passwords import hash_password, is_hash, verify
from gitops.oidc.provider import make_server, new_client_secret

ISSUER = "https://auth.example.test:8443"
REDIRECT = "http://127.0.0.1:18000/callback"
HEADERS = {"X-Forwarded-Proto": "https"}  # as the pod's TLS front sets it
SECRET, SECRET_SHA = new_client_secret()


@pytest.fixture(scope="module")
def provider(tmp_path_factory):
    base = tmp_path_factory.mktemp("oidc")
    config = {"issuer": ISSUER, "tokenTTL": 300,
              "users": [{"username": "alice", "email": "alice@example.com",
                         "passwordHash": hash_password("wonder", rounds=4), "groups": ["devs", "ops"]},
                        {"username": "<b>bob</b>", "email": "bob@example.com",
                         "passwordHash": hash_password("x", rounds=4)}],
              "clients": [{"id": "kubernetes", "redirectURIs": [REDIRECT],
                           "grantTypes": ["authorization_code", "password", "refresh_token"]},
                          {"id": "web", "name": "<script>alert(1)</script>", "redirectURIs": [REDIRECT],
                           "secretSHA256": SECRET_SHA}]}
    (base / "config.json").write_text(json.dumps(config))
    server = make_server(str(base / "config.json"), str(base / "keys"), "127.0.0.1:0")
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.effective_port}", base / "keys"
    finally:
        server.close()
        thread.join(timeout=10)


def post(base: str, path: str, **kw):
    return requests.post(base + path, headers={**HEADERS, **kw.pop("headers", {})}, timeout=10, **kw)


def get(base: str, path: str, **kw):
    return requests.get(base + path, headers={**HEADERS, **kw.pop("headers", {})}, timeout=10, **kw)


def claims_of(base: str, id_token: str) -> dict:
    keys = KeySet.import_key_set(get(base, "/keys").json())
    return jwt.decode(id_token, keys, algorithms=["RS256"]).claims


def pkce() -> tuple[str, str]:
    verifier = secrets.token_urlsafe(48)
    return verifier, base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()


def authorize(base: str, client: str = "kubernetes", **extra) -> dict:
    verifier, challenge = pkce()
    query = {"response_type": "code", "client_id": client, "redirect_uri": REDIRECT, "scope": "openid email groups",
             "state": "s-1", "code_challenge": challenge, "code_challenge_method": "S256",
             "nonce": secrets.token_hex(8), **extra}
    return {"query": {k: v for k, v in query.items() if v is not None}, "verifier": verifier}


def login(base: str, query: dict, username: str = "alice", password: str = "wonder"):
    return post(base, "/auth", data={**query, "username": username, "password": password}, allow_redirects=False)


def test_discovery_and_keys_name_the_issuer_and_its_endpoints(provider):
    base, _ = provider
    found = get(base, "/.well-known/openid-configuration").json()
    assert found["issuer"] == ISSUER and found["jwks_uri"] == f"{ISSUER}/keys"
    assert found["token_endpoint"] == f"{ISSUER}/token" and found["code_challenge_methods_supported"] == ["S256"]
    keys = get(base, "/keys").json()["keys"]
    assert keys and all(k["kty"] == "RSA" and "d" not in k and k["kid"] for k in keys)


def test_the_password_grant_issues_an_id_token_signed_by_the_published_key(provider):
    base, _ = provider
    answer = post(base, "/token", data={"grant_type": "password", "username": "alice", "password": "wonder",
                                         "client_id": "kubernetes", "scope": "openid email groups offline_access"})
    assert answer.status_code == 200, answer.text
    token = answer.json()
    claims = claims_of(base, token["id_token"])
    assert (claims["iss"], claims["aud"], claims["sub"], claims["email"]) == (ISSUER, "kubernetes", "alice",
                                                                              "alice@example.com")
    assert claims["groups"] == ["devs", "ops"] and 0 < claims["exp"] - time.time() <= 300
    info = get(base, "/userinfo", headers={"Authorization": f"Bearer {token['access_token']}"}).json()
    assert info["email"] == "alice@example.com" and info["groups"] == ["devs", "ops"]
    refreshed = post(base, "/token", data={"grant_type": "refresh_token", "refresh_token": token["refresh_token"],
                                            "client_id": "kubernetes"})
    assert refreshed.status_code == 200 and claims_of(base, refreshed.json()["id_token"])["sub"] == "alice"
    again = post(base, "/token", data={"grant_type": "refresh_token", "refresh_token": token["refresh_token"],
                                        "client_id": "kubernetes"})
    assert again.status_code == 400  # a refresh token is used once


def test_the_code_flow_with_pkce_logs_a_user_in_through_the_login_page(provider):
    base, _ = provider
    flow = authorize(base, nonce="n-1")
    page = get(base, "/auth", params=flow["query"])
    assert page.status_code == 200 and 'name="password"' in page.text
    answer = login(base, flow["query"])
    assert answer.status_code == 302, answer.text
    back = parse_qs(urlsplit(answer.headers["Location"]).query)
    assert answer.headers["Location"].startswith(REDIRECT) and back["state"] == ["s-1"]
    token = post(base, "/token", data={"grant_type": "authorization_code", "code": back["code"][0],
                                        "redirect_uri": REDIRECT, "client_id": "kubernetes",
                                        "code_verifier": flow["verifier"]})
    assert token.status_code == 200, token.text
    claims = claims_of(base, token.json()["id_token"])
    assert claims["nonce"] == "n-1" and claims["sub"] == "alice"
    again = login(base, authorize(base, nonce="n-1")["query"])  # a nonce is used once
    assert again.status_code == 400 and "Location" not in again.headers, again.text
    bearer = {"Authorization": f"Bearer {token.json()['access_token']}"}
    assert get(base, "/userinfo", headers=bearer).status_code == 200
    replayed = post(base, "/token", data={"grant_type": "authorization_code", "code": back["code"][0],
                                           "redirect_uri": REDIRECT, "client_id": "kubernetes",
                                           "code_verifier": flow["verifier"]})
    assert replayed.status_code == 400 and replayed.json()["error"] == "invalid_grant"
    # the replay revokes what the code gave (RFC 6749 4.1.2): its access token and its refresh token
    assert get(base, "/userinfo", headers=bearer).status_code == 401
    refreshed = post(base, "/token", data={"grant_type": "refresh_token", "client_id": "kubernetes",
                                            "refresh_token": token.json()["refresh_token"]})
    assert refreshed.status_code == 400


def test_a_confidential_client_needs_its_secret(provider):
    base, _ = provider
    flow = authorize(base, client="web")
    code = parse_qs(urlsplit(login(base, flow["query"]).headers["Location"]).query)["code"][0]
    data = {"grant_type": "authorization_code", "code": code, "redirect_uri": REDIRECT,
            "code_verifier": flow["verifier"]}
    assert post(base, "/token", data=data, auth=("web", "wrong")).status_code == 401
    assert post(base, "/token", data=data, auth=("web", SECRET)).status_code == 200


@pytest.mark.parametrize("case", ["wrong password", "unknown user", "unknown client", "bad redirect URI",
                                  "no PKCE", "no verifier", "wrong verifier", "implicit flow"])
def test_each_bad_request_is_refused(provider, case):
    base, _ = provider
    if case in ("wrong password", "unknown user"):
        user = "alice" if case == "wrong password" else "mallory"
        token = post(base, "/token", data={"grant_type": "password", "username": user, "password": "nope",
                                            "client_id": "kubernetes", "scope": "openid"})
        assert token.status_code == 400 and "id_token" not in token.text
        page = login(base, authorize(base)["query"], user, "nope")
        assert page.status_code == 401 and "Wrong username or password." in page.text
        assert "Location" not in page.headers
        return
    if case in ("unknown client", "bad redirect URI", "no PKCE", "implicit flow"):
        extra = {"unknown client": {"client_id": "nobody"}, "bad redirect URI": {"redirect_uri": "https://evil.test/"},
                 "no PKCE": {"code_challenge": None, "code_challenge_method": None},
                 "implicit flow": {"response_type": "token"}}[case]
        flow = authorize(base, **extra)
        for answer in (get(base, "/auth", params=flow["query"]), login(base, flow["query"])):
            assert answer.status_code == 400 and "refused" in answer.text, answer.text
            assert "Location" not in answer.headers
        return
    flow = authorize(base)
    code = parse_qs(urlsplit(login(base, flow["query"]).headers["Location"]).query)["code"][0]
    data = {"grant_type": "authorization_code", "code": code, "redirect_uri": REDIRECT, "client_id": "kubernetes"}
    if case == "wrong verifier":
        data["code_verifier"] = pkce()[0]
    answer = post(base, "/token", data=data)
    assert answer.status_code == 400 and "id_token" not in answer.text, answer.text


def test_the_login_page_escapes_what_it_shows(provider):
    base, _ = provider
    flow = authorize(base, client="web", state='"><script>alert(2)</script>')
    page = get(base, "/auth", params=flow["query"])
    assert page.status_code == 200
    assert "<script>" not in page.text and "&lt;script&gt;alert(1)&lt;/script&gt;" in page.text
    refused = login(base, flow["query"], "<b>bob</b>", "wrong")
    assert "<b>bob</b>" not in refused.text and "&lt;b&gt;bob&lt;/b&gt;" in refused.text
    csp = page.headers["Content-Security-Policy"]
    # the form posts to the provider, whose answer redirects to the client: a browser holds both to form-action
    assert "frame-ancestors 'none'" in csp and "form-action 'self' http://127.0.0.1:18000;" in csp, csp


def test_keys_are_born_on_first_start_and_a_rotated_key_stays_published_until_its_tokens_expire(tmp_path):
    store = KeyStore(tmp_path, token_ttl=300)
    first = store.signing.kid
    assert (tmp_path / f"{first}.pem").stat().st_mode & 0o777 == 0o600
    assert KeyStore(tmp_path, token_ttl=300).signing.kid == first  # kept across restarts
    now = time.time()
    second = store.rotate(now)
    assert store.signing.kid == second
    assert {k["kid"] for k in store.jwks(now + 299)["keys"]} == {first, second}
    assert {k["kid"] for k in store.jwks(now + 301)["keys"]} == {second}
    store.rotate(now + 400)  # the first key, expired, is forgotten
    assert not (tmp_path / f"{first}.pem").exists()


def test_a_token_checked_against_another_key_does_not_verify(provider):
    base, _ = provider
    token = post(base, "/token", data={"grant_type": "password", "username": "alice", "password": "wonder",
                                        "client_id": "kubernetes", "scope": "openid"}).json()["id_token"]
    kid = json.loads(base64.urlsafe_b64decode(token.split(".")[0] + "=="))["kid"]
    impostor = RSAKey.generate_key(2048, parameters={"kid": kid, "use": "sig", "alg": "RS256"}, private=True)
    with pytest.raises(BadSignatureError):  # the same kid, another key
        jwt.decode(token, KeySet([impostor]), algorithms=["RS256"])
    assert claims_of(base, token)["sub"] == "alice"


def test_password_hashes_bcrypt_or_argon2id_only():
    from argon2 import PasswordHasher

    hashed = hash_password("pw", rounds=4)
    argon = PasswordHasher().hash("pw")
    assert is_hash(hashed) and is_hash(argon) and not is_hash("pw") and not is_hash("$1$abc$def")
    assert verify(hashed, "pw") and verify(argon, "pw")
    assert not verify(hashed, "PW") and not verify(argon, "PW") and not verify(None, "pw")
    assert not verify("pw", "pw")  # a plaintext "hash" never matches


def test_gitops_kubeconfig_oidc_prints_a_persons_kubeconfig_with_the_login_plugin(tmp_path):
    """`gitops kubeconfig --oidc USER`: the cluster's server and CA, and the exec plugin with the Cluster's
    spec.apiServer.oidc; a cluster that trusts no issuer is an error that says so."""
    import shutil as sh

    import yaml
    from click.testing import CliRunner
    from test_plan_diff import settle

    from gitops.cli import cli as main
    from gitops.model.validate import validate_repo
    from gitops.state.store import LocalDirStore

    repo = tmp_path / "repo"
    sh.copytree(Path(__file__).resolve().parents[1] / "gitops" / "example_repo", repo)
    path = repo / "clusters/team-a/cluster.yaml"
    text = path.read_text()
    assert "\n  apiServer:\n" in text
    path.write_text(text.replace("\n  apiServer:\n", "\n  apiServer:\n    oidc:\n"
                                 "      issuerURL: https://auth.example.test:8443\n      clientID: kubernetes\n", 1))
    result = validate_repo(repo)
    assert not result.diagnostics, [str(d) for d in result.diagnostics]
    state, _ = settle(result.model)
    LocalDirStore(tmp_path / "state").save(state)
    runner = CliRunner()
    done = runner.invoke(main, ["kubeconfig", str(repo), "--state-dir", str(tmp_path / "state"), "--cluster", "team-a",
                                "--oidc", "alice"])
    assert done.exit_code == 0, done.output
    config = yaml.safe_load(done.output)
    user = config["users"][0]["user"]
    assert "client-key-data" not in user and user["exec"]["command"] == "gitops"
    assert user["exec"]["args"] == ["oidc-login", "--issuer-url", "https://auth.example.test:8443", "--client-id",
                                    "kubernetes", "--username", "alice"]
    admin = yaml.safe_load(runner.invoke(main, ["kubeconfig", str(repo), "--state-dir", str(tmp_path / "state"),
                                                "--cluster", "team-a"]).output)
    assert config["clusters"][0]["cluster"] == admin["clusters"][0]["cluster"]
    refused = runner.invoke(main, ["kubeconfig", str(repo), "--state-dir", str(tmp_path / "state"), "--cluster",
                                   "team-b", "--oidc", "alice"])
    assert refused.exit_code == 1 and "Cluster team-b trusts no OIDC issuer" in refused.output


def test_the_provider_listens_on_loopback_only(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"issuer": ISSUER}))
    with pytest.raises(ValueError, match="loopback only"):
        make_server(str(tmp_path / "config.json"), str(tmp_path / "keys"), "0.0.0.0:5556")


def test_a_password_past_bcrypts_72_bytes_is_refused_alike_for_known_and_unknown_users(provider):
    base, _ = provider
    answers = [post(base, "/token", data={"grant_type": "password", "username": user, "password": "p" * 100,
                                           "client_id": "kubernetes", "scope": "openid"}).status_code
               for user in ("alice", "mallory")]
    assert answers == [400, 400], answers  # no 500 that would tell the two apart


def test_a_code_exchanged_twice_at_once_gives_one_token(provider):
    base, _ = provider
    flow = authorize(base)
    code = parse_qs(urlsplit(login(base, flow["query"]).headers["Location"]).query)["code"][0]
    data = {"grant_type": "authorization_code", "code": code, "redirect_uri": REDIRECT, "client_id": "kubernetes",
            "code_verifier": flow["verifier"]}
    statuses: list[int] = []
    threads = [threading.Thread(target=lambda: statuses.append(post(base, "/token", data=data).status_code))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(statuses) == [200, 400, 400, 400], statuses


def test_retired_keys_are_kept_for_the_longest_token_lifetime_a_provider_gave(tmp_path):
    KeyStore(tmp_path, token_ttl=86400)  # the provider: day-long tokens
    rotating = KeyStore(tmp_path, token_ttl=600)  # `gitops oidc rotate-keys` with its default
    first = rotating.signing.kid
    now = time.time()
    rotating.rotate(now)
    rotating.rotate(now + 3600)  # an hour later: the first key's tokens may still be valid
    assert first in {k["kid"] for k in rotating.jwks(now + 3600)["keys"]}
    assert (tmp_path / f"{first}.pem").exists()


def test_the_login_sends_a_password_over_https_only(tmp_path, monkeypatch):
    from gitops.oidc.login import Login, LoginError, id_token

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with pytest.raises(LoginError, match="over https only"):
        id_token(Login("http://auth.example.test", "kubernetes", "alice"))
