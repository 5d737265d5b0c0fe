"""Virtual IPs of clusters with two or more ingress nodes (pure).

Such a cluster is reached at `https://VIP:PORT`: keepalived (VRRP, unicast between its ingress nodes'
hypervisors) holds the address on one ingress node and moves it when that node, its haproxy or its machine
fails. The address is the Cluster's pin (spec.apiServer.virtualIP) or the lowest free one of gitops.yaml's
pool (spec.ingress.virtualIPs), recorded in the cluster's record like ports are, and kept while it stays
valid: in the pool (or pinned) and no other cluster's. Each gets a VRRP router id (1-255) no other cluster
of the fleet has, since all ingress nodes may share one network. A cluster that drops to one ingress node
gives both back and is reached at that node's address again.
"""
from __future__ import annotations

import ipaddress

from gitops.compile.desired import VirtualIP
from gitops.compile.placement import PlacementError
from gitops.model.resources import Cluster, RepoModel
from gitops.state.records import State

MAX_VRRP_ID = 255


class VirtualIPError(PlacementError):
    """No virtual IP or router id is left for a cluster: a plan error naming it."""


def of(cluster: Cluster, model: RepoModel, state: State) -> VirtualIP | None:
    """The cluster's virtual IP as recorded (after `allocate`), None without one."""
    record = state.clusters.get(cluster.name)
    if record is None or not record.virtual_ip:
        return None
    port = cluster.api_port if cluster.api_port is not None else model.ingress.port
    return VirtualIP(record.virtual_ip, port, record.vrrp_id)


def allocate(model: RepoModel, state: State) -> None:
    """Give each cluster of `state` that wants one a virtual IP and router id, in place (sorted by name, so
    the result is deterministic); take them back from the others. VirtualIPError names a cluster that cannot
    have one."""
    wanting = sorted(n for n in model.clusters if n in state.clusters and model.wants_virtual_ip(n))
    for name, record in sorted(state.clusters.items()):
        if name not in wanting:
            record.virtual_ip, record.vrrp_id = "", 0
    ranges = model.ingress.ranges()  # validation checked every entry
    pinned = {_norm(model.clusters[n].virtual_ip): n for n in wanting if model.clusters[n].virtual_ip}
    kept: dict[str, str] = {}
    for name in wanting:
        record, pin = state.clusters[name], model.clusters[name].virtual_ip
        address = record.virtual_ip
        valid = (_same(address, pin) if pin else
                 _in(address, ranges) and _norm(address) not in pinned and _norm(address) not in kept)
        if valid:
            record.virtual_ip = _norm(address)
            kept[record.virtual_ip] = name
        else:
            record.virtual_ip = ""
    for name in wanting:
        record, pin = state.clusters[name], model.clusters[name].virtual_ip
        if record.virtual_ip:
            continue
        if pin:
            record.virtual_ip = _norm(pin)
        else:
            taken = set(kept) | set(pinned)
            free = _first_free(ranges, taken)
            if free is None:
                raise VirtualIPError(f"Cluster {name} has two or more ingress nodes and needs a virtual IP, but "
                                     "gitops.yaml's spec.ingress.virtualIPs has none left "
                                     f"({len(taken)} taken): add addresses to the pool, or pin "
                                     "spec.apiServer.virtualIP")
            record.virtual_ip = free
        kept[record.virtual_ip] = name
    ids: dict[int, str] = {}
    for name in wanting:
        record = state.clusters[name]
        if 1 <= record.vrrp_id <= MAX_VRRP_ID and record.vrrp_id not in ids:
            ids[record.vrrp_id] = name
        else:
            record.vrrp_id = 0
    for name in wanting:
        record = state.clusters[name]
        if record.vrrp_id:
            continue
        free_id = next((i for i in range(1, MAX_VRRP_ID + 1) if i not in ids), None)
        if free_id is None:
            raise VirtualIPError(f"Cluster {name}: every VRRP router id (1-{MAX_VRRP_ID}) is another cluster's; "
                                 f"at most {MAX_VRRP_ID} clusters with a virtual IP share a fleet")
        record.vrrp_id = free_id
        ids[free_id] = name


def _norm(address: str) -> str:
    return str(ipaddress.ip_address(address))


def _same(address: str, pin: str) -> bool:
    try:
        return bool(address) and ipaddress.ip_address(address) == ipaddress.ip_address(pin)
    except ValueError:
        return False


def _in(address: str, ranges: list) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False  # (a recorded value is input: the status branch is someone else's)
    return any(first.version == ip.version and first <= ip <= last for first, last in ranges)


def _first_free(ranges: list, taken: set[str]) -> str | None:
    """The lowest free address of the pool, entries in the order written (at most `len(taken) + 1` addresses
    looked at per entry)."""
    for first, last in ranges:
        ip = first
        while ip <= last:
            if str(ip) not in taken:
                return str(ip)
            ip += 1
    return None
