"""The addresses lab workers add to `lo`, and their release when the lab goes down.

Each worker's directory holds a record (`worker.json`) naming its address, so `gitops lab down`
finds what to remove without knowing anything else of workers.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

from gitops.lab.errors import LabError

#: the record a worker's directory holds (its `LabWorker`, as JSON)
RECORD = "worker.json"


def add_address(ip: str) -> None:
    """`ip`/32 on `lo`, once."""
    if not _has_address(ip):
        _ip("addr", "add", f"{ip}/32", "dev", "lo")


def release(hv_dir: Path) -> list[str]:
    """Remove the address `prepare` added for the worker in `hv_dir`; returns what was removed."""
    record = hv_dir / RECORD
    if not record.exists():
        return []
    try:
        ip = str(json.loads(record.read_text())["node_ip"])
    except (OSError, ValueError, KeyError) as err:
        raise LabError(f"unreadable worker record {record}: {err}") from None
    done = []
    if _has_address(ip):
        _ip("addr", "del", f"{ip}/32", "dev", "lo")
        done.append(f"worker address {ip}")
    record.unlink()
    return done


def _has_address(ip: str) -> bool:
    out = subprocess.run(["ip", "-4", "-o", "addr", "show", "dev", "lo"], capture_output=True, text=True)
    return f" {ip}/" in out.stdout


def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise LabError(f"ip {' '.join(args)}: {result.stderr.strip()}")
