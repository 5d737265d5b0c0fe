"""A worker machine in the lab: its own network namespace and its own containerd (kubelet owns
every pod of its runtime and kills pods it did not make, so a worker never shares a hypervisor's),
with a bridge CNI.

The worker's network is a machine on the lab bridge (`gitops.lab.network`): a namespace of its own,
its node address (10.250.<lab subnet's third octet>.<n>; kubelet refuses a loopback node IP)
only inside it, the hypervisors its neighbours on the bridge. Its containerd runs in the namespace, and so must `gitops join` and `gitops leave`
(`gitops lab exec lab-worker-N -- gitops join ...`): kubelet, kube-proxy's iptables chains,
`ip_forward` and the CNI bridge are then the namespace's, never the host's. Its containerd gets
Debian's CNI plugins (bridge, host-local, loopback) in its CNI bin directory; `gitops join
--cni-conf-dir` writes the bridge network. `gitops lab down` stops the containerd and removes
the namespace and its link (`gitops.lab.netns.release`); a worker still joined (`joined`) is
abandoned with it: its kubelet and kube-proxy stopped, kubelet's mounts (the host's) undone, its
directory removed (`gitops.worker.run.abandon`).
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from gitops.lab import netns, network
from gitops.lab.errors import LabError
from gitops.lab.lab import add_runtime, info
from gitops.lab.netns import RECORD

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
    netns: str
    port: str
    subnet: str
    kubelet_port: int = 10250
    proxy_port: int = 10256

    def join_flags(self) -> list[str]:
        return [f"--node-name={self.name}", f"--node-ip={self.node_ip}", f"--cri-endpoint={self.cri_endpoint}",
                f"--cni-conf-dir={self.cni_conf_dir}", f"--pod-cidr={self.pod_cidr}",
                f"--cluster-cidr={self.cluster_cidr}", f"--bridge={self.bridge}",
                f"--kubelet-port={self.kubelet_port}", f"--proxy-port={self.proxy_port}",
                # kubelet's KUBE-FIREWALL rule ("block incoming localnet connections") would drop what the
                # worker gets from a host loopback address (127.0.T.254, the lab's source on the bridge)
                "--no-kubelet-iptables-util-chains"]


def prepare(number: int = 1, lab_dir: Path | None = None) -> LabWorker:
    """Give worker `number` its network namespace and start its containerd there (once); the flags for
    `gitops join`, which runs in that namespace (`command`)."""
    if not CNI_SOURCE.is_dir():
        raise LabError(f"{CNI_SOURCE} missing: install Debian's containernetworking-plugins "
                       "(scripts/install-deps.sh does)")
    lab = info(lab_dir)
    if not 1 <= number <= 250:
        raise LabError("--number must be between 1 and 250")
    name = f"lab-worker-{number}"
    net = network.LabNetwork(lab.subnet).worker(number, name)
    third = net.lab.third
    hv_dir = lab.dir / f"hv-{name}"
    worker = LabWorker(name=name, node_ip=net.ip, cri_endpoint=f"unix://{hv_dir / 'containerd.sock'}",
                       cni_conf_dir=str(hv_dir / "cni" / "conf"), pod_cidr=f"10.{87 + number}.{third}.0/24",
                       cluster_cidr=f"10.{87 + number}.0.0/16",
                       bridge=f"gitops{third}w{number}", netns=net.netns, port=net.port, subnet=net.subnet)
    if netns.exists(net.netns) and any(p.role == "containerd" and p.hypervisor == name and p.alive()
                                       for p in lab.processes):
        return worker
    (hv_dir / "cni" / "bin").mkdir(parents=True, exist_ok=True)
    (hv_dir / RECORD).write_text(json.dumps(asdict(worker), indent=2, sort_keys=True) + "\n")  # before: down finds it
    network.create_machine(net)
    for plugin in CNI_PLUGINS:
        link = hv_dir / "cni" / "bin" / plugin
        if not link.exists():
            link.symlink_to(CNI_SOURCE / plugin)
    add_runtime(lab.dir, name, net.ip, net.netns)
    return worker


def command(name: str, argv: list[str], lab_dir: Path | None = None) -> list[str]:
    """`argv` as it runs on lab worker `name` (in its network namespace)."""
    net = netns.recorded(info(lab_dir).dir / f"hv-{name}")
    if net is None:
        raise LabError(f"no lab worker {name} in this lab (`gitops lab worker` prepares it)")
    if not netns.exists(net.netns):
        raise LabError(f"the network namespace {net.netns} of {name} is gone (`gitops lab worker` again)")
    return netns.enter(net.netns, argv)


def run(name: str, argv: list[str], lab_dir: Path | None = None) -> None:
    """Replace this process with `argv` run on lab worker `name`."""
    full = command(name, argv, lab_dir)
    os.execvp(full[0], full)

