"""The Kubernetes versions gitops compiles control planes for, and the etcd each runs on.

One declaration (`RELEASES`): per supported minor, the patch release gitops builds and tests
(`scripts/build-kubernetes.sh` reads its list from here: `python3 gitops/model/versions.py`) and the
etcd that upstream kubeadm of that minor pairs with (cmd/kubeadm/app/constants: DefaultEtcdVersion).
Flags differ between versions, so a version outside the supported range is a validation error rather
than a guess. This module imports nothing of gitops: the build script runs it as a file.
"""
from __future__ import annotations

import re

import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Release:
    """A supported minor: the patch release built and tested, and the etcd kubeadm pairs with it."""

    kubernetes: str  # "1.37.2"
    etcd: str  # "3.7.3": the newest patch the Go module proxy serves of kubeadm's etcd minor


#: minor -> release; kubeadm v1.35.4 and v1.36.3 pair their minor with etcd 3.6, v1.37.2 with 3.7
RELEASES: dict[int, Release] = {
    35: Release("1.35.4", "3.6.16"),
    36: Release("1.36.3", "3.6.16"),
    37: Release("1.37.2", "3.7.3"),
}
#: oldest and newest supported minor versions of Kubernetes 1.x
#: the container runtime gitops builds from its module (github.com/containerd/containerd/v2, newest patch the
#: proxy serves; containerd 1.6 is out of support since 2025-08, 1.7 since 2026-09)
CONTAINERD = "2.4.2"
MIN_MINOR = min(RELEASES)
MAX_MINOR = max(RELEASES)
#: the version a Cluster of the example repo and a lab without other wishes run
DEFAULT_KUBERNETES = RELEASES[MAX_MINOR].kubernetes
DEFAULT_ETCD = RELEASES[MAX_MINOR].etcd
#: version skew (kubernetes.io/releases/version-skew-policy): a kubelet may be this many minors older
#: than the oldest API server, and never newer
KUBELET_MAX_SKEW = 3


def parse(version: str) -> tuple[int, int, int]:
    """"v1.37.2" or "1.37.2" -> (1, 37, 2); ValueError otherwise."""
    parts = version.strip().removeprefix("v").split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"not a Kubernetes version (want MAJOR.MINOR.PATCH): {version!r}")
    major, minor, patch = (int(p) for p in parts)
    return major, minor, patch


def minor(version: str) -> int:
    """The minor version of a supported 1.x version."""
    return parse(version)[1]


def supported_range() -> str:
    return f"1.{MIN_MINOR}.0 to 1.{MAX_MINOR}.x"


def problem(version: str) -> str | None:
    """Why `version` is not supported, or None if it is."""
    try:
        major, minor_, _ = parse(version)
    except ValueError as err:
        return str(err)
    if major != 1 or not MIN_MINOR <= minor_ <= MAX_MINOR:
        return f"Kubernetes {version.removeprefix('v')} is not supported: gitops supports {supported_range()}"
    return None


def release_of(reported: str) -> str | None:
    """The MAJOR.MINOR.PATCH a component reports (`v1.37.2`, `v1.30.4+k3s1`, `v1.29.3-eks-1`), None when it
    reports none readable."""
    found = _REPORTED.fullmatch(reported.strip())
    return ".".join(found.groups()) if found else None


_REPORTED = re.compile(r"v?(\d+)\.(\d+)\.(\d+)(?:[-+].*)?")


def kubelet_skew_problem(node: str, kubelet: str, apiserver: str) -> str | None:
    """Why a kubelet of version `kubelet` on `node` may not join API servers of version `apiserver` (the
    version-skew policy: never newer, at most KUBELET_MAX_SKEW minors older), or None if it may."""
    try:
        k_major, k_minor, _ = parse(release_of(kubelet) or kubelet)  # (a distribution's suffix: +k3s1, -eks-1)
        a_major, a_minor, _ = parse(apiserver)
    except ValueError as err:
        return f"node {node}: {err}"
    if (k_major, k_minor) > (a_major, a_minor):
        return (f"node {node}: kubelet {kubelet} is newer than the cluster's API server {apiserver}: the "
                "version-skew policy never allows a kubelet newer than the API server (upgrade the control "
                "plane first)")
    if k_major != a_major or a_minor - k_minor > KUBELET_MAX_SKEW:
        return (f"node {node}: kubelet {kubelet} is more than {KUBELET_MAX_SKEW} minor versions older than the "
                f"cluster's API server {apiserver}: the version-skew policy does not allow it")
    return None


def etcd_for(version: str) -> str:
    """The etcd version ("3.7.3") a Cluster of Kubernetes `version` runs unless it names one; for a version
    outside the supported range (a validation error of its own) the newest release's."""
    try:
        return RELEASES.get(minor(version), RELEASES[MAX_MINOR]).etcd
    except ValueError:
        return DEFAULT_ETCD


def built() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The Kubernetes and etcd versions gitops builds ("v1.35.4", ...; "v3.6.16", ...), oldest first."""
    kube = tuple(f"v{r.kubernetes}" for _, r in sorted(RELEASES.items()))
    etcd = tuple(dict.fromkeys(f"v{r.etcd}" for _, r in sorted(RELEASES.items())))
    return kube, etcd


if __name__ == "__main__":  # for scripts/build-kubernetes.sh: "kubernetes v1.35.4 ...", "etcd v3.6.16 ...", "containerd v2.4.2"
    kube_built, etcd_built = built()
    sys.stdout.write(f"kubernetes {' '.join(kube_built)}\netcd {' '.join(etcd_built)}\ncontainerd v{CONTAINERD}\n")
