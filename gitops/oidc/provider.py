"""The OpenID Connect provider (Authlib's OAuth 2 / OIDC server on Flask), configured from one JSON file.

Endpoints, under the issuer URL:

* `/.well-known/openid-configuration` (discovery) and `/keys` (JWKS);
* `/auth`: the authorization endpoint with its login page. Code flow only (`response_type=code`), and
  PKCE (S256) is required of every client: a code without its verifier is refused;
* `/token`: `authorization_code`, `password` (for `gitops oidc-login`, the kubectl exec plugin: kubectl
  runs it in a terminal, often on a machine with no browser; a client must be declared with the
  `password` grant to use it) and `refresh_token`;
* `/userinfo`: the claims of the bearer's access token.

Codes are single-use and live 60 s; tokens live `tokenTTL` seconds. Codes and tokens are held in memory:
a restart logs people out, as Dex's memory storage does. It serves plain HTTP on loopback; the pod's
TLS front (haproxy) sets `X-Forwarded-Proto`, which waitress trusts from loopback only.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from authlib.integrations.flask_oauth2 import AuthorizationServer
from authlib.oauth2.rfc6749 import InvalidRequestError, OAuth2Error, grants
from authlib.oauth2.rfc6749.util import list_to_scope, scope_to_list
from authlib.oauth2.rfc7636 import CodeChallenge
from authlib.oidc.core import UserInfo
from authlib.oidc.core.grants import OpenIDCode, OpenIDToken
from flask import Flask, Response, g, jsonify, render_template_string, request

from gitops.oidc.keys import KeyStore
from gitops.oidc.passwords import verify

CODE_TTL = 60
#: how long a refresh token lives (used once; each use gives a new one)
REFRESH_TTL = 24 * 3600
SCOPES = ("openid", "email", "profile", "groups", "offline_access")


@dataclass(frozen=True)
class User:
    username: str
    email: str
    password_hash: str
    groups: tuple[str, ...] = ()


@dataclass(frozen=True)
class Client:
    """A declared client: `secret_sha256` empty for a public one (a CLI), which then must use PKCE."""

    client_id: str
    redirect_uris: tuple[str, ...] = ()
    secret_sha256: str = ""
    grant_types: tuple[str, ...] = ("authorization_code", "refresh_token")
    name: str = ""

    # -- Authlib's ClientMixin
    def get_client_id(self) -> str:
        return self.client_id

    def get_default_redirect_uri(self) -> str | None:
        return self.redirect_uris[0] if len(self.redirect_uris) == 1 else None

    def get_allowed_scope(self, scope: str) -> str:
        return list_to_scope([s for s in scope_to_list(scope or "") if s in SCOPES])

    def check_redirect_uri(self, redirect_uri: str) -> bool:
        return redirect_uri in self.redirect_uris  # exact match, as OAuth 2.1 asks

    def check_client_secret(self, client_secret: str) -> bool:
        given = hashlib.sha256(client_secret.encode()).hexdigest()
        return bool(self.secret_sha256) and hmac.compare_digest(given, self.secret_sha256)

    def check_endpoint_auth_method(self, method: str, endpoint: str) -> bool:
        if endpoint != "token":
            return True
        return method == "none" if not self.secret_sha256 else method in ("client_secret_basic",
                                                                         "client_secret_post")

    def check_response_type(self, response_type: str) -> bool:
        return response_type == "code"

    def check_grant_type(self, grant_type: str) -> bool:
        return grant_type in self.grant_types


@dataclass(frozen=True)
class ProviderConfig:
    issuer: str
    users: tuple[User, ...]
    clients: tuple[Client, ...]
    token_ttl: int = 600

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProviderConfig:
        return cls(data["issuer"].rstrip("/"),
                   tuple(User(u["username"], u["email"], u["passwordHash"], tuple(u.get("groups", ())))
                         for u in data.get("users", ())),
                   tuple(Client(c["id"], tuple(c.get("redirectURIs", ())), c.get("secretSHA256", ""),
                                tuple(c.get("grantTypes", ("authorization_code", "refresh_token"))), c.get("name", ""))
                         for c in data.get("clients", ())),
                   int(data.get("tokenTTL", 600)))


@dataclass
class _Code:
    code: str
    client_id: str
    redirect_uri: str
    scope: str
    user: User
    code_challenge: str
    code_challenge_method: str
    nonce: str | None
    auth_time: int
    expires: float

    # -- Authlib's AuthorizationCodeMixin (OIDC flavour)
    def get_redirect_uri(self) -> str:
        return self.redirect_uri

    def get_scope(self) -> str:
        return self.scope

    def get_nonce(self) -> str | None:
        return self.nonce

    def get_auth_time(self) -> int:
        return self.auth_time

    def get_acr(self) -> None:
        return None

    def get_amr(self) -> None:
        return None


@dataclass
class _Token:
    client_id: str
    user: User
    scope: str
    access_token: str
    refresh_token: str | None
    expires: float
    refresh_expires: float
    #: the code its first token of the chain came from ("" without one): a replay of that code revokes them all
    family: str = ""

    # -- Authlib's TokenMixin (a refresh token's credential)
    def check_client(self, client: Client) -> bool:
        return client.client_id == self.client_id

    def get_scope(self) -> str:
        return self.scope

    def get_expires_in(self) -> int:
        return max(0, int(self.expires - time.time()))

    def is_expired(self) -> bool:
        return self.refresh_expires < time.time()

    def is_revoked(self) -> bool:
        return False

    def get_user(self) -> User:
        return self.user


@dataclass
class _Memory:
    """Codes and tokens, in memory, behind one lock (waitress serves from several threads)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    codes: dict[str, _Code] = field(default_factory=dict)
    access: dict[str, _Token] = field(default_factory=dict)
    refresh: dict[str, _Token] = field(default_factory=dict)
    #: (client, nonce) of each authorization, until the longest token it could have given expires: once only
    nonces: dict[tuple[str, str], float] = field(default_factory=dict)
    #: codes exchanged already, until the tokens they gave expire: a second use of one is a replay
    used: dict[str, float] = field(default_factory=dict)

    def sweep(self, now: float) -> None:
        self.codes = {k: v for k, v in self.codes.items() if v.expires > now}
        self.used = {k: v for k, v in self.used.items() if v > now}
        self.nonces = {k: v for k, v in self.nonces.items() if v > now}
        self.access = {k: v for k, v in self.access.items() if v.expires > now}
        self.refresh = {k: v for k, v in self.refresh.items() if v.refresh_expires > now}


LOGIN_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Log in to {{ issuer }}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>body{font-family:sans-serif;max-width:22rem;margin:4rem auto}label,input,button{display:block;width:100%;
margin:.4rem 0}.error{color:#b00}</style></head>
<body><h1>Log in</h1>
<p>to <b>{{ client }}</b>, as a user of {{ issuer }}</p>
{% if error %}<p class="error" id="error">{{ error }}</p>{% endif %}
<form method="post" action="{{ action }}">
{% for name, value in params %}<input type="hidden" name="{{ name }}" value="{{ value }}">{% endfor %}
<label for="username">Username</label>
<input id="username" name="username" value="{{ username }}" autocomplete="username" required>
<label for="password">Password</label>
<input id="password" name="password" type="password" autocomplete="current-password" required>
<button id="login" type="submit">Log in</button></form></body></html>
"""


class _PKCE(CodeChallenge):
    """PKCE with S256 of every client, public or confidential: an authorization request without it is refused
    before any login (Authlib's own check lets a confidential client go without)."""

    SUPPORTED_CODE_CHALLENGE_METHOD = ["S256"]

    def validate_code_challenge(self, grant: Any, redirect_uri: str) -> None:
        data = grant.request.payload.data
        if not data.get("code_challenge") or data.get("code_challenge_method") != "S256":
            raise InvalidRequestError("PKCE is required: code_challenge with code_challenge_method S256")
        super().validate_code_challenge(grant, redirect_uri)


def _csp(form_action: str) -> str:
    return f"default-src 'none'; style-src 'unsafe-inline'; form-action {form_action}; frame-ancestors 'none'"


def create_app(config: ProviderConfig, keys: KeyStore) -> Flask:
    """The provider as a WSGI app."""
    app = Flask("gitops.oidc")
    users = {u.username: u for u in config.users}
    clients = {c.client_id: c for c in config.clients}
    memory = _Memory()
    issuer = config.issuer

    def query_client(client_id: str) -> Client | None:
        return clients.get(client_id)

    def save_token(token: dict[str, Any], req: Any) -> None:
        now = time.time()
        code, earlier = getattr(req, "authorization_code", None), getattr(req, "credential", None)
        family = code.code if isinstance(code, _Code) else earlier.family if isinstance(earlier, _Token) else ""
        with memory.lock:
            memory.sweep(now)
            held = _Token(req.client.client_id, req.user, token.get("scope", ""), token["access_token"],
                          token.get("refresh_token"), now + token.get("expires_in", config.token_ttl),
                          now + REFRESH_TTL, family)
            memory.access[held.access_token] = held
            if held.refresh_token:
                memory.refresh[held.refresh_token] = held

    def user_info(user: User, scope: str) -> UserInfo:
        info = UserInfo(sub=user.username, preferred_username=user.username, name=user.username)
        scopes = scope_to_list(scope or "")
        if "email" in scopes:
            info.update(email=user.email, email_verified=True)
        if "groups" in scopes:
            info["groups"] = list(user.groups)
        return info

    class _Signing:
        """How ID tokens are signed and what they claim (a mixin of the OIDC extensions)."""

        def resolve_client_private_key(self, client: Client):  # noqa: ANN201 -- joserfc's key
            return g.pop("signing_key", None) or keys.signing  # the key whose kid the header names

        def get_client_algorithm(self, client: Client) -> str:
            return "RS256"

        def get_encode_header(self, client: Client) -> dict[str, str]:
            g.signing_key = keys.signing  # one key for the header and the signature, whatever rotates meanwhile
            return {"alg": "RS256", "kid": g.signing_key.kid, "typ": "JWT"}

        def get_client_claims(self, client: Client) -> dict[str, Any]:
            now = int(time.time())
            return {"iss": issuer, "aud": client.client_id, "iat": now, "exp": now + config.token_ttl}

        def generate_user_info(self, user: User, scope: str) -> UserInfo:
            return user_info(user, scope)

    class _IDCode(_Signing, OpenIDCode):
        def exists_nonce(self, nonce: str, req: Any) -> bool:
            with memory.lock:
                return (req.payload.client_id, nonce) in memory.nonces

    class _IDToken(_Signing, OpenIDToken):
        pass

    class _CodeGrant(grants.AuthorizationCodeGrant):
        TOKEN_ENDPOINT_AUTH_METHODS = ["client_secret_basic", "client_secret_post", "none"]

        def save_authorization_code(self, code: str, req: Any) -> None:
            data = req.payload.data
            with memory.lock:
                memory.sweep(time.time())
                memory.codes[code] = _Code(code, req.client.client_id, req.payload.redirect_uri, req.scope, req.user,
                                           data.get("code_challenge", ""), data.get("code_challenge_method", "plain"),
                                           data.get("nonce"), int(time.time()), time.time() + CODE_TTL)
                if data.get("nonce"):
                    memory.nonces[(req.client.client_id, data["nonce"])] = time.time() + CODE_TTL + config.token_ttl

        def query_authorization_code(self, code: str, client: Client) -> _Code | None:
            with memory.lock:  # taken out as it is read: of two requests at once with one code, one gets it
                found = memory.codes.pop(code, None)
                if found is None and code in memory.used:
                    # a replay (RFC 6749 4.1.2): what the code gave is revoked (its ID tokens, signed, live on
                    # until they expire, as every ID token does)
                    memory.access = {k: v for k, v in memory.access.items() if v.family != code}
                    memory.refresh = {k: v for k, v in memory.refresh.items() if v.family != code}
                elif found is not None:
                    memory.used[code] = time.time() + REFRESH_TTL
            if found is None or found.client_id != client.client_id or found.expires < time.time():
                return None
            return found

        def delete_authorization_code(self, authorization_code: _Code) -> None:
            with memory.lock:
                memory.codes.pop(authorization_code.code, None)

        def authenticate_user(self, authorization_code: _Code) -> User:
            return authorization_code.user

    class _PasswordGrant(grants.ResourceOwnerPasswordCredentialsGrant):
        TOKEN_ENDPOINT_AUTH_METHODS = ["client_secret_basic", "client_secret_post", "none"]

        def authenticate_user(self, username: str, password: str) -> User | None:
            user = users.get(username)
            return user if verify(user.password_hash if user else None, password) else None

    class _RefreshGrant(grants.RefreshTokenGrant):
        TOKEN_ENDPOINT_AUTH_METHODS = ["client_secret_basic", "client_secret_post", "none"]
        INCLUDE_NEW_REFRESH_TOKEN = True

        def authenticate_refresh_token(self, refresh_token: str) -> _Token | None:
            with memory.lock:  # used once, even by two requests at once
                found = memory.refresh.pop(refresh_token, None)
            return found if found is not None and found.refresh_expires > time.time() else None

        def authenticate_user(self, credential: _Token) -> User | None:
            user = users.get(credential.user.username)
            return user if user == credential.user else None  # a user changed or removed in the repo: log in again

        def revoke_old_credential(self, credential: _Token) -> None:
            with memory.lock:
                memory.refresh.pop(credential.refresh_token or "", None)
                memory.access.pop(credential.access_token, None)

    app.config["OAUTH2_TOKEN_EXPIRES_IN"] = {"authorization_code": config.token_ttl, "password": config.token_ttl,
                                             "refresh_token": config.token_ttl}
    app.config["OAUTH2_REFRESH_TOKEN_GENERATOR"] = True
    server = AuthorizationServer()
    server.init_app(app, query_client=query_client, save_token=save_token)
    server.register_grant(_CodeGrant, [_PKCE(required=True), _IDCode(require_nonce=False)])
    server.register_grant(_PasswordGrant, [_IDToken()])
    server.register_grant(_RefreshGrant, [_IDToken()])

    @app.after_request
    def _headers(response: Response) -> Response:
        response.headers["Cache-Control"] = "no-store"
        response.headers["X-Frame-Options"] = "DENY"
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers.setdefault("Content-Security-Policy", _csp("'self'"))
        response.headers["Referrer-Policy"] = "no-referrer"
        return response

    @app.get("/.well-known/openid-configuration")
    def discovery() -> Response:
        return jsonify({
            "issuer": issuer, "authorization_endpoint": f"{issuer}/auth", "token_endpoint": f"{issuer}/token",
            "jwks_uri": f"{issuer}/keys", "userinfo_endpoint": f"{issuer}/userinfo",
            "response_types_supported": ["code"], "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["RS256"], "scopes_supported": list(SCOPES),
            "grant_types_supported": ["authorization_code", "password", "refresh_token"],
            "code_challenge_methods_supported": ["S256"],
            "token_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post", "none"],
            "claims_supported": ["iss", "sub", "aud", "exp", "iat", "email", "email_verified", "groups",
                                 "preferred_username", "name", "nonce", "at_hash"]})

    @app.get("/keys")
    def jwks() -> Response:
        return jsonify(keys.jwks())

    def _login_page(grant: Any, error: str = "", status: int = 200) -> Response:
        client = clients.get(request.values.get("client_id", ""))
        params = [(k, v) for k, v in request.values.items(multi=True) if k not in ("username", "password")]
        page = render_template_string(LOGIN_PAGE, issuer=issuer, client=(client.name or client.client_id) if client
                                      else "", error=error, params=params, action=f"{issuer}/auth",
                                      username=request.values.get("username", ""))
        # a browser holds the form's redirect to the client to form-action too: the client's (validated) origin
        parts = urlsplit(grant.redirect_uri or "")
        origin = f"{parts.scheme}://{parts.netloc}" if parts.scheme in ("https", "http") and parts.netloc else ""
        return Response(page, status, mimetype="text/html",
                        headers={"Content-Security-Policy": _csp(f"'self' {origin}".strip())})

    @app.route("/auth", methods=["GET", "POST"])
    def authorize() -> Any:
        try:  # a bad client, redirect URI, response type or missing PKCE: refused before any login
            grant = server.get_consent_grant(end_user=None)
        except OAuth2Error as err:
            description = getattr(err, "description", "") or str(err)
            return Response(f"refused: {getattr(err, 'error', 'invalid_request')}: {description}\n", 400,
                            mimetype="text/plain")
        if request.method == "GET":
            return _login_page(grant)
        user = users.get(request.form.get("username", ""))
        if not verify(user.password_hash if user else None, request.form.get("password", "")):
            return _login_page(grant, "Wrong username or password.", 401)
        return server.create_authorization_response(grant_user=user, grant=grant)

    @app.post("/token")
    def token() -> Response:
        try:
            return server.create_token_response()
        except OAuth2Error as err:  # raised before Authlib's own handling (a request not over https)
            return Response(json.dumps({"error": err.error, "error_description": err.description or ""}), 400,
                            mimetype="application/json")

    @app.route("/userinfo", methods=["GET", "POST"])
    def userinfo() -> Any:
        header = request.headers.get("Authorization", "")
        bearer = header[7:] if header.lower().startswith("bearer ") else ""
        with memory.lock:
            held = memory.access.get(bearer)
        if held is None or held.expires < time.time():
            return Response(json.dumps({"error": "invalid_token"}), 401, mimetype="application/json",
                            headers={"WWW-Authenticate": 'Bearer error="invalid_token"'})
        return jsonify(dict(user_info(held.user, held.scope)))

    return app


def new_client_secret() -> tuple[str, str]:
    """(secret, its SHA-256): the secret goes age-encrypted into the repo, the hash to the provider."""
    secret = secrets.token_urlsafe(32)
    return secret, hashlib.sha256(secret.encode()).hexdigest()


def read_config(path: str) -> ProviderConfig:
    """The provider's configuration file (JSON); ValueError or KeyError when it is not one."""
    with open(path) as f:
        return ProviderConfig.from_json(json.load(f))


def make_server(config: str | ProviderConfig, key_dir: str, listen: str):  # noqa: ANN201 -- waitress's server
    """The provider on `listen` (host:port, loopback: its TLS front is the only client), trusting that front's
    X-Forwarded-Proto; `.run()` serves until `.close()`. `config`: its configuration, or the path of its file."""
    import ipaddress

    from waitress import create_server

    host, _, port = listen.rpartition(":")
    try:
        loopback = ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        loopback = False
    if not loopback:  # its TLS front is its only client, and the only one whose X-Forwarded-Proto it trusts
        raise ValueError(f"the provider listens on loopback only (an IP of 127.0.0.0/8 or ::1), not {host!r}")
    if not isinstance(config, ProviderConfig):
        config = read_config(config)
    app = create_app(config, KeyStore(key_dir, config.token_ttl))
    return create_server(app, host=host.strip("[]"), port=int(port), threads=4, ident="gitops-oidc",
                         trusted_proxy=host.strip("[]"), trusted_proxy_headers={"x-forwarded-proto"},
                         clear_untrusted_proxy_headers=True)
