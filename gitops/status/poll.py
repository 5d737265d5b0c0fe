"""What a controller poll may skip (pure bookkeeping, no I/O).

A pod's node files are read through an ExecSync into its files agent, the costly
part of observing. `NodeFilesCache` reuses what was read while the pod's CRI
listing (sandbox, containers, their states and spec hashes) is unchanged, and
reads them again once `interval` seconds passed (drift nobody committed).
`live_fingerprint` digests an observation, so a poll whose commit and live state
match the last converged reconcile can stop there: nothing compiled, verified,
planned or committed.
"""
from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from gitops.observe.types import ObservedPod, ObservedState
from gitops.plan.upkeep import fragmented
from gitops.pods import NodeFiles


def pod_listing(pod: ObservedPod) -> str:
    """What the CRI lists for a pod without entering it: sandbox, readiness, spec hash, containers."""
    return repr((pod.sandbox_id, pod.ready, pod.spec_hash,
                 tuple((c.id, c.component, c.state, c.spec_hash) for c in pod.containers)))


@dataclass(frozen=True)
class _Read:
    listing: str
    files: NodeFiles
    at: float
    digest: str


class NodeFilesCache:
    """Node files by pod (hypervisor, sandbox), each with the listing it was read under and when."""

    def __init__(self, interval: float, clock: Callable[[], float] = time.monotonic):
        self.interval = interval
        self.clock = clock
        self._reads: dict[tuple[str, str], _Read] = {}
        self._by_files: dict[int, _Read] = {}  # id(files) -> its read (the read holds the files alive)
        self._lock = threading.Lock()
        self.reused = 0

    def reuse(self, pod: ObservedPod) -> NodeFiles | None:
        """The files read earlier, while the pod's listing is unchanged and they are recent enough."""
        with self._lock:
            read = self._reads.get((pod.hypervisor, pod.sandbox_id))
            if read is None or read.listing != pod_listing(pod) or self.clock() - read.at >= self.interval:
                return None
            self.reused += 1
            return read.files

    def remember(self, observed: ObservedState) -> None:
        """Keep the files of `observed` (only these pods): read now, or reused (keeping their read time)."""
        now = self.clock()
        with self._lock:
            reads = {}
            for pod in observed.pods():
                if pod.files is None:
                    continue
                key = (pod.hypervisor, pod.sandbox_id)
                old = self._reads.get(key)
                if old is not None and old.files is pod.files:
                    reads[key] = _Read(pod_listing(pod), pod.files, old.at, old.digest)
                else:
                    reads[key] = _Read(pod_listing(pod), pod.files, now, _files_digest(pod.files))
            self._reads = reads
            self._by_files = {id(read.files): read for read in reads.values()}

    def files_digest(self, files: NodeFiles) -> str:
        """A digest of `files`, taken once for files this cache holds."""
        with self._lock:
            read = self._by_files.get(id(files))
        return read.digest if read is not None and read.files is files else _files_digest(files)

    def forget(self) -> None:
        with self._lock:
            self._reads, self._by_files = {}, {}


def _files_digest(files: NodeFiles) -> str:
    return hashlib.sha256(repr(files).encode()).hexdigest()


def live_fingerprint(observed: ObservedState, files_digest: Callable[[NodeFiles], str] = _files_digest) -> str:
    """A digest of everything an observation says: reachability, pods, containers, node files, hosts,
    what each cluster's API holds, what its etcd's upkeep would do."""
    h = hashlib.sha256()
    for name, hv in sorted(observed.hypervisors.items()):
        h.update(repr((name, hv.reachable, hv.error)).encode())
        for pod in hv.pods:
            files = "-" if pod.files is None else files_digest(pod.files)
            h.update(repr((pod.node, pod.cluster, pod.role, pod.created_at, pod_listing(pod), files,
                           tuple(c.created_at for c in pod.containers))).encode())
    h.update(repr(observed.hosts).encode())
    h.update(repr([c.to_dict() for _, c in sorted(observed.clusters.items())]).encode())
    h.update(repr(upkeep_signature(observed)).encode())
    return h.hexdigest()


def upkeep_signature(observed: ObservedState) -> list[tuple]:
    """What of etcd's space the plan acts on (which members answered, which are fragmented, the alarms),
    not the sizes themselves: they change with every write."""
    return [(name, tuple((m.node, bool(m.error), fragmented(m.db_size, m.db_in_use, etcd.quota))
                         for m in etcd.members), etcd.alarms) for name, etcd in sorted(observed.etcd.items())]
