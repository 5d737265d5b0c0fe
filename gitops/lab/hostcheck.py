"""What the lab must never leave on the host: addresses on its interfaces, Kubernetes chains in its iptables.

`gitops lab up` records the host's addresses (outside 127.0.0.0/8 and ::1) in `host.json`;
`gitops lab check-host` compares them with now and lists the host's KUBE-* chains (a worker's
kube-proxy writes them in its own network namespace, never here).
"""
from __future__ import annotations

import ipaddress
import json
import shutil
import subprocess
from pathlib import Path

BASELINE = "host.json"


def addresses() -> list[str]:
    """`interface address/prefix` for every address of this network namespace outside 127.0.0.0/8 and ::1."""
    out = subprocess.run(["ip", "-o", "addr", "show"], capture_output=True, text=True, check=False).stdout
    found = []
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 4 or fields[2] not in ("inet", "inet6"):
            continue
        if not ipaddress.ip_interface(fields[3]).ip.is_loopback:
            found.append(f"{fields[1]} {fields[3]}")
    return sorted(found)


def kube_chains() -> list[str]:
    """`table/chain` for every KUBE-* chain in this network namespace's iptables (IPv4 and IPv6)."""
    found = []
    for save in ("iptables-save", "ip6tables-save"):
        if shutil.which(save) is None:
            continue
        out = subprocess.run([save], capture_output=True, text=True, check=False).stdout
        table = ""
        for line in out.splitlines():
            if line.startswith("*"):
                table = line[1:]
            elif line.startswith(":KUBE-"):
                found.append(f"{save.removesuffix('-save')} {table}/{line[1:].split()[0]}")
    return sorted(set(found))


def record(lab_dir: Path) -> None:
    """The host's addresses as the lab found them."""
    (lab_dir / BASELINE).write_text(json.dumps({"addresses": addresses()}, indent=2) + "\n")


def problems(lab_dir: Path) -> list[str]:
    """Addresses added to a host interface since `lab up`, and any KUBE-* chain in the host's iptables."""
    try:
        before = set(json.loads((lab_dir / BASELINE).read_text())["addresses"])
    except (OSError, ValueError, KeyError, TypeError):
        before = None
    found = [f"KUBE chain on the host: {chain}" for chain in kube_chains()]
    if before is None:
        found.append(f"no record of the host's addresses in {lab_dir / BASELINE} (lab up writes it)")
    else:
        found += [f"address added to a host interface: {a}" for a in addresses() if a not in before]
    return found
