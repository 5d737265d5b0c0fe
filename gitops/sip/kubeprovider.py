"""The `kubernetes` BareMetalHost provider: metal3.io/v1alpha1 BareMetalHosts of a management
cluster reached with a kubeconfig (client certificate or bearer token).

Labels are changed with JSON merge patches carrying ``metadata.resourceVersion``, so a stale
write gets 409 Conflict; the host is then read again and the patch retried (up to `retries`
times) unless someone else changed its SIP labels meanwhile. Talks through `gitops.kubeapi`
(the official client's kubeconfig loading, TLS, auth); tested against a real kube-apiserver
v1.37 with deploy/crds/metal3.io_baremetalhosts.yaml.
"""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar
from urllib.parse import quote

from gitops.kubeapi import MERGE_PATCH, KubeAPI, KubeAPIError
from gitops.model.config import BareMetalSource
from gitops.model.resources import BareMetalHost, RepoModel
from gitops.sip import SIPError
from gitops.sip.hosts import host_from_object
from gitops.sip.selection import MANAGED_LABELS, LabelChange, host_key
from gitops.state.records import State

API = "/apis/metal3.io/v1alpha1"
PLURAL = "baremetalhosts"


class KubernetesProvider:
    """BareMetalHosts of a management cluster, labeled with resourceVersion-guarded merge patches."""

    #: the hosts live in the management cluster: listed while observing
    observed: ClassVar[bool] = True

    def __init__(self, api: KubeAPI, namespace: str | None = None, *, retries: int = 5, page_size: int = 500):
        self.api = api
        self.server = api.server
        self.namespace = namespace
        self.retries = retries
        self.page_size = page_size
        #: host key -> (resourceVersion, managed labels) as last read
        self._seen: dict[str, tuple[str, dict[str, str]]] = {}

    @classmethod
    def configured(cls, model: RepoModel, source: BareMetalSource, state: State) -> KubernetesProvider:
        """The management cluster of `source`'s kubeconfig (the schema requires one), in its namespace."""
        assert source.kubeconfig is not None  # the schema requires it
        return cls.from_kubeconfig(source.kubeconfig, namespace=source.namespace)

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

    def record(self, state: State) -> None:
        """Nothing: the labels live on the hosts themselves."""

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
