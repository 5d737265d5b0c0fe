"""Take one backup of a cluster's etcd into its target, then apply the cluster's retention."""
from __future__ import annotations

import ssl
import tempfile
from pathlib import Path

from gitops.backup.etcdsnapshot import take_snapshot
from gitops.backup.restic import Restic
from gitops.backup.snapshot import Snapshot
from gitops.model.config import BackupTarget


def back_up(target: BackupTarget, cluster: str, keep: int, context: ssl.SSLContext,
            members: dict[str, str]) -> Snapshot:
    """Snapshot the members' etcd (node -> client URL), store it in `target`, keep the newest `keep`.

    The snapshot file lives in a private temporary directory only while restic reads it."""
    restic = Restic(target)
    restic.ensure_repository()
    with tempfile.TemporaryDirectory(prefix="gitops-backup-") as scratch:
        taken = take_snapshot(context, members, Path(scratch) / "etcd.db")
        stored = restic.backup(taken.path, cluster, taken.revision, taken.member)
    restic.forget(cluster, keep)
    return stored
