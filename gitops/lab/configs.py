"""containerd's config for the lab's runtimes: a hypervisor's own (`gitops.hypervisor.configs`) with every path under
the lab runtime's directory, so several coexist on one host. (Each front's config is written by `gitops hypervisor
init`, run on the lab machine.)"""
from __future__ import annotations

from pathlib import Path

from gitops.hypervisor.configs import ContainerdPaths, containerd_config as _containerd_config


def containerd_config(hv_dir: Path, ip: str, sandbox_image: str) -> str:
    """containerd's config for the lab runtime in `hv_dir` (root, state, sockets, opt and runc's roots there)."""
    return _containerd_config(ContainerdPaths.under(hv_dir), ip, sandbox_image)
