"""`gitops state pull` and `gitops state push`: recorded state between a state dir and the status branch."""
from __future__ import annotations

import tempfile
from pathlib import Path

import click

from gitops.cli.reconcile import STATE_ENV
from gitops.cli.secrets import IDENTITY_ENV, read_identity
from gitops.errors import GitopsError
from gitops.gitclone import as_url
from gitops.state import LocalDirStore
from gitops.state.store import STATE_FILE
from gitops.status.branch import StatusBranch
from gitops.status.handover import pull, push
from gitops.status.reader import DEFAULT_BRANCH
from gitops.status.sealed_state import Sealer


@click.group("state")
def state() -> None:
    """Move recorded state (CAs, placements) between a state dir (`gitops apply` by hand) and the status
    branch (the controller), sealed to the controller's age identity on the branch."""


def _options(f):
    for option in reversed([
        click.option("--repo", required=True, help="The infra repo holding the status branch: path or URL."),
        click.option("--status-branch", default=DEFAULT_BRANCH, show_default=True),
        click.option("--state-dir", required=True, envvar=STATE_ENV,
                     type=click.Path(file_okay=False, path_type=Path), help="The local state directory."),
        click.option("--identity", type=click.Path(dir_okay=False, exists=True, path_type=Path),
                     envvar=IDENTITY_ENV, help=f"The controller's age identity (${IDENTITY_ENV})."),
        click.option("--insecure-plaintext-secrets", is_flag=True,
                     help="The controller runs with --insecure-plaintext-secrets (labs only)."),
        click.option("--force", is_flag=True, help="Replace a different state at the destination."),
    ]):
        f = option(f)
    return f


def _branch(repo: str, status_branch: str, workdir: Path) -> StatusBranch:
    return StatusBranch(as_url(repo), workdir, status_branch)


def _sealer(identity: Path | None, insecure: bool) -> Sealer:
    return Sealer(read_identity(identity), insecure_plaintext=insecure)


@state.command("pull")
@_options
def pull_cmd(repo: str, status_branch: str, state_dir: Path, identity: Path | None,
             insecure_plaintext_secrets: bool, force: bool) -> None:
    """Decrypt the state sealed on the status branch into --state-dir (for `gitops plan/apply --state-dir`)."""
    sealer = _sealer(identity, insecure_plaintext_secrets)
    with tempfile.TemporaryDirectory(prefix="gitops-status-") as scratch:
        generation, found = pull(_branch(repo, status_branch, Path(scratch)), sealer)
    store = LocalDirStore(state_dir)
    here = store.load()
    if here.clusters and here.to_dict() != found.to_dict() and not force:
        raise GitopsError(f"{state_dir} already holds another state (clusters {', '.join(sorted(here.clusters))}); "
                          "--force replaces it")
    store.save(found)
    click.echo(f"pulled generation {generation} of {status_branch} into {state_dir}: "
               f"{len(found.clusters)} cluster(s), {len(found.nodes)} node(s)")


@state.command("push")
@_options
def push_cmd(repo: str, status_branch: str, state_dir: Path, identity: Path | None,
             insecure_plaintext_secrets: bool, force: bool) -> None:
    """Seal --state-dir's state onto the status branch: the controller restores it on its next reconcile."""
    sealer = _sealer(identity, insecure_plaintext_secrets)
    recorded = LocalDirStore(state_dir).load()
    if not recorded.clusters and not recorded.nodes:
        raise GitopsError(f"{state_dir} holds no recorded state (no {STATE_FILE}): nothing to push")
    with tempfile.TemporaryDirectory(prefix="gitops-status-") as scratch:
        generation, sha = push(_branch(repo, status_branch, Path(scratch)), sealer, recorded, force=force)
    if sha is None:
        click.echo(f"{status_branch} already holds this state (generation {generation}): nothing pushed")
    else:
        click.echo(f"pushed the state of {state_dir} to {status_branch} as generation {generation} ({sha[:12]}): "
                   f"{len(recorded.clusters)} cluster(s), {len(recorded.nodes)} node(s)")


COMMANDS: list[click.Command] = [state]
