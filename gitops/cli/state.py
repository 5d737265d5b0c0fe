"""`gitops state pull` and `gitops state push`: recorded state between a state dir and the status branch."""
from __future__ import annotations

import tempfile
from pathlib import Path

import click

from gitops.cli.reconcile import STATE_ENV
from gitops.cli.secrets import IDENTITY_ENV, read_identity
from gitops.cli.trust import reader_options, reader_verifier
from gitops.errors import GitopsError
from gitops.gitrepo import as_url
from gitops.state import LocalDirStore
from gitops.state.store import STATE_FILE
from gitops.status.branch import StatusBranch
from gitops.status.handover import pull, push
from gitops.model.config import CONFIG_FILE
from gitops.status.reader import DEFAULT_BRANCH, signers_of_checkout
from gitops.status.sealed_state import Sealer
from gitops.status.trust import BranchTrust, SigningKey


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
        click.option("--force", is_flag=True, help="Replace a different state at the destination (push: also sign "
                                                   "with a key spec.status.signers does not list, with a warning)."),
    ]):
        f = option(f)
    return reader_options(f)


def _branch(repo: str, status_branch: str, workdir: Path, trust: BranchTrust) -> StatusBranch:
    return StatusBranch(as_url(repo), workdir, status_branch, trust)


def _pinned(repo: str) -> tuple[str, ...]:
    """spec.status.signers of --repo when it is a local checkout (a URL's are given with --status-signers)."""
    local = Path(repo)
    return signers_of_checkout(local) if (local / CONFIG_FILE).is_file() else ()


def _sealer(identity: Path | None, insecure: bool) -> Sealer:
    return Sealer(read_identity(identity), insecure_plaintext=insecure)


@state.command("pull")
@_options
def pull_cmd(repo: str, status_branch: str, state_dir: Path, identity: Path | None,
             insecure_plaintext_secrets: bool, force: bool, status_signers: Path | None,
             insecure_unverified_status: bool, status_min_generation: int) -> None:
    """Decrypt the state sealed on the status branch into --state-dir (for `gitops plan/apply --state-dir`),
    from a status commit signed by a pinned key (spec.status.signers of --repo, --status-signers)."""
    sealer = _sealer(identity, insecure_plaintext_secrets)
    verifier = reader_verifier(_pinned(repo), status_signers, insecure_unverified_status, status_min_generation)
    with tempfile.TemporaryDirectory(prefix="gitops-status-") as scratch:
        branch = _branch(repo, status_branch, Path(scratch), BranchTrust(verifier))
        generation, found = pull(branch, sealer)
        if branch.untrusted is not None:
            click.echo(f"WARNING: the tip of {status_branch} ({branch.untrusted[0][:12] or 'deleted'}) is not trusted: "
                       f"{branch.untrusted[1]}; pulled the newest status commit a pinned key signed", err=True)
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
@click.option("--signing-key", required=True, type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="Your SSH private key: the status commit is signed with it, and spec.status.signers must list "
                   "it (else the controller sets the commit aside).")
def push_cmd(repo: str, status_branch: str, state_dir: Path, identity: Path | None,
             insecure_plaintext_secrets: bool, force: bool, status_signers: Path | None,
             insecure_unverified_status: bool, status_min_generation: int, signing_key: Path) -> None:
    """Seal --state-dir's state onto the status branch, in a commit signed with --signing-key: the controller
    restores it on its next reconcile when spec.status.signers lists that key."""
    sealer = _sealer(identity, insecure_plaintext_secrets)
    recorded = LocalDirStore(state_dir).load()
    if not recorded.clusters and not recorded.nodes:
        raise GitopsError(f"{state_dir} holds no recorded state (no {STATE_FILE}): nothing to push")
    key = SigningKey(signing_key.absolute())
    verifier = reader_verifier(_pinned(repo), status_signers, insecure_unverified_status, status_min_generation)
    if not verifier.insecure and not verifier.signers.allows(key.signer):
        if not force:
            raise GitopsError(f"{signing_key} is not a pinned status signer (spec.status.signers, --status-signers): "
                              "the controller would set this push aside; add the key there first, or --force")
        click.echo(f"WARNING: {signing_key} is not a pinned status signer: the controller sets this commit aside "
                   "until spec.status.signers lists it", err=True)
    with tempfile.TemporaryDirectory(prefix="gitops-status-") as scratch:
        branch = _branch(repo, status_branch, Path(scratch), BranchTrust(verifier, key))
        generation, sha = push(branch, sealer, recorded, force=force)
    if sha is None:
        click.echo(f"{status_branch} already holds this state (generation {generation}): nothing pushed")
    else:
        click.echo(f"pushed the state of {state_dir} to {status_branch} as generation {generation} ({sha[:12]}): "
                   f"{len(recorded.clusters)} cluster(s), {len(recorded.nodes)} node(s)")


COMMANDS: list[click.Command] = [state]
