"""The real Kubernetes binaries `scripts/build-kubernetes.sh` builds and caches.

Only one version can be built on these machines (Debian's `kubernetes` source
package): `BUILT_VERSION`. The cache lives outside the work tree,
``$GITOPS_KUBE_CACHE/<version>/`` (default ``~/.cache/gitops/kubernetes``).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from gitops.lab.errors import LabError

if TYPE_CHECKING:
    from gitops.lab.images import ImageRecipe

BUILT_VERSION = "v1.20.2"
#: the control-plane components gitops runs as CRI containers
CONTROL_PLANE = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
BUILD_HINT = "bash scripts/build-kubernetes.sh (about 5-7 minutes once; scripts/install-deps.sh runs it)"


def cache_root() -> Path:
    return Path(os.environ.get("GITOPS_KUBE_CACHE") or Path.home() / ".cache" / "gitops" / "kubernetes")


def buildable(version: str) -> bool:
    """Whether real binaries of `version` ("v1.20.2") can exist on this machine."""
    return version == BUILT_VERSION


def binary(name: str, version: str = BUILT_VERSION) -> Path:
    """The cached binary `name` of `version`; LabError naming the build step when it is missing."""
    path = cache_root() / version / name
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise LabError(f"real Kubernetes {version} binary {name} not found in {path.parent}: run {BUILD_HINT}")
    return path


def kubectl() -> Path:
    """The cached kubectl built with the control plane (works on any fresh machine)."""
    return binary("kubectl")


def real_recipe(component: str, version: str = BUILT_VERSION) -> ImageRecipe:
    """`gitops.lab/<component>:<version>`: the cached real binary as /usr/local/bin/<component>.

    Like the upstream images, there is no entrypoint: gitops's container specs name the command.
    """
    from gitops.lab.images import ImageRecipe

    target = f"/usr/local/bin/{component}"
    return ImageRecipe(
        component, version, (), (target,), installs=((str(binary(component, version)), target),),
        dirs=("var/run/kubernetes",),
        labels=(("org.opencontainers.image.description", f"{component} {version} (real, built from Debian's "
                                                          f"kubernetes source package)"),))
