"""What a hypervisor runs, as configuration files: containerd as gitops needs it, and its TLS-only CRI front.

Used by `gitops hypervisor init` on a real machine (Debian's paths) and by the lab (every path under
the lab hypervisor's directory, so several run on one host).
"""
from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

#: the sandbox image a hypervisor's pods start from (the lab imports its own under this name too)
DEFAULT_SANDBOX_IMAGE = "registry.k8s.io/pause:3.9"
DEFAULT_CRI_PORT = 10250


def _q(value: str) -> str:
    """A TOML basic string (JSON string escaping is a subset of TOML's)."""
    return json.dumps(value)


@dataclass(frozen=True)
class ContainerdPaths:
    """Where one containerd keeps everything: its root (disk), its state (memory: /run), its sockets."""

    root: str
    state: str
    socket: str
    opt: str
    runc_root: str
    runc_v1_root: str
    cni_bin: str
    cni_conf: str
    debug_socket: str

    @classmethod
    def system(cls) -> ContainerdPaths:
        """Debian's containerd on a machine of its own."""
        return cls(root="/var/lib/containerd", state="/run/containerd", socket="/run/containerd/containerd.sock",
                   opt="/opt/containerd", runc_root="/run/containerd/runc", runc_v1_root="/run/containerd/runc-v1",
                   cni_bin="/usr/lib/cni", cni_conf="/etc/cni/net.d", debug_socket="/run/containerd/debug.sock")

    @classmethod
    def under(cls, directory: Path) -> ContainerdPaths:
        """Every path under `directory` (a lab hypervisor: several containerd on one host)."""
        d = directory
        return cls(root=str(d / "root"), state=str(d / "state"), socket=str(d / "containerd.sock"), opt=str(d / "opt"),
                   runc_root=str(d / "runc"), runc_v1_root=str(d / "runc-v1"), cni_bin=str(d / "cni" / "bin"),
                   cni_conf=str(d / "cni" / "conf"), debug_socket=str(d / "debug.sock"))


class ContainerdError(Exception):
    """A containerd gitops cannot configure (not found, unreadable version, unsupported release)."""


#: the oldest containerd gitops configures (1.6 is out of support since 2025-08, 1.7 since 2026-09: both
#: still read config version 2, for machines that have them)
OLDEST_CONTAINERD = (1, 6)


@dataclass(frozen=True)
class ContainerdRelease:
    """A containerd's release, as `containerd --version` says it."""

    version: str  # "2.4.2", "1.6.20~ds1"

    @property
    def minor(self) -> tuple[int, int]:
        major, minor = re.match(r"(\d+)\.(\d+)", self.version).groups()  # type: ignore[union-attr]
        return int(major), int(minor)

    @property
    def config_version(self) -> int:
        """The config version gitops writes for it, the one it reads without migrating: 4 from containerd 2.4
        (the servers' addresses are plugins' settings), 3 for 2.0-2.3, 2 for 1.6 and 1.7."""
        return 4 if self.minor >= (2, 4) else 3 if self.minor >= (2, 0) else 2

    @property
    def supported(self) -> bool:
        """Still maintained upstream (2.x); 1.6 and 1.7 are configured, but said to be out of support."""
        return self.minor >= (2, 0)


def parse_release(version_output: str) -> ContainerdRelease:
    """`containerd --version` -> its release: "containerd github.com/containerd/containerd/v2 v2.4.2 REV" (a
    build of the module), "containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+deb12u3"
    (Debian). ContainerdError when it is not one gitops configures."""
    fields = version_output.split()
    if len(fields) < 3 or fields[0] != "containerd" or not re.match(r"v?\d+\.\d+\.\d+", fields[2]):
        raise ContainerdError(f"not a containerd version: {version_output.strip()[:200]!r}")
    release = ContainerdRelease(fields[2].removeprefix("v"))
    if release.minor < OLDEST_CONTAINERD:
        raise ContainerdError(f"containerd {release.version} is too old: gitops configures containerd 2.x "
                              "(and 1.7 or 1.6, out of support, where a machine has them)")
    return release


def release_of(binary: str = "containerd") -> ContainerdRelease:
    """The release of the containerd `binary` (a path, or a name on PATH) by its `--version`."""
    try:
        done = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as err:
        raise ContainerdError(f"cannot run {binary} --version: {err}") from None
    if done.returncode != 0:
        raise ContainerdError(f"{binary} --version failed: {(done.stderr or done.stdout).strip()[:200]}")
    return parse_release(done.stdout)


def shim_beside(binary: str) -> str:
    """The runc shim beside a containerd named by its path ("" for a name on PATH, or none there): containerd
    looks the shim up on PATH first, where a machine's packaged one may be."""
    if "/" not in binary:
        return ""
    shim = Path(binary).parent / "containerd-shim-runc-v2"
    return str(shim) if shim.is_file() else ""


def containerd_config(paths: ContainerdPaths, stream_ip: str, sandbox_image: str = DEFAULT_SANDBOX_IMAGE, *,
                      release: ContainerdRelease, shim: str = "") -> str:
    """containerd's config as gitops needs it, in the version `release` reads (`ContainerdRelease.config_version`).

    The CRI plugin runs pods with host networking only (no CNI is needed), serves exec/attach
    streams on the machine's address, and needs restrict_oom_score_adj to start pods when
    containerd itself runs with a negative OOM score adjustment limit (containers, CI, some
    systemd units). Every path comes from `paths`; `shim` is the runc shim to run (its path) where
    it is not the one on PATH (a containerd of its own beside a machine's packaged one).
    """
    if release.config_version >= 3:
        return _config_v3(paths, stream_ip, sandbox_image, release, shim)
    return _config_v2(paths, stream_ip, sandbox_image, shim)


def _servers(paths: ContainerdPaths, version: int) -> str:
    """Where containerd listens: top-level sections up to config version 3, plugins' settings in 4."""
    servers = (("grpc", paths.socket), ("ttrpc", paths.socket + ".ttrpc"), ("debug", paths.debug_socket))
    if version >= 4:
        return "\n".join(f"[plugins.'io.containerd.server.v1.{name}']\n  address = {_q(address)}\n"
                         for name, address in servers)
    return "\n".join(f"[{name}]\n  address = {_q(address)}\n" for name, address in servers)


def _config_v3(paths: ContainerdPaths, stream_ip: str, sandbox_image: str, release: ContainerdRelease,
               shim: str) -> str:
    """containerd 2.x (config version 3, or 4 from 2.4): the CRI plugin split into images and runtime; NRI
    off (gitops uses none, and several containerd on one host would share its one socket); no host
    `conf.d` imported."""
    images, runtime = "plugins.'io.containerd.cri.v1.images'", "plugins.'io.containerd.cri.v1.runtime'"
    # 2.1 took a list of CNI binary directories (bin_dirs) in place of bin_dir
    cni_bin = (f"bin_dirs = [{_q(paths.cni_bin)}]" if release.minor >= (2, 1) else f"bin_dir = {_q(paths.cni_bin)}")
    runtime_path = f"\n      runtime_path = {_q(shim)}" if shim else ""
    return f"""\
# Generated by gitops (gitops hypervisor init, gitops lab up) for containerd {release.version}.
version = {release.config_version}
root = {_q(paths.root)}
state = {_q(paths.state)}
imports = []
disabled_plugins = [
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
]

{_servers(paths, release.config_version)}
[plugins.'io.containerd.internal.v1.opt']
  path = {_q(paths.opt)}

[plugins.'io.containerd.nri.v1.nri']
  disable = true

[{images}]
  snapshotter = "overlayfs"

[{images}.pinned_images]
  sandbox = {_q(sandbox_image)}

[{runtime}]
  restrict_oom_score_adj = true
  disable_apparmor = true

[{runtime}.containerd]
  default_runtime_name = "runc"

[{runtime}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"{runtime_path}

[{runtime}.containerd.runtimes.runc.options]
  Root = {_q(paths.runc_root)}
  SystemdCgroup = false

[{runtime}.cni]
  {cni_bin}
  conf_dir = {_q(paths.cni_conf)}

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = {_q(stream_ip)}
  stream_server_port = "0"
"""


def _config_v2(paths: ContainerdPaths, stream_ip: str, sandbox_image: str, shim: str) -> str:
    """containerd 1.6 and 1.7 (config version 2)."""
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    runtime_path = f"\n  runtime_path = {_q(shim)}" if shim else ""
    return f"""\
# Generated by gitops (gitops hypervisor init, gitops lab up).
version = 2
root = {_q(paths.root)}
state = {_q(paths.state)}
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
]

[grpc]
  address = {_q(paths.socket)}

[ttrpc]
  address = {_q(paths.socket + ".ttrpc")}

[debug]
  address = {_q(paths.debug_socket)}

[plugins."io.containerd.internal.v1.opt"]
  path = {_q(paths.opt)}

[plugins."io.containerd.runtime.v1.linux"]
  runtime_root = {_q(paths.runc_v1_root)}

[{cri}]
  sandbox_image = {_q(sandbox_image)}
  restrict_oom_score_adj = true
  disable_apparmor = true
  stream_server_address = {_q(stream_ip)}
  stream_server_port = "0"

[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"{runtime_path}

[{cri}.containerd.runtimes.runc.options]
  Root = {_q(paths.runc_root)}
  SystemdCgroup = false

[{cri}.cni]
  bin_dir = {_q(paths.cni_bin)}
  conf_dir = {_q(paths.cni_conf)}
"""


def front_config(ip: str, port: int, cert_pem_path: Path | str, ca_path: Path | str, socket: Path | str) -> str:
    """The TLS-only CRI front (haproxy): a client certificate signed by `ca_path` required, plain HTTP/2 on to
    containerd's unix socket. gRPC clients insist on ALPN `h2`."""
    return f"""\
# Generated by gitops (gitops hypervisor init, gitops lab up).
global
    maxconn 256
    ssl-default-bind-options ssl-min-ver TLSv1.2

defaults
    mode tcp
    timeout connect 5s
    timeout client 1h
    timeout server 1h

frontend cri
    bind {ip}:{port} ssl crt {cert_pem_path} ca-file {ca_path} verify required alpn h2
    default_backend containerd

backend containerd
    server cri unix@{socket}
"""
