"""A lab worker's records: the machine (`gitops.lab.network`) its runtime directory names, and the
workers joined on it.

A worker is a machine of its own: its network namespace on the lab bridge (`gitops.lab.network`),
its node address 10.250.<lab subnet's third octet>.<n> (kubelet refuses a loopback node IP).
Processes enter the namespace with `nsenter --net` (network only: the worker's containerd and kubelet
must share the host's mount namespace, where kubelet's volume mounts are seen by containerd). So
kubelet's mounts are the host's, under the worker's `gitops join --dir`; `gitops lab down` finds that
directory and undoes them (`joined`). Each worker's runtime directory holds a record (`worker.json`)
naming its machine, so `gitops lab down` removes it without knowing anything else of workers.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

from gitops import procs
from gitops.errors import GitopsError
from gitops.lab.errors import LabError
from gitops.lab.network import Machine, enter, exists, in_namespace, remove_machine
from gitops.worker import run as worker_run

__all__ = ["RECORD", "enter", "exists", "in_namespace", "joined", "recorded", "release"]

#: a mount kubelet made: its root dir (`<join --dir>/kubelet`, made rshared) or a pod's volume under it
_KUBELET_MOUNT = re.compile(r"^(/.+?)/kubelet(?:/pods/.*)?$")

#: the record a worker's directory holds (its `LabWorker`, as JSON)
RECORD = "worker.json"


def recorded(hv_dir: Path) -> Machine | None:
    """The machine of the worker whose record `hv_dir` holds, None without a record."""
    record = hv_dir / RECORD
    if not record.exists():
        return None
    try:
        raw = json.loads(record.read_text())
        return Machine(raw["name"], raw["netns"], raw["port"], raw["node_ip"], raw["subnet"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise LabError(f"unreadable worker record {record}: {err}") from None


def release(hv_dir: Path) -> list[str]:
    """Remove the machine of the worker recorded in `hv_dir` (if any); returns what was removed."""
    machine = recorded(hv_dir)
    if machine is None:
        return []
    done = remove_machine(machine)
    (hv_dir / RECORD).unlink()
    return done


def joined(hv_dir: Path) -> list[Path]:
    """The directories (`gitops join --dir`) of workers joined on the lab runtime in `hv_dir`, wherever they
    are: named by the processes in its namespace (kubelet's working and root directories) and by kubelet's
    mounts on the host; a directory counts only if the worker state `join` wrote there names this runtime's
    CRI socket (a worker of another lab, or of a real machine, is never taken)."""
    hints: set[Path] = set()
    machine = recorded(hv_dir)
    if machine is not None and exists(machine.netns):
        for pid in in_namespace(machine.netns):
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
