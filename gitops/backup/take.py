"""Take one backup of a cluster's etcd into its target, then apply the cluster's retention."""
from __future__ import annotations

import os
import shutil
import ssl
import tempfile
from pathlib import Path

from gitops.backup.etcdsnapshot import take_snapshot
from gitops.backup.restic import Restic
from gitops.backup.snapshot import Snapshot
from gitops.model.config import BackupTarget


#: a backup's private scratch directory in the temp dir: SCRATCH + its process id + "-" + a random part
SCRATCH = "gitops-backup-"


def back_up(target: BackupTarget, cluster: str, keep: int, context: ssl.SSLContext,
            members: dict[str, str]) -> Snapshot:
    """Snapshot the members' etcd (node -> client URL), store it in `target`, keep the newest `keep`.

    The snapshot file lives in a private temporary directory only while restic reads it; one left by
    a backup killed before it removed its own (kill -9: it holds the cluster's data) goes first."""
    sweep(Path(tempfile.gettempdir()))
    restic = Restic(target)
    restic.ensure_repository()
    with tempfile.TemporaryDirectory(prefix=f"{SCRATCH}{os.getpid()}-") as scratch:
        taken = take_snapshot(context, members, Path(scratch) / "etcd.db")
        stored = restic.backup(taken.path, cluster, taken.revision, taken.member)
    restic.forget(cluster, keep)
    return stored


def sweep(tmp: Path) -> list[Path]:
    """Remove the scratch directories under `tmp` whose backup process is gone; returns them."""
    gone = []
    for path in tmp.glob(f"{SCRATCH}*-*"):
        pid = path.name[len(SCRATCH):].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)
            gone.append(path)
    return gone


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: alive
        return True
    return True
