"""Live state inside each cluster's own API: gitops's bootstrap objects, joined nodes,
and certificate requests waiting for gitops to sign them. Reads only; what it reports is
`gitops.observe.types`."""
from __future__ import annotations

import base64
import hashlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gitops.apipaths import COLLECTIONS, CSRS
from gitops.kubeapi import Credentials, KubeAPI, KubeAPIError, node_ready
from gitops.observe.types import ClusterTarget, ObservedCluster, ObservedCSR, ObservedWorker
from gitops.pods import MANAGED, MANAGER, SPEC_HASH

log = logging.getLogger(__name__)

#: answers that say "not now": too many requests, or a moment without an etcd leader (an election under load),
#: which every API server of the cluster answers at once
BUSY = frozenset({429, 500, 502, 503, 504})
#: seconds before a cluster none of whose API servers answered, one of them busy, is asked again (once)
BUSY_RETRY = 1.0


def observe_cluster(target: ClusterTarget, timeout: float = 5.0) -> ObservedCluster:
    """The first API server that answers tells (see `ask`)."""
    return ask(target, lambda server: _observe(target, server, timeout))


def ask(target: ClusterTarget, read: Callable[[str], ObservedCluster],
        failed: Callable[[str], None] = lambda server: None) -> ObservedCluster:
    """The first of the cluster's API servers that answers (`read` of it) tells. When none does but one said it is
    busy (`BUSY`), they are asked once more BUSY_RETRY seconds later; then the cluster is unreachable (with why).
    `failed` hears each server that did not answer."""
    errors: list[str] = []
    for attempt in (1, 2):
        errors, busy = [], False
        for server in target.servers:
            try:
                return read(server)
            except KubeAPIError as err:
                errors.append(str(err))
                busy = busy or err.status in BUSY
            except (OSError, KeyError, TypeError, ValueError) as err:  # an odd answer is one cluster's problem
                errors.append(f"{server}: unexpected answer: {type(err).__name__}: {err}")
            failed(server)
        if not busy or attempt == 2:
            break
        log.info("cluster API busy, asked again in %gs: %s", BUSY_RETRY, "; ".join(errors))
        time.sleep(BUSY_RETRY)
    log.info("cluster API unreachable: %s", "; ".join(errors))
    return ObservedCluster(target.cluster, reachable=False, error="; ".join(errors))


def _observe(target: ClusterTarget, server: str, timeout: float) -> ObservedCluster:
    with KubeAPI(server, target.ca_pem, Credentials(target.cert_pem, target.key_pem), timeout=timeout) as api:
        return _cluster(target.cluster, _managed_objects(api), api)


def _managed_objects(api: KubeAPI) -> dict[str, str]:
    """gitops's objects in the cluster (collection/name) and their spec-hash annotations, sorted."""
    objects: dict[str, str] = {}
    for collection in COLLECTIONS:
        for item in api.list(collection, f"{MANAGED}={MANAGER}"):
            meta = item.get("metadata") or {}
            objects[f"{collection}/{meta.get('name')}"] = (meta.get("annotations") or {}).get(SPEC_HASH, "")
    return dict(sorted(objects.items()))


def _cluster(name: str, objects: dict[str, str], api: KubeAPI) -> ObservedCluster:
    """`objects` with the cluster's nodes and pending certificate requests, read now."""
    workers = tuple(sorted((_worker(n) for n in api.list("/api/v1/nodes")), key=lambda w: w.name))
    csrs = tuple(sorted(filter(None, (_pending(c) for c in api.list(CSRS))), key=lambda c: c.name))
    return ObservedCluster(name, True, objects=objects, workers=workers, pending_csrs=csrs)


def observe_clusters(targets: list[ClusterTarget], timeout: float = 5.0) -> dict[str, ObservedCluster]:
    """Every target in parallel (a few threads: each is a handful of short requests)."""
    if not targets:
        return {}
    with ThreadPoolExecutor(max_workers=min(8, len(targets))) as pool:
        found = list(pool.map(lambda t: observe_cluster(t, timeout), targets))
    return {o.name: o for o in sorted(found, key=lambda o: o.name)}


class ClusterReader:
    """Reads the clusters' APIs poll after poll (the controller's), as cheaply as freshness allows.

    One client per cluster, server and credentials stays open between reads, so its TLS connections
    are reused. Nodes and certificate requests (what a joining worker waits for) are read every
    time; gitops's own objects, whose only changes between applies are somebody's edits, are
    listed again once `objects_interval` seconds passed since `remember` or the last listing.
    """

    def __init__(self, objects_interval: float, timeout: float = 5.0,
                 clock: Callable[[], float] = time.monotonic):
        self.objects_interval = objects_interval
        self.timeout = timeout
        self.clock = clock
        self._clients: dict[tuple[str, str, str], KubeAPI] = {}
        self._objects: dict[str, tuple[float, dict[str, str]]] = {}  # cluster -> (listed at, objects)
        self._lock = threading.Lock()
        self.listed = 0  # how many times a cluster's objects were listed (not reused)

    def observe(self, targets: list[ClusterTarget]) -> dict[str, ObservedCluster]:
        """Every target in parallel; clients of servers no longer targeted are closed."""
        wanted = {self._key(t, s) for t in targets for s in t.servers}
        with self._lock:
            stale = [self._clients.pop(k) for k in list(self._clients) if k not in wanted]
        for api in stale:
            api.close()
        if not targets:
            return {}
        with ThreadPoolExecutor(max_workers=min(8, len(targets))) as pool:
            found = list(pool.map(self._observe_one, targets))
        return {o.name: o for o in sorted(found, key=lambda o: o.name)}

    def remember(self, observed: dict[str, ObservedCluster]) -> None:
        """Take the objects of a full observation (after an apply) as listed now."""
        now = self.clock()
        with self._lock:
            self._objects = {name: (now, dict(o.objects)) for name, o in observed.items() if o.reachable}

    def forget(self) -> None:
        with self._lock:
            self._objects = {}

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for api in clients:
            api.close()

    @staticmethod
    def _key(target: ClusterTarget, server: str) -> tuple[str, str, str]:
        credentials = hashlib.sha256("\0".join((target.ca_pem, target.cert_pem, target.key_pem)).encode())
        return target.cluster, server, credentials.hexdigest()

    def _observe_one(self, target: ClusterTarget) -> ObservedCluster:
        # a server that did not answer gets a new client (and connections) next time
        return ask(target, lambda server: self._read(target, server), lambda server: self._drop(target, server))

    def _read(self, target: ClusterTarget, server: str) -> ObservedCluster:
        key = self._key(target, server)
        with self._lock:
            api = self._clients.get(key)
            cached = self._objects.get(target.cluster)
        if api is None:
            api = KubeAPI(server, target.ca_pem, Credentials(target.cert_pem, target.key_pem), timeout=self.timeout)
            with self._lock:
                self._clients[key] = api
        if cached is None or self.clock() - cached[0] >= self.objects_interval:
            objects = _managed_objects(api)
            with self._lock:
                self._objects[target.cluster] = (self.clock(), objects)
                self.listed += 1
        else:
            objects = dict(cached[1])
        return _cluster(target.cluster, objects, api)

    def _drop(self, target: ClusterTarget, server: str) -> None:
        with self._lock:
            api = self._clients.pop(self._key(target, server), None)
        if api is not None:
            api.close()


def _worker(node: dict[str, Any]) -> ObservedWorker:
    status = node.get("status") or {}
    addresses = {a.get("type"): a.get("address") for a in status.get("addresses") or ()}
    return ObservedWorker(name=node["metadata"]["name"], ready=node_ready(node),
                          kubelet_version=(status.get("nodeInfo") or {}).get("kubeletVersion", ""),
                          address=addresses.get("InternalIP", ""))


def _pending(csr: dict[str, Any]) -> ObservedCSR | None:
    spec, status = csr.get("spec") or {}, csr.get("status") or {}
    conditions = {c.get("type") for c in status.get("conditions") or ()}
    if status.get("certificate") or "Denied" in conditions or "Failed" in conditions:
        return None
    try:
        request = base64.b64decode(spec.get("request", "")).decode()
    except ValueError:
        request = ""
    return ObservedCSR(name=csr["metadata"]["name"], uid=csr["metadata"].get("uid", ""),
                       signer=spec.get("signerName", ""), username=spec.get("username", ""),
                       groups=tuple(spec.get("groups") or ()), usages=tuple(spec.get("usages") or ()),
                       request=request, approved="Approved" in conditions)
