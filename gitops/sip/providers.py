"""Where BareMetalHosts live, behind one interface: list them, apply label changes.

* `FileProvider` -- hosts from the repo (or a ``kubectl get bmh -o yaml`` export);
  the labels gitops sets are kept in an overlay that the caller records (on the
  status branch) and passes back next time; the repo is never written.
* `KubernetesProvider` -- metal3.io/v1alpha1 BareMetalHosts of a management
  cluster reached with a kubeconfig (client certificate or bearer token). Labels
  are changed with JSON merge patches carrying ``metadata.resourceVersion``, so a
  stale write gets 409 Conflict; the host is then read again and the patch retried
  (up to `retries` times) unless someone else changed its SIP labels meanwhile.
  Standard library only (urllib + ssl).
"""
from __future__ import annotations

import base64
import binascii
import json
import os
import ssl
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import yaml

from gitops.model.build import baremetal_host
from gitops.model.documents import Document
from gitops.model.resources import BareMetalHost, RepoModel
from gitops.sip import SIPError
from gitops.sip.selection import MANAGED_LABELS, LabelChange, host_key

API_PREFIX = "/apis/metal3.io/v1alpha1"
#: an overlay: host key -> label -> value set by gitops, or None for a label it removed
Overlay = dict[str, dict[str, str | None]]


class BMHProvider(Protocol):
    def list_hosts(self) -> list[BareMetalHost]:
        """Every host, sorted by ``namespace/name``, labels as they are now."""
        ...

    def apply_labels(self, changes: Sequence[LabelChange]) -> None:
        """Apply `changes` in order; raise `SIPError` on the first that fails."""
        ...


def host_from_object(obj: Any, source: str) -> BareMetalHost:
    """A `BareMetalHost` from a metal3.io/v1alpha1 object (API item or export document)."""
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    name = meta.get("name") if isinstance(meta, dict) else None
    if not isinstance(name, str) or not name:
        raise SIPError(f"{source}: a BareMetalHost without metadata.name")
    labels = meta.get("labels") or {}
    if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
        raise SIPError(f"{source}: BareMetalHost {name}: metadata.labels must map strings to strings")
    if not isinstance(obj.get("spec", {}), dict) or not isinstance(obj.get("status", {}), dict):
        raise SIPError(f"{source}: BareMetalHost {name}: spec and status must be mappings")
    return baremetal_host(Document(file=source, line=0, data=obj))


def hosts_from_yaml(text: str, source: str) -> list[BareMetalHost]:
    """BareMetalHosts of a YAML stream: documents and ``kind: List`` items; other kinds are skipped."""
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as err:
        raise SIPError(f"{source}: not valid YAML: {err}") from None
    objects: list[Any] = []
    for doc in docs:
        if isinstance(doc, dict) and doc.get("kind") == "List":
            objects.extend(doc.get("items") or [])
        else:
            objects.append(doc)
    hosts = [host_from_object(o, source) for o in objects if isinstance(o, dict) and o.get("kind") == "BareMetalHost"]
    return sorted(hosts, key=host_key)


# --------------------------------------------------------------------------- file


class FileProvider:
    """Hosts from files; the labels gitops sets live in `overlay`, for the caller to record."""

    def __init__(self, hosts: Iterable[BareMetalHost], overlay: Mapping[str, Mapping[str, str | None]] | None = None):
        self._hosts = {host_key(h): h for h in sorted(hosts, key=host_key)}
        self._overlay: Overlay = {}
        for key, labels in (overlay or {}).items():
            if key in self._hosts:  # entries of hosts gone from the repo are dropped
                for label, value in labels.items():
                    self._record(key, label, value)

    @classmethod
    def from_model(cls, model: RepoModel, overlay: Mapping[str, Mapping[str, str | None]] | None = None) -> FileProvider:
        return cls(model.baremetal_hosts.values(), overlay)

    @property
    def overlay(self) -> Overlay:
        """Label differences from the files, sorted: value set, or None where removed."""
        return {k: dict(sorted(v.items())) for k, v in sorted(self._overlay.items()) if v}

    def _labels(self, key: str) -> dict[str, str]:
        labels = dict(self._hosts[key].labels)
        for label, value in self._overlay.get(key, {}).items():
            if value is None:
                labels.pop(label, None)
            else:
                labels[label] = value
        return dict(sorted(labels.items()))

    def _record(self, key: str, label: str, value: str | None) -> None:
        entry = self._overlay.setdefault(key, {})
        if self._hosts[key].labels.get(label) == value:
            entry.pop(label, None)  # back to what the file says
        else:
            entry[label] = value

    def list_hosts(self) -> list[BareMetalHost]:
        return [replace(h, labels=self._labels(k)) for k, h in self._hosts.items()]

    def apply_labels(self, changes: Sequence[LabelChange]) -> None:
        unknown = sorted({c.host for c in changes} - set(self._hosts))
        if unknown:
            raise SIPError(f"cannot label unknown BareMetalHost(s): {', '.join(unknown)}")
        for change in changes:
            for label in change.remove:
                self._record(change.host, label, None)
            for label, value in change.set:
                self._record(change.host, label, value)


# --------------------------------------------------------------------------- kubernetes


@dataclass(frozen=True)
class KubeCredentials:
    """What a kubeconfig context says about reaching its cluster."""

    server: str  # https://host:port
    ca_pem: str | None = None
    insecure: bool = False
    client_cert_pem: str | None = None
    client_key_pem: str | None = None
    token: str | None = None

    def ssl_context(self) -> ssl.SSLContext:
        if self.insecure:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        else:
            ctx = ssl.create_default_context(cadata=self.ca_pem) if self.ca_pem else ssl.create_default_context()
        if self.client_cert_pem and self.client_key_pem:
            # ssl only loads key pairs from files: a private temporary directory, removed at once
            with tempfile.TemporaryDirectory(prefix="gitops-kube-") as tmp:
                cert, key = Path(tmp, "client.crt"), Path(tmp, "client.key")
                cert.write_text(self.client_cert_pem)
                fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "w") as handle:
                    handle.write(self.client_key_pem)
                try:
                    ctx.load_cert_chain(cert, key)
                except ssl.SSLError as err:
                    raise SIPError(f"kubeconfig client certificate/key unusable: {err.reason or err}") from None
        return ctx


def load_kubeconfig(path: str | os.PathLike[str], context: str | None = None) -> KubeCredentials:
    """Credentials of `context` (default: current-context) of the kubeconfig at `path`.

    Supports certificate-authority(-data), insecure-skip-tls-verify,
    client-certificate(-data)/client-key(-data), token and tokenFile; file paths
    are relative to the kubeconfig. exec and auth-provider plugins are not supported.
    """
    path = Path(path)
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise SIPError(f"{path}: cannot read kubeconfig: {err.strerror}") from None
    except yaml.YAMLError:
        raise SIPError(f"{path}: kubeconfig is not valid YAML") from None
    if not isinstance(config, dict):
        raise SIPError(f"{path}: kubeconfig is not a mapping")
    name = context or config.get("current-context")
    if not name:
        raise SIPError(f"{path}: no context given and no current-context set")
    ctx = _named(config, "contexts", "context", name, path)
    cluster = _named(config, "clusters", "cluster", ctx.get("cluster"), path)
    user = _named(config, "users", "user", ctx.get("user"), path) if ctx.get("user") else {}
    server = cluster.get("server")
    if not isinstance(server, str) or not server.startswith("https://"):
        raise SIPError(f"{path}: cluster {ctx.get('cluster')!r} needs an https:// server, got {server!r}")
    for plugin in ("exec", "auth-provider"):
        if plugin in user:
            raise SIPError(f"{path}: user {ctx.get('user')!r} uses {plugin}, which is not supported; "
                           "use a client certificate or a token")

    def material(obj: dict, key: str) -> str | None:
        if obj.get(f"{key}-data"):
            try:
                return base64.b64decode(obj[f"{key}-data"], validate=True).decode()
            except (binascii.Error, UnicodeDecodeError, TypeError):
                raise SIPError(f"{path}: {key}-data is not base64 PEM") from None
        return _read(path, obj[key], key) if obj.get(key) else None

    token = user.get("token") or (_read(path, user["tokenFile"], "tokenFile").strip() if user.get("tokenFile") else None)
    return KubeCredentials(
        server=server.rstrip("/"),
        ca_pem=material(cluster, "certificate-authority"),
        insecure=bool(cluster.get("insecure-skip-tls-verify", False)),
        client_cert_pem=material(user, "client-certificate"),
        client_key_pem=material(user, "client-key"),
        token=token,
    )


def _named(config: dict, section: str, inner: str, name: Any, path: Path) -> dict:
    for entry in config.get(section) or []:
        if isinstance(entry, dict) and entry.get("name") == name and isinstance(entry.get(inner), dict):
            return entry[inner]
    raise SIPError(f"{path}: no {inner} named {name!r} in {section}")


def _read(kubeconfig: Path, ref: str, what: str) -> str:
    file = (kubeconfig.parent / ref) if not os.path.isabs(ref) else Path(ref)
    try:
        return file.read_text(encoding="utf-8")
    except OSError as err:
        raise SIPError(f"{kubeconfig}: cannot read {what} {file}: {err.strerror}") from None


class KubernetesProvider:
    """BareMetalHosts of a management cluster, labeled with resourceVersion-guarded merge patches."""

    def __init__(self, credentials: KubeCredentials, namespace: str | None = None, *,
                 retries: int = 5, timeout: float = 10.0, page_size: int = 500):
        self.credentials = credentials
        self.namespace = namespace
        self.retries = retries
        self.timeout = timeout
        self.page_size = page_size
        self._opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=credentials.ssl_context()))
        #: host key -> (resourceVersion, managed labels) as last read
        self._seen: dict[str, tuple[str, dict[str, str]]] = {}

    @classmethod
    def from_kubeconfig(cls, path: str | os.PathLike[str], context: str | None = None,
                        namespace: str | None = None, **options: Any) -> KubernetesProvider:
        return cls(load_kubeconfig(path, context), namespace, **options)

    # -- HTTP

    def _request(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        """(status, JSON body); HTTP errors come back as statuses, transport errors raise."""
        headers = {"Accept": "application/json"}
        if self.credentials.token:
            headers["Authorization"] = f"Bearer {self.credentials.token}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/merge-patch+json"
        request = urllib.request.Request(self.credentials.server + path, data=data, method=method, headers=headers)
        try:
            with self._opener.open(request, timeout=self.timeout) as response:
                return response.status, self._json(response.read(), method, path)
        except urllib.error.HTTPError as err:
            with err:
                return err.code, self._json(err.read(), method, path, strict=False)
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise SIPError(f"{method} {self.credentials.server}{path}: cannot reach the management cluster: {reason}") from None

    @staticmethod
    def _json(raw: bytes, method: str, path: str, strict: bool = True) -> dict:
        try:
            value = json.loads(raw or b"{}")
        except ValueError:
            if strict:
                raise SIPError(f"{method} {path}: the server answered with something that is not JSON") from None
            return {"message": raw[:200].decode("utf-8", "replace")}
        return value if isinstance(value, dict) else {}

    def _fail(self, what: str, status: int, body: dict) -> SIPError:
        return SIPError(f"{what}: HTTP {status}: {body.get('message') or body.get('reason') or 'no details'}")

    @staticmethod
    def _object_path(key: str) -> str:
        namespace, name = key.split("/", 1)
        return f"{API_PREFIX}/namespaces/{urllib.parse.quote(namespace)}/baremetalhosts/{urllib.parse.quote(name)}"

    def _remember(self, obj: dict) -> BareMetalHost:
        host = host_from_object(obj, self.credentials.server)
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if not isinstance(rv, str) or not rv:
            raise SIPError(f"{self.credentials.server}: BareMetalHost {host_key(host)} has no resourceVersion")
        self._seen[host_key(host)] = (rv, _managed(host.labels))
        return host

    # -- provider

    def list_hosts(self) -> list[BareMetalHost]:
        base = f"{API_PREFIX}/namespaces/{urllib.parse.quote(self.namespace)}/baremetalhosts" if self.namespace \
            else f"{API_PREFIX}/baremetalhosts"
        hosts: list[BareMetalHost] = []
        token = ""
        while True:
            query = {"limit": str(self.page_size)} | ({"continue": token} if token else {})
            status, body = self._request("GET", f"{base}?{urllib.parse.urlencode(query)}")
            if status != 200:
                raise self._fail(f"listing BareMetalHosts at {self.credentials.server}{base}", status, body)
            items = body.get("items")
            if not isinstance(items, list):
                raise SIPError(f"GET {base}: the answer has no items list")
            hosts.extend(self._remember(item) for item in items)
            token = (body.get("metadata") or {}).get("continue") or ""
            if not token:
                return sorted(hosts, key=host_key)

    def _get(self, key: str) -> None:
        status, body = self._request("GET", self._object_path(key))
        if status != 200:
            raise self._fail(f"reading BareMetalHost {key}", status, body)
        self._remember(body)

    def apply_labels(self, changes: Sequence[LabelChange]) -> None:
        for change in changes:
            self._apply(change)

    def _apply(self, change: LabelChange) -> None:
        key = change.host
        if key not in self._seen:
            self._get(key)
        planned_over = self._seen[key][1]
        labels: dict[str, str | None] = {label: None for label in change.remove}
        labels.update(change.set)
        for attempt in range(self.retries + 1):
            rv = self._seen[key][0]
            patch = {"metadata": {"resourceVersion": rv, "labels": labels}}
            status, body = self._request("PATCH", self._object_path(key), patch)
            if status == 200:
                self._remember(body)
                return
            if status != 409:
                raise self._fail(f"labeling BareMetalHost {key} ({change.reason})", status, body)
            self._get(key)  # stale: read again, and retry only if nobody touched the SIP labels
            now = self._seen[key][1]
            if now != planned_over:
                raise SIPError(f"BareMetalHost {key}: its SIP labels changed while labeling "
                               f"(planned over {planned_over}, now {now}); plan again")
        raise SIPError(f"BareMetalHost {key}: still conflicting after {self.retries} retries "
                       "(resourceVersion keeps changing); try again later")


def _managed(labels: Mapping[str, str]) -> dict[str, str]:
    return {k: labels[k] for k in sorted(labels) if k in MANAGED_LABELS}
