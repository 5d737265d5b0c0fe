"""A worker machine in the lab: its own containerd (kubelet owns every pod of its runtime and
kills pods it did not make, so a worker never shares a hypervisor's), with a bridge CNI.

kubelet 1.20 refuses a loopback node IP (127.0.0.0/8), so the worker gets its own
address, 10.250.<lab subnet's third octet>.<n>/32, added to `lo` (the host has no
interface to spare and nothing leaves the machine). Its containerd gets Debian's CNI
plugins (bridge, host-local, loopback) in its CNI bin directory; `gitops join
--cni-conf-dir` writes the bridge network. `gitops lab down` stops the containerd and
removes the address (`gitops.lab.addresses.release`).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from gitops.lab.addresses import RECORD, add_address
from gitops.lab.errors import LabError
from gitops.lab.lab import add_runtime, info

CNI_SOURCE = Path("/usr/lib/cni")
CNI_PLUGINS = ("bridge", "host-local", "loopback")


@dataclass(frozen=True)
class LabWorker:
    """A lab worker's runtime and the `gitops join` flags that use it."""

    name: str
    node_ip: str
    cri_endpoint: str
    cni_conf_dir: str
    pod_cidr: str
    cluster_cidr: str
    bridge: str
    kubelet_port: int = 10250
    proxy_port: int = 10256

    def join_flags(self) -> list[str]:
        return [f"--node-name={self.name}", f"--node-ip={self.node_ip}", f"--cri-endpoint={self.cri_endpoint}",
                f"--cni-conf-dir={self.cni_conf_dir}", f"--pod-cidr={self.pod_cidr}",
                f"--cluster-cidr={self.cluster_cidr}", f"--bridge={self.bridge}",
                f"--kubelet-port={self.kubelet_port}", f"--proxy-port={self.proxy_port}"]


def prepare(number: int = 1, lab_dir: Path | None = None) -> LabWorker:
    """Start worker `number`'s containerd (once) and give it its address; the flags for `gitops join`."""
    if not CNI_SOURCE.is_dir():
        raise LabError(f"{CNI_SOURCE} missing: install Debian's containernetworking-plugins "
                       "(scripts/install-deps.sh does)")
    lab = info(lab_dir)
    third = lab.hypervisors[0].ip.split(".")[2]
    name = f"lab-worker-{number}"
    ip = f"10.250.{third}.{number}"
    hv_dir = lab.dir / f"hv-{name}"
    worker = LabWorker(name=name, node_ip=ip, cri_endpoint=f"unix://{hv_dir / 'containerd.sock'}",
                       cni_conf_dir=str(hv_dir / "cni" / "conf"), pod_cidr=f"10.{87 + number}.{third}.0/24",
                       cluster_cidr=f"10.{87 + number}.0.0/16",
                       bridge=f"gitops{third}w{number}")
    if any(p.role == "containerd" and p.hypervisor == name and p.alive() for p in lab.processes):
        return worker
    add_address(ip)
    (hv_dir / "cni" / "bin").mkdir(parents=True, exist_ok=True)
    (hv_dir / RECORD).write_text(json.dumps(asdict(worker), indent=2, sort_keys=True) + "\n")
    for plugin in CNI_PLUGINS:
        link = hv_dir / "cni" / "bin" / plugin
        if not link.exists():
            link.symlink_to(CNI_SOURCE / plugin)
    add_runtime(lab.dir, name, ip)
    return worker
