"""A Kubernetes API connection from PEM strings, through the official `kubernetes` client.

The client's TLS layer reads credentials from file paths; here they are
anonymous in-memory files (`memfd_create`), so a cluster's admin key or CA
never touches the disk. Requests are plain JSON (`get`, `list`, `create`, `apply`,
`delete`): gitops manages a handful of well-known objects and has no use
for the generated model classes.
"""
from __future__ import annotations

import json
import os
import threading
import warnings
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

from gitops.errors import GitopsError


_IMPORT = threading.Lock()


class KubeAPIError(GitopsError):
    """A request failed: `status` is the HTTP status (0: no answer)."""

    def __init__(self, message: str, status: int = 0):
        super().__init__(message)
        self.status = status


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
                 timeout: float = 10.0):
        with _IMPORT:  # ~0.3 s, only when an API is used; threads importing it at once deadlock
            from kubernetes.client import ApiClient, Configuration

        self.server = server.rstrip("/")
        self.timeout = timeout
        self._fds: list[int] = []
        config = Configuration()
        config.host = self.server
        config.retries = False
        if ca_pem:
            config.ssl_ca_cert = self._memfile("ca", ca_pem)
        else:
            config.verify_ssl = False
        if credentials.cert_pem:
            config.cert_file = self._memfile("cert", credentials.cert_pem)
            config.key_file = self._memfile("key", credentials.key_pem)
        self._headers = {"Accept": "application/json", "Content-Type": "application/json",
                         "User-Agent": "gitops"}
        if credentials.token:
            self._headers["Authorization"] = f"Bearer {credentials.token}"
        try:
            self._client = ApiClient(config)
        except Exception:
            self._close_files()
            raise

    def _memfile(self, name: str, text: str) -> str:
        fd = os.memfd_create(f"gitops-{name}", os.MFD_CLOEXEC)
        os.write(fd, text.encode())
        self._fds.append(fd)
        return f"/proc/{os.getpid()}/fd/{fd}"

    def _close_files(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds = []

    def close(self) -> None:
        try:
            self._client.close()
        finally:
            self._close_files()

    def __enter__(self) -> "KubeAPI":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------------------------- requests

    def request(self, method: str, path: str, body: Any = None, *, query: dict[str, str] | None = None,
                timeout: float | None = None) -> dict[str, Any]:
        """The decoded JSON answer; KubeAPIError (with the API's own message) otherwise."""
        url = self.server + path + (f"?{urlencode(query)}" if query else "")
        try:
            with warnings.catch_warnings():  # unverified on purpose (discovery): the caller pins the CA
                warnings.filterwarnings("ignore", message="Unverified HTTPS request")
                response = self._client.call_api(method, url, header_params=dict(self._headers),
                                                 body=body, _request_timeout=timeout or self.timeout)
                response.read()
        except Exception as err:  # noqa: BLE001 -- urllib3 raises many kinds; all mean "no answer"
            raise KubeAPIError(f"{self.server}: {method} {path}: no answer: {_reason(err)}") from None
        data = response.data or b""
        try:
            decoded = json.loads(data) if data else {}
        except ValueError:
            decoded = {"message": data.decode(errors="replace")[:200]}
        if not 200 <= response.status <= 299:
            message = decoded.get("message") if isinstance(decoded, dict) else None
            raise KubeAPIError(f"{self.server}: {method} {path}: {response.status} {message or response.reason}",
                               response.status)
        return decoded

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
            response = self._client.call_api("GET", self.server + path, header_params=dict(self._headers),
                                             _request_timeout=self.timeout)
            body = response.read() or b""
        except Exception as err:  # noqa: BLE001 -- urllib3 raises many kinds; all mean "no answer"
            return _reason(err)
        return "" if response.status == 200 and body.strip() == b"ok" else f"HTTP {response.status}"

    def ready(self) -> bool:
        return not self.not_ready()


def _reason(err: Exception) -> str:
    text = str(getattr(err, "reason", None) or err)
    return " ".join(text.split())[:300]
