"""Back up one cluster's etcd as the repo and the recorded state describe it.

Joins the pieces `gitops backup create` and the controller's schedule both need: the target the
Cluster's spec.backup names, the recorded etcd authority (a client certificate for this call), and
the client URLs of the members the state records (compiled placements).
"""
from __future__ import annotations

from gitops.backup.snapshot import Snapshot
from gitops.backup.take import back_up
from gitops.compile import compile_desired
from gitops.errors import GitopsError
from gitops.etcdclient import client_context
from gitops.model.config import BackupTarget, RepoConfig
from gitops.model.resources import ClusterBackup, RepoModel
from gitops.pki import CertKey
from gitops.state.records import State


def backup_of(model: RepoModel, config: RepoConfig, cluster: str) -> tuple[BackupTarget, ClusterBackup]:
    """The target `cluster`'s spec.backup names, and that spec."""
    if cluster not in model.clusters:
        raise GitopsError(f"no Cluster {cluster!r} in the repo (defined: {', '.join(sorted(model.clusters)) or 'none'})")
    spec = model.clusters[cluster].backup
    if spec is None:
        raise GitopsError(f"Cluster {cluster} has no spec.backup: set spec.backup.target to one of gitops.yaml's "
                          "spec.backup.targets")
    return config.backup_targets[spec.target], spec


def back_up_cluster(model: RepoModel, config: RepoConfig, state: State, cluster: str) -> Snapshot:
    """Take a snapshot of `cluster`'s etcd into its target now and apply its retention."""
    target, spec = backup_of(model, config, cluster)
    record = state.clusters.get(cluster)
    if record is None or "etcd" not in record.authorities or not record.etcd_members:
        raise GitopsError(f"Cluster {cluster} has not been applied yet (no etcd recorded); run gitops apply")
    want = compile_desired(model, state).desired.clusters[cluster]
    members = {m.node: m.client_url for m in want.etcd_members if m.node in record.etcd_members}
    authority = record.authorities["etcd"]
    context = client_context(CertKey.from_pem(authority.cert_pem, authority.key_pem), record.trust_bundle("etcd"))
    return back_up(target, cluster, spec.keep, context, members)
