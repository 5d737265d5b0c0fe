"""Kubernetes version changes (pure): one minor version at a time, never down.

The version a cluster runs is read from its running API servers' image tags
(`...:v1.37.2`); a tag that is not a version (a digest, a custom name) is not
checked. An upgrade then rolls in the supported order (see `Action.sort_key`):
every etcd member, then the API servers, controller-managers and schedulers,
one at a time, each gated on health.
"""
from __future__ import annotations

import functools
import json
import re

from gitops.errors import GitopsError
from gitops.model import versions
from gitops.model.components import APISERVER, ETCD
from gitops.model.resources import RepoModel
from gitops.observe.types import ObservedState

_TAG = re.compile(r":v?(\d+)\.(\d+)\.(\d+)(?:[-+][^/]*)?$")


class VersionSkew(GitopsError):
    """The repo asks for a version change Kubernetes does not support."""


def running_minors(observed: ObservedState, component: str = APISERVER) -> dict[str, set[tuple[int, int]]]:
    """(major, minor) of every running `component` (kube-apiserver, etcd), by cluster."""
    out: dict[str, set[tuple[int, int]]] = {}
    for pod in observed.pods():
        container = pod.running(component)
        minor = _minor(container.spec) if container is not None and container.spec is not None else None
        if minor is not None:
            out.setdefault(pod.cluster, set()).add(minor)
    return out


@functools.lru_cache(maxsize=1 << 16)
def _minor(spec: str) -> tuple[int, int] | None:
    """(major, minor) of the image in a container's spec annotation (decoded once per content)."""
    try:
        inputs = json.loads(spec)
    except ValueError:
        return None
    image = str(((inputs if isinstance(inputs, dict) else {}).get("container") or {}).get("image", ""))
    match = _TAG.search(image)
    return (int(match[1]), int(match[2])) if match else None


def _step(running: set[tuple[int, int]], want: tuple[int, int]) -> str | None:
    """How `want` (major, minor) steps from the running minors: "skip" (another major, or more than one minor
    past the oldest running), "down" (behind the newest running), or None (the same minor or the next)."""
    low, high = min(running), max(running)
    if want[0] != low[0] or want[1] > low[1] + 1:
        return "skip"
    return "down" if want < high else None


def version_problems(model: RepoModel, observed: ObservedState) -> list[str]:
    problems = []
    running = running_minors(observed)
    for name, cluster in sorted(model.clusters.items()):
        if not running.get(name):
            continue
        step = _step(running[name], versions.parse(cluster.kubernetes_version)[:2])
        low = min(running[name])
        have = ", ".join(f"v{a}.{b}" for a, b in sorted(running[name]))
        asks = f"{_at(cluster.version_at)}Cluster {name} runs {have} and the repo asks for {cluster.kubernetes_version}"
        if step == "skip":
            problems.append(f"{asks}: upgrade one minor version at a time (v{low[0]}.{low[1] + 1} first)")
        elif step == "down":
            problems.append(f"{asks}: Kubernetes does not support downgrading a minor version")
    problems += _etcd_problems(model, observed)
    problems += _worker_problems(model, observed)
    return problems


def _worker_problems(model: RepoModel, observed: ObservedState) -> list[str]:
    """The cluster's joined kubelets (its Nodes, as its API reports them) against the version the repo asks
    for: never older than the kubelets, at most KUBELET_MAX_SKEW minors newer. A kubelet that reports no
    version (or an unreadable one) is not checked."""
    problems = []
    for name, cluster in sorted(model.clusters.items()):
        seen = observed.clusters.get(name)
        for worker in sorted(seen.workers if seen is not None else (), key=lambda w: w.name):
            if versions.release_of(worker.kubelet_version) is None:
                continue
            why = versions.kubelet_skew_problem(worker.name, worker.kubelet_version, cluster.kubernetes_version)
            if why:
                problems.append(f"{_at(cluster.version_at)}Cluster {name} asks for {cluster.kubernetes_version}: "
                                f"{why}")
    return problems


def _at(where: str) -> str:
    return f"{where}: " if where else ""


def _etcd_problems(model: RepoModel, observed: ObservedState) -> list[str]:
    """etcd moves one minor at a time too (3.6 -> 3.7; 3.5 -> 3.7 crash-loops) and never back: its data
    directory is upgraded by the newer minor, so a minor change needs a snapshot taken first (spec.backup:
    the plan takes one before the first member changes)."""
    problems = []
    running = running_minors(observed, ETCD)
    for name, cluster in sorted(model.clusters.items()):
        match = _TAG.search(cluster.image(ETCD))
        if not running.get(name) or not match:
            continue
        want = (int(match[1]), int(match[2]))
        step = _step(running[name], want)
        low = min(running[name])
        asks = f"{_at(cluster.etcd_version_at)}Cluster {name} runs etcd " \
               f"{', '.join(f'{a}.{b}' for a, b in sorted(running[name]))} and the repo asks for etcd {want[0]}.{want[1]}"
        if step == "skip":
            problems.append(f"{asks}: upgrade etcd one minor version at a time ({low[0]}.{low[1] + 1} first)")
        elif step == "down":
            problems.append(f"{asks}: etcd does not support downgrading a minor version")
        elif want > max(running[name]) and cluster.backup is None:
            problems.append(f"{asks}: a new etcd minor version rewrites its data and cannot be undone, so a snapshot "
                            "is taken first: give the Cluster spec.backup (a target of the repo's spec.backup.targets)")
    return problems


def check_versions(model: RepoModel, observed: ObservedState) -> None:
    problems = version_problems(model, observed)
    if problems:
        raise VersionSkew("; ".join(problems))
