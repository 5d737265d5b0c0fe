"""The real Kubernetes and etcd binaries `scripts/build-kubernetes.sh` builds from their Go modules.

Every supported release (`gitops.model.versions.RELEASES`) is built: kube-apiserver,
kube-controller-manager, kube-scheduler, kubectl, kubelet and kube-proxy per Kubernetes version, etcd
and etcdctl per etcd version, and containerd 2.x. The cache lives outside the work tree,
``$GITOPS_KUBE_CACHE/<version>/``, ``etcd-<version>/`` and ``containerd-<version>/`` (default
``~/.cache/gitops/kubernetes``).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from gitops.lab.errors import LabError
from gitops.model import versions

if TYPE_CHECKING:
    from gitops.lab.images import ImageRecipe

KUBERNETES_BUILT, ETCD_BUILT = versions.built()
#: the newest supported release: what the lab, the example and a worker run unless told otherwise
DEFAULT_VERSION = f"v{versions.DEFAULT_KUBERNETES}"
#: the control-plane components gitops runs as CRI containers
CONTROL_PLANE = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
BUILD_HINT = "bash scripts/build-kubernetes.sh (scripts/install-deps.sh runs it; minutes once, then free)"


def cache_root() -> Path:
    return Path(os.environ.get("GITOPS_KUBE_CACHE") or Path.home() / ".cache" / "gitops" / "kubernetes")


def normalize(version: str) -> str:
    """"1.37.2" or "v1.37.2" -> "v1.37.2"; LabError unless it is MAJOR.MINOR.PATCH."""
    try:
        versions.parse(version)
    except ValueError as err:
        raise LabError(str(err)) from None
    return "v" + version.strip().removeprefix("v")


def buildable(version: str) -> bool:
    """Whether `version` ("v1.37.2") is one of the Kubernetes releases the build script builds."""
    return normalize(version) in KUBERNETES_BUILT


def _cached(directory: Path, name: str, what: str) -> Path:
    path = directory / name
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise LabError(f"{what} binary {name} not found in {directory}: run {BUILD_HINT}")
    return path


def binary(name: str, version: str = DEFAULT_VERSION) -> Path:
    """The cached binary `name` of Kubernetes `version`; LabError naming the build step when it is missing."""
    v = normalize(version)
    if v not in KUBERNETES_BUILT:
        raise LabError(f"Kubernetes {v} is not built here: gitops builds {', '.join(KUBERNETES_BUILT)}")
    return _cached(cache_root() / v, name, f"real Kubernetes {v}")


def etcd_program(name: str, etcd_version: str) -> Path:
    """The cached `etcd`, `etcdctl` or `etcdutl` of `etcd_version` ("3.7.3")."""
    v = "v" + etcd_version.strip().removeprefix("v")
    if v not in ETCD_BUILT:
        raise LabError(f"etcd {v} is not built here: gitops builds {', '.join(ETCD_BUILT)}")
    return _cached(cache_root() / f"etcd-{v}", name, f"real etcd {v}")


def containerd_program(name: str) -> Path:
    """The cached `containerd`, `ctr` or `containerd-shim-runc-v2` of containerd `versions.CONTAINERD`."""
    v = f"v{versions.CONTAINERD}"
    return _cached(cache_root() / f"containerd-{v}", name, f"containerd {v}")


def kubectl(version: str = DEFAULT_VERSION) -> Path:
    """The cached kubectl (of the newest release unless told: kubectl works within one minor either way)."""
    return binary("kubectl", version)


def real_recipe(component: str, version: str = DEFAULT_VERSION) -> ImageRecipe:
    """`gitops.lab/<component>:<version>`: the cached real binary as /usr/local/bin/<component>.

    Like the upstream images, there is no entrypoint: gitops's container specs name the command.
    """
    from gitops.lab.images import ImageRecipe

    target = f"/usr/local/bin/{component}"
    v = normalize(version)
    return ImageRecipe(
        component, v, (), (target,), installs=((str(binary(component, v)), target),),
        dirs=("var/run/kubernetes",),
        labels=(("org.opencontainers.image.description", f"{component} {v} (built from its Go module)"),))


def etcd_recipe(etcd_version: str) -> ImageRecipe:
    """`gitops.lab/etcd:<version>`: the cached etcd, etcdctl and etcdutl, as upstream's etcd images carry them
    (a restore runs `etcdutl snapshot restore` in it), entrypoint etcd."""
    from gitops.lab.images import ImageRecipe

    v = etcd_version.strip().removeprefix("v")
    return ImageRecipe(
        "etcd", v, (), ("/usr/local/bin/etcd",),
        installs=tuple((str(etcd_program(b, v)), f"/usr/local/bin/{b}") for b in ("etcd", "etcdctl", "etcdutl")),
        dirs=("var/lib/etcd",),
        labels=(("org.opencontainers.image.description", f"etcd {v} (built from its Go module)"),))
