"""Status-branch trust on the command line: the options every reader of the branch takes, and
`gitops status-key`, which prints a controller's allowed-signers line for spec.status.signers."""
from __future__ import annotations

from pathlib import Path

import click

from gitops.status.trust import INSECURE_FLAG, SIGNING_KEY, Signers, SigningKey, TrustError, Verifier, ensure_key


def reader_options(f):
    """--status-signers and --insecure-unverified-status, for commands that read the status branch."""
    for option in reversed([
        click.option("--status-signers", type=click.Path(dir_okay=False, exists=True, path_type=Path),
                     help="Allowed-signers file (or a public key) of the status branch's signers, beside "
                          "spec.status.signers of gitops.yaml (e.g. a controller's workdir/status-signing-key.pub)."),
        click.option("--insecure-unverified-status", is_flag=True,
                     help="Read the status branch without verifying who signed it (anyone who can push there "
                          "decides what is shown). Labs only."),
        click.option("--status-min-generation", type=click.IntRange(0), default=0, metavar="N",
                     help="Refuse a status commit older than generation N (`gitops status` shows the generation it "
                          "read): a branch put back to an older signed commit is noticed."),
    ]):
        f = option(f)
    return f


def reader_verifier(pinned: tuple[str, ...], status_signers: Path | None, insecure: bool,
                    min_generation: int = 0) -> Verifier:
    """The verifier a reader of the status branch uses: spec.status.signers (`pinned`) and --status-signers,
    commits at least generation `min_generation`; none of either is an error, unless
    --insecure-unverified-status (warned about on stderr)."""
    if insecure:
        click.echo(f"WARNING: {INSECURE_FLAG}: the status branch is read WITHOUT verifying its signatures; "
                   "anyone who can push there decides what this shows", err=True)
        return Verifier(Signers(), insecure=True, min_generation=min_generation)
    signers = Signers.parse(pinned, "spec.status.signers")
    if status_signers is not None:
        signers = signers.plus(Signers.from_file(status_signers).signers)
    if not signers:
        raise TrustError("no status signer is pinned: list the controllers' keys in spec.status.signers of "
                         "gitops.yaml (`gitops status-key --workdir DIR` prints one), or pass --status-signers "
                         f"FILE ({INSECURE_FLAG} reads the branch unverified)")
    return Verifier(signers, min_generation=min_generation)


@click.command("status-key")
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="The controller's workdir: its status signing key is made there if missing.")
@click.option("--key", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="A signing key given to the controller with --status-signing-key instead.")
@click.option("--principal", default="gitops", show_default=True, help="The name the line gives the key.")
def status_key(workdir: Path | None, key: Path | None, principal: str) -> None:
    """Print the allowed-signers line of a controller's status signing key, for spec.status.signers."""
    if (workdir is None) == (key is None):
        raise click.UsageError("give --workdir or --key")
    signing = SigningKey(key) if key is not None else ensure_key(workdir / SIGNING_KEY, "gitops-status")
    signer = signing.signer
    click.echo(f"{principal} {signer.key_type} {signer.key}")


COMMANDS: list[click.Command] = [status_key]
