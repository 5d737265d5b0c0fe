"""The lab's network: every lab machine (hypervisor or worker) in a network namespace of its own, all of
them on one bridge that lives in a namespace the lab creates, the host on that bridge by one veth.

For the lab of subnet `127.0.T` (its `--subnet`):

    gitops-0-T-net      the lab's own namespace: bridge `lab0`, one port per machine and `uplink`
    gitops-0-T-hvN      hypervisor N: `eth0` 10.249.T.N, its containerd, its mTLS front, its pods
    gitops-0-T-wN       worker N: `eth0` 10.250.T.N, its containerd, kubelet, kube-proxy, pods
    host `glab0-T`      the host's end of `uplink`: no address at all (no IPv6 link-local either)

Nothing is added to a host interface. The host reaches 10.249.T.0/24 and 10.250.T.0/24 by routes
through `glab0-T` whose source is a loopback address (`127.0.T.254`); `route_localnet` on the host's
link and on each machine's `eth0` lets those loopback-sourced packets (and the ARP for them) cross.
Inside a machine only 127.0.0.1 stays local; the rest of 127.0.0.0/8 is the host's, over the bridge.
The bridge namespace does no routing: host and machines are neighbours on one link.

Faults act on one machine: `power_off` SIGKILLs every process in its namespace at once and takes its
bridge port down; `partition` drops its traffic both ways (all of it, or only to and from named
peers) with iptables rules in its own namespace while its processes run on; `heal` removes them.
"""
from __future__ import annotations

import ipaddress
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from gitops import procs
from gitops.lab.errors import LabError

NETNS_DIR = Path("/run/netns")
BRIDGE = "lab0"
UPLINK = "uplink"
#: the iptables chain a partition fills, in the partitioned machine's namespace
PARTITION_CHAIN = "GITOPS-PARTITION"
HYPERVISOR_NET = "10.249"
WORKER_NET = "10.250"
#: the last octets of the lab's virtual IPs (10.249.T.200-249): hypervisors are numbered below
VIRTUAL_IP_FIRST, VIRTUAL_IP_LAST = 200, 249


@dataclass(frozen=True)
class LabNetwork:
    """The bridge of the lab on `subnet` (`127.0.T`) and the names and addresses that hang off it."""

    subnet: str

    @classmethod
    def for_subnet(cls, subnet: str) -> LabNetwork:
        octets = subnet.split(".")
        if (len(octets) != 3 or octets[:2] != ["127", "0"] or not octets[2].isdigit()
                or not 1 <= int(octets[2]) <= 255 or octets[2] != str(int(octets[2]))):
            raise LabError(f"a lab subnet is 127.0.T with T from 1 to 255 (got {subnet!r})")
        return cls(subnet)

    @property
    def third(self) -> str:
        return self.subnet.split(".")[2]

    @property
    def netns(self) -> str:
        return f"gitops-0-{self.third}-net"

    @property
    def host_link(self) -> str:
        return f"glab0-{self.third}"

    @property
    def host_ip(self) -> str:
        """The host's source address towards the lab (a loopback address: nothing is added to an interface)."""
        return f"{self.subnet}.254"

    @property
    def prefixes(self) -> tuple[str, ...]:
        return (f"{HYPERVISOR_NET}.{self.third}.0/24", f"{WORKER_NET}.{self.third}.0/24")

    @property
    def virtual_ips(self) -> str:
        """The lab's pool of virtual IPs (gitops.yaml spec.ingress.virtualIPs): on the hypervisors' network, above
        any hypervisor's address; keepalived adds one to a machine's eth0, never to a host interface."""
        return f"{HYPERVISOR_NET}.{self.third}.{VIRTUAL_IP_FIRST}-{HYPERVISOR_NET}.{self.third}.{VIRTUAL_IP_LAST}"

    def hypervisor(self, number: int, name: str) -> Machine:
        if not 1 <= number < VIRTUAL_IP_FIRST:
            raise LabError(f"a lab has at most {VIRTUAL_IP_FIRST - 1} hypervisors")
        return Machine(name, f"gitops-0-{self.third}-hv{number}", f"hv{number}",
                       f"{HYPERVISOR_NET}.{self.third}.{number}", self.subnet)

    def worker(self, number: int, name: str) -> Machine:
        return Machine(name, f"gitops-0-{self.third}-w{number}", f"w{number}",
                       f"{WORKER_NET}.{self.third}.{number}", self.subnet)


@dataclass(frozen=True)
class Machine:
    """One lab machine's network: its namespace, its port on the lab bridge, its address."""

    name: str
    netns: str
    port: str
    ip: str
    subnet: str

    @property
    def lab(self) -> LabNetwork:
        return LabNetwork(self.subnet)

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "netns": self.netns, "port": self.port, "ip": self.ip, "subnet": self.subnet}

    @classmethod
    def from_json(cls, raw: dict[str, str]) -> Machine:
        return cls(raw["name"], raw["netns"], raw["port"], raw["ip"], raw["subnet"])


# ---------------------------------------------------------------------------- commands

def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise LabError(f"ip {' '.join(args)}: {result.stderr.strip()}")


def reserve_ports(m: Machine, ranges: str) -> None:
    """Keep `ranges` ("LOW-HIGH,PORT") out of machine `m`'s ephemeral ports, as `gitops hypervisor init`
    does on a real machine: a pod's listen must never meet an outgoing connection's port."""
    _sysctl(m.netns, "net.ipv4.ip_local_reserved_ports", ranges)


def _sysctl(netns: str | None, key: str, value: str) -> None:
    argv = ["sysctl", "-qw", f"{key}={value}"]
    if netns:
        argv = enter(netns, argv)  # /proc/sys/net is the writer's namespace's
    result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode != 0:
        raise LabError(f"{' '.join(argv)}: {result.stderr.strip()}")


def _iptables(netns: str, *args: str, check: bool = True) -> bool:
    result = subprocess.run(enter(netns, ["iptables", "-w", "5", *args]), capture_output=True, text=True)
    if check and result.returncode != 0:
        raise LabError(f"iptables {' '.join(args)} in {netns}: {result.stderr.strip()}")
    return result.returncode == 0


def enter(netns: str, argv: list[str]) -> list[str]:
    """`argv` run in the network namespace `netns` (and nothing else of the host changed)."""
    return ["nsenter", f"--net={NETNS_DIR / netns}", "--", *argv]


def exists(netns: str) -> bool:
    return (NETNS_DIR / netns).exists()


def link_exists(link: str, netns: str | None = None) -> bool:
    argv = ["ip", *(("-n", netns) if netns else ()), "link", "show", link]
    return subprocess.run(argv, capture_output=True).returncode == 0


def in_namespace(netns: str) -> list[int]:
    """PIDs of the processes in network namespace `netns`."""
    out = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True)
    return sorted(int(p) for p in out.stdout.split() if p.isdigit())


# ---------------------------------------------------------------------------- the bridge

def create_lab(lab: LabNetwork) -> None:
    """The lab's namespace with its bridge, and the host's link to it with its routes (a leftover of an
    earlier lab on this subnet is replaced)."""
    remove_lab(lab)
    _ip("netns", "add", lab.netns)
    try:
        ns = ("-n", lab.netns)
        _ip(*ns, "link", "set", "lo", "up")
        _ip(*ns, "link", "add", BRIDGE, "type", "bridge", "stp_state", "0")
        _ip(*ns, "link", "set", BRIDGE, "addrgenmode", "none")
        _ip(*ns, "link", "set", BRIDGE, "up")
        _ip("link", "add", lab.host_link, "type", "veth", "peer", "name", UPLINK, "netns", lab.netns)
        _ip("link", "set", lab.host_link, "addrgenmode", "none")  # no IPv6 link-local address on the host
        _ip(*ns, "link", "set", UPLINK, "addrgenmode", "none")
        _ip(*ns, "link", "set", UPLINK, "master", BRIDGE, "up")
        _sysctl(None, f"net.ipv4.conf.{lab.host_link}.route_localnet", "1")
        _ip("link", "set", lab.host_link, "up")
        for prefix in lab.prefixes:
            _ip("route", "add", prefix, "dev", lab.host_link, "src", lab.host_ip)
    except LabError:
        remove_lab(lab)
        raise


def remove_lab(lab: LabNetwork) -> list[str]:
    """The host's link (and its routes with it) and the lab's namespace; what was removed."""
    done = []
    if link_exists(lab.host_link):
        _ip("link", "del", lab.host_link)
        done.append(f"veth {lab.host_link}")
    if exists(lab.netns):
        _stop_all(lab.netns)
        _ip("netns", "del", lab.netns)
        done.append(f"network namespace {lab.netns}")
    return done


def namespaces(lab: LabNetwork) -> list[str]:
    """Every namespace of the lab on `lab`'s subnet that is there: its bridge's and its machines'."""
    prefix = f"gitops-0-{lab.third}-"
    return sorted(p.name for p in NETNS_DIR.glob(f"{prefix}*")) if NETNS_DIR.is_dir() else []


def ports_down(lab: LabNetwork) -> list[str]:
    """The machines' ports on `lab`'s bridge that are down: machines powered off (`power_off`)."""
    out = subprocess.run(["ip", "-n", lab.netns, "-o", "link", "show", "master", BRIDGE],
                         capture_output=True, text=True)
    down = []
    for line in out.stdout.splitlines():
        fields = line.split(":")
        if len(fields) > 2 and ",UP" not in fields[2].split(">")[0]:
            down.append(fields[1].strip().split("@")[0])
    return sorted(port for port in down if port != UPLINK)


def leftover(lab: LabNetwork) -> bool:
    """Whether the lab network on `lab`'s subnet is the leftover of a lab that no longer runs: not one process
    in any of its namespaces, and no machine of it powered off (a lab whose every machine is powered off is
    still a lab). Its processes all died without `gitops lab down`: a killed test run or a killed sandbox."""
    return (exists(lab.netns) and not any(in_namespace(ns) for ns in namespaces(lab))
            and not ports_down(lab))


def remove_leftover(lab: LabNetwork) -> list[str]:
    """Every namespace and the host link of a `leftover` lab network; what was removed."""
    done = []
    for ns in namespaces(lab):
        if ns != lab.netns:
            _ip("netns", "del", ns)
            done.append(f"network namespace {ns}")
    return done + remove_lab(lab)


# ---------------------------------------------------------------------------- machines

def create_machine(m: Machine) -> None:
    """`m`'s namespace, its veth to the lab bridge, its address and routes (a leftover is replaced)."""
    lab = m.lab
    if not exists(lab.netns):
        raise LabError(f"the lab network {lab.netns} is not there (gitops lab up makes it)")
    remove_machine(m)
    ns = ("-n", m.netns)
    _ip("netns", "add", m.netns)
    try:
        _ip("-n", lab.netns, "link", "add", m.port, "type", "veth", "peer", "name", "eth0", "netns", m.netns)
        _ip("-n", lab.netns, "link", "set", m.port, "addrgenmode", "none")
        _ip(*ns, "link", "set", "eth0", "addrgenmode", "none")
        _ip("-n", lab.netns, "link", "set", m.port, "master", BRIDGE, "up")
        _sysctl(m.netns, "net.ipv4.conf.eth0.route_localnet", "1")
        _ip(*ns, "link", "set", "lo", "up")
        # only 127.0.0.1 stays local in the machine; the rest of 127/8 is the host's, over the bridge
        _ip(*ns, "addr", "del", "127.0.0.1/8", "dev", "lo")
        _ip(*ns, "addr", "add", "127.0.0.1/32", "dev", "lo")
        _ip(*ns, "addr", "add", f"{m.ip}/32", "dev", "eth0")
        _ip(*ns, "link", "set", "eth0", "up")
        for prefix in lab.prefixes:
            _ip(*ns, "route", "add", prefix, "dev", "eth0", "src", m.ip)
        _ip(*ns, "route", "add", "127.0.0.0/8", "dev", "eth0", "src", m.ip)
    except LabError:
        remove_machine(m)
        raise


def remove_machine(m: Machine) -> list[str]:
    """Stop every process left in `m`'s namespace, then remove its link and namespace; what was removed."""
    done = []
    if exists(m.netns):
        stopped = _stop_all(m.netns)
        if stopped:
            done.append(f"stopped {stopped} process(es) in network namespace {m.netns}")
    if exists(m.lab.netns) and link_exists(m.port, m.lab.netns):
        _ip("-n", m.lab.netns, "link", "del", m.port)  # both ends
        done.append(f"veth {m.port}")
    if exists(m.netns):
        _ip("netns", "del", m.netns)
        done.append(f"network namespace {m.netns}")
    return done


def _stop_all(netns: str) -> int:
    pids = in_namespace(netns)
    if pids:
        try:
            procs.terminate([(pid, procs.start_time(pid)) for pid in pids], timeout=10)
        except procs.ProcError as err:
            raise LabError(f"cannot stop the processes in network namespace {netns}: {err}") from None
    return len(pids)


# ---------------------------------------------------------------------------- faults

def power_off(m: Machine, timeout: float = 10.0) -> int:
    """Every process of `m` SIGKILLed at once (again until none is left: a shim may still be forking), then
    its bridge port down, as in a power cut. Returns how many processes were killed."""
    killed: set[int] = set()
    end = time.monotonic() + timeout
    while True:
        pids = [pid for pid in in_namespace(m.netns) if pid != os.getpid()]
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except ProcessLookupError:
                pass
        for pid in pids:  # reap the ones this process started (the lab's `up`), or they linger as zombies
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
        if time.monotonic() > end:
            raise LabError(f"processes of {m.name} still alive after SIGKILL: {pids}")
        time.sleep(0.05)
    set_link(m, up=False)
    _forget_addresses(m)
    return len(killed)


def _forget_addresses(m: Machine) -> None:
    """The addresses its processes added to `m`'s eth0 (a virtual IP keepalived held) go with the power: a
    machine boots with its own address only."""
    out = subprocess.run(["ip", "-n", m.netns, "-o", "addr", "show", "dev", "eth0"], capture_output=True, text=True)
    for line in out.stdout.splitlines():
        fields = line.split()
        if len(fields) > 3 and fields[2] in ("inet", "inet6") and fields[3] != f"{m.ip}/32" \
                and not fields[3].startswith("fe80:"):
            _ip("-n", m.netns, "addr", "del", fields[3], "dev", "eth0")


def set_link(m: Machine, up: bool) -> None:
    """`m`'s port on the lab bridge up or down (the machine's cable in or out)."""
    _ip("-n", m.lab.netns, "link", "set", m.port, "up" if up else "down")


def link_up(m: Machine) -> bool:
    out = subprocess.run(["ip", "-n", m.lab.netns, "-o", "link", "show", m.port], capture_output=True, text=True)
    return out.returncode == 0 and ",UP" in out.stdout.split(">")[0]


def partition(m: Machine, peers: list[str] | None = None) -> None:
    """Drop `m`'s traffic both ways: all of it, or only to and from the addresses `peers` (partial)."""
    for peer in peers or ():
        ipaddress.ip_address(peer)
    if not _iptables(m.netns, "-n", "-L", PARTITION_CHAIN, check=False):
        _iptables(m.netns, "-N", PARTITION_CHAIN)
        _iptables(m.netns, "-I", "INPUT", "1", "-i", "eth0", "-j", PARTITION_CHAIN)
        _iptables(m.netns, "-I", "OUTPUT", "1", "-o", "eth0", "-j", PARTITION_CHAIN)
    if not peers:
        _iptables(m.netns, "-F", PARTITION_CHAIN)
        _iptables(m.netns, "-A", PARTITION_CHAIN, "-j", "DROP")
        return
    for peer in peers:
        for match in ("-s", "-d"):
            if not _iptables(m.netns, "-C", PARTITION_CHAIN, match, peer, "-j", "DROP", check=False):
                _iptables(m.netns, "-A", PARTITION_CHAIN, match, peer, "-j", "DROP")


def heal(m: Machine) -> bool:
    """Remove every partition rule of `m`; whether there was one."""
    if not _iptables(m.netns, "-n", "-L", PARTITION_CHAIN, check=False):
        return False
    _iptables(m.netns, "-D", "INPUT", "-i", "eth0", "-j", PARTITION_CHAIN, check=False)
    _iptables(m.netns, "-D", "OUTPUT", "-o", "eth0", "-j", PARTITION_CHAIN, check=False)
    _iptables(m.netns, "-F", PARTITION_CHAIN)
    _iptables(m.netns, "-X", PARTITION_CHAIN)
    return True


def partitioned_from(m: Machine) -> list[str]:
    """What `m` is partitioned from: ["*"] for everything, else the peer addresses; [] when it is not."""
    out = subprocess.run(enter(m.netns, ["iptables", "-w", "5", "-S", PARTITION_CHAIN]), capture_output=True,
                         text=True)
    if out.returncode != 0:
        return []
    found = []
    for line in out.stdout.splitlines():
        fields = line.split()
        if fields[:1] != ["-A"]:
            continue
        if "-s" in fields:
            found.append(fields[fields.index("-s") + 1].removesuffix("/32"))
        elif "-d" not in fields:
            return ["*"]
    return sorted(set(found))


def rss_kib(netns: str) -> int:
    """Resident memory of every process in network namespace `netns` (a machine's containerd, front and pods),
    KiB (shared pages counted in each process, as `ps` does)."""
    total = 0
    for pid in in_namespace(netns):
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass  # gone meanwhile
    return total
