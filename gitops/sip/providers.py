"""Where BareMetalHosts live, behind one interface: list them, apply label changes.

* `FileProvider` -- hosts from the repo (or a ``kubectl get bmh -o yaml`` export);
  the labels gitops sets are kept in an overlay that the caller records (on the
  status branch) and passes back next time; the repo is never written.
* `KubernetesProvider` -- metal3.io/v1alpha1 BareMetalHosts of a management
  cluster reached with a kubeconfig (client certificate or bearer token). Labels
  are changed with JSON merge patches carrying ``metadata.resourceVersion``, so a
  stale write gets 409 Conflict; the host is then read again and the patch retried
  (up to `retries` times) unless someone else changed its SIP labels meanwhile.
  Talks through the official `kubernetes` client (kubeconfig loading, TLS, auth);
  tested against a real kube-apiserver v1.20.2 with deploy/crds/metal3.io_baremetalhosts.yaml.
"""
from __future__ import annotations

import binascii
import json
import logging
import os
import re
import ssl
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import yaml

from gitops.model.build import baremetal_host
from gitops.model.documents import Document
from gitops.model.resources import BareMetalHost, RepoModel
from gitops.sip import SIPError
from gitops.sip.selection import MANAGED_LABELS, LabelChange, host_key

if TYPE_CHECKING:  # the client is imported when a kubernetes provider is made: it costs ~0.3 s
    from kubernetes.client import ApiClient, Configuration
    from kubernetes.client.exceptions import ApiException

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

GROUP, VERSION, PLURAL = "metal3.io", "v1alpha1", "baremetalhosts"
MERGE_PATCH = "application/merge-patch+json"


class KubernetesProvider:
    """BareMetalHosts of a management cluster, labeled with resourceVersion-guarded merge patches."""

    def __init__(self, api_client: ApiClient, namespace: str | None = None, *,
                 retries: int = 5, timeout: float = 10.0, page_size: int = 500):
        from kubernetes.client import CustomObjectsApi

        self.server: str = api_client.configuration.host
        self.api = CustomObjectsApi(api_client)
        self.namespace = namespace
        self.retries = retries
        self.timeout = timeout
        self.page_size = page_size
        #: host key -> (resourceVersion, managed labels) as last read
        self._seen: dict[str, tuple[str, dict[str, str]]] = {}

    @classmethod
    def from_kubeconfig(cls, path: str | os.PathLike[str], context: str | None = None,
                        namespace: str | None = None, **options: Any) -> KubernetesProvider:
        """A provider for `context` (default: current-context) of the kubeconfig at `path`.

        The official client reads the kubeconfig: certificate-authority(-data),
        insecure-skip-tls-verify, client certificates, token/tokenFile, exec and
        auth-provider plugins; relative file paths are relative to the kubeconfig.
        It is never written back (``persist_config=False``).
        """
        return cls(api_client_from_kubeconfig(path, context), namespace, **options)

    # -- calls

    def _call(self, what: str, method: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[int, dict]:
        """(200, object) or (HTTP status, Status body) of an API call; transport failures raise SIPError."""
        import urllib3
        from kubernetes.client.exceptions import ApiException

        try:
            return 200, _mapping(method(*args, _request_timeout=self.timeout, **kwargs), what)
        except ApiException as err:
            if err.status:
                return err.status, _status_body(err)
            # status 0: the client turned a TLS failure into an ApiException (the cause is its context)
            cause = err.__context__ if isinstance(err.__context__, BaseException) else None
            reason = _transport_reason(cause) if cause is not None else " ".join(str(err.reason).split())
        except (urllib3.exceptions.HTTPError, OSError) as err:
            reason = _transport_reason(err)
        raise SIPError(f"{what}: cannot reach the management cluster at {self.server}: {reason}")

    @staticmethod
    def _fail(what: str, status: int, body: dict) -> SIPError:
        message = body.get("message") or body.get("reason") or "no details"
        return SIPError(" ".join(f"{what}: HTTP {status}: {message}".split()))

    def _remember(self, obj: dict) -> BareMetalHost:
        host = host_from_object(obj, self.server)
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if not isinstance(rv, str) or not rv:
            raise SIPError(f"{self.server}: BareMetalHost {host_key(host)} has no resourceVersion")
        self._seen[host_key(host)] = (rv, _managed(host.labels))
        return host

    # -- provider

    def list_hosts(self) -> list[BareMetalHost]:
        where = f"namespace {self.namespace}" if self.namespace else "all namespaces"
        what = f"listing BareMetalHosts ({where}) at {self.server}"
        hosts: list[BareMetalHost] = []
        token: str | None = None
        while True:
            if self.namespace:
                status, body = self._call(what, self.api.list_namespaced_custom_object, GROUP, VERSION,
                                          self.namespace, PLURAL, limit=self.page_size, _continue=token)
            else:
                status, body = self._call(what, self.api.list_cluster_custom_object, GROUP, VERSION, PLURAL,
                                          limit=self.page_size, _continue=token)
            if status != 200:
                raise self._fail(what, status, body)
            items = body.get("items")
            if not isinstance(items, list):
                raise SIPError(f"{what}: the answer has no items list")
            hosts.extend(self._remember(item) for item in items)
            token = (body.get("metadata") or {}).get("continue") or None
            if not token:
                return sorted(hosts, key=host_key)

    def _get(self, key: str) -> None:
        namespace, name = key.split("/", 1)
        what = f"reading BareMetalHost {key}"
        status, body = self._call(what, self.api.get_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, name)
        if status != 200:
            raise self._fail(what, status, body)
        self._remember(body)

    def apply_labels(self, changes: Sequence[LabelChange]) -> None:
        for change in changes:
            self._apply(change)

    def _apply(self, change: LabelChange) -> None:
        key = change.host
        if key not in self._seen:
            self._get(key)
        namespace, name = key.split("/", 1)
        what = f"labeling BareMetalHost {key} ({change.reason})"
        planned_over = self._seen[key][1]
        labels: dict[str, str | None] = {label: None for label in change.remove}
        labels.update(change.set)
        for _attempt in range(self.retries + 1):
            patch = {"metadata": {"resourceVersion": self._seen[key][0], "labels": labels}}
            status, body = self._call(what, self.api.patch_namespaced_custom_object, GROUP, VERSION, namespace,
                                      PLURAL, name, patch, _content_type=MERGE_PATCH)
            if status == 200:
                self._remember(body)
                return
            if status != 409:
                raise self._fail(what, status, body)
            self._get(key)  # stale: read again, and retry only if nobody touched the SIP labels
            now = self._seen[key][1]
            if now != planned_over:
                raise SIPError(f"BareMetalHost {key}: its SIP labels changed while labeling "
                               f"(planned over {planned_over}, now {now}); plan again")
        raise SIPError(f"BareMetalHost {key}: still conflicting after {self.retries} retries "
                       "(resourceVersion keeps changing); try again later")


def api_client_from_kubeconfig(path: str | os.PathLike[str], context: str | None = None) -> ApiClient:
    """An `ApiClient` for `context` of the kubeconfig at `path`; SIPError (one line) when unusable."""
    from kubernetes.client import ApiClient, Configuration
    from kubernetes.config import kube_config

    path = Path(path)
    if not path.is_file():
        raise SIPError(f"{path}: cannot read kubeconfig: no such file")
    configuration = Configuration()
    exec_errors = _ExecErrors()
    logging.getLogger().addHandler(exec_errors)
    try:
        kube_config.load_kube_config(config_file=str(path), context=context,
                                     client_configuration=configuration, persist_config=False)
    except Exception as err:  # noqa: BLE001 -- the loader raises ConfigException, yaml, base64, OS and type errors
        raise SIPError(" ".join(f"{path}: unusable kubeconfig: {_loader_reason(err)}".split())) from None
    finally:
        logging.getLogger().removeHandler(exec_errors)
    if exec_errors.messages:  # the loader only logs a failed exec plugin and goes on as anonymous
        raise SIPError(" ".join(f"{path}: the exec credential plugin failed: {exec_errors.messages[0]}".split()))
    if not configuration.host.startswith("https://"):
        raise SIPError(f"{path}: the cluster needs an https:// server, got {configuration.host!r}")
    _check_tls_material(configuration, path)
    _strip_tokens(configuration)
    configuration.retries = False  # urllib3: no silent reconnect loops; the reconcile retries later
    client = ApiClient(configuration)
    client.user_agent = "gitops"
    return client


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
        raise SIPError(f"{path}: certificate-authority unusable: {_transport_reason(err)}") from None
    if configuration.cert_file or configuration.key_file:
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(configuration.cert_file, configuration.key_file)
        except (ssl.SSLError, OSError, TypeError) as err:
            raise SIPError(f"{path}: client certificate/key unusable: {_transport_reason(err)}") from None


def _strip_tokens(configuration: Configuration) -> None:
    """Trim a token as client-go does: the Python loader sends a tokenFile's trailing newline,
    which http.client refuses as a header value. The loader's refresh hook re-sets the token
    (and itself) before every request, so trimming wraps that hook and re-installs itself."""
    refresh = configuration.refresh_api_key_hook

    def stripped(config: Configuration) -> None:
        if refresh is not None:
            refresh(config)
        config.refresh_api_key_hook = stripped
        config.api_key = {k: v.strip() if isinstance(v, str) else v for k, v in config.api_key.items()}

    stripped(configuration)
    configuration.refresh_api_key_hook = stripped


def _loader_reason(err: Exception) -> str:
    if isinstance(err, yaml.YAMLError):
        return "not valid YAML"
    if isinstance(err, binascii.Error):
        return f"bad base64 data ({err})"
    return str(err) or type(err).__name__


def _mapping(value: Any, what: str) -> dict:
    if not isinstance(value, dict):
        raise SIPError(f"{what}: the server answered with something that is not a JSON object")
    return value


def _status_body(err: ApiException) -> dict:
    """The metav1.Status an API error carries, or what little there is."""
    try:
        body = json.loads(err.body or b"{}")
    except (ValueError, TypeError):
        body = None
    if not isinstance(body, dict):
        body = {"message": str(err.body or "")[:200] or err.reason}
    return body


def _transport_reason(err: BaseException) -> str:
    """The innermost cause of a urllib3/socket failure, without object reprs."""
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
    return " ".join(text.split()) or type(err).__name__


def _managed(labels: Mapping[str, str]) -> dict[str, str]:
    return {k: labels[k] for k in sorted(labels) if k in MANAGED_LABELS}
