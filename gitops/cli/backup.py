"""`gitops backup create` and `gitops backup list`: etcd snapshots of a cluster in its backup target."""
from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import click

from gitops.backup.restic import Restic
from gitops.backup.snapshot import Snapshot
from gitops.cli.reconcile import load, repo_argument, state_option, state_store
from gitops.cli.secrets import identity_option
from gitops.units import human_age, human_size
from gitops.snapshots import back_up_cluster, backup_of

cluster_option = click.option("--cluster", required=True, help="Cluster name (its spec.backup names the target).")


@click.group()
def backup() -> None:
    """etcd snapshots of a cluster, in the restic repository its spec.backup names."""


@backup.command("create")
@repo_argument
@state_option
@cluster_option
@identity_option
def create(repo: Path, state_dir: Path | None, cluster: str, identity: Path | None) -> None:
    """Take a snapshot of CLUSTER's etcd now (from a healthy, current member) and print its id."""
    validation = load(repo, identity)
    model, config = validation.model, validation.repo.config
    target, spec = backup_of(model, config, cluster)
    snap = back_up_cluster(model, config, state_store(repo, state_dir).load(), cluster)
    click.echo(f"snapshot {snap.short_id} of {cluster}: revision {snap.revision}, {snap.bytes} bytes, from "
               f"{snap.member}, in target {target.name} (kept: the newest {spec.keep})", err=True)
    click.echo(snap.id)


@backup.command("list")
@repo_argument
@cluster_option
@identity_option
@click.option("--json", "as_json", is_flag=True, help="One JSON array instead of a table.")
def list_(repo: Path, cluster: str, identity: Path | None, as_json: bool) -> None:
    """List CLUSTER's snapshots, oldest first: id, time, revision, size."""
    validation = load(repo, identity)
    target, _ = backup_of(validation.model, validation.repo.config, cluster)
    snaps = Restic(target).snapshots(cluster)
    if as_json:
        click.echo(json.dumps([s.to_json() for s in snaps], indent=2, sort_keys=True))
        return
    if not snaps:
        click.echo(f"no snapshot of {cluster} in target {target.name}")
        return
    now = dt.datetime.now(dt.timezone.utc)
    click.echo(f"{'ID':<10}{'TIME (UTC)':<22}{'AGE':>8}  {'REVISION':>9}  {'SIZE':>10}  MEMBER")
    for snap in snaps:
        click.echo(f"{snap.short_id:<10}{_utc(snap):<22}{human_age((now - snap.time).total_seconds()):>8}  {snap.revision:>9}  "
                   f"{human_size(snap.bytes):>10}  {snap.member}")


def _utc(snap: Snapshot) -> str:
    return snap.time.astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


COMMANDS: list[click.Command] = [backup]
