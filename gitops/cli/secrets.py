"""`gitops secrets`: encrypt secret fields of the repo with age, in place, and re-encrypt them.

Also the `--identity` option (and `$GITOPS_IDENTITY`) that validate, plan and apply use to
decrypt them in memory.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from gitops.errors import GitopsError
from gitops.model.config import CONFIG_FILE
from gitops.model.diagnostics import MAX_SHOWN, capped
from gitops.model.repo import repo_files
from gitops.model.secretfields import describe_declared
from gitops.model.secretedit import (
    FileChange,
    encrypt_fields,
    find_fields,
    parse_field,
    read_yaml,
    rekey_fields,
    write_changes,
)
from gitops.model.yamledit import EditError
from gitops.printable import printable
from gitops.safeio import FileRefused, MiB, read_text
from gitops.secrets import encrypt, load_identities

IDENTITY_ENV = "GITOPS_IDENTITY"
#: an age identity file is a few lines; a larger one is not one
MAX_IDENTITY_BYTES = MiB

identity_option = click.option(
    "--identity", type=click.Path(dir_okay=False, exists=True, path_type=Path), envvar=IDENTITY_ENV,
    help=f"age identity (age-keygen output; ${IDENTITY_ENV}) that decrypts the repo's encrypted secret fields, "
         "in memory only. The controller's --identity, or yours if you are among spec.secrets.recipients.")


def read_identity(path: Path | None) -> str | None:
    """The identity file's text: `path`, else `$GITOPS_IDENTITY`, else None."""
    if path is None and os.environ.get(IDENTITY_ENV):
        path = Path(os.environ[IDENTITY_ENV])
    if path is None:
        return None
    try:
        return read_text(path, MAX_IDENTITY_BYTES)
    except FileRefused as err:
        raise GitopsError(f"cannot read the age identity: {err}") from None


recipient_option = click.option(
    "-r", "--recipient", "recipients", multiple=True, metavar="AGE1...",
    help="Encrypt to this age recipient (repeatable) instead of gitops.yaml's spec.secrets.recipients.")


def _repo_root_of(path: Path) -> Path | None:
    """The repo whose gitops.yaml applies to `path`: a directory is its own repo; a file's is the nearest
    directory holding gitops.yaml from the file up, never above the top of its git checkout (a
    directory holding `.git`): the gitops.yaml of an enclosing directory is another repo's."""
    real = Path(os.path.realpath(path))
    if real.is_dir():
        return real if os.path.lexists(real / CONFIG_FILE) else None
    for directory in (real.parent, *real.parent.parents):
        if os.path.lexists(directory / CONFIG_FILE):
            return directory
        if os.path.lexists(directory / ".git"):
            return None
    return None


def _recipients(root: Path | None, given: tuple[str, ...]) -> tuple[str, ...]:
    if given:
        return given
    if root is None:
        raise GitopsError(f"no {CONFIG_FILE} found in the repo and no --recipient given: nothing to encrypt to "
                          "(--repo names the repo whose gitops.yaml lists the recipients)")
    config, _, problems = repo_files(root)
    if problems:
        raise GitopsError(f"{root / CONFIG_FILE} is invalid:\n" + "\n".join(capped(problems)))
    if not config.secrets.recipients:
        raise GitopsError(f"{root / CONFIG_FILE} declares no spec.secrets.recipients (the controller's age recipient "
                          "and yours); add them, or pass --recipient")
    return config.secrets.recipients


def _files(target: Path, root: Path | None) -> list[tuple[str, Path]]:
    """(name to report, path) of a YAML file, or of every YAML file of a repo directory."""
    if target.is_dir():
        _, rels, problems = repo_files(target)
        if problems:
            raise GitopsError("\n".join(capped(problems)))
        config = [CONFIG_FILE] if (target / CONFIG_FILE).is_file() else []  # its backup targets' passwords
        return [(rel, target / rel) for rel in config + rels]
    resolved = Path(os.path.realpath(target))
    name = resolved.relative_to(root).as_posix() if root and resolved.is_relative_to(root) else printable(str(target))
    return [(name, target)]


def _report(changes: list[FileChange], dry_run: bool = False) -> None:
    for change in changes:
        for line in change.report:
            click.echo(printable(line))
    if not any(c.report for c in changes):
        click.echo("no secret fields found (secret fields: " + describe_declared() + ")")
        return
    changed = sum(1 for c in changes if c.new_text is not None)
    if dry_run:
        click.echo(f"dry run: {changed} file(s) would be rewritten")
        return
    click.echo(f"{write_changes(changes)} file(s) rewritten in place")


@click.group()
def secrets() -> None:
    """Encrypt secret fields (a Hypervisor's client private key) with age, for the repo's recipients."""


@secrets.command("encrypt-value")
@click.option("--repo", "repo", type=click.Path(file_okay=False, exists=True, path_type=Path), default=".",
              show_default=True, help="Repo whose gitops.yaml lists the recipients.")
@recipient_option
def encrypt_value(repo: Path, recipients: tuple[str, ...]) -> None:
    """Encrypt stdin to the recipients; print one armored age block (paste it under `field: |`)."""
    data = sys.stdin.buffer.read()
    if not data:
        raise GitopsError("nothing on stdin to encrypt")
    click.echo(encrypt(data, _recipients(_repo_root_of(repo), recipients)), nl=False)


@secrets.command("encrypt")
@click.argument("target", type=click.Path(exists=True, path_type=Path), metavar="FILE|REPO")
@click.option("--field", "field_text", metavar="PATH",
              help="Only this secret field, e.g. spec.remoteCRIEndpoint.clientCertificate.privateKey.")
@click.option("--document", metavar="NAME", help="Only the document with this metadata.name (or Kind/name).")
@click.option("--repo", "repo", type=click.Path(file_okay=False, exists=True, path_type=Path),
              help="Repo whose gitops.yaml lists the recipients (default: the nearest one above FILE).")
@recipient_option
@click.option("--dry-run", is_flag=True, help="Say what would be encrypted; write nothing.")
def encrypt_command(target: Path, field_text: str | None, document: str | None, repo: Path | None,
                    recipients: tuple[str, ...], dry_run: bool) -> None:
    """Encrypt secret fields of FILE (or of every file of REPO) in place.

    Each plaintext value becomes one ASCII-armored age block written as a `|` literal;
    every other byte of the file (comments, order, quoting) stays as it was. Values
    already encrypted are left alone.
    """
    root = repo.resolve() if repo else _repo_root_of(target)
    changes = encrypt_fields(_files(target, root), _recipients(root, recipients),
                             field_path=parse_field(field_text) if field_text else None, document=document)
    _report(changes, dry_run)


@secrets.command()
@click.argument("repo", default=".", type=click.Path(file_okay=False, exists=True, path_type=Path))
@identity_option
@recipient_option
@click.option("--dry-run", is_flag=True, help="Decrypt everything and say what would change; write nothing.")
def rekey(repo: Path, identity: Path | None, recipients: tuple[str, ...], dry_run: bool) -> None:
    """Re-encrypt every encrypted secret field of REPO to gitops.yaml's current recipients.

    Run it after changing spec.secrets.recipients, with an identity that can decrypt the
    values today. Nothing is written unless every value decrypts.
    """
    text = read_identity(identity)
    if text is None:
        raise GitopsError(f"rekey needs an identity that decrypts the values today: --identity FILE or ${IDENTITY_ENV}")
    changes = rekey_fields(_files(repo, repo.resolve()), load_identities(text), _recipients(repo.resolve(), recipients))
    _report(changes, dry_run)


@secrets.command("list")
@click.argument("repo", default=".", type=click.Path(file_okay=False, exists=True, path_type=Path))
def list_fields(repo: Path) -> None:
    """List every secret field of REPO (file:line: Kind/name: field: encrypted | PLAINTEXT)."""
    found = 0
    problems: list[str] = []
    for rel, path in _files(repo, repo.resolve()):
        try:
            fields = find_fields(rel, read_yaml(rel, path))
        except EditError as err:  # unreadable, or not YAML: said after the list, and the exit code is 1
            problems.append(str(err))
            continue
        for secret in fields:
            found += 1
            click.echo(printable(f"{secret.where}: {'encrypted' if secret.encrypted else 'PLAINTEXT'}"))
    if not found and not problems:
        click.echo("no secret fields in this repo")
    for line in problems[:MAX_SHOWN] + ([f"... and {len(problems) - MAX_SHOWN} more"] if len(problems) > MAX_SHOWN else []):
        click.echo(f"error: {printable(line)}", err=True)
    if problems:
        raise SystemExit(1)


COMMANDS: list[click.Command] = [secrets]
