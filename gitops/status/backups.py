"""`backups/<cluster>.yaml` on the status branch: each cluster's last etcd snapshot and whether the
last attempt worked (condition `BackedUp`).

Outside `status/` on purpose: a reconcile's commit rewrites `status/` whole, while snapshots are
taken on their own schedule and committed on their own.
"""
from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import yaml

from gitops.backup.snapshot import Snapshot
from gitops.backup.schedule import due
from gitops.errors import GitopsError
from gitops.model.config import RepoConfig
from gitops.model.resources import ClusterBackup, RepoModel
from gitops.snapshots import back_up_cluster
from gitops.state.records import State
from gitops.status.branch import StatusBranch
from gitops.status.report import API_VERSION, condition, dump

log = logging.getLogger("gitops.backup")

BACKUPS_DIR = "backups"


def backup_path(cluster: str) -> str:
    return f"{BACKUPS_DIR}/{cluster}.yaml"


@dataclass(frozen=True)
class BackupStatus:
    """What `backups/<cluster>.yaml` says."""

    cluster: str
    last: dict[str, Any] | None = None  # the last snapshot: id, time, revision, bytes, member, target
    failed_at: dt.datetime | None = None
    message: str = ""
    conditions: tuple[dict[str, Any], ...] = ()

    @property
    def last_time(self) -> dt.datetime | None:
        return dt.datetime.fromisoformat(self.last["time"]) if self.last else None


def read_backup(raw: bytes | None, cluster: str) -> BackupStatus:
    """The document as written (an unreadable one counts as none: the next snapshot rewrites it)."""
    try:
        doc = yaml.safe_load(raw or b"") or {}
        status = doc.get("status", {})
        failed = status.get("lastFailureTime")
        return BackupStatus(cluster, status.get("lastSnapshot"), dt.datetime.fromisoformat(failed) if failed else None,
                            status.get("message", ""), tuple(status.get("conditions", ())))
    except (yaml.YAMLError, AttributeError, TypeError, ValueError):
        return BackupStatus(cluster)


def backup_document(cluster: str, spec: ClusterBackup, before: BackupStatus, now: dt.datetime,
                    taken: Snapshot | None = None, error: str = "") -> bytes:
    """The document after a snapshot was taken (`taken`) or failed (`error`)."""
    previous = {c.get("type"): c for c in before.conditions if isinstance(c, dict)}
    last = before.last
    if taken is not None:
        last = {**taken.to_json(), "target": spec.target}
        ok = condition("BackedUp", True, "SnapshotTaken", f"snapshot {taken.short_id} at revision {taken.revision}",
                       previous, now)
    else:
        ok = condition("BackedUp", False, "BackupFailed", error, previous, now)
    status: dict[str, Any] = {"lastSnapshot": last, "conditions": [ok]}
    if taken is None:
        status["lastFailureTime"] = now.isoformat(timespec="seconds")
        status["message"] = error
    return dump({"apiVersion": API_VERSION, "kind": "BackupStatus", "metadata": {"name": cluster},
                 "spec": {"target": spec.target, "intervalMinutes": spec.interval_minutes, "keep": spec.keep},
                 "status": status})


def read_all(read: Callable[[str], bytes | None], clusters: list[str]) -> dict[str, BackupStatus]:
    return {name: read_backup(read(backup_path(name)), name) for name in clusters}


def take_due(model: RepoModel, config: RepoConfig, state: State, branch: StatusBranch, now: dt.datetime,
             clusters: list[str], owns_all: bool = True) -> dict[str, BackupStatus]:
    """Snapshot each of `clusters` (those with spec.backup) whose schedule says so, then commit their
    `backups/` documents in one status commit; returns every one's status afterwards. A failed
    snapshot is a `BackedUp: False` condition and a log line, never an exception. `owns_all`: this
    controller writes every cluster's backups (then documents of clusters gone are removed)."""
    enabled = {n: model.clusters[n].backup for n in sorted(clusters) if model.clusters[n].backup is not None}
    before = read_all(branch.read, list(enabled))
    results: dict[str, tuple[Snapshot | None, str]] = {}
    for name, spec in enabled.items():
        if not due(spec, before[name].last_time, before[name].failed_at, now):
            continue
        try:
            results[name] = (back_up_cluster(model, config, state, name), "")
            log.info("etcd snapshot taken", extra={"cluster": name, "snapshot": results[name][0].short_id})
        except GitopsError as err:
            results[name] = (None, str(err))
            log.error("etcd snapshot failed", extra={"cluster": name, "error": str(err)})
    def write(b: StatusBranch) -> None:
        files = {backup_path(n): b.read(backup_path(n)) for n in enabled if n not in results}
        files = {rel: data for rel, data in files.items() if data is not None}
        for name, (taken, error) in results.items():
            files[backup_path(name)] = backup_document(name, enabled[name], before[name], now, taken, error)
        b.write_tree(files, (BACKUPS_DIR,) if owns_all else ())

    kept = {backup_path(n) for n in enabled}
    gone = [rel for rel in branch.tracked_under(BACKUPS_DIR) if rel not in kept]
    if results or (owns_all and gone):
        done = sorted(n for n, (taken, _) in results.items() if taken is not None)
        failed = sorted(n for n, (taken, _) in results.items() if taken is None)
        branch.publish(write, f"backup: {len(done)} snapshot(s)" + (f", failed: {', '.join(failed)}" if failed else ""))
    return read_all(branch.read, list(enabled))
