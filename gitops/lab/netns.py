"""A lab worker's own network: a network namespace joined to the host by a veth pair.

A worker is a machine of its own, so it gets its own network namespace (`ip netns`):
its node address, routes, iptables (kube-proxy's chains), `ip_forward` and CNI bridge
live there, never on the host. kubelet 1.20 refuses a loopback node IP, so the node
address is a routed one (10.250.<subnet's third octet>.<n>), on the namespace's side of
the veth only. Nothing is added to a host interface: the host side of the veth has no
address (no IPv6 link-local either), and the host reaches the worker by a route through
the veth whose source is a loopback address of the lab's subnet (`<subnet>.254`).

The worker reaches the hypervisors' loopback addresses (its cluster's ingress) through the
same veth: inside the namespace only 127.0.0.1 stays local, the rest of 127.0.0.0/8 is
routed to the host, and `route_localnet` on both ends of the veth lets loopback-range
packets cross it (the kernel drops them on other interfaces otherwise).

Processes enter the namespace with `nsenter --net` (network only: the worker's containerd
and kubelet must share the host's mount namespace, where kubelet's volume mounts are seen
by containerd). So kubelet's mounts are the host's, under the worker's `gitops join --dir`;
`gitops lab down` finds that directory and undoes them (`joined`). Each
worker's runtime directory holds a record (`worker.json`) naming its namespace and link, so
`gitops lab down` removes them without knowing anything else of workers.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from gitops import procs
from gitops.errors import GitopsError
from gitops.lab.errors import LabError
from gitops.worker import run as worker_run

#: a mount kubelet made: its root dir (`<join --dir>/kubelet`, made rshared) or a pod's volume under it
_KUBELET_MOUNT = re.compile(r"^(/.+?)/kubelet(?:/pods/.*)?$")

#: the record a worker's directory holds (its `LabWorker`, as JSON)
RECORD = "worker.json"
NETNS_DIR = Path("/run/netns")


@dataclass(frozen=True)
class WorkerNetwork:
    """A worker's namespace, its host-side link, its node address and the host's source address to it."""

    netns: str
    link: str
    node_ip: str
    host_ip: str

    @classmethod
    def for_worker(cls, subnet: str, number: int) -> WorkerNetwork:
        """Stable names for worker `number` of the lab on `subnet` (three octets, e.g. 127.0.24)."""
        octets = subnet.split(".")
        if len(octets) != 3 or octets[0] != "127" or subnet == "127.0.0":
            raise LabError(f"a lab worker needs a lab subnet inside 127.0.0.0/8 other than 127.0.0 (got {subnet})")
        third = octets[2]
        return cls(netns=f"gitops-{octets[1]}-{third}-w{number}", link=f"gw{third}w{number}",
                   node_ip=f"10.250.{third}.{number}", host_ip=f"{subnet}.254")


def create(net: WorkerNetwork) -> None:
    """The namespace, the veth pair, the addresses and routes (a leftover of an earlier lab is replaced)."""
    remove(net)
    ns = ("-n", net.netns)
    _ip("netns", "add", net.netns)
    try:
        _ip("link", "add", net.link, "type", "veth", "peer", "name", "eth0", "netns", net.netns)
        for side, link in (((), net.link), (ns, "eth0")):
            _ip(*side, "link", "set", link, "addrgenmode", "none")  # no IPv6 link-local address
        _sysctl((), f"net.ipv4.conf.{net.link}.route_localnet", "1")
        _sysctl(ns, "net.ipv4.conf.eth0.route_localnet", "1")
        _ip(*ns, "link", "set", "lo", "up")
        # only 127.0.0.1 stays local in the namespace; the rest of 127/8 is the host's, over the veth
        _ip(*ns, "addr", "del", "127.0.0.1/8", "dev", "lo")
        _ip(*ns, "addr", "add", "127.0.0.1/32", "dev", "lo")
        _ip(*ns, "addr", "add", f"{net.node_ip}/32", "dev", "eth0")
        _ip(*ns, "link", "set", "eth0", "up")
        _ip(*ns, "route", "add", "127.0.0.0/8", "dev", "eth0", "src", net.node_ip)
        _ip("link", "set", net.link, "up")
        _ip("route", "add", f"{net.node_ip}/32", "dev", net.link, "src", net.host_ip)
    except LabError:
        remove(net)
        raise


def enter(netns: str, argv: list[str]) -> list[str]:
    """`argv` run in the network namespace `netns` (and nothing else of the host changed)."""
    return ["nsenter", f"--net={NETNS_DIR / netns}", "--", *argv]


def exists(netns: str) -> bool:
    return (NETNS_DIR / netns).exists()


def remove(net: WorkerNetwork) -> list[str]:
    """Stop every process left in the namespace, then remove the veth and the namespace; what was removed."""
    done = []
    if exists(net.netns):
        pids = in_namespace(net.netns)
        if pids:
            try:
                procs.terminate([(pid, procs.start_time(pid)) for pid in pids], timeout=10)
            except procs.ProcError as err:
                raise LabError(f"cannot stop the processes in network namespace {net.netns}: {err}") from None
            done.append(f"stopped {len(pids)} process(es) in network namespace {net.netns}")
    if subprocess.run(["ip", "link", "show", net.link], capture_output=True).returncode == 0:
        _ip("link", "del", net.link)  # both ends, and the host route through it
        done.append(f"veth {net.link}")
    if exists(net.netns):
        _ip("netns", "del", net.netns)
        done.append(f"network namespace {net.netns}")
    return done


def recorded(hv_dir: Path) -> WorkerNetwork | None:
    """The network of the worker whose record `hv_dir` holds, None without a record."""
    record = hv_dir / RECORD
    if not record.exists():
        return None
    try:
        raw = json.loads(record.read_text())
        return WorkerNetwork(raw["netns"], raw["link"], raw["node_ip"], raw["host_ip"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise LabError(f"unreadable worker record {record}: {err}") from None


def release(hv_dir: Path) -> list[str]:
    """Remove the network of the worker recorded in `hv_dir` (if any); returns what was removed."""
    net = recorded(hv_dir)
    if net is None:
        return []
    done = remove(net)
    (hv_dir / RECORD).unlink()
    return done


def in_namespace(netns: str) -> list[int]:
    """PIDs of the processes in network namespace `netns`."""
    out = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True)
    return sorted(int(p) for p in out.stdout.split() if p.isdigit())


def _sysctl(ns: tuple[str, ...], key: str, value: str) -> None:
    argv = ["sysctl", "-qw", f"{key}={value}"]
    if ns:
        argv = enter(ns[1], argv)  # /proc/sys/net is the writer's namespace's
    result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode != 0:
        raise LabError(f"{' '.join(argv)}: {result.stderr.strip()}")


def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise LabError(f"ip {' '.join(args)}: {result.stderr.strip()}")


def joined(hv_dir: Path) -> list[Path]:
    """The directories (`gitops join --dir`) of workers joined on the lab runtime in `hv_dir`, wherever they
    are: named by the processes in its namespace (kubelet's working and root directories) and by kubelet's
    mounts on the host; a directory counts only if the worker state `join` wrote there names this runtime's
    CRI socket (a worker of another lab, or of a real machine, is never taken)."""
    hints: set[Path] = set()
    net = recorded(hv_dir)
    if net is not None and exists(net.netns):
        for pid in in_namespace(net.netns):
            try:
                hints.add(Path(os.readlink(f"/proc/{pid}/cwd")))
            except OSError:
                pass  # gone, or a kernel thread
            hints.update(Path(arg.removeprefix("--root-dir=")).parent for arg in procs.cmdline(pid)
                         if arg.startswith("--root-dir="))
    for point in procs.mounts_under(Path("/")):
        found = _KUBELET_MOUNT.match(point)
        if found:
            hints.add(Path(found.group(1)))
    sock = (hv_dir / "containerd.sock").resolve()
    dirs = []
    for hint in sorted(hints):
        try:
            spec = worker_run.recorded(hint)
        except GitopsError:
            continue  # not a worker's state we can read: not ours to touch
        if spec is not None and Path(spec[0].cri_endpoint.removeprefix("unix://")).resolve() == sock:
            dirs.append(hint)
    return dirs
