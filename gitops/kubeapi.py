"""A Kubernetes API connection through the official `kubernetes` client: from PEM strings, or from a kubeconfig.

The client's TLS layer reads credentials from file paths; given as PEM strings they
are anonymous in-memory files (`memfd_create`), so a cluster's admin key or CA
never touches the disk. A kubeconfig (a management cluster's: client certificates,
tokens, `tokenFile`, exec plugins) is read by the official loader (`from_kubeconfig`).
Requests are plain JSON (`get`, `list`, `create`, `apply`, `delete`, `request`):
gitops manages a handful of well-known objects and has no use for the generated model classes.
"""
from __future__ import annotations

import binascii
import contextlib
import json
import logging
import os
import re
import ssl
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

import yaml

from gitops.errors import GitopsError

if TYPE_CHECKING:  # the client is imported when an API is used: it costs ~0.3 s
    from kubernetes.client import Configuration


_IMPORT = threading.Lock()
#: held while the official kubeconfig loader runs and its temporary files move to memory
_LOADER = threading.Lock()


MERGE_PATCH = "application/merge-patch+json"


class KubeAPIError(GitopsError):
    """A request failed: `status` is the HTTP status (0: no answer, or an unusable kubeconfig);
    `details` the API's own message, or why there was no answer."""

    def __init__(self, message: str, status: int = 0, details: str = ""):
        super().__init__(message)
        self.status = status
        self.details = details


class MemoryFiles:
    """Key material for libraries that read it only from file paths (the client's TLS layer, Python's
    `ssl`): anonymous in-memory files (`memfd_create`), open until `close`, so no key touches the disk."""

    def __init__(self) -> None:
        self._fds: list[int] = []

    def add(self, name: str, text: str) -> str:
        """A path this process reads `text` at (`name` labels the file in /proc)."""
        fd = os.memfd_create(f"gitops-{name}", os.MFD_CLOEXEC)
        self._fds.append(fd)
        os.write(fd, text.encode())
        return f"/proc/{os.getpid()}/fd/{fd}"

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds = []

    def __enter__(self) -> "MemoryFiles":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class Credentials:
    """Who talks to the API: a client certificate, a bearer token, or nobody (anonymous)."""

    cert_pem: str = ""
    key_pem: str = ""
    token: str = ""

    def __repr__(self) -> str:  # never print a key or a token
        return "Credentials(<certificate>)" if self.cert_pem else ("Credentials(<token>)" if self.token
                                                                    else "Credentials(anonymous)")


class KubeAPI:
    """One API server: `server` is https://host:port; `ca_pem` empty = do not verify (discovery only)."""

    def __init__(self, server: str, ca_pem: str, credentials: Credentials = Credentials(), *,
                 timeout: float = 10.0, fresh_connections: bool = False):
        with _IMPORT:  # ~0.3 s, only when an API is used; threads importing it at once deadlock
            from kubernetes.client import Configuration

        self._files = MemoryFiles()
        config = Configuration()
        config.host = server
        if ca_pem:
            config.ssl_ca_cert = self._files.add("ca", ca_pem)
        else:
            config.verify_ssl = False
        if credentials.cert_pem:
            config.cert_file = self._files.add("cert", credentials.cert_pem)
            config.key_file = self._files.add("key", credentials.key_pem)
        if credentials.token:
            config.api_key = {"BearerToken": f"Bearer {credentials.token}"}
        self._open(config, timeout)
        if fresh_connections:
            # each request on a new connection (`Connection: close`), as a new client would: a server that closes
            # an idle kept-alive connection while it shuts down gracefully is not a failed request (client-go
            # replays an idempotent request in that case; a probe that reused the connection would count it)
            self._headers["Connection"] = "close"
            self._fresh = True

    @classmethod
    def from_kubeconfig(cls, path: str | os.PathLike[str], context: str | None = None, *,
                        timeout: float = 10.0) -> KubeAPI:
        """The API of `context` (default: current-context) of the kubeconfig at `path`.

        The official loader reads it: certificate-authority(-data), insecure-skip-tls-verify,
        client certificates, token/tokenFile, exec and auth-provider plugins; relative file
        paths are relative to the kubeconfig. It is never written back. KubeAPIError (one
        line, naming `path`) when it is unusable.
        """
        api = cls.__new__(cls)
        api._files = MemoryFiles()
        try:
            api._open(load_kubeconfig(path, context, api._files), timeout)
        except BaseException:
            api._files.close()
            raise
        return api

    def _open(self, config: Configuration, timeout: float) -> None:
        from kubernetes.client import ApiClient

        config.host = config.host.rstrip("/")
        config.retries = False  # urllib3: no silent reconnect loops; callers retry
        self.server: str = config.host
        self.timeout = timeout
        self._fresh = False
        self._config = config
        self._headers = {"Accept": "application/json", "Content-Type": "application/json",
                         "User-Agent": "gitops"}
        try:
            self._client = ApiClient(config)
        except Exception:
            self._files.close()
            raise

    def close(self) -> None:
        try:
            self._client.close()
        finally:
            self._files.close()

    def __enter__(self) -> "KubeAPI":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------------------------- requests

    def request(self, method: str, path: str, body: Any = None, *, query: dict[str, str] | None = None,
                timeout: float | None = None, content_type: str = "") -> dict[str, Any]:
        """The decoded JSON answer; KubeAPIError (with the API's own message) otherwise."""
        url = self.server + path + (f"?{urlencode(query)}" if query else "")
        try:
            with warnings.catch_warnings():  # unverified on purpose (discovery): the caller pins the CA
                warnings.filterwarnings("ignore", message="Unverified HTTPS request")
                response = self._client.call_api(method, url, header_params=self._request_headers(content_type),
                                                 body=body, _request_timeout=timeout or self.timeout)
                response.read()
        except Exception as err:  # noqa: BLE001 -- urllib3 raises many kinds; all mean "no answer"
            reason = _reason(err)
            raise KubeAPIError(f"{self.server}: {method} {path}: no answer: {reason}", details=reason) from None
        finally:
            if self._fresh:  # (urllib3 keeps a connection the answer did not say it closes: never reuse it)
                self._client.rest_client.pool_manager.clear()
        data = response.data or b""
        try:
            decoded = json.loads(data) if data else {}
        except ValueError:
            decoded = {"message": data.decode(errors="replace")[:200]}
        if not 200 <= response.status <= 299:
            status = decoded if isinstance(decoded, dict) else {}
            message = " ".join(str(status.get("message") or status.get("reason") or response.reason or "").split())
            raise KubeAPIError(f"{self.server}: {method} {path}: {response.status} {message}", response.status,
                               message)
        return decoded

    def _request_headers(self, content_type: str = "") -> dict[str, str]:
        """The headers of one request; a kubeconfig's token is read (or its plugin run) again as the client does."""
        headers = dict(self._headers)
        if content_type:
            headers["Content-Type"] = content_type
        token = self._config.get_api_key_with_prefix("BearerToken", alias="authorization")
        if token:
            headers["Authorization"] = token
        return headers

    def get(self, path: str) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        try:
            return self.request("GET", path)
        except KubeAPIError as err:
            if err.status == 404:
                return None
            raise

    def list(self, path: str, label_selector: str = "") -> list[dict[str, Any]]:
        query = {"labelSelector": label_selector} if label_selector else None
        return list(self.request("GET", path, query=query).get("items") or [])

    def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.request("POST", path, body)

    def apply(self, collection: str, body: dict[str, Any]) -> dict[str, Any]:
        """Create the object in `collection`, or replace it (keeping its resourceVersion) if it exists."""
        name = body["metadata"]["name"]
        current = self.get(f"{collection}/{quote(name)}")
        if current is None:
            return self.create(collection, body)
        body = {**body, "metadata": {**body["metadata"],
                                     "resourceVersion": current["metadata"]["resourceVersion"]}}
        return self.request("PUT", f"{collection}/{quote(name)}", body)

    def delete(self, path: str) -> bool:
        """True when something was deleted, False when it was already gone."""
        try:
            self.request("DELETE", path)
            return True
        except KubeAPIError as err:
            if err.status == 404:
                return False
            raise

    def not_ready(self, path: str = "/readyz") -> str:
        """Why the server is not ready: "" when `path` answers 200 `ok`, else its status or why it did not answer."""
        try:
            response = self._client.call_api("GET", self.server + path, header_params=self._request_headers(),
                                             _request_timeout=self.timeout)
            body = response.read() or b""
        except Exception as err:  # noqa: BLE001 -- urllib3 raises many kinds; all mean "no answer"
            return _reason(err)
        return "" if response.status == 200 and body.strip() == b"ok" else f"HTTP {response.status}"

    def ready(self) -> bool:
        return not self.not_ready()


def node_ready(node: dict[str, Any]) -> bool:
    """Whether a Node object's Ready condition is True (a worker: control planes run as pods here)."""
    status = node.get("status") or {}
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ())


def _reason(err: BaseException) -> str:
    """Why a request got no answer: the innermost cause of a urllib3/socket failure, one line, no object reprs."""
    from kubernetes.client.exceptions import ApiException

    if isinstance(err, ApiException) and isinstance(err.__context__, BaseException):
        err = err.__context__  # the client turns a TLS failure into an ApiException: the cause is its context
    seen: set[int] = set()
    while id(err) not in seen:
        seen.add(id(err))
        inner = getattr(err, "reason", None)
        if isinstance(inner, BaseException):
            err = inner
            continue
        nested = next((a for a in err.args if isinstance(a, BaseException)), None)
        if nested is not None:
            err = nested
            continue
        break
    if isinstance(err, ssl.SSLError) and err.reason:
        return f"{err.reason}: {getattr(err, 'verify_message', None) or err.strerror or err}"
    text = str(err.args[-1] if err.args and isinstance(err.args[-1], str) else err)
    text = re.sub(r"^\w*Connection(?:Pool)?\(host=[^)]*\):\s*", "", text)  # urllib3 2 names the connection first
    return " ".join(text.split())[:300] or type(err).__name__


# --------------------------------------------------------------------------- kubeconfig


def load_kubeconfig(path: str | os.PathLike[str], context: str | None = None,
                    files: MemoryFiles | None = None) -> Configuration:
    """The official client's configuration for `context` of the kubeconfig at `path`; KubeAPIError when unusable.

    The loader writes the kubeconfig's embedded CA, certificate and key (`*-data`) to temporary files that it
    removes only when the process exits normally; given `files`, they move into them at once and the temporary
    files go (a process killed later leaves no key on the disk)."""
    with _IMPORT:
        from kubernetes.client import Configuration
        from kubernetes.config import kube_config

    path = Path(path)
    if not path.is_file():
        raise KubeAPIError(f"{path}: cannot read kubeconfig: no such file")
    configuration = Configuration()
    exec_errors = _ExecErrors()
    logging.getLogger().addHandler(exec_errors)
    moved: dict[str, str] = {}
    try:
        with _LOADER:  # its temporary files are shared by content between loads: none taken while another moves
            try:
                kube_config.load_kube_config(config_file=str(path), context=context,
                                             client_configuration=configuration, persist_config=False)
            finally:
                if files is not None:
                    moved = _into_memory(configuration, kube_config, files)
    except Exception as err:  # noqa: BLE001 -- the loader raises ConfigException, yaml, base64, OS and type errors
        raise KubeAPIError(" ".join(f"{path}: unusable kubeconfig: {_loader_reason(err)}".split())) from None
    finally:
        logging.getLogger().removeHandler(exec_errors)
    if exec_errors.messages:  # the loader only logs a failed exec plugin and goes on as anonymous
        raise KubeAPIError(" ".join(f"{path}: the exec credential plugin failed: {exec_errors.messages[0]}".split()))
    if not configuration.host.startswith("https://"):
        raise KubeAPIError(f"{path}: the cluster needs an https:// server, got {configuration.host!r}")
    _check_tls_material(configuration, path)
    _after_refresh(configuration, moved)
    return configuration


def _into_memory(configuration: Configuration, kube_config: Any, files: MemoryFiles) -> dict[str, str]:
    """The loader's temporary files that `configuration` names, moved into `files` and removed; returns the
    attributes set to the memory files' paths."""
    made = {name: content for content, name in kube_config._temp_files.items()}
    moved = {}
    for attribute in ("ssl_ca_cert", "cert_file", "key_file"):
        name = getattr(configuration, attribute, None)
        if not name or name not in made:
            continue
        try:
            text = Path(name).read_text()
        except OSError:
            continue
        moved[attribute] = files.add(attribute, text)
        setattr(configuration, attribute, moved[attribute])
        kube_config._temp_files.pop(made[name], None)
        with contextlib.suppress(OSError):
            os.remove(name)
    return moved


class _ExecErrors(logging.Handler):
    """Collects the kubeconfig loader's ``exec: ...`` error log lines (it logs them on the root logger)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("exec:"):
            self.messages.append(message.removeprefix("exec:").strip())


def _check_tls_material(configuration: Configuration, path: Path) -> None:
    """Fail now, naming the kubeconfig, rather than as a TLS error on the first request."""
    try:
        if configuration.ssl_ca_cert:
            ssl.create_default_context(cafile=configuration.ssl_ca_cert)
    except (ssl.SSLError, OSError) as err:
        raise KubeAPIError(f"{path}: certificate-authority unusable: {_reason(err)}") from None
    if configuration.cert_file or configuration.key_file:
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(configuration.cert_file, configuration.key_file)
        except (ssl.SSLError, OSError, TypeError) as err:
            raise KubeAPIError(f"{path}: client certificate/key unusable: {_reason(err)}") from None


def _after_refresh(configuration: Configuration, paths: dict[str, str]) -> None:
    """What the loader's refresh hook (which re-sets the token, the file paths and itself before every request)
    gets wrong, mended after it on every call: a token trimmed as client-go does (the Python loader sends a
    tokenFile's trailing newline, which http.client refuses as a header value), and `paths` (attribute -> memory
    file path) put back over the loader's temporary files. Runs once now, and re-installs itself."""
    refresh = configuration.refresh_api_key_hook

    def mended(config: Configuration) -> None:
        if refresh is not None:
            refresh(config)
        config.refresh_api_key_hook = mended
        config.api_key = {k: v.strip() if isinstance(v, str) else v for k, v in config.api_key.items()}
        for attribute, name in paths.items():
            setattr(config, attribute, name)

    mended(configuration)
    configuration.refresh_api_key_hook = mended


def _loader_reason(err: Exception) -> str:
    if isinstance(err, yaml.YAMLError):
        return "not valid YAML"
    if isinstance(err, binascii.Error):
        return f"bad base64 data ({err})"
    return str(err) or type(err).__name__
