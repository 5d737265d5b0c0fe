"""Reading each cluster's etcd for its upkeep: every running member's database size and the space in
use, who leads, and the cluster's alarms (NOSPACE, CORRUPT), through etcd's v3 JSON gateway over
mutual TLS (`gitops.etcdclient`). Never raises: a member that does not answer says why."""
from __future__ import annotations

import json
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gitops.etcdclient import client_context
from gitops.hostport import host_port
from gitops.model.components import ETCD
from gitops.model.resources import RepoModel
from gitops.observe.types import EtcdMemberSpace, ObservedEtcd, ObservedState
from gitops.pki import CertKey
from gitops.state.records import State

TIMEOUT = 5.0


class EtcdReader:
    """The controller's: a cluster's etcd is read again once `interval` seconds passed since the last
    reading (space changes slowly), at once while it has an alarm or a member did not answer."""

    def __init__(self, interval: float = 300.0, clock: Callable[[], float] = time.monotonic):
        self.interval = interval
        self.clock = clock
        self._seen: dict[str, tuple[float, ObservedEtcd]] = {}
        self._lock = threading.Lock()

    def observe(self, model: RepoModel, state: State, observed: ObservedState) -> dict[str, ObservedEtcd]:
        now = self.clock()
        with self._lock:
            kept = {name: seen for name, (at, seen) in self._seen.items() if name in model.clusters
                    and now - at < self.interval and not seen.alarms and not any(m.error for m in seen.members)}
        fresh = observe_etcd(model, state, observed, skip=kept)
        self.remember(fresh, now)
        return {**kept, **fresh}

    def remember(self, seen: dict[str, ObservedEtcd], now: float | None = None) -> None:
        """Readings made elsewhere (the observation after an apply), as of now."""
        at = self.clock() if now is None else now
        with self._lock:
            self._seen.update((name, (at, etcd)) for name, etcd in seen.items())

    def forget(self) -> None:
        with self._lock:
            self._seen.clear()


def observe_etcd(model: RepoModel, state: State, observed: ObservedState,
                 skip: Iterable[str] = ()) -> dict[str, ObservedEtcd]:
    """Each cluster of `model` (but those in `skip`) with recorded members whose etcd container runs: its
    members' space and alarms."""
    skipped = set(skip)
    running: dict[str, set[str]] = {}
    for pod in observed.pods():
        if pod.running(ETCD) is not None:
            running.setdefault(pod.cluster, set()).add(pod.node)
    jobs = []
    for name in sorted(model.clusters):
        record = state.clusters.get(name)
        if record is None or "etcd" not in record.authorities or name not in running or name in skipped:
            continue
        urls = []
        for member in record.etcd_members:
            node = state.nodes.get(member)
            hv = model.hypervisors.get(node.hypervisor) if node is not None else None
            if member in running[name] and hv is not None and "etcd-client" in node.ports:
                urls.append((member, f"https://{host_port(hv.ip_address, node.ports['etcd-client'])}"))
        if urls:
            authority = record.authorities["etcd"]
            jobs.append((name, CertKey.from_pem(authority.cert_pem, authority.key_pem), record.trust_bundle("etcd"),
                         tuple(urls), model.clusters[name].etcd_quota))
    if not jobs:
        return {}
    with ThreadPoolExecutor(min(8, len(jobs))) as pool:
        return dict(pool.map(lambda job: (job[0], _cluster(*job[1:])), jobs))


def _cluster(ca: CertKey, trust: str, members: tuple[tuple[str, str], ...], quota: int | None = None) -> ObservedEtcd:
    context = client_context(ca, trust)
    spaces, ids = [], {}
    for node, url in members:
        try:
            status = _post(context, url, "/v3/maintenance/status", {})
        except _Unanswered as err:
            spaces.append(EtcdMemberSpace(node, url, error=str(err)))
            continue
        header = status.get("header", {})
        ids[str(header.get("member_id", ""))] = node
        size = int(status.get("dbSize", 0))
        spaces.append(EtcdMemberSpace(node, url, size, int(status.get("dbSizeInUse", size)),
                                      str(status.get("leader")) == str(header.get("member_id"))))
    alarms: list[tuple[str, str]] = []
    for space in spaces:
        if space.error:
            continue
        try:
            raw = _post(context, space.client_url, "/v3/maintenance/alarm", {"action": "GET"})
        except _Unanswered:
            continue
        for alarm in raw.get("alarms") or ():
            alarms.append((ids.get(str(alarm.get("memberID", "")), str(alarm.get("memberID", ""))),
                           str(alarm.get("alarm", ""))))
        break
    return ObservedEtcd(tuple(spaces), tuple(sorted(alarms)), quota)


class _Unanswered(Exception):
    pass


def _post(context: ssl.SSLContext, url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(f"{url}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT, context=context) as response:
            return json.loads(response.read(1 << 20) or b"{}")
    except urllib.error.HTTPError as err:
        raise _Unanswered(f"HTTP {err.code}") from None
    except (urllib.error.URLError, OSError, ValueError) as err:
        raise _Unanswered(str(getattr(err, "reason", err))) from None
