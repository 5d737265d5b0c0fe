"""A snapshot of a cluster's etcd, streamed from one healthy, current member over mutual TLS.

The member is one whose `/health` is true and whose revision is the highest the members report
(a follower when one is as current as the leader: it spares the leader the copy). The snapshot
comes through etcd's v3 JSON gateway (`/v3/maintenance/snapshot`, base64 chunks, one JSON
object per line) into a private file, and `etcdctl snapshot status` must read it back.
"""
from __future__ import annotations

import base64
import json
import os
import shutil
import ssl
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from gitops.backup.restic import BackupError

TIMEOUT = 10.0
#: reading one chunk of a snapshot stream may take this long before the member counts as stuck
READ_TIMEOUT = 120.0
#: a snapshot line longer than this is no etcd chunk (they are 32 KiB of data, base64-encoded)
MAX_LINE = 1 << 20


@dataclass(frozen=True)
class MemberStatus:
    node: str
    client_url: str
    healthy: bool
    revision: int = 0
    leader: bool = False
    why: str = ""


@dataclass(frozen=True)
class TakenSnapshot:
    """A snapshot file written and read back, with where and at which revision it was taken."""

    path: Path
    member: str
    revision: int
    bytes: int


def _post(context: ssl.SSLContext, url: str, path: str, timeout: float = TIMEOUT):
    request = urllib.request.Request(f"{url}{path}", data=b"{}", headers={"Content-Type": "application/json"},
                                     method="POST")
    return urllib.request.urlopen(request, timeout=timeout, context=context)


def member_status(context: ssl.SSLContext, node: str, url: str) -> MemberStatus:
    """Health, revision and leadership of the member at `url` (never raises: unhealthy says why)."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=TIMEOUT, context=context) as response:
            health = json.loads(response.read(65536) or b"{}")
        if str(health.get("health")) != "true":
            return MemberStatus(node, url, False, why=health.get("reason") or "health false")
        with _post(context, url, "/v3/maintenance/status") as response:
            status = json.loads(response.read(65536) or b"{}")
    except urllib.error.HTTPError as err:
        return MemberStatus(node, url, False, why=f"HTTP {err.code}")
    except (urllib.error.URLError, OSError, ValueError) as err:
        return MemberStatus(node, url, False, why=str(getattr(err, "reason", err)))
    header = status.get("header", {})
    return MemberStatus(node, url, True, int(header.get("revision", 0)),
                        str(status.get("leader")) == str(header.get("member_id")))


def pick_member(statuses: list[MemberStatus]) -> MemberStatus:
    """The healthy member with the highest revision; a follower before the leader, then by name."""
    healthy = [s for s in statuses if s.healthy]
    if not healthy:
        sick = "; ".join(f"{s.node} ({s.why})" for s in statuses) or "no member recorded"
        raise BackupError(f"no healthy etcd member to take a snapshot from: {sick}")
    current = max(s.revision for s in healthy)
    return sorted((s for s in healthy if s.revision == current), key=lambda s: (s.leader, s.node))[0]


def stream_snapshot(context: ssl.SSLContext, member: MemberStatus, out: Path) -> None:
    """Write the member's snapshot (with etcd's trailing checksum) to `out`, created 0600."""
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as sink:
        try:
            with _post(context, member.client_url, "/v3/maintenance/snapshot", READ_TIMEOUT) as response:
                while line := response.readline(MAX_LINE):
                    chunk = json.loads(line)
                    if "error" in chunk:
                        raise BackupError(f"etcd snapshot from {member.node}: {chunk['error'].get('message', chunk)}")
                    sink.write(base64.b64decode(chunk.get("result", {}).get("blob", "")))
        except urllib.error.HTTPError as err:
            raise BackupError(f"etcd snapshot from {member.node}: HTTP {err.code}") from None
        except (urllib.error.URLError, OSError, ValueError) as err:
            raise BackupError(f"etcd snapshot from {member.node}: {getattr(err, 'reason', err)}") from None
        sink.flush()
        os.fsync(sink.fileno())


def read_back(path: Path) -> dict:
    """`etcdutl snapshot status` of the file (etcd 3.6 moved it there from etcdctl, which older clients such
    as Debian's etcd-client still answer): its revision, key count and size (it opens the database)."""
    tool = shutil.which("etcdutl") or shutil.which("etcdctl")
    if tool is None:
        raise BackupError("neither etcdutl nor etcdctl is installed (Debian: apt install etcd-client)")
    try:
        done = subprocess.run([tool, "snapshot", "status", str(path), "-w", "json"], capture_output=True,
                              env={**os.environ, "ETCDCTL_API": "3"}, timeout=300, check=False)
    except OSError as err:
        raise BackupError(f"cannot run {tool}: {err}") from None
    if done.returncode != 0:
        raise BackupError(f"the snapshot does not read back: {done.stderr.decode(errors='replace').strip()[-300:]}")
    return json.loads(done.stdout)


def take_snapshot(context: ssl.SSLContext, members: dict[str, str], out: Path) -> TakenSnapshot:
    """Snapshot of the etcd whose members (node -> client URL) are given, written to `out`."""
    member = pick_member([member_status(context, node, url) for node, url in sorted(members.items())])
    stream_snapshot(context, member, out)
    status = read_back(out)
    return TakenSnapshot(out, member.node, int(status.get("revision", member.revision)), out.stat().st_size)
