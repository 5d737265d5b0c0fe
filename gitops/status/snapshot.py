"""The observed snapshot on the status branch: one compact JSON file per cluster (pure).

`observed/clusters/<cluster>.json` holds the pods labeled with that cluster and
what its API holds (`api`, see `gitops.observe.clusters`); `observed/hypervisors.json`
holds each hypervisor's reachability, the pods and cluster APIs whose cluster name is
not a usable file name, and the listed BareMetalHosts. Every
file is sorted, compact JSON, so a status commit rewrites only the clusters whose
pods changed. A container's spec is its spec annotation, verbatim (JSON text).
"""
from __future__ import annotations

import hashlib
import json
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import asdict, fields
from typing import Any

from gitops.errors import GitopsError
from gitops.model.resources import BareMetalHost
from gitops.observe.types import ObservedCluster, ObservedContainer, ObservedHypervisor, ObservedPod, ObservedState
from gitops.plan.converged import blob_id
from gitops.plan.upkeep import upkeep_facts
from gitops.pods import NodeFiles

OBSERVED_DIR = "observed"
HYPERVISORS = f"{OBSERVED_DIR}/hypervisors.json"
CLUSTERS_DIR = f"{OBSERVED_DIR}/clusters"
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_POD_FIELDS = tuple(f.name for f in fields(ObservedPod) if f.name not in ("containers", "files"))
_CONTAINER_FIELDS = tuple(f.name for f in fields(ObservedContainer))


def cluster_path(cluster: str) -> str:
    """`observed/clusters/<cluster>.json`."""
    return f"{CLUSTERS_DIR}/{cluster}.json"


def compact(data: Any) -> bytes:
    return (json.dumps(data, sort_keys=True, separators=(",", ":")) + "\n").encode()


def _pod_key(pod: ObservedPod) -> tuple:
    return pod.hypervisor, pod.node, pod.created_at, pod.sandbox_id


def snapshot_files(observed: ObservedState) -> dict[str, bytes]:
    """The snapshot's files, by path."""
    by_cluster: dict[str, list[ObservedPod]] = {}
    loose: list[ObservedPod] = []
    for pod in observed.pods():
        (by_cluster.setdefault(pod.cluster, []) if _NAME.match(pod.cluster) else loose).append(pod)
    apis = {n: c for n, c in observed.clusters.items() if _NAME.match(n)}
    top: dict[str, Any] = {
        "hypervisors": {n: {"name": hv.name, "reachable": hv.reachable, "error": hv.error}
                        for n, hv in sorted(observed.hypervisors.items())},
        "pods": [pod_dict(p) for p in sorted(loose, key=_pod_key)],
    }
    if observed.hosts is not None:
        top["bareMetalHosts"] = [asdict(h) for h in observed.hosts]
    others = {n: c.to_dict() for n, c in sorted(observed.clusters.items()) if n not in apis}
    if others:
        top["clusters"] = others
    out = {HYPERVISORS: compact(top)}
    for cluster in sorted(by_cluster.keys() | apis.keys()):
        out[cluster_path(cluster)] = cluster_file(cluster, by_cluster.get(cluster, ()), apis.get(cluster))
    return out


def cluster_file(cluster: str, pods: Iterable[ObservedPod], api: ObservedCluster | None = None) -> bytes:
    """`observed/clusters/<cluster>.json`: the cluster's pods, sorted, and what its API holds."""
    data: dict[str, Any] = {"cluster": cluster, "pods": [pod_dict(p) for p in sorted(pods, key=_pod_key)]}
    if api is not None:
        data["api"] = api.to_dict()
    return compact(data)


def pod_dict(pod: ObservedPod) -> dict[str, Any]:
    data: dict[str, Any] = {name: getattr(pod, name) for name in _POD_FIELDS}
    data["containers"] = [{name: getattr(c, name) for name in _CONTAINER_FIELDS} for c in pod.containers]
    files = pod.files
    data["files"] = None if files is None else {
        "digests": files.digests, "certificates": files.certificates, "keys": list(files.keys),
        "public_keys": files.public_keys}
    return data


def _interned(mapping: dict[str, str]) -> dict[str, str]:
    return {sys.intern(k): sys.intern(v) if len(v) < 64 else v for k, v in mapping.items()}


def pod_from_dict(data: dict[str, Any]) -> ObservedPod:
    """A pod as `pod_dict` wrote it (or as the whole-snapshot form did); names and digests interned."""
    intern = sys.intern
    files = data.get("files")
    return ObservedPod(
        **{k: intern(v) if isinstance(v, str) and k != "sandbox_id" else v
           for k, v in data.items() if k not in ("containers", "files")},
        containers=tuple(ObservedContainer(c["id"], intern(c["component"]), intern(c["state"]),
                                           intern(c["spec_hash"]), c["created_at"], c.get("spec"),
                                           c.get("certificates"))
                         for c in data.get("containers", [])),
        files=None if files is None else NodeFiles(
            _interned(files["digests"]), {intern(k): v for k, v in files["certificates"].items()},
            tuple(map(intern, files["keys"])), _interned(files["public_keys"])),
    )


def load_snapshot(read: Callable[[str], bytes | None], cluster_files: Iterable[str] = (),
                  contents: Iterable[bytes | None] | None = None) -> ObservedState:
    """The snapshot from `read(path)` and the names of the files under `observed/clusters/` (or, given
    `contents`, those files' contents, as they come). Each file is parsed and turned into pods before
    the next is read: no whole-snapshot text is held."""
    raw = read(HYPERVISORS)
    if raw is None:
        raise GitopsError(f"no {HYPERVISORS}")
    top = json.loads(raw)
    pods: dict[str, list[ObservedPod]] = {name: [] for name in top.get("hypervisors", {})}
    loaded = [pod_from_dict(p) for p in top.get("pods", [])]
    apis = {n: ObservedCluster.from_dict(c) for n, c in top.get("clusters", {}).items()}
    if contents is None:
        contents = (read(f"{CLUSTERS_DIR}/{name}") for name in sorted(cluster_files) if name.endswith(".json"))
    for data in contents:
        if data is not None:
            part = json.loads(data)
            loaded.extend(pod_from_dict(p) for p in part.get("pods", []))
            if part.get("api") is not None:
                apis[part["cluster"]] = ObservedCluster.from_dict(part["api"])
    for pod in loaded:
        if pod.hypervisor not in pods:
            raise GitopsError(f"observed snapshot: pod {pod.node} is on {pod.hypervisor}, which "
                              f"{HYPERVISORS} does not list")
        pods[pod.hypervisor].append(pod)
    hypervisors = {name: ObservedHypervisor(hv["name"], hv["reachable"], hv.get("error", ""),
                                            tuple(sorted(pods[name], key=lambda p: _pod_key(p)[1:])))
                   for name, hv in sorted(top.get("hypervisors", {}).items())}
    hosts = top.get("bareMetalHosts")
    return ObservedState(hypervisors, tuple(BareMetalHost(**h) for h in hosts) if hosts is not None else None,
                         dict(sorted(apis.items())))


def live_fingerprints(observed: ObservedState) -> dict[str, str]:
    """Per cluster, a fingerprint of everything a plan reads of its live observation: its snapshot file's
    git blob id (its pods and API objects), the facts its etcd upkeep decides on, its snapshots listing.
    What a local state dir's `converged.json` records (`gitops plan` with a live observation)."""
    by_cluster: dict[str, list[ObservedPod]] = {}
    for pod in observed.pods():
        by_cluster.setdefault(pod.cluster, []).append(pod)
    out = {}
    for cluster in sorted(by_cluster.keys() | observed.clusters.keys() | observed.etcd.keys()
                          | observed.snapshots.keys()):
        listing = observed.snapshots.get(cluster)
        text = "\n".join([blob_id(cluster_file(cluster, by_cluster.get(cluster, ()), observed.clusters.get(cluster))),
                          repr(upkeep_facts(observed.etcd.get(cluster))),
                          repr(listing.to_dict() if listing is not None else None)])
        out[cluster] = hashlib.sha256(text.encode()).hexdigest()
    return out
