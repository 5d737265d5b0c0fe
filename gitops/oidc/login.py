"""`gitops oidc-login`: kubectl's exec credential plugin for people (issue #47.3).

kubectl runs it before a request and reads an ExecCredential (client.authentication.k8s.io/v1beta1) with
the user's ID token. The token is cached under `$XDG_CACHE_HOME/gitops/oidc/` (default
`~/.cache/gitops/oidc/`, files 0600, one per issuer, client and user) and used until 30 s before it
expires; then the refresh token gets a new one; without one, the password grant logs in: the password
comes from `$GITOPS_OIDC_PASSWORD` when set (scripts), else it is asked on the terminal.
"""
from __future__ import annotations

import base64
import fcntl
import getpass
import hashlib
import json
import os
import ssl
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from gitops.errors import GitopsError

EARLY = 30  # seconds before expiry a cached token is renewed
PASSWORD_ENV = "GITOPS_OIDC_PASSWORD"


class LoginError(GitopsError):
    pass


@dataclass(frozen=True)
class Login:
    issuer_url: str
    client_id: str
    username: str
    ca_pem: str = ""  # "": the system's trust
    scope: str = "openid email groups offline_access"

    def cache_file(self) -> Path:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gitops" / "oidc"
        key = hashlib.sha256(f"{self.issuer_url}\n{self.client_id}\n{self.username}".encode()).hexdigest()[:24]
        return base / f"{key}.json"


def _claims(id_token: str) -> dict:
    """The (unverified: the API server verifies) claims of a JWT, for its expiry."""
    try:
        payload = id_token.split(".")[1]
        return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (IndexError, ValueError) as err:
        raise LoginError(f"the issuer answered a token that is not a JWT: {err}") from None


def _post(login: Login, url: str, form: dict[str, str], context: ssl.SSLContext) -> dict:
    data = urllib.parse.urlencode(form).encode()
    request = urllib.request.Request(url, data, {"Content-Type": "application/x-www-form-urlencoded",
                                                 "Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=15, context=context) as answer:
            return json.loads(answer.read())
    except urllib.error.HTTPError as err:
        try:
            said = json.loads(err.read())
            reason = f"{said.get('error')}: {said.get('error_description', '')}".rstrip(": ")
        except ValueError:
            reason = f"HTTP {err.code}"
        raise LoginError(f"{login.issuer_url} refused the login: {reason}") from None
    except (urllib.error.URLError, OSError, ValueError) as err:
        raise LoginError(f"{login.issuer_url}: no answer: {getattr(err, 'reason', err)}") from None


def _context(login: Login) -> ssl.SSLContext:
    context = ssl.create_default_context()
    if login.ca_pem:
        context = ssl.create_default_context(cadata=login.ca_pem)
    return context


def _token_endpoint(login: Login, context: ssl.SSLContext) -> str:
    url = login.issuer_url.rstrip("/") + "/.well-known/openid-configuration"
    try:
        with urllib.request.urlopen(url, timeout=15, context=context) as answer:
            found = json.loads(answer.read())
    except (urllib.error.URLError, OSError, ValueError) as err:
        raise LoginError(f"{url}: no discovery document: {getattr(err, 'reason', err)}") from None
    if found.get("issuer", "").rstrip("/") != login.issuer_url.rstrip("/"):
        raise LoginError(f"{url} names another issuer: {found.get('issuer')!r}")
    endpoint = str(found.get("token_endpoint", ""))
    mine, theirs = urllib.parse.urlsplit(login.issuer_url), urllib.parse.urlsplit(endpoint)
    if (theirs.scheme, theirs.netloc) != (mine.scheme, mine.netloc):  # the password goes to the issuer only
        raise LoginError(f"{url}: its token endpoint {endpoint!r} is not on the issuer's origin")
    return endpoint


def _password() -> str:
    if PASSWORD_ENV in os.environ:
        return os.environ[PASSWORD_ENV]
    try:
        return getpass.getpass("Password: ", stream=sys.stderr)
    except (EOFError, OSError) as err:
        raise LoginError(f"no password: set ${PASSWORD_ENV} or run where a terminal can ask ({err})") from None


def id_token(login: Login, now: float | None = None) -> tuple[str, int]:
    """(ID token, its expiry) for `login`: cached, refreshed or logged in; one process at a time per cache file
    (kubectl may run the plugin several times at once: one logs in or refreshes, the others read its token)."""
    if urllib.parse.urlsplit(login.issuer_url).scheme != "https":
        raise LoginError(f"{login.issuer_url}: an issuer is reached over https only (a password goes there)")
    path = login.cache_file()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    with open(path.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _id_token(login, path, time.time() if now is None else now)


def _id_token(login: Login, path: Path, now: float) -> tuple[str, int]:
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        cached = {}
    if cached.get("id_token") and cached.get("expiry", 0) - EARLY > now:
        return cached["id_token"], cached["expiry"]
    context = _context(login)
    endpoint = _token_endpoint(login, context)
    answer = None
    if cached.get("refresh_token"):
        try:
            answer = _post(login, endpoint, {"grant_type": "refresh_token", "refresh_token": cached["refresh_token"],
                                             "client_id": login.client_id}, context)
        except LoginError:
            answer = None  # expired or the provider restarted: log in again
    if answer is None:
        answer = _post(login, endpoint, {"grant_type": "password", "username": login.username,
                                         "password": _password(), "client_id": login.client_id,
                                         "scope": login.scope}, context)
    token = answer.get("id_token")
    if not token:
        raise LoginError(f"{login.issuer_url} answered no ID token (is `openid` among the client's scopes?)")
    expiry = int(_claims(token).get("exp", now + 60))
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=".token-")  # 0600, a name of its own
    with os.fdopen(fd, "w") as f:
        json.dump({"id_token": token, "refresh_token": answer.get("refresh_token", ""), "expiry": expiry}, f)
    os.replace(temp, path)
    return token, expiry


def exec_credential(token: str, expiry: int) -> str:
    """What kubectl reads from an exec plugin."""
    return json.dumps({"apiVersion": "client.authentication.k8s.io/v1beta1", "kind": "ExecCredential",
                       "status": {"token": token,
                                  "expirationTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(expiry))}})


def plugin_args(login: Login) -> list[str]:
    """The arguments of `gitops` that log `login` in (a kubeconfig's exec plugin)."""
    args = ["oidc-login", "--issuer-url", login.issuer_url, "--client-id", login.client_id,
            "--username", login.username]
    if login.ca_pem:
        args += ["--certificate-authority-data", base64.b64encode(login.ca_pem.encode()).decode()]
    return args
