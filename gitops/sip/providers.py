"""Where BareMetalHosts live, behind one interface: list them, apply label changes.

* `FileProvider` -- hosts from the repo (or a ``kubectl get bmh -o yaml`` export);
  the labels gitops sets are kept in an overlay that the caller records (on the
  status branch) and passes back next time; the repo is never written.
* `KubernetesProvider` -- metal3.io/v1alpha1 BareMetalHosts of a management
  cluster reached with a kubeconfig (client certificate or bearer token). Labels
  are changed with JSON merge patches carrying ``metadata.resourceVersion``, so a
  stale write gets 409 Conflict; the host is then read again and the patch retried
  (up to `retries` times) unless someone else changed its SIP labels meanwhile.
  Talks through `gitops.kubeapi` (the official client's kubeconfig loading, TLS, auth);
  tested against a real kube-apiserver v1.20.2 with deploy/crds/metal3.io_baremetalhosts.yaml.
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol
from urllib.parse import quote

import yaml

from gitops.kubeapi import MERGE_PATCH, KubeAPI, KubeAPIError
from gitops.model.build import baremetal_host
from gitops.model.documents import Document
from gitops.model.resources import BareMetalHost, RepoModel
from gitops.sip import SIPError
from gitops.sip.selection import MANAGED_LABELS, LabelChange, host_key

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

API = "/apis/metal3.io/v1alpha1"
PLURAL = "baremetalhosts"


class KubernetesProvider:
    """BareMetalHosts of a management cluster, labeled with resourceVersion-guarded merge patches."""

    def __init__(self, api: KubeAPI, namespace: str | None = None, *, retries: int = 5, page_size: int = 500):
        self.api = api
        self.server = api.server
        self.namespace = namespace
        self.retries = retries
        self.page_size = page_size
        #: host key -> (resourceVersion, managed labels) as last read
        self._seen: dict[str, tuple[str, dict[str, str]]] = {}

    @classmethod
    def from_kubeconfig(cls, path: str | os.PathLike[str], context: str | None = None,
                        namespace: str | None = None, *, timeout: float = 10.0, **options: Any) -> KubernetesProvider:
        """A provider for `context` (default: current-context) of the kubeconfig at `path`
        (see `KubeAPI.from_kubeconfig`: what the official loader reads; never written back)."""
        try:
            api = KubeAPI.from_kubeconfig(path, context, timeout=timeout)
        except KubeAPIError as err:
            raise SIPError(str(err)) from None
        return cls(api, namespace, **options)

    # -- calls

    def _call(self, what: str, method: str, path: str, body: Any = None, **kwargs: Any) -> dict:
        """The answer (a JSON object). An HTTP error stays a KubeAPIError (status, details); no answer is a SIPError."""
        try:
            return _mapping(self.api.request(method, path, body, **kwargs), what)
        except KubeAPIError as err:
            if err.status:
                raise
            raise SIPError(f"{what}: cannot reach the management cluster at {self.server}: {err.details}") from None

    @staticmethod
    def _fail(what: str, err: KubeAPIError) -> SIPError:
        return SIPError(" ".join(f"{what}: HTTP {err.status}: {err.details or 'no details'}".split()))

    def _remember(self, obj: dict) -> BareMetalHost:
        host = host_from_object(obj, self.server)
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if not isinstance(rv, str) or not rv:
            raise SIPError(f"{self.server}: BareMetalHost {host_key(host)} has no resourceVersion")
        self._seen[host_key(host)] = (rv, _managed(host.labels))
        return host

    @staticmethod
    def _path(key: str) -> str:
        namespace, name = key.split("/", 1)
        return f"{API}/namespaces/{quote(namespace)}/{PLURAL}/{quote(name)}"

    # -- provider

    def list_hosts(self) -> list[BareMetalHost]:
        where = f"namespace {self.namespace}" if self.namespace else "all namespaces"
        what = f"listing BareMetalHosts ({where}) at {self.server}"
        path = f"{API}/namespaces/{quote(self.namespace)}/{PLURAL}" if self.namespace else f"{API}/{PLURAL}"
        hosts: list[BareMetalHost] = []
        token: str | None = None
        while True:
            query = {"limit": str(self.page_size), **({"continue": token} if token else {})}
            try:
                body = self._call(what, "GET", path, query=query)
            except KubeAPIError as err:
                raise self._fail(what, err) from None
            items = body.get("items")
            if not isinstance(items, list):
                raise SIPError(f"{what}: the answer has no items list")
            hosts.extend(self._remember(item) for item in items)
            token = (body.get("metadata") or {}).get("continue") or None
            if not token:
                return sorted(hosts, key=host_key)

    def _get(self, key: str) -> None:
        what = f"reading BareMetalHost {key}"
        try:
            self._remember(self._call(what, "GET", self._path(key)))
        except KubeAPIError as err:
            raise self._fail(what, err) from None

    def apply_labels(self, changes: Sequence[LabelChange]) -> None:
        for change in changes:
            self._apply(change)

    def _apply(self, change: LabelChange) -> None:
        key = change.host
        if key not in self._seen:
            self._get(key)
        what = f"labeling BareMetalHost {key} ({change.reason})"
        planned_over = self._seen[key][1]
        labels: dict[str, str | None] = {label: None for label in change.remove}
        labels.update(change.set)
        for _attempt in range(self.retries + 1):
            patch = {"metadata": {"resourceVersion": self._seen[key][0], "labels": labels}}
            try:
                self._remember(self._call(what, "PATCH", self._path(key), patch, content_type=MERGE_PATCH))
                return
            except KubeAPIError as err:
                if err.status != 409:
                    raise self._fail(what, err) from None
            self._get(key)  # stale: read again, and retry only if nobody touched the SIP labels
            now = self._seen[key][1]
            if now != planned_over:
                raise SIPError(f"BareMetalHost {key}: its SIP labels changed while labeling "
                               f"(planned over {planned_over}, now {now}); plan again")
        raise SIPError(f"BareMetalHost {key}: still conflicting after {self.retries} retries "
                       "(resourceVersion keeps changing); try again later")


def _mapping(value: Any, what: str) -> dict:
    if not isinstance(value, dict):
        raise SIPError(f"{what}: the server answered with something that is not a JSON object")
    return value


def _managed(labels: Mapping[str, str]) -> dict[str, str]:
    return {k: labels[k] for k in sorted(labels) if k in MANAGED_LABELS}
