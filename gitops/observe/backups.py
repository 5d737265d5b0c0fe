"""Listing the snapshots a restore reads (`spec.restore`): only for clusters whose restore is not done."""
from __future__ import annotations

from gitops.backup.restic import Restic
from gitops.errors import GitopsError
from gitops.model.config import RepoConfig
from gitops.model.resources import RepoModel
from gitops.observe.types import SnapshotListing
from gitops.state.records import State


def list_restores(model: RepoModel, config: RepoConfig, state: State) -> dict[str, SnapshotListing]:
    """Each cluster with a pending spec.restore: its snapshots in spec.backup.target, or why not listed."""
    out: dict[str, SnapshotListing] = {}
    for name, cluster in sorted(model.clusters.items()):
        record = state.clusters.get(name)
        if cluster.restore is None or cluster.backup is None or record is None:
            continue
        if not record.restore_pending(cluster.restore.snapshot):
            continue
        target = config.backup_targets.get(cluster.backup.target)
        if target is None:
            out[name] = SnapshotListing(cluster.backup.target, error="no such target in gitops.yaml's spec.backup")
            continue
        try:
            out[name] = SnapshotListing(target.name, tuple(Restic(target).snapshots(name)))
        except GitopsError as err:
            out[name] = SnapshotListing(target.name, error=str(err))
    return out
